"""Pipeline parallelism (`strategies.pipeline`): the schedules against ones written out by hand,
training on real ranks equal to one process, and the bytes each stage sends and the activations
it holds equal to their closed forms (`theory.pipeline`)."""
import pytest
import torch

from zeroedu.models import GPTConfig
from zeroedu.runtime import cluster
from zeroedu.theory import pipeline as P

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


@pytest.mark.parametrize("p, m, kind", [(2, 1, "1f1b"), (2, 4, "gpipe"), (2, 4, "1f1b"), (2, 8, "gpipe"),
                                        (4, 1, "gpipe"), (4, 2, "gpipe"), (4, 2, "1f1b"), (4, 8, "1f1b")])
def test_a_pipeline_trains_like_one_process_and_sends_and_holds_what_the_closed_forms_say(p, m, kind):
    from zeroedu.train.pipeline import reference

    steps = 3
    ranks = cluster.run("zeroedu.train.pipeline:pipeline_job", p, {
        "model": MODEL.as_dict(), "schedule": kind, "microbatches": m, "steps": steps, "global_batch": BATCH,
        "lr": LR})
    ref_losses, ref_params = reference(MODEL, steps, BATCH, LR)
    losses = ranks[-1]["losses"]
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses, ref_losses, strict=True)), (losses, ref_losses)
    names = [n for r in ranks for n in r["names"]]
    assert sorted(names) == sorted(ref_params)  # every parameter on exactly one stage
    for r in ranks:
        for n, q in zip(r["names"], r["params"]):
            want = ref_params[n]
            if n.endswith("attn.qkv.bias"):  # the key third's true gradient is 0: Adam steps on round-off,
                d = MODEL.d_model          # at most lr per step of either sign (tests/test_models.py)
                assert (q[d:2 * d] - want[d:2 * d]).abs().max() <= 2 * steps * LR
                q, want = torch.cat([q[:d], q[2 * d:]]), torch.cat([want[:d], want[2 * d:]])
            assert ((q - want).norm() / want.norm()).item() <= PARAM_TOL, n
        # exact: bytes on the pp axis (the records and, gloo's framing added, the kernel's count)
        st = r["stage"]  # a train.pipeline.StageReport
        assert st.sent == st.predicted_sent
        if st.wire is not None:
            assert st.wire == st.sent + 144 * st.messages
        # exact: the most activation bytes held == micro-batches in flight x one's saved tensors
        assert st.peak_activations == st.predicted_peak_activations, st
        assert st.match
        # the timeline's actions, in the order they ran, are the stage's schedule, one after another
        assert [(w.what, w.micro) for w in st.work] == P.schedule(kind, p, m, st.stage)
        assert all(a.end <= b.start for a, b in zip(st.work, st.work[1:]))
    # causality on the shared clock: a stage's work on a micro-batch starts after its neighbour's
    # that it needs has ended (forward from the stage before, backward from the stage after)
    work = {(w.stage, w.what, w.micro): w for r in ranks for w in r["stage"].work}
    for (s, what, i), w in work.items():
        need = (s - 1, "F", i) if what == "F" else (s + 1, "B", i)
        if need in work:
            assert work[need].end <= w.start, (s, what, i)
    one = P.boundary_bytes(BATCH // m, MODEL.seq_len, MODEL.d_model, 4)
    assert sum(r["stage"].sent for r in ranks) == 2 * m * one * (p - 1)


@pytest.mark.fast
def test_the_bubble_is_read_off_the_stages_actions():
    """p = 2, m = 2, forward 1 s, backward 2 s, GPipe written out by hand: the step spans
    (m + p - 1)(1 + 2) = 9 s and each stage works 6 s of it, idle 1/3 = (p-1)/(m+p-1)."""
    from zeroedu.train.pipeline import Work, measured_bubble

    s0 = [Work(0, "F", 0, 0, 1), Work(0, "F", 1, 1, 2), Work(0, "B", 0, 5, 7), Work(0, "B", 1, 7, 9)]
    s1 = [Work(1, "F", 0, 1, 2), Work(1, "F", 1, 2, 3), Work(1, "B", 0, 3, 5), Work(1, "B", 1, 5, 7)]
    assert measured_bubble([s0, s1]) == [pytest.approx(1 / 3), pytest.approx(1 / 3)]
    assert float(P.bubble_fraction(2, 2)) == pytest.approx(1 / 3)
    # a stage that works less than the others (here stage 1 loses its last 2 s) idles more
    assert measured_bubble([s0, s1[:3]])[1] == pytest.approx(1 - 4 / 9)


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
    (dict(p=3), "do not split into 3 equal stages"),
    (dict(m=3), "does not split into 3 micro-batches"),
    (dict(schedule="interleaved"), "schedule must be one of"),
])
def test_a_pipeline_that_cannot_exist_is_refused(kw, msg):
    from zeroedu.train.pipeline import check

    args = dict(model=MODEL, p=2, m=4, schedule="1f1b", global_batch=BATCH) | kw
    with pytest.raises(ValueError, match=msg):
        check(**args)


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
    import json

    from .cli_inprocess import zeroedu  # on the session's warm pools (tests/cli_inprocess.py)

    out = zeroedu("pipeline", "--pp", "2", "--micro-batches", "2", "--steps", "1", "--json")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert [s["in_flight"] for s in rep["per_stage"]] == [2, 1]
    assert all(s["sent"] == s["predicted_sent"] for s in rep["per_stage"])
    bad = zeroedu("pipeline", "--pp", "2", "--micro-batches", "3")
    assert bad.returncode == 2 and "does not split into 3 micro-batches" in bad.stderr
    bad = zeroedu("pipeline", "--emulate", "5")
    assert bad.returncode == 2 and "--emulate takes FORWARD_MS,BACKWARD_MS" in bad.stderr


def _composed(strategy, m, steps=2):
    return cluster.run("zeroedu.train.pipeline:pipeline_job", 4, {
        "model": MODEL.as_dict(), "schedule": "1f1b", "microbatches": m, "steps": steps, "global_batch": BATCH,
        "lr": LR, "dp": 2, "strategy": strategy})


def test_with_data_parallelism_zero1_reduces_once_per_step_zero2_and_fsdp_once_per_micro_batch():
    """A (pp = 2, dp = 2) mesh, each stage data-parallel under zeroedu's own strategy: training equals one
    process; the bytes each rank sends on dp equal `theory.exact_comm` for its stage with m micro-batches;
    ZeRO-1's are the same for every m (one reduce-scatter after the step's last backward) while ZeRO-2's
    reduce-scatter grows as m (a gradient shard per micro-batch: it keeps no whole gradient to
    accumulate in), and FSDP's all-gathers grow as m too (every micro-batch's forward and backward
    gather the stage's weights again), which is why a pipeline pairs with ZeRO-1."""
    from zeroedu.train.pipeline import reference

    ref_losses, ref_params = reference(MODEL, 2, BATCH, LR)
    dp_bytes = {}
    for strategy in ("zero1", "zero2", "fsdp1", "fsdp2"):
        for m in (1, 2, 4):
            ranks = _composed(strategy, m)
            last = [r for r in ranks if r["losses"] is not None]
            losses = [sum(v) / len(last) for v in zip(*(r["losses"] for r in last))]
            assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses, ref_losses)), (strategy, m)
            for r in ranks:
                st = r["stage"]
                assert st.dp_sent == st.predicted_dp_sent and st.match, (strategy, m, st)
                for n, q in zip(r["names"], r["params"]):
                    want = ref_params[n]
                    if n.endswith("attn.qkv.bias"):
                        d = MODEL.d_model
                        q, want = torch.cat([q[:d], q[2 * d:]]), torch.cat([want[:d], want[2 * d:]])
                    assert ((q - want).norm() / want.norm()).item() <= PARAM_TOL, (strategy, m, n)
            dp_bytes[strategy, m] = ranks[0]["stage"].dp_sent
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
    from zeroedu.train.pipeline import run

    rep = run(MODEL, 2, 3, "1f1b", steps=1, global_batch=6, compute=(0.01, 0.02))
    assert rep.compute == (0.01, 0.02) and len(rep.measured_bubble) == 2
    fig = viz.pipeline_schedule(rep)
    measured, predicted = fig.axes[:2]
    assert len(measured.collections) == len(predicted.collections) == 2 * 2 * 3  # p stages x 2m actions
    rows = [BubbleRow(2, "1f1b", m, float(P.bubble_fraction(2, m)), [0.5, 0.5], [0.1, 0.2]) for m in (1, 2)]
    assert rows[0].worst == 0.0 and rows[1].worst == pytest.approx(0.5)
    assert len(viz.bubble_figure(rows).axes[0].lines) == 2  # the closed form's line and the 1F1B markers
