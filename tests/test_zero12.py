"""ZeRO-1 (reduce-scatter and all-reduce variants) and ZeRO-2: equal single-process training,
and every byte of model state and communication equals the closed forms (exact mode).

Expected values: `train.reference` (single process, torch.optim.Adam, fp32) and
`zeroedu.theory.exact_model_states` / `exact_comm` (computed here from the model's shapes).
"""

import pytest

from zeroedu import theory
from zeroedu.models import MLPConfig, make_model, unit_shapes
from zeroedu.recipes import get_recipe
from zeroedu.strategies import build
from zeroedu.strategies.base import DistState
from zeroedu.train import RunConfig
from zeroedu.kinds import EventKind

from .shared_runs import RUNS

STRATEGIES = ["zero1", "zero1_allreduce", "zero2"]
FP32_TOL = 1e-6
# bf16 (8 significant bits) in params and grads: documented in test_ddp_bucketed.py.
BF16_LOSS_TOL, BF16_PARAM_TOL = 2e-3, 5e-2
SHAPES = unit_shapes(make_model(MLPConfig()))


def _run(strategy, n, recipe):
    return RUNS(RunConfig(strategy, n, steps=5, recipe=recipe, return_params=True, model="mlp"))


def _rel(a, b):
    return abs(a - b) / abs(b)


def _param_rel(ps, qs):
    return max(((p.float() - q).norm() / q.norm()).item() for p, q in zip(ps, qs))


def _check_bytes(r, strategy, n, recipe):
    comm = theory.exact_comm(strategy, SHAPES, n, recipe=recipe)
    for rank, rep in enumerate(r.ranks):
        ms = theory.exact_model_states(strategy, SHAPES, n, rank=rank, recipe=recipe)
        me = rep.measured
        assert (me.param, me.grad, me.optim, me.total) == \
               (ms.param, ms.grad, ms.optim, ms.total)
        assert me.optim_detail == {k: getattr(ms, k) for k in me.optim_detail}
        assert me.comm == {k: float(v) for k, v in comm.by_collective().items() if v}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_fp32_equals_single_process_and_bytes(strategy, n):
    r = _run(strategy, n, "fp32")
    assert max(_rel(a, b) for a, b in zip(r.losses, r.reference_losses)) <= FP32_TOL
    assert _param_rel(r.params, r.reference_params) <= FP32_TOL
    _check_bytes(r, strategy, n, "fp32")


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_mixed_bf16_bytes_equal_theory(strategy, n):
    r = _run(strategy, n, "mixed-bf16")
    _check_bytes(r, strategy, n, "mixed-bf16")
    assert r.match.plain() == {"model_states": True, "comm": True, "wire": True, "activations": True, "losses": True}
    assert max(_rel(a, b) for a, b in zip(r.losses, r.reference_losses)) <= BF16_LOSS_TOL
    assert _param_rel(r.params, r.reference_params) <= BF16_PARAM_TOL


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fp16_recipe_bytes(strategy):  # fp32 main-grad copy on the shard only
    _check_bytes(_run(strategy, 3, "fp16"), strategy, 3, "fp16")


def test_zero2_frees_full_gradients():
    r = _run("zero2", 4, "mixed-bf16")
    ev = r.ranks[0].timeline.events
    last = [e for e in ev if e.step == 4]
    kinds = [(e.kind, e.unit) for e in last]
    # each unit's full buffer appears in backward and is gone before the optimizer step
    assert sorted(u for k, u in kinds if k == EventKind.GRAD_ALLOC) == list(range(len(SHAPES)))
    assert sorted(u for k, u in kinds if k == EventKind.GRAD_FREED) == list(range(len(SHAPES)))
    at_step = next(e for e in last if e.kind == EventKind.OPTIMIZER_STEP)
    shard_bytes = theory.exact_model_states("zero2", SHAPES, 4, recipe="mixed-bf16").grad
    assert at_step.bytes["grad"] == shard_bytes
    assert max(e.bytes["grad"] for e in last) > shard_bytes  # the full buffers did exist
    z1 = _run("zero1", 4, "mixed-bf16").ranks[0].measured.grad
    assert shard_bytes < z1


def test_zero2_reduce_scatter_overlaps_backward():
    from zeroedu.runtime import analysis

    r = _run("zero2", 4, "mixed-bf16")
    for rank in r.ranks:
        assert 0.0 <= rank.overlap <= 1.0
        # Deterministic part of the overlap: every unit's reduce-scatter is launched by a hook
        # while backward is still running, in every step (none waits for the optimizer step).
        for s in range(r.steps):
            assert analysis.launched_in_backward(rank.timeline, step=s) == len(SHAPES)


def _local(strategy, recipe, **opts):
    dist = DistState.single()
    return build(strategy, make_model(MLPConfig()), dist, get_recipe(recipe), None, **opts)


@pytest.mark.fast
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_rejects_unsupported(strategy):
    with pytest.raises(ValueError, match="megatron-bf16"):
        _local(strategy, "megatron-bf16")
    with pytest.raises(ValueError, match="does not take option"):
        _local(strategy, "fp32", bucket_bytes=4)


@pytest.mark.fast
def test_params_are_views_of_the_flat_buffer():
    s = _local("zero1", "mixed-bf16")
    for u in s.units:
        base = u.param_buffer.untyped_storage().data_ptr()
        assert all(p.untyped_storage().data_ptr() == base for p in u.params)
        assert u.layout.padded_numel == u.param_buffer.numel()
