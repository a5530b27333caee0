"""Every strategy on the GPT (gpt-tiny: a transformer's shape, fast): model states, activations
and bytes on the ring model equal the closed forms on every rank, and the losses and final
parameters equal single-process training, also with gradient accumulation, activation
recompute and gradient clipping."""
from __future__ import annotations

import pytest
import torch

from zeroedu import catalog, theory
from zeroedu.models import PRESETS, unit_shapes
from zeroedu.runtime import analysis
from zeroedu.train import RunConfig, run
from zeroedu.kinds import EventKind

STRATEGIES = list(catalog.STRATEGIES)
TINY = PRESETS["gpt-tiny"]
TOL = 1e-5  # losses, fp32; measured differences are ~2e-7
# Parameters after 3 Adam steps: Adam divides by sqrt(v), so ulp-level differences in the
# gradients (another summation order in the reductions and in the clipping norm) come out as
# up to ~1.5e-5 relative differences in the weights (measured); 1e-4 leaves room, and is still
# 300x below the size of the updates themselves (lr · steps = 0.03 against weights of ~0.05).
PARAM_TOL = 1e-4


def _run(strategy, **kw):
    m = 2 if catalog.get_spec(strategy).hybrid else 1
    return run(RunConfig(strategy, 4, steps=3, recipe="fp32", m=m, model="gpt-tiny", return_params=True, **kw))


def _rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


NAMES = [n for n, _ in TINY.build().named_parameters()]


def _param_rel(a, b):
    """Largest relative difference per parameter, leaving out the attention key bias: its true
    gradient is exactly zero (a constant added to every score of a query row does not change the
    softmax), so Adam turns round-off into lr-sized steps of arbitrary sign there."""
    out = 0.0
    for name, x, y in zip(NAMES, a, b):
        if name.endswith("attn.qkv.bias"):
            d = TINY.d_model
            x, y = torch.cat([x[:d], x[2 * d:]]), torch.cat([y[:d], y[2 * d:]])
        out = max(out, float((x - y).abs().max() / y.abs().max()))
    return out


def _check(r):
    assert r.match.plain() == {"model_states": True, "comm": True, "wire": True, "activations": True, "losses": True}, r.match
    assert _rel(r.losses, r.reference_losses) <= TOL
    assert _param_rel(r.params, r.reference_params) <= PARAM_TOL


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gpt_equals_single_process_and_theory(strategy):
    _check(_run(strategy))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_accumulation_and_clipping(strategy):
    r = _run(strategy, micro_batches=2, clip_grad_norm=0.05)
    _check(r)
    # the clip was active: the trajectory differs from the unclipped one
    free = _run(strategy, micro_batches=2)
    assert max(abs(a - b) for a, b in zip(r.losses, free.losses)) > 1e-4
    # K micro-batches: two backward windows per step on every rank
    for rk in r.ranks:
        assert len(analysis.backward_windows(rk.timeline, step=1)) == 2


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "fsdp1", "fsdp2", "megatron_distopt", "hsdp", "hfsdp"])
def test_accumulation_bytes_follow_the_real_semantics(strategy):
    """Per optimizer step with K = 2: DDP, ZeRO-1 and Megatron reduce once; ZeRO-2 reduces every
    micro-batch; ZeRO-3/FSDP gathers and reduces every micro-batch; hybrids' outer axis once."""
    one, two = _run(strategy), _run(strategy, micro_batches=2)
    c1, c2 = one.ranks[0].measured.comm_by_axis, two.ranks[0].measured.comm_by_axis
    spec = catalog.get_spec(strategy)
    inner1, inner2 = c1["dp_shard"], c2["dp_shard"]
    level = catalog.shards(spec.inner)
    if level["param"]:
        assert inner2 == {k: 2 * v for k, v in inner1.items()}
    elif level["grad"]:
        assert inner2["reduce_scatter"] == 2 * inner1["reduce_scatter"]
        assert inner2["all_gather"] == inner1["all_gather"]
    else:
        assert inner2 == inner1
    if spec.hybrid:
        assert c2["dp_outer"] == c1["dp_outer"]


@pytest.mark.parametrize("strategy", ["ddp_bucketed", "zero2", "fsdp1", "fsdp2", "hsdp"])
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recompute(strategy, recompute):
    r = _run(strategy, recompute=recompute)
    _check(r)
    base = _run(strategy)
    for rk, bk in zip(r.ranks, base.ranks):
        assert rk.measured.activations < bk.measured.activations
        # recompute moves no extra bytes: the re-run happens inside the unit's own backward,
        # after its (already counted) backward all-gather
        assert rk.measured.comm == bk.measured.comm
        # the extra forward is on the timeline, inside backward, once per block (or core)
        marks = [m for m in rk.timeline.marks if m.kind == EventKind.RECOMPUTE and m.step == 2]
        windows = analysis.backward_windows(rk.timeline, step=2)
        assert sorted(m.block for m in marks) == list(range(TINY.n_layers))
        assert all(any(b <= m.t <= e for b, e in windows) for m in marks)


def test_clip_norm_allreduce_is_in_the_closed_form():
    shapes = unit_shapes(TINY.build())
    c = theory.exact_comm("hfsdp", shapes, 2, 2, recipe="fp32", clip=True)
    assert c["world"] == {"all_reduce": theory.sent_bytes("all_reduce", 4, 4)}
    assert "world" not in theory.exact_comm("hsdp", shapes, 2, 2, recipe="fp32", clip=True)
    assert theory.exact_comm("ddp", shapes, 4, clip=True).total() == theory.exact_comm("ddp", shapes, 4).total()


def test_mixed_bf16_gpt_matches_theory_and_is_close():
    r = run(RunConfig("fsdp2", 2, steps=2, model="gpt-tiny"))
    assert r.match.plain() == {"model_states": True, "comm": True, "wire": True, "activations": True, "losses": True}
    assert _rel(r.losses, r.reference_losses) < 1e-2
    assert r.ranks[0].measured.activations == TINY.activation_bytes(4, 2)
    assert torch.bfloat16.itemsize == 2


def test_minimal_record_keeps_the_reports_figures():
    """A minimal record (`RunConfig.timeline`) drops the lifecycle events and the per-collective
    wire, and keeps every figure the report checks: the same bytes as the full record."""
    with pytest.raises(ValueError, match="timeline"):
        RunConfig("fsdp2", 2, timeline="some").resolved()
    full = run(RunConfig("zero2", 2, steps=2, model="gpt-tiny"))
    mini = run(RunConfig("zero2", 2, steps=2, model="gpt-tiny", timeline="minimal"))
    assert mini.timeline_mode == "minimal" and all(mini.match.plain().values())
    for a, b in zip(full.ranks, mini.ranks):
        assert a.measured == b.measured and a.wire.messages == b.wire.messages
        assert b.wire.by_collective == {} and a.wire.by_collective
        assert len(b.timeline.events) < len(a.timeline.events)
    assert mini.losses == full.losses
