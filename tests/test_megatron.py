"""Megatron distributed optimizer: bytes and traffic equal the closed forms (exact mode), and
training equals single-process torch.optim.Adam.

Expected values come from `zeroedu.theory` (exact closed forms), from `train.reference`
(single-process fp32 torch Adam) and, for the buffer layout, from `zeroedu.shard`.

bf16 tolerance (``megatron-bf16``): the weights themselves are bf16 (8 mantissa bits), so the
run cannot match fp32 training bit for bit. Losses agree to 2e-3 relative; final weights to
``steps * lr`` absolute, because Adam moves a weight by at most about lr per step, so even a
gradient whose sign flips under bf16 rounding cannot push a weight further than that.
"""
from fractions import Fraction

import pytest
import torch

from zeroedu import shard, theory
from zeroedu.models import MLPConfig, make_batch, make_model, unit_shapes
from zeroedu.recipes import get_recipe
from zeroedu.strategies.base import DistState
from zeroedu.strategies.megatron_distopt import MegatronDistOpt
from zeroedu.train import RunConfig, run

from .shared_runs import RUNS

SHAPES = unit_shapes(make_model(MLPConfig()))


def _rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def _param_rel(r):
    return max(((p - q).abs().max() / q.abs().max()).item()
               for p, q in zip(r.params, r.reference_params))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_fp32_equals_single_process_and_theory(n):
    r = RUNS(RunConfig("megatron_distopt", n, steps=5, recipe="fp32", return_params=True, model="mlp"))
    assert r.match.plain() == {"model_states": True, "comm": True, "wire": True, "activations": True, "losses": True}
    assert _rel(r.losses, r.reference_losses) <= 1e-6
    assert _param_rel(r) <= 1e-6


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_megatron_bf16_bytes_and_comm_exact(n):
    cfg = RunConfig("megatron_distopt", n, steps=5, return_params=True, model="mlp")
    r = run(cfg)
    for rk in r.ranks:
        me = rk.measured
        pred = theory.exact_model_states("megatron_distopt", SHAPES, n, rank=rk.rank)
        assert (me.param, me.grad, me.optim, me.total) == \
            (pred.param, pred.grad, pred.optim, pred.total)
        comm = theory.exact_comm("megatron_distopt", SHAPES, n)
        assert me.comm == {k: float(v) for k, v in comm.by_collective().items() if v}
        assert me.comm_by_axis == rk.predicted.comm_by_axis
    # The flat layout by hand: param 2 B + grad 4 B on the padded buffer, 12 B on the chunk.
    padded = [shard.padded_numel(sum(shard.numel(s) for s in u), n) for u in SHAPES]
    assert r.ranks[0].measured.total == sum(6 * p + 12 * (p // n) for p in padded)
    if n > 1:  # fp32 grads on the wire: reduce-scatter moves twice the all-gather's bytes
        c = r.ranks[0].measured.comm
        assert c["reduce_scatter"] == 2 * c["all_gather"] == 2 * float(
            Fraction(n - 1, n) * 2 * sum(padded))
    assert _rel(r.losses, r.reference_losses) <= 2e-3
    steps_lr = cfg.steps * cfg.resolved().adam.lr
    assert max((p - q).abs().max().item() for p, q in zip(r.params, r.reference_params)) <= steps_lr


@pytest.mark.parametrize("recipe, n", [("fp16", 3), ("mixed-bf16", 4), ("fp32", 8)])
def test_other_recipes_match_theory(recipe, n):
    r = run(RunConfig("megatron_distopt", n, steps=5, recipe=recipe, model="mlp"))
    assert r.match.plain() == {"model_states": True, "comm": True, "wire": True, "activations": True, "losses": True}
    assert _rel(r.losses, r.reference_losses) <= 2e-3


@pytest.mark.fast
def test_asymptotic_recipe_forms_hold_for_large_units():
    # One unit of 8 * 10**6 parameters (divisible by N): exact == 6Ψ + 12Ψ/N, 4Ψ + 16Ψ/N, 8Ψ + 8Ψ/N.
    psi, n = 8 * 10**6, 8
    for recipe, a, b in [("megatron-bf16", 6, 12), ("fp16", 4, 16), ("fp32", 8, 8)]:
        ex = theory.exact_model_states("megatron_distopt", [[(psi,)]], n, recipe=recipe)
        assert ex.total == a * psi + b * psi // n


def _local_strategy(recipe="megatron-bf16", **opts):
    """A world of one rank, in this process: a group of one never calls torch.distributed."""
    dist = DistState.single()
    ledger = dist.ledger
    return MegatronDistOpt(make_model(MLPConfig()), dist, get_recipe(recipe), **opts), ledger


@pytest.mark.fast
def test_params_view_the_buffer_and_bf16_grads_are_dropped():
    strat, ledger = _local_strategy()
    x, y = make_batch(0, 8, MLPConfig())
    strat.forward_backward(x, y)
    for u in strat.units:
        base = u.param_buffer.untyped_storage().data_ptr()
        for i, p in enumerate(u.params):
            g = u.grad_view(i)  # Megatron's main_grad: a view of the fp32 gradient buffer
            assert p.untyped_storage().data_ptr() == base  # a view, not a copy
            assert p.grad is None  # folded into main_grad, then dropped
            assert g.dtype == torch.float32 and g.abs().sum() > 0
    # The reduce-scatter of every unit was launched from the hooks, during backward.
    assert [r.tag for r in ledger.comm] == [f"megatron_distopt/unit{k}/grads" for k in (2, 1, 0)]
    strat.step()
    assert all(u.grad_buffer.abs().sum() == 0 for u in strat.units)


@pytest.mark.fast
def test_index_spaces_report_and_options():
    strat, _ = _local_strategy(overlap_grad_reduce=False)
    ex = strat.report_extra()
    assert [u["padded"] for u in ex] == [sum(shard.numel(s) for s in u) for u in SHAPES]
    assert ex[0]["slices"][1] == {"param": 1, "buffer": [240, 260], "param_range": [0, 20],
                                  "local": [240, 260]}
    with pytest.raises(ValueError, match="overlap_grad_reduce"):
        _local_strategy(bucket=3)
