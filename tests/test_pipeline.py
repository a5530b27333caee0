"""Pipeline parallelism (`strategies.pipeline`, on the run's spine as `splits.PipelineSplit`): the
schedules against ones written out by hand, training on real ranks equal to one process and to
torch's own pipeline, and the bytes each stage sends and the activations it holds equal to their
closed forms (`theory.pipeline`)."""
import re

import pytest

from tests.shared_runs import RUNS
from zeroedu.kinds import DP_SHARD
from zeroedu.models import GPTConfig
from zeroedu.optim import AdamConfig
from zeroedu.runtime import cluster
from zeroedu.theory import pipeline as P
from zeroedu.train import RunConfig
from zeroedu.train.reference import parameter_error

# gpt-tiny with 4 layers, so 4 stages get one block each
MODEL = GPTConfig(vocab=67, seq_len=32, d_model=32, n_layers=4, n_heads=2, lr=1e-2, preset="")
LR, BATCH = 1e-2, 8
# Parameters after 3 Adam steps, per tensor (relative norm): the m micro-batches' gradients sum in
# another order than the whole batch's, and Adam's division by sqrt(v) turns those ulps into up to
# ~1.5e-5 (tests/test_run_options.py measured the same); the steps themselves are ~lr = 1e-2.
PARAM_TOL = 1e-4


@pytest.mark.fast
def test_schedules_are_the_ones_written_out_by_hand():
    F, B = P.FORWARD, P.BACKWARD
    # 1F1B, p = 4, m = 6: stage 0 warms up with 3 forwards, stage 3 alternates from the start
    assert P.schedule("1f1b", 4, 6, 0) == [(F, 0), (F, 1), (F, 2), (F, 3), (B, 0), (F, 4), (B, 1), (F, 5), (B, 2),
                                           (B, 3), (B, 4), (B, 5)]
    assert P.schedule("1f1b", 4, 6, 3) == [x for i in range(6) for x in ((F, i), (B, i))]
    # m < p: the warm-up is cut to m, and every forward comes before any backward
    assert P.schedule("1f1b", 4, 2, 0) == [(F, 0), (F, 1), (B, 0), (B, 1)]
    assert P.schedule("gpipe", 2, 3, 1) == [(F, 0), (F, 1), (F, 2), (B, 0), (B, 1), (B, 2)]
    for kind in P.SCHEDULES:
        for p, m in ((1, 1), (2, 4), (4, 8), (4, 2), (3, 5)):
            for s in range(p):
                sched = P.schedule(kind, p, m, s)
                assert sorted(sched) == sorted([(F, i) for i in range(m)] + [(B, i) for i in range(m)])
                assert all(sched.index((F, i)) < sched.index((B, i)) for i in range(m))
                # micro-batches in flight at most: m under GPipe, p - s under 1F1B (Korthikanti §4.2.3)
                assert P.in_flight(kind, p, m, s) == (m if kind == "gpipe" else min(p - s, m))
    assert P.bubble_fraction(4, 8) == P.bubble_fraction(4, 8) == __import__("fractions").Fraction(3, 11)


@pytest.mark.fast
def test_the_schedules_cannot_deadlock_when_sends_do_not_block():
    """Simulate p stages with blocking receives and asynchronous sends: every stage finishes."""
    for kind in P.SCHEDULES:
        for p, m in ((2, 4), (4, 8), (4, 2), (3, 1)):
            todo = {s: list(P.schedule(kind, p, m, s)) for s in range(p)}
            sent = set()  # ("act", i, to stage) / ("grad", i, to stage)
            while any(todo.values()):
                moved = False
                for s in range(p):
                    if not todo[s]:
                        continue
                    what, i = todo[s][0]
                    need = (("act", i, s) if s > 0 else None) if what == "F" else (("grad", i, s) if s < p - 1 else None)
                    if need is None or need in sent:
                        todo[s].pop(0)
                        sent.add(("act", i, s + 1) if what == "F" else ("grad", i, s - 1))
                        moved = True
                assert moved, (kind, p, m, todo)


def _run(p, m, kind, strategy="ddp", dp=1, steps=3, **kw):
    """MODEL on p stages x dp ranks of the run's spine (`zeroedu run --pp`), fp32, beside one process."""
    return RUNS(RunConfig(strategy, p * dp, pp=p, micro_batches=m, schedule=kind, model=MODEL, global_batch=BATCH,
                          steps=steps, recipe="fp32", adam=AdamConfig(lr=LR), **kw))


def _params_equal_one_process(r, steps):
    names = [n for n, _ in MODEL.build().named_parameters()]
    trained, ref = dict(zip(names, r.params)), dict(zip(names, r.reference_params))
    d = MODEL.d_model
    for n in names:  # the key third's true gradient is 0: Adam steps on round-off, at most lr per
        if n.endswith("attn.qkv.bias"):  # step of either sign (tests/test_models.py)
            assert (trained[n][d:2 * d] - ref[n][d:2 * d]).abs().max() <= 2 * steps * LR
    assert parameter_error(trained, ref, d) <= PARAM_TOL


@pytest.mark.parametrize("p, m, kind", [(2, 1, "1f1b"), (2, 4, "gpipe"), (2, 4, "1f1b"), (2, 8, "gpipe"),
                                        (4, 1, "gpipe"), (4, 2, "gpipe"), (4, 2, "1f1b"), (4, 8, "1f1b")])
def test_a_pipeline_trains_like_one_process_and_sends_and_holds_what_the_closed_forms_say(p, m, kind):
    steps = 3
    r = _run(p, m, kind, steps=steps)
    # losses within 1e-5 of one process's; every rank's model states, activations (the most it
    # held: micro-batches in flight x one's saved tensors) and bytes per axis == the closed forms;
    # the kernel's byte count == the records + gloo's framing
    assert all(v is True for v in vars(r.match).values()), r.match
    _params_equal_one_process(r, steps)
    one = P.boundary_bytes(BATCH // m, MODEL.seq_len, MODEL.d_model, 4)
    for rk in r.ranks:
        w = rk.pipeline
        assert w.stage == rk.rank and w.layers == [4 // p * rk.rank, 4 // p * (rk.rank + 1)]
        # exact, by hand: each micro-batch's activations forward unless last, gradients back unless first
        assert rk.measured.comm_by_axis["pp"] == {"send": m * one * ((w.stage < p - 1) + (w.stage > 0))}
        assert w.in_flight == w.predicted_in_flight == P.in_flight(kind, p, m, w.stage)
        # the timeline's actions, in the order they ran, are the stage's schedule, one after another
        acts = sorted(w.work, key=lambda a: a[2])
        assert [(what, i) for what, i, _, _ in acts] == P.schedule(kind, p, m, w.stage)
        assert all(a[3] <= b[2] for a, b in zip(acts, acts[1:]))
    # causality on the shared clock: a stage's work on a micro-batch starts after its neighbour's
    # that it needs has ended (forward from the stage before, backward from the stage after)
    work = {(rk.pipeline.stage, what, i): (start, end) for rk in r.ranks for what, i, start, end in rk.pipeline.work}
    for (s, what, i), (start, _) in work.items():
        need = (s - 1, "F", i) if what == "F" else (s + 1, "B", i)
        if need in work:
            assert work[need][1] <= start, (s, what, i)


@pytest.mark.fast
def test_the_bubble_is_read_off_the_stages_actions():
    """p = 2, m = 2, forward 1 s, backward 2 s, GPipe written out by hand: the step spans
    (m + p - 1)(1 + 2) = 9 s and each stage works 6 s of it, idle 1/3 = (p-1)/(m+p-1)."""
    from zeroedu.reports import PipelineWork, measured_bubble

    s0 = [["F", 0, 0, 1], ["F", 1, 1, 2], ["B", 0, 5, 7], ["B", 1, 7, 9]]
    s1 = [["F", 0, 1, 2], ["F", 1, 2, 3], ["B", 0, 3, 5], ["B", 1, 5, 7]]
    stages = [PipelineWork(s, [s, s + 1], 2, 2, w) for s, w in enumerate((s0, s1))]
    assert measured_bubble(stages) == [pytest.approx(1 / 3), pytest.approx(1 / 3)]
    assert float(P.bubble_fraction(2, 2)) == pytest.approx(1 / 3)
    # a stage that works less than the others (here stage 1 loses its last 2 s) idles more
    stages[1].work = s1[:3]
    assert measured_bubble(stages)[1] == pytest.approx(1 - 4 / 9)


@pytest.mark.fast
def test_an_emulated_device_paces_an_action_and_refuses_a_zero_length():
    import time

    from zeroedu.strategies.pipeline import EmulatedCompute

    dev = EmulatedCompute(0.05, 0.1)
    t = time.perf_counter()
    dev.hold("B", t)
    assert time.perf_counter() - t >= 0.1
    with pytest.raises(ValueError, match="lasts > 0 s"):
        EmulatedCompute(0.0, 0.1)


@pytest.mark.fast
def test_a_micro_batch_mark_round_trips_with_its_index():
    from zeroedu.kinds import EventKind
    from zeroedu.reports import Event

    e = Event(1.5, EventKind.MICRO_BACKWARD_BEGIN, 2, micro=3)
    assert e.label == "backward begins on micro-batch 3"
    assert Event.from_plain(e.plain()) == e


@pytest.mark.fast
@pytest.mark.parametrize("kw, msg", [
    (dict(world_size=3, pp=3), "4 blocks do not split"),
    (dict(micro_batches=3), "must be divisible by 3 micro-batches"),
    (dict(schedule="interleaved"), "schedule must be one of"),
])
def test_a_pipeline_that_cannot_exist_is_refused(kw, msg):
    args = dict(strategy="ddp", world_size=2, pp=2, model=MODEL, global_batch=BATCH, micro_batches=4) | kw
    with pytest.raises(ValueError, match=msg):
        RunConfig(**args).resolved()


@pytest.mark.parametrize("p, m, kind", [(2, 4, "gpipe"), (2, 4, "1f1b"), (4, 4, "1f1b")])
def test_gradients_equal_torchs_own_pipeline_and_one_process(p, m, kind):
    """torch.distributed.pipelining (PipelineStage + ScheduleGPipe / Schedule1F1B over gloo) on the
    same stages: zeroedu's gradients equal torch's and one process's whole-batch gradients."""
    ranks = cluster.run("zeroedu.references.torch_pipeline:torch_pipeline_job", p, {
        "model": MODEL.as_dict(), "schedule": kind, "microbatches": m, "global_batch": BATCH})
    gpt = MODEL.build()
    x, y = MODEL.batch(0, BATCH)
    loss = gpt.loss(gpt(x), y)
    loss.backward()
    one = {n: q.grad for n, q in gpt.named_parameters()}
    assert sorted(n for r in ranks for n in r["zeroedu"]) == sorted(one)
    for r in ranks:
        for n, g in r["zeroedu"].items():
            scale = one[n].norm().clamp_min(1e-12)
            assert ((g - one[n]).norm() / scale).item() <= 1.5e-6, n
            assert ((g - r["torch"][n]).norm() / scale).item() <= 1.5e-6, n
    last = ranks[-1]
    assert abs(last["loss"] - loss.item()) <= 1e-6 * loss.item()
    assert abs(last["torch_loss"] - loss.item()) <= 1e-6 * loss.item()


def test_the_command_line_prints_every_stage_beside_its_closed_forms():
    """`zeroedu pipeline` is `zeroedu run` with a pipeline by default: it prints each stage's blocks
    and micro-batches in flight beside the schedule's, and its progress line follows the last
    stage, where the loss is."""
    from .cli_inprocess import zeroedu  # on the session's warm pools (tests/cli_inprocess.py)

    out = zeroedu("pipeline", "--micro-batches", "2", "--global-batch", "4", "--steps", "1")
    assert out.returncode == 0, out.stderr
    assert "(pp 2 x dp N = 1, 1f1b)" in out.stdout and out.stdout.rstrip().endswith("match: True"), out.stdout
    # rank, stage, blocks, in flight, predicted, match: 1F1B holds p - stage micro-batches
    rows = re.findall(r"^(\d)\s+(\d)\s+(\d-\d)\s+(\d)\s+(\d)\s+(yes|NO)\s+[\d.]+%$", out.stdout, re.M)
    assert rows == [("0", "0", "0-0", "2", "2", "yes"), ("1", "1", "1-1", "1", "1", "yes")], out.stdout
    assert re.search(r"step 1/1 \[#+ *\] loss \d\.\d{4}", out.stderr), out.stderr
    bad = zeroedu("pipeline", "--micro-batches", "3")
    assert bad.returncode == 2 and "must be divisible by 3 micro-batches" in bad.stderr
    bad = zeroedu("pipeline", "--emulate", "5")
    assert bad.returncode == 2 and "FORWARD_MS,BACKWARD_MS" in bad.stderr, bad.stderr


def test_with_data_parallelism_zero1_reduces_once_per_step_zero2_and_fsdp_once_per_micro_batch():
    """A (pp = 2, dp = 2) mesh, each stage data-parallel under zeroedu's own strategy: training equals one
    process; the bytes each rank sends on dp equal `theory.exact_comm` for its stage with m micro-batches;
    ZeRO-1's are the same for every m (one reduce-scatter after the step's last backward) while ZeRO-2's
    reduce-scatter grows as m (a gradient shard per micro-batch: it keeps no whole gradient to
    accumulate in), and FSDP's all-gathers grow as m too (every micro-batch's forward and backward
    gather the stage's weights again), which is why a pipeline pairs with ZeRO-1."""
    dp_bytes = {}
    for strategy in ("zero1", "zero2", "fsdp1", "fsdp2"):
        for m in (1, 2, 4):
            r = _run(2, m, "1f1b", strategy, dp=2, steps=2)
            assert all(v is True for v in vars(r.match).values()), (strategy, m, r.match)
            _params_equal_one_process(r, 2)
            dp_bytes[strategy, m] = r.ranks[0].measured.comm_by_axis[DP_SHARD]
    assert dp_bytes["zero1", 1] == dp_bytes["zero1", 2] == dp_bytes["zero1", 4]
    rs = {m: dp_bytes["zero2", m]["reduce_scatter"] for m in (1, 2, 4)}
    assert rs[2] == 2 * rs[1] and rs[4] == 4 * rs[1]
    assert dp_bytes["zero2", 4]["all_gather"] == dp_bytes["zero1", 1]["all_gather"]
    for fsdp in ("fsdp1", "fsdp2"):  # gather, gather again, reduce-scatter: all three per micro-batch
        for m in (2, 4):
            assert dp_bytes[fsdp, m] == {k: m * v for k, v in dp_bytes[fsdp, 1].items()}
        assert dp_bytes[fsdp, 1]["all_gather"] == 2 * dp_bytes[fsdp, 1]["reduce_scatter"]


@pytest.mark.fast
def test_the_timed_schedule_spans_m_plus_p_minus_1_slots_and_idles_the_bubble():
    """With every forward t_f and backward t_b, both schedules take (m+p-1)(t_f+t_b), each stage
    works m(t_f+t_b) of it (so idles (p-1)/(m+p-1)), and no action starts before its input exists."""
    from fractions import Fraction as F

    for kind in P.SCHEDULES:
        for p, m in ((2, 1), (2, 4), (4, 8), (4, 2), (3, 5), (8, 3)):
            for t_f, t_b in ((F(1), F(2)), (F(2), F(3))):
                rows = P.timed_schedule(kind, p, m, t_f, t_b)
                span = max(a[3] for r in rows for a in r)
                assert span == (m + p - 1) * (t_f + t_b), (kind, p, m)
                for s, r in enumerate(rows):
                    assert [(w, i) for w, i, _, _ in r] == P.schedule(kind, p, m, s)
                    assert 1 - sum(e - b for _, _, b, e in r) / span == P.bubble_fraction(p, m)
                    assert all(a[3] <= b[2] for a, b in zip(r, r[1:]))
    # GPipe, p = 2, m = 2, t_f = 1, t_b = 2, by hand: stage 1 runs F0 [1, 2), F1 [2, 3), B0 [3, 5), B1 [5, 7)
    assert P.timed_schedule("gpipe", 2, 2, 1, 2)[1] == [("F", 0, 1, 2), ("F", 1, 2, 3), ("B", 0, 3, 5), ("B", 1, 5, 7)]


def test_the_figures_draw_every_action_the_timeline_holds():
    from zeroedu.notebook import viz
    from zeroedu.notebook.time_lessons import BubbleRow
    from zeroedu.reports import measured_bubble

    r = RUNS(RunConfig("ddp", 2, pp=2, micro_batches=3, model=MODEL, global_batch=6, steps=1, recipe="fp32",
                       emulate=(0.01, 0.02)))
    assert r.emulate == [0.01, 0.02] and len(measured_bubble([rk.pipeline for rk in r.ranks])) == 2
    fig = viz.pipeline_schedule(r)
    measured, predicted = fig.axes[:2]
    actions = lambda ax: [c for c in ax.collections if not (c.get_gid() or "").endswith(("stage0", "stage1"))]  # noqa: E731
    assert len(actions(measured)) == len(actions(predicted)) == 2 * 2 * 3  # p stages x 2m actions
    # the closed form's idle time, shaded: (p-1)/(m+p-1) of the span on every stage
    span = max(stop for acts in P.timed_schedule("1f1b", 2, 3, 10.0, 20.0) for *_, stop in acts)
    for s in range(2):
        idle = next(c for c in predicted.collections if c.get_gid() == f"predicted/idle/stage{s}")
        shaded = sum(p.get_extents().width for p in idle.get_paths())
        assert shaded == pytest.approx(float(P.bubble_fraction(2, 3)) * span)
    rows = [BubbleRow(2, "1f1b", m, float(P.bubble_fraction(2, m)), [0.5, 0.5], [0.1, 0.2]) for m in (1, 2)]
    assert rows[0].worst == 0.0 and rows[1].worst == pytest.approx(0.5)
    assert len(viz.bubble_figure(rows).axes[0].lines) == 2  # the closed form's line and the 1F1B markers


def test_1f1b_beside_gpipe_at_m_above_p_differ_in_order_not_in_idle_time():
    """14's figure: GPipe and 1F1B live at m = 4 > p = 2, one panel each, idle time shaded per
    stage (the span less the stage's actions); 1F1B's first stage starts a backward before its
    last forward, GPipe's never does, and both idle about (p-1)/(m+p-1)."""
    from zeroedu.notebook import viz
    from zeroedu.notebook.viz.pipeline import idle_intervals

    runs = [RUNS(RunConfig("ddp", 2, pp=2, micro_batches=4, model=MODEL, global_batch=8, steps=1, recipe="fp32",
                           emulate=(0.01, 0.02), schedule=k)) for k in ("gpipe", "1f1b")]
    fig = viz.pipeline_schedule(*runs)
    assert len(fig.axes) == 2 and [r.schedule for r in runs] == ["gpipe", "1f1b"]
    for k, (ax, r) in enumerate(zip(fig.axes, runs)):
        assert f"{r.schedule}, p = 2, m = 4" in ax.get_title(loc="left")
        for s in range(2):
            idle = next(c for c in ax.collections if c.get_gid() == f"run{k}/idle/stage{s}")
            assert idle.get_paths()  # shaded where the stage waited
    order = {r.schedule: [w for w, _ in P.schedule(r.schedule, 2, 4, 0)] for r in runs}
    first_b = {k: o.index("B") for k, o in order.items()}
    assert first_b["gpipe"] == 4 and first_b["1f1b"] < 4  # 1F1B interleaves; GPipe runs all forwards first
    rows = [[("F", 0, 0.0, 1.0), ("B", 0, 3.0, 5.0)]]
    assert idle_intervals(rows[0], 6.0) == [(1.0, 2.0), (5.0, 1.0)]
