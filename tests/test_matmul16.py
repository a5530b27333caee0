"""16-bit products computed in fp32 (`zeroedu.runtime.matmul16`): the same bytes everywhere, the
one rounding a native kernel does, and the choice forced by one environment variable."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from zeroedu.catalog import STRATEGIES
from zeroedu.models.gpt import PRESETS
from zeroedu.recipes import RECIPES
from zeroedu.runtime import cluster, matmul16
from zeroedu.strategies import strategy_class
from zeroedu.train import RunConfig
from zeroedu.train.config import config_to_dict


@pytest.fixture
def decided(monkeypatch):
    """Set this process's decision for one test (restored after it)."""
    def set_(mode: matmul16.Matmul16):
        d = matmul16.decision()
        monkeypatch.setattr(matmul16, "_DECISION", replace(d, bf16=mode, fp16=mode, forced=True))
    return set_


@pytest.mark.fast
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_emulated_product_is_the_fp32_product_rounded_once(decided, dtype):
    decided(matmul16.Matmul16.EMULATED)
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(33, 70, generator=g).to(dtype), torch.randn(70, 21, generator=g).to(dtype)
    bias = torch.randn(21, generator=g).to(dtype)
    x = torch.randn(3, 33, 70, generator=g).to(dtype)
    with matmul16.compute():
        mm, addmm, bmm = a @ b, torch.addmm(bias, a, b), x @ b
    # Expected: torch's fp32 kernels on the same operands, one rounding (independent of the mode).
    assert mm.dtype == addmm.dtype == bmm.dtype == dtype
    assert torch.equal(mm, (a.float() @ b.float()).to(dtype))
    assert torch.equal(addmm, torch.addmm(bias.float(), a.float(), b.float()).to(dtype))
    assert torch.equal(bmm, (x.float() @ b.float()).to(dtype))
    # fp32 operands are left to torch, and outside the context nothing is emulated.
    with matmul16.compute():
        assert torch.equal(a.float() @ b.float(), torch.mm(a.float(), b.float()))


@pytest.mark.fast
@pytest.mark.parametrize("attention", ["eager", "fused"])
def test_autograd_saves_the_same_tensors_on_both_paths(decided, attention):
    """What autograd saves (dtype, shape, storage bytes, in order) and every gradient's dtype are
    the same natively and emulated: the mode sits below autograd."""
    cfg = replace(PRESETS["gpt-tiny"], attention=attention)
    x, y = cfg.batch(0, 4)
    seen = {}
    for mode in matmul16.Matmul16:
        decided(mode)
        model = cfg.build().to(torch.bfloat16)
        saved = []

        def pack(t):
            saved.append((t.dtype, tuple(t.shape), t.untyped_storage().nbytes()))
            return t

        with matmul16.compute("bf16"), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model.loss(model(x), y).backward()
        seen[mode] = saved, [(p.grad.dtype, tuple(p.grad.shape)) for p in model.parameters()]
    native, emulated = seen.values()
    assert native == emulated and len(native[0]) > 20


@pytest.mark.fast
def test_the_environment_variable_forces_the_path(monkeypatch):
    for value, mode in (("emulated", matmul16.Matmul16.EMULATED), ("native", matmul16.Matmul16.NATIVE),
                        (" Emulated ", matmul16.Matmul16.EMULATED)):
        monkeypatch.setenv(matmul16.ENV, value)
        assert matmul16.forced() == mode
        d = matmul16._decide()
        assert (d.bf16, d.fp16, d.forced, d.slowdown) == (mode, mode, True, {})
        assert d.line("bf16") == f"bf16 matmul: {mode.value}"
    monkeypatch.setenv(matmul16.ENV, "auto")
    assert matmul16.forced() is None
    d = matmul16._decide()  # the probe: a ratio per 16-bit dtype, and a verdict that follows from it
    assert not d.forced and set(d.slowdown) == {"bf16", "fp16"}
    for dt in ("bf16", "fp16"):
        assert d.mode(dt) == (matmul16.Matmul16.EMULATED if d.slowdown[dt] > matmul16.SLOW else matmul16.Matmul16.NATIVE)
    monkeypatch.setenv(matmul16.ENV, "fast")
    with pytest.raises(ValueError, match="ZEROEDU_MATMUL16='fast': use 'native', 'emulated' or 'auto'"):
        matmul16.forced()
    assert matmul16.Decision.from_plain(d.plain()) == d


def _configs() -> dict[str, list[dict]]:
    """Every strategy in every recipe it takes, on gpt-tiny for two steps (N = 2, hybrids 2 x 2).
    A strategy that reduces gradients in the parameter's dtype refuses a recipe whose gradients
    have another (megatron-bf16's fp32 gradients of bf16 parameters)."""
    out = {}
    for name, spec in STRATEGIES.items():
        cls = strategy_class(name)
        out[name] = [config_to_dict(RunConfig(name, 4 if spec.hybrid else 2, m=2 if spec.hybrid else 1, steps=2,
                                              recipe=r.name, model="gpt-tiny", global_batch=8).resolved())
                     for r in RECIPES.values() if not (cls.GRADS_IN_PARAM_DTYPE and r.grad != r.param)]
    return out


def test_every_strategys_bytes_are_the_same_on_both_paths():
    """Model states, activations, comm payloads, the peak and the kernel's wire count of every
    strategy in every recipe: identical whether the ranks multiply 16-bit matrices natively or
    emulated; the losses of a 16-bit recipe stay within its tolerance of each other."""
    from zeroedu.recipes import TOLERANCE

    checked = 0
    configs = _configs()
    for name, cfgs in configs.items():
        world = 4 if STRATEGIES[name].hybrid else 2
        for rank_rows in cluster.run("tests.rank_jobs:bytes_on_both_paths", world, {"cfgs": cfgs}):
            for cfg, row in zip(cfgs, rank_rows):
                native, emulated = row["native"], row["emulated"]
                losses = (native.pop("losses"), emulated.pop("losses"))
                want = None if cfg["recipe"] == "fp32" else ("native", "emulated")
                assert (native.pop("matmul16"), emulated.pop("matmul16")) == (want or (None, None))
                if STRATEGIES[name].hybrid:
                    # A hybrid frees its outer all-reduce's buffer when that asynchronous collective
                    # ends, so whether the peak event sees it depends on timing, on either path
                    # (hsdp in megatron-bf16: 506,216 or 508,968 B, native run after native run).
                    native.pop("peak"), emulated.pop("peak")
                assert native == emulated, (name, cfg["recipe"])
                assert native["wire"] is not None and native["states"]["total"] > 0
                tol = TOLERANCE[cfg["recipe"]]
                assert all(abs(a - b) <= tol * abs(b) for a, b in zip(*losses)), (name, cfg["recipe"], losses)
                checked += 1
    # every rank of every strategy, in all four recipes or in the three it takes
    takes = {n: 3 if strategy_class(n).GRADS_IN_PARAM_DTYPE else 4 for n in STRATEGIES}
    assert checked == sum((4 if STRATEGIES[n].hybrid else 2) * k for n, k in takes.items())
    assert 4 in takes.values()
