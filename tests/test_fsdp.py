"""FSDP1 / FSDP2 (ZeRO-3) checked against independent sources.

* single-process training on the global batch (`train.reference`, torch.optim.Adam): fp32,
  N = 1..4, 5 steps, both representations, reshard_after_forward True and False: <= 1e-6 rel;
* torch's own FSDP2 (`fully_shard`, gloo on CPU) on the same model and data: same tolerance;
* the closed forms (`theory.exact_model_states`, `theory.exact_comm`): bytes equal exactly,
  N = 1, 2, 3, 4, 8, mixed-bf16, reshard_after_forward True and False;
* FSDP2's batched collectives (one all-gather and one reduce-scatter per unit, copy-in /
  copy-out) against its per-parameter collectives: bitwise the same parameters, the same bytes
  on the ring model and the same payload on the wire (only gloo's framing differs: fewer
  messages), one collective per unit and direction, counted from the ledger's records.
Peaks against torch's memory trackers are in `tests/test_peak.py`.
"""
from fractions import Fraction

import pytest
import torch

from zeroedu import shard, theory
from zeroedu.reports import Timeline
from zeroedu.runtime import analysis, cluster
from zeroedu.models import MLPConfig, make_model, unit_shapes
from zeroedu.recipes import get_recipe
from zeroedu.references.torch_fsdp2 import fully_shard_job
from zeroedu.strategies import build
from zeroedu.strategies.base import DistState
from zeroedu.train import RunConfig, config_to_dict, run
from zeroedu.kinds import EventKind

STRATEGIES = ("fsdp1", "fsdp2")
SHAPES = unit_shapes(make_model(MLPConfig()))
TOL = 1e-6


def assert_params_close(got, want):
    assert len(got) == len(want)
    for p, q in zip(got, want):
        assert p.shape == q.shape
        assert float((p - q).abs().max()) <= TOL * float(q.abs().max())


def assert_losses_close(got, want):
    assert len(got) == len(want) >= 5
    for a, b in zip(got, want):
        assert abs(a - b) <= TOL * abs(b)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fp32_equals_single_process_reference(strategy, n):
    for raf in (True, False):
        r = run(RunConfig(strategy, n, steps=5, recipe="fp32", return_params=True,
                          options={"reshard_after_forward": raf}, model="mlp"))
        assert_losses_close(r.losses, r.reference_losses)
        assert_params_close(r.params, r.reference_params)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bytes_and_comm_equal_closed_forms(strategy, n):
    for raf in (True, False):
        r = run(RunConfig(strategy, n, steps=2, recipe="mixed-bf16", options={"reshard_after_forward": raf}, model="mlp"))
        comm = theory.exact_comm(strategy, SHAPES, n, recipe="mixed-bf16", reshard_after_forward=raf)
        want_comm = {k: float(v) for k, v in comm.by_collective().items() if v}
        for rk in r.ranks:
            want = theory.exact_model_states(strategy, SHAPES, n, rank=rk.rank, recipe="mixed-bf16")
            me = rk.measured
            assert (me.param, me.grad, me.optim, me.total) == \
                (want.param, want.grad, want.optim, want.total)
            assert me.comm == want_comm
        if n > 1:
            # 3Ψ ring (2 all-gathers + 1 reduce-scatter, same dtype width) or 2Ψ without the
            # backward re-gather: all-gather bytes are 2x (or 1x) the reduce-scatter bytes.
            sent = r.ranks[0].measured.comm
            assert sent["all_gather"] == (2 if raf else 1) * sent["reduce_scatter"]


def _events(rank_report, step):
    return [e for e in rank_report.timeline.events if e.step == step]


def test_timeline_saw_tooth_and_transient_peak():
    n, P = 2, 2  # mixed-bf16: params gathered in bf16
    # one unit unsharded = its whole padded flat buffer
    unit_bytes = [shard.padded_numel(sum(shard.numel(s) for s in u), n) * P for u in SHAPES]
    for opts, most in [({"limit_all_gathers": 1}, 1), ({"forward_prefetch": True}, 2), ({}, 2)]:
        rk = run(RunConfig("fsdp1", n, steps=2, options=opts, model="mlp")).ranks[0]
        ev = _events(rk, 1)
        seen = [(e.kind, e.unit) for e in ev if e.unit is not None]
        # Each unit is gathered and freed twice per step (forward, backward): 3Ψ's two all-gathers.
        for i in range(len(SHAPES)):
            assert seen.count((EventKind.UNSHARD, i)) == 2 and seen.count((EventKind.RESHARD, i)) == 2
        for e in ev:
            if e.kind == EventKind.UNSHARD and opts.get("limit_all_gathers") == 1:
                assert e.bytes["gathered"] == unit_bytes[e.unit]
        # at most the current unit plus one prefetched one is ever unsharded
        assert max(e.bytes["gathered"] for e in ev) <= most * max(unit_bytes)
        if most == 1:
            assert max(e.bytes["gathered"] for e in ev) == max(unit_bytes)
        step = next(e for e in ev if e.kind == EventKind.OPTIMIZER_STEP)
        assert step.bytes["gathered"] == 0 and step.bytes["comm_buffer"] == 0
    # Without resharding after forward every unit is alive at the forward/backward boundary.
    rk = run(RunConfig("fsdp1", n, steps=2, options={"reshard_after_forward": False}, model="mlp")).ranks[0]
    fwd_end = next(e for e in _events(rk, 1) if e.kind == EventKind.FORWARD_END)
    assert fwd_end.bytes["gathered"] == sum(unit_bytes)


def test_synchronous_reduce_scatter_is_not_counted_as_hidden():
    """FSDP's reduce-scatter is issued synchronously inside backward's hooks: it runs inside the
    backward window but stalls backward, so the overlap fraction counts none of it as hidden,
    while DDP's bucketed all-reduce (asynchronous) is recorded as not blocking."""
    fsdp = run(RunConfig("fsdp2", 2, steps=2, model="mlp"))
    for rk in fsdp.ranks:
        rs = [c for c in rk.timeline.comm if c.op == "reduce_scatter"]
        assert rs and all(c.blocking for c in rs)
        assert rk.overlap == 0.0
    ddp = run(RunConfig("ddp_bucketed", 2, steps=2, model="mlp"))
    for rk in ddp.ranks:
        ar = [c for c in rk.timeline.comm if c.op == "all_reduce" and "bucket" in c.tag]
        assert ar and not any(c.blocking for c in ar)


@pytest.mark.fast
def test_overlap_fraction_counts_only_asynchronous_time_inside_backward():
    marks = [{"kind": "backward begin", "t": 0.0, "step": 0}, {"kind": "backward end", "t": 10.0, "step": 0}]
    from zeroedu.reports import CommRecord

    def rec(op, t0, t1, blocking):
        return CommRecord(op, "t", "dp_shard", 2, 8, 4.0, 0, t0, t1, blocking=blocking)

    comm = [rec("all_reduce", 2.0, 6.0, False), rec("reduce_scatter", 6.0, 8.0, True),
            rec("all_reduce", 9.0, 13.0, False)]
    # hidden: 4 (first) + 0 (blocking) + 1 (the part of the last before backward ends) of 10
    assert analysis.overlap_fraction(Timeline(marks=marks, comm=comm)) == pytest.approx(0.5)


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_matches_torch_fully_shard(n, batched):
    """Same losses and parameters as torch's fully_shard, FSDP2 batched or per parameter; and
    torch's sharded parameters are stored padded to c = ceil(d0/N) rows (FSDPMemTracker's
    SHARDED_PARAM), zeroedu's only the real rows (the closed form's dim-0 rule)."""
    cfg = RunConfig("fsdp2", n, steps=5, recipe="fp32", return_params=True, model="mlp",
                    options={"batched": batched}).resolved()
    ref = cluster.run(fully_shard_job, n, {"cfg": config_to_dict(cfg)})
    ours = run(cfg)
    torch_losses = [sum(r["losses"][k] for r in ref) / n for k in range(cfg.steps)]
    assert_losses_close(ours.losses, torch_losses)
    assert_params_close(ours.params, ref[0]["params"])
    padded_chunks = sum(shard.dim0_padded_numel(s, n) // n for u in SHAPES for s in u) * 4
    for mine, theirs in zip(ours.ranks, ref):
        assert theirs["peak_by_category"]["_FSDPRefType.SHARDED_PARAM"] == padded_chunks
        want = theory.exact_model_states("fsdp2", SHAPES, n, rank=mine.rank, recipe="fp32")
        assert want.param <= padded_chunks


def test_reshard_after_forward_false_matches_torch():
    cfg = RunConfig("fsdp2", 3, steps=5, recipe="fp32", return_params=True,
                    options={"reshard_after_forward": False}, model="mlp").resolved()
    ref = cluster.run(fully_shard_job, 3, {"cfg": config_to_dict(cfg), "track_memory": False})
    ours = run(RunConfig("fsdp1", 3, steps=5, recipe="fp32", return_params=True,
                         options={"reshard_after_forward": False}, model="mlp"))
    assert_losses_close(ours.losses, [sum(r["losses"][k] for r in ref) / 3 for k in range(5)])
    assert_params_close(ours.params, ref[0]["params"])


def _local(strategy, **opts):
    """A one-rank strategy in this process (a group of one never touches the network)."""
    dist = DistState.single()
    return build(strategy, make_model(MLPConfig()), dist, get_recipe("fp32"), **opts)


@pytest.mark.fast
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_options_and_freeing(strategy):
    with pytest.raises(ValueError):
        _local(strategy, bucket_size=3)
    s = _local(strategy)
    x = torch.randn(4, 12)
    s.forward_backward(x, torch.randn(4, 7))
    # after backward every unit is resharded: its unsharded storage really has 0 bytes
    assert all(leaf.untyped_storage().nbytes() == 0 for u in s.units for leaf in u.leaves)
    assert all(u.leaves[0].grad is None for u in s.units)
    ref = make_model(MLPConfig())
    assert_params_close(s.full_parameters(), [p.detach() for p in ref.parameters()])
    if strategy == "fsdp2":  # each rank's state dict is local: shards plus row offsets
        sd = s.local_state_dict()
        for (name, p) in ref.named_parameters():
            row, t = sd[name]
            assert row == 0 and torch.equal(t, p.detach())
    assert Fraction(0) == sum(Fraction(r.sent) for r in s.ledger.comm)  # a group of one sends nothing


# mixed-bf16: params and grads in bf16 (2^-8 relative rounding), fp32 master/m/v. Losses stay
# within 2e-3 relative of the fp32 reference over 5 steps; parameters within 10% of each
# tensor's largest entry, because Adam's update is ~lr·sign(g) for small g, so a bf16-rounded
# gradient near zero can flip a step of size lr (naive DDP in bf16 shows the same 7% worst case).
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_mixed_bf16_close_to_reference(strategy):
    r = run(RunConfig(strategy, 4, steps=5, recipe="mixed-bf16", return_params=True, model="mlp"))
    for a, b in zip(r.losses, r.reference_losses):
        assert abs(a - b) <= 2e-3 * abs(b)
    for p, q in zip(r.params, r.reference_params):
        assert float((p - q).abs().max()) <= 0.1 * float(q.abs().max())


@pytest.mark.fast
def test_fsdp1_unit_takes_axis_and_padding_multiple():
    """What hybrid strategies build on: pad each flat unit to a multiple of N·M, shard over N."""
    from zeroedu.strategies.fsdp1 import FSDP1

    class Padded(FSDP1):
        def pad_multiple(self):
            return 4  # as if N = 1 rank per domain and M = 4 domains

    dist = DistState.single()
    s = Padded(make_model(MLPConfig()), dist, get_recipe("fp32"))
    for u, shapes in zip(s.units, SHAPES):
        assert u.shards[0].numel() == shard.padded_numel(sum(shard.numel(x) for x in shapes), 4)
    s.forward_backward(torch.randn(4, 12), torch.randn(4, 7))
    s.step()
    assert all(g.numel() == u.shards[0].numel() for u in s.units for g in u.grad_shards)


def test_counting_torch_bytes_leaves_nothing_patched_in_a_warm_pool():
    # The benchmark's torch arm wraps dist.all_gather_single / reduce_scatter_single to count
    # bytes; the next job on the same warm ranks must see torch's own functions again.
    from zeroedu.references.bench import compare_job
    from zeroedu.references.torch_fsdp2 import patched_collectives

    cfg = config_to_dict(RunConfig("fsdp2", 2, steps=1, recipe="fp32", model="mlp").resolved())
    arms = [{"label": "torch", "impl": "torch", "cfg": cfg, "torch": "fully_shard"}]
    with cluster.Pool(2) as pool:
        assert pool.run(patched_collectives) == [{}, {}]
        out = pool.run(compare_job, {"arms": arms, "rounds": 1, "steps": 1})
        assert all(o["ring_model"]["torch"] > 0 for o in out)  # the count happened
        assert pool.run(patched_collectives) == [{}, {}]
        pool.run(compare_job, {"arms": arms, "rounds": 1, "steps": 1})
        assert pool.run(patched_collectives) == [{}, {}]


# ---------------------------------------------------------------- FSDP2: batched vs per parameter
def _pair(n, recipe="fp32", model="gpt-tiny", options=None, **kw):
    """The same run twice: FSDP2 batched, then per parameter."""
    return [run(RunConfig("fsdp2", n, steps=3, recipe=recipe, model=model, return_params=True,
                          options={"batched": b, **(options or {})}, **kw)) for b in (True, False)]


@pytest.mark.parametrize("n,recipe,model,kw", [
    (4, "fp32", "gpt-tiny", {}),  # vocab 67 and seq 32 rows over 4 ranks: uneven last shards
    (3, "fp32", "mlp", {}),
    (2, "mixed-bf16", "gpt-tiny", {}),
    (4, "fp32", "gpt-tiny", {"micro_batches": 2}),  # accumulated grad shards
    (2, "fp32", "gpt-tiny", {"options": {"reshard_after_forward": False}}),
])
def test_batched_equals_per_parameter(n, recipe, model, kw):
    """Bitwise the same parameters and losses (the ring reduce-scatter sums every element in
    the same order whatever the chunk boundaries: `runtime.ring`), the same ring-model bytes
    per collective and per axis, and the same payload on the wire: the measured bytes differ
    by gloo's framing only (144 B per message), and the batched run sends fewer messages."""
    from zeroedu.runtime.wire import FRAMING_PER_MESSAGE

    batched, per_param = _pair(n, recipe, model, **kw)
    assert batched.losses == per_param.losses
    assert all(torch.equal(a, b) for a, b in zip(batched.params, per_param.params))
    assert batched.match.plain() == per_param.match.plain() == {
        "model_states": True, "comm": True, "wire": True, "activations": True, "losses": True}
    for b, p in zip(batched.ranks, per_param.ranks):
        assert b.measured.comm == p.measured.comm
        assert b.measured.comm_by_axis == p.measured.comm_by_axis
        assert b.measured.total == p.measured.total
        wb, wp = b.wire, p.wire
        assert wb.messages < wp.messages
        # the payload: measured bytes less gloo's framing of every message the step sent
        assert wb.sent - FRAMING_PER_MESSAGE * wb.messages == wp.sent - FRAMING_PER_MESSAGE * wp.messages


def test_batched_issues_one_collective_per_unit():
    """Counted from the ledger's records of the last step: per unit, one all-gather per unshard
    (forward and backward: two with reshard_after_forward) and one reduce-scatter per backward,
    each tagged with the unit alone; per parameter, one of each per parameter."""
    n, k = 4, 2
    shapes = unit_shapes(make_model("gpt-tiny"))
    batched, per_param = _pair(n, micro_batches=k)
    for rk in batched.ranks:
        last = [c for c in rk.timeline.comm if c.step == 2]
        for i in range(len(shapes)):
            tags = [c.op for c in last if c.tag == f"fsdp2/unit{i}/params"]
            assert tags == ["all_gather"] * (2 * k)
            assert [c.op for c in last if c.tag == f"fsdp2/unit{i}/grads"] == ["reduce_scatter"] * k
            unshards = [e for e in rk.timeline.events if e.step == 2 and (e.kind, e.unit) == (EventKind.UNSHARD, i)]
            assert len(unshards) == 2 * k
        assert not any("/param" in c.tag.split("/")[-1] for c in last if c.op != "all_reduce")
    for rk in per_param.ranks:
        last = [c for c in rk.timeline.comm if c.step == 2]
        for i, unit in enumerate(shapes):
            for j in range(len(unit)):
                assert len([c for c in last if c.tag == f"fsdp2/unit{i}/params/param{j}"]) == 2 * k
                assert len([c for c in last if c.tag == f"fsdp2/unit{i}/grads/param{j}"]) == k


def test_batched_buffers_on_the_timeline():
    """The copy-in / copy-out buffers are in the ledger: at a unit's copy-out its parameters
    ("gathered") and the all-gather output ("comm_buffer") are both alive, each the unit's
    row-padded size; at its copy-in the full gradients and the reduce-scatter input; nothing
    of either at the optimizer step."""
    n = 4
    shapes = unit_shapes(make_model("gpt-tiny"))
    rk = run(RunConfig("fsdp2", n, steps=2, recipe="fp32", model="gpt-tiny")).ranks[0]
    ev = [e for e in rk.timeline.events if e.step == 1]
    for i, unit in enumerate(shapes):
        g = sum(shard.dim0_padded_numel(s, n) for s in unit) * 4
        outs = [e for e in ev if (e.kind, e.unit) == (EventKind.COPY_OUT, i)]
        assert len(outs) == 2 and all(e.bytes["gathered"] >= g and e.bytes["comm_buffer"] >= g for e in outs)
        (cin,) = [e for e in ev if (e.kind, e.unit) == (EventKind.COPY_IN, i)]
        assert cin.bytes["comm_buffer"] >= 2 * g
    step = next(e for e in ev if e.kind == EventKind.OPTIMIZER_STEP)
    assert step.bytes["gathered"] == step.bytes["comm_buffer"] == 0


@pytest.mark.parametrize("n,kw", [(4, {}), (2, {"micro_batches": 2}), (2, {"recipe": "mixed-bf16"})])
def test_async_reduce_scatter_equals_blocking(n, kw):
    """One reduce-scatter in flight (`async_reduce_scatter`, torch's default) changes when the
    rank waits, nothing else: bitwise the same losses and parameters as the blocking
    reduce-scatter (the same ring sums in the same order), the same bytes; every
    reduce-scatter recorded as asynchronous, waited for by the next unit or at backward's end,
    so the overlap fraction counts the part of it that ran inside backward."""
    runs = [run(RunConfig("fsdp2", n, steps=3, model="gpt-tiny", return_params=True,
                          options={"async_reduce_scatter": a}, **kw)) for a in (False, True)]
    blocking, overlapped = runs
    assert blocking.losses == overlapped.losses
    assert all(torch.equal(a, b) for a, b in zip(blocking.params, overlapped.params))
    assert overlapped.match.plain() == {"model_states": True, "comm": True, "wire": True, "activations": True,
                                        "losses": True}
    for b, o in zip(blocking.ranks, overlapped.ranks):
        assert b.measured.comm == o.measured.comm and b.wire.sent == o.wire.sent
        rs = [c for c in o.timeline.comm if c.op == "reduce_scatter"]
        assert rs and not any(c.blocking for c in rs)
        if n > 1:
            assert o.overlap > 0.0


@pytest.mark.fast
def test_async_reduce_scatter_needs_batched_units():
    from zeroedu.train.config import resolve
    from zeroedu.strategies import strategy_class

    assert "async_reduce_scatter" in strategy_class("fsdp2").OPTIONS
    assert "async_reduce_scatter" not in strategy_class("fsdp1").OPTIONS
    with pytest.raises(ValueError, match="batched=True"):
        resolve(RunConfig("fsdp2", 2, model="mlp", options={"async_reduce_scatter": True, "batched": False}))


@pytest.mark.fast
def test_the_cli_flag_sets_the_asynchronous_reduce_scatter():
    from zeroedu.cli import build_parser
    from zeroedu.cli.run import config_from_args

    args = build_parser().parse_args(["run", "--strategy", "fsdp2", "--world-size", "2", "--prefetch", "both",
                                      "--async-reduce-scatter"])
    assert config_from_args(args, 2).options == {"async_reduce_scatter": True, "backward_prefetch": True,
                                                 "forward_prefetch": True}
    args = build_parser().parse_args(["run", "--strategy", "fsdp1", "--world-size", "2", "--async-reduce-scatter"])
    with pytest.raises(ValueError, match="async_reduce_scatter"):
        config_from_args(args, 2)  # FSDP1 does not take it
