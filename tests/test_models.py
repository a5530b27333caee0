"""The shipped models and any nn.Module: Ψ, determinism, the data is learnable, unit policies."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

from zeroedu import catalog
from zeroedu.models import PRESETS, CustomModel, GPTConfig, check_units, get_model, units
from zeroedu.models import data
from zeroedu.train import RunConfig, config_from_dict, config_to_dict, run


@pytest.mark.fast
@pytest.mark.parametrize("name", ["mlp", "gpt-tiny", "gpt-small"])
def test_param_count_closed_form_equals_the_model(name):
    cfg = get_model(name)
    model = cfg.build()
    assert cfg.param_count() == sum(p.numel() for p in model.parameters())
    # every parameter in exactly one unit
    owned = [p for u in units(model) for p in u.parameters()]
    assert len(owned) == len(list(model.parameters())) == len({id(p) for p in owned})


@pytest.mark.fast
def test_presets_sizes():
    assert PRESETS["gpt-tiny"].param_count() == 30_851
    small = PRESETS["gpt-small"].param_count()
    assert small == 3_242_081 and 2_000_000 <= small <= 10_000_000
    # units: embeddings, one per block, head (as fully_shard per block)
    g = PRESETS["gpt-small"].build()
    assert [type(u).__name__ for u in units(g)] == ["Embed"] + ["Block"] * 4 + ["Head"]


@pytest.mark.fast
def test_same_seed_same_weights_and_batches():
    cfg = PRESETS["gpt-tiny"]
    a, b = cfg.build(), cfg.build()
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    other = dataclasses.replace(cfg, seed=1)
    assert not torch.equal(other.build().embed.tok.weight, a.embed.tok.weight)
    x1, y1 = cfg.batch(3, 8)
    x2, y2 = cfg.batch(3, 8)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the stream shifted by one
    assert x1.dtype == torch.long and x1.max() < data.N_SYMBOLS
    # a sequence does not depend on the batch it is in
    assert torch.equal(cfg.batch(3, 2)[0], x1[:2])


@pytest.mark.fast
def test_the_token_stream_is_learnable():
    """Single-process Adam on gpt-tiny: from about ln(V) to well below within 80 steps."""
    cfg = PRESETS["gpt-tiny"]
    torch.manual_seed(0)
    model = cfg.build()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    losses = []
    for step in range(80):
        x, y = cfg.batch(step, 8)
        loss = model.loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert abs(losses[0] - math.log(cfg.vocab)) < 0.1
    assert losses[-1] < 0.6 * losses[0]
    assert data.entropy_floor(cfg, 64) < losses[-1]  # nobody beats the generator


@pytest.mark.fast
def test_config_round_trip_and_bad_input():
    for name in ("mlp", "gpt-tiny", "gpt-small"):
        c = RunConfig("fsdp2", 2, model=name).resolved()
        back = config_from_dict(config_to_dict(c))
        assert back.model == c.model and back.adam == c.adam
    with pytest.raises(ValueError, match="unknown model 'gpt-huge'"):
        RunConfig("ddp", 2, model="gpt-huge").resolved()
    with pytest.raises(ValueError, match="divisible by 4 micro-batches"):
        RunConfig("ddp", 4, model="gpt-tiny", micro_batches=4).resolved()  # local batch 2
    with pytest.raises(ValueError, match="transformer"):
        RunConfig("ddp", 2, model="mlp", recompute="full").resolved()
    with pytest.raises(ValueError, match="d_model"):
        GPTConfig(vocab=67, seq_len=8, d_model=30, n_layers=1, n_heads=4)
    with pytest.raises(ValueError, match="too small"):
        GPTConfig(vocab=20, seq_len=8, d_model=32, n_layers=1, n_heads=4)


# ---------------------------------------------------------------- any nn.Module
class Tied(nn.Module):
    """Token embedding and LM head share one weight, in two different units."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(11, 8)
        self.head = nn.Linear(8, 11, bias=False)
        self.head.weight = self.tok.weight


@pytest.mark.fast
def test_unit_policy_refuses_a_parameter_shared_by_two_units():
    m = Tied()
    with pytest.raises(ValueError, match="belongs to units 0 and 1"):
        check_units(m, [m.tok, m.head])


@pytest.mark.fast
def test_unit_policy_refuses_parameters_in_no_unit():
    m = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"parameters in no unit: \['1.weight', '1.bias'\]"):
        check_units(m, [m[0]])


def test_shared_parameter_is_refused_by_sharded_strategies_before_training():
    cfg = RunConfig("fsdp1", 1, steps=1, model=CustomModel("tests.custom_models:tied_model",
                                                           "tests.custom_models:token_batch",
                                                           units=("tok", "head")))
    with pytest.raises(Exception, match="belongs to units 0 and 1"):
        run(cfg)


@pytest.mark.fast
def test_custom_model_by_reference_round_trips():
    from examples import custom_model as ex

    m = CustomModel(ex.build, ex.batch, ex.loss, units=("embed", "blocks.*", "head"))
    d = m.as_dict()
    assert d["kind"] == "custom" and d["build"] == "examples.custom_model:build"
    assert d["units"] == ("embed", "blocks.*", "head")
    assert get_model(d) == m
    model = m.build()
    assert [n for n, _ in model.named_children()] == ["embed", "blocks", "head"]
    assert len(model.units()) == 2 + len(model.blocks)
    with pytest.raises(ValueError, match="no submodule named 'body'"):
        CustomModel(ex.build, ex.batch, units=("embed", "body.*")).build().units()


@pytest.mark.parametrize("strategy", sorted(catalog.STRATEGIES))
def test_custom_model_trains_like_single_process_under_every_strategy(strategy):
    """examples/custom_model.py (nn.MultiheadAttention reading its packed in_proj_weight,
    LayerNorm, nested blocks, a bare position table) on 4 ranks (hybrids 2 x 2), fp32: bytes
    measured == predicted, losses and final parameters those of single-process training."""
    from examples import custom_model as ex

    model = CustomModel(ex.build, ex.batch, ex.loss, units=("embed", "blocks.*", "head"), lr=3e-3,
                        global_batch=16)
    hybrid = catalog.get_spec(strategy).hybrid
    rep = run(RunConfig(strategy, 4, m=2 if hybrid else 1, steps=2, recipe="fp32", model=model,
                        return_params=True))
    assert rep.match.model_states and rep.match.comm and rep.match.wire is not False
    assert rep.match.activations is None  # no closed form for a user's model: measured only
    assert all(r.measured.activations > 0 for r in rep.ranks)
    assert max(abs(a - b) / abs(b) for a, b in zip(rep.losses, rep.reference_losses)) <= 1e-5
    # fp32 sums in another order: parameters within 1e-5 of single-process (relative norm, per
    # tensor), except the attention's key bias (in_proj_bias[D:2D]). Its true gradient is 0 (a
    # bias on the keys adds q·b to every score of a query row, which softmax ignores), so what it
    # receives is rounding noise, and Adam turns noise of any size into steps of about lr: there
    # the runs may differ by up to lr per step, and nowhere else.
    names = [n for n, _ in ex.build().named_parameters()]
    for name, p, q in zip(names, rep.params, rep.reference_params):
        if name.endswith("attn.in_proj_bias"):
            key = slice(ex.D, 2 * ex.D)
            assert (p[key] - q[key]).abs().max() <= 2 * 3e-3 * 1.01, name
            p, q = torch.cat([p[:ex.D], p[2 * ex.D:]]), torch.cat([q[:ex.D], q[2 * ex.D:]])
        assert ((p - q).norm() / q.norm()).item() <= 1e-5, name
    assert rep.replica_max_diff == 0.0
