"""Activation memory: the exact closed forms of zeroedu's models against what autograd saves
(measured by the ledger), and Korthikanti et al. 2022's per-layer expressions."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from zeroedu.models import PRESETS, MLPConfig, apply_recompute
from zeroedu.runtime.ledger import Ledger
from zeroedu.theory import activations as A

pytestmark = pytest.mark.fast


def measure(cfg, batch, dtype, recompute="none"):
    """Bytes the ledger counts as activations at the forward/backward boundary of one
    micro-batch of `batch` sequences (parameters tracked as such, so saved weights are not
    activations); backward runs afterwards, so the graph is used and freed."""
    model = cfg.build().to(dtype)
    if recompute != "none":
        apply_recompute(cfg.recompute_modules(model, recompute))
    ledger = Ledger(0)
    for p in model.parameters():
        ledger.track(p, "param")
    x, y = cfg.batch(0, batch)
    x = x.to(dtype) if x.is_floating_point() else x
    with ledger.saving_activations():
        loss = model.loss(model(x), y)
        got = ledger.bytes_by_category()["activation"]
    loss.backward()
    return got


@pytest.mark.parametrize("attention", ["eager", "fused"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("batch", [1, 3])
def test_gpt_tiny_formula_equals_measurement(dtype, recompute, batch, attention):
    cfg = dataclasses.replace(PRESETS["gpt-tiny"], attention=attention)
    a = torch.finfo(dtype).bits // 8
    assert measure(cfg, batch, dtype, recompute) == cfg.activation_bytes(batch, a, recompute)


def test_fused_attention_saves_no_scores_and_makes_selective_recompute_nearly_free():
    """torch's scaled_dot_product_attention (CPU flash kernel) saves q, k, v, its output and an
    fp32 log-sum-exp per row, never the B·H·S² probabilities: against eager, each layer drops
    a·B·H·S² and adds a·T·D + 4·B·H·S; selective recompute then only drops those two, and saves
    the same as eager's selective."""
    eager, fused = PRESETS["gpt-small"], dataclasses.replace(PRESETS["gpt-small"], attention="fused")
    B, S, D, H, L, a = 2, eager.seq_len, eager.d_model, eager.n_heads, eager.n_layers, 2
    assert measure(fused, B, torch.bfloat16) == fused.activation_bytes(B, a)
    assert eager.activation_bytes(B, a) - fused.activation_bytes(B, a) == L * (a * B * H * S * S - a * B * S * D - 4 * B * H * S)
    assert fused.activation_bytes(B, a, "none") - fused.activation_bytes(B, a, "selective") == L * (a * B * S * D + 4 * B * H * S)
    for r in ("selective", "full"):
        assert fused.activation_bytes(B, a, r) == eager.activation_bytes(B, a, r)
    with pytest.raises(ValueError, match="attention must be one of"):
        dataclasses.replace(eager, attention="flash")


def test_gpt_small_formula_equals_measurement():
    cfg = PRESETS["gpt-small"]
    got = measure(cfg, 2, torch.bfloat16)
    assert got == cfg.activation_bytes(2, 2) == 9_811_972  # the figure FINDINGS quotes for B=2, S=128


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mlp_formula_equals_measurement(dtype):
    cfg = MLPConfig()
    a = torch.finfo(dtype).bits // 8
    for batch in (1, 6):
        assert measure(cfg, batch, dtype) == cfg.activation_bytes(batch, a)


def test_recompute_drops_the_terms_the_closed_form_says():
    cfg = PRESETS["gpt-small"]
    B, S, D, H, L = 2, cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.n_layers
    none, sel, full = (cfg.activation_bytes(B, 2, r) for r in ("none", "selective", "full"))
    assert none - sel == L * 2 * B * H * S * S  # the softmax outputs, a·B·H·S² per layer
    # full keeps one a·B·S·D block input per layer instead of everything inside the block
    per_block_none = sum(t.bytes for t in A.gpt_activation_terms(cfg, B, S, 2) if t.unit == "block")
    assert none - full == L * (per_block_none - 2 * B * S * D)


def test_term_table_sums_to_the_total():
    cfg = PRESETS["gpt-tiny"]
    for r in ("none", "selective", "full"):
        rows = A.gpt_activation_table(cfg, 4, 32, 2, r)
        assert sum(row["bytes"] for row in rows) == cfg.activation_bytes(4, 2, r)


# ---------------------------------------------------------------- Korthikanti et al. 2022
def test_korthikanti_eq1_and_table2():
    # GPT-3 175B's layer (their Table 3): h = 12288, a = 96, s = 2048, micro-batch 1
    s, b, h, a = 2048, 1, 12288, 96
    sbh = s * b * h
    assert A.korthikanti_layer_bytes(s, b, h, a) == sbh * 34 + 5 * a * s * s * b  # §4.1 Eq. (1)
    assert A.korthikanti_layer_bytes(s, b, h, a, "selective") == 34 * sbh  # §5, Table 2 (t = 1)
    assert A.korthikanti_layer_bytes(s, b, h, a, "full") == 2 * sbh
    terms = A.korthikanti_layer_terms(s, b, h, a)
    by_block = {}
    for block, _, n in terms:
        by_block[block] = by_block.get(block, 0) + n
    assert by_block == {"attention": 11 * sbh + 5 * a * s * s * b, "mlp": 19 * sbh, "layernorm": 4 * sbh}
    # sbh(34 + 5as/h) in the paper's own form, where 5as/h is an integer
    assert A.korthikanti_layer_bytes(s, b, h, a) == sbh * (34 + 5 * a * s // h)


def test_korthikanti_in_other_activation_dtypes():
    s, b, h, a = 128, 2, 256, 4
    assert A.korthikanti_layer_bytes(s, b, h, a, dtype_bytes=2) == A.korthikanti_layer_bytes(s, b, h, a)
    # fp32 activations, 1-byte masks: (16·4 + 2)sbh + (2·4 + 1)as²b
    assert A.korthikanti_layer_bytes(s, b, h, a, dtype_bytes=4) == 66 * s * b * h + 9 * a * s * s * b
    with pytest.raises(ValueError, match="recompute"):
        A.korthikanti_layer_bytes(s, b, h, a, "partial")
