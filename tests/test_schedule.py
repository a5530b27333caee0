"""The step-time simulator (`zeroedu.theory.schedule`) against schedules worked by hand.

Links of 1 MB/s and no latency on two ranks, so that a collective's time is round: a 2 MB
all-gather or reduce-scatter takes (g-1)/g · 2 MB / 1 MB/s = 1 s, a 1 MB all-reduce
2(g-1)/g · 1 MB / 1 MB/s = 1 s."""
from __future__ import annotations

import pytest

from zeroedu.reports import StepTime
from zeroedu.theory import schedule as S

pytestmark = pytest.mark.fast
LINK = {"dp_shard": S.Link(alpha=0.0, beta=1e6)}


def test_ddp_one_bucket_hides_nothing_three_buckets_hide_two_seconds():
    # forward 1, backward 3, one 3 MB bucket after it: 3 s of all-reduce, none hidden
    one = S.simulate(S.ddp(1, [3], [3e6], 0.5, group=2), LINK)
    assert one.seconds == 1 + 3 + 3 + 0.5
    # three 1 MB buckets, each ready after 1 s of backward: [2,3], [3,4], [4,5]; the optimizer
    # waits for the last one (5) and takes 0.5
    three = S.simulate(S.ddp(1, [1, 1, 1], [1e6] * 3, 0.5, group=2), LINK)
    assert [three.span(f"all_reduce bucket {i}").start for i in range(3)] == [2, 3, 4]
    assert three.seconds == 5.5 and three.exposed == 1.0 and three.comm("dp_shard") == 3.0
    # naive DDP: every bucket after backward, blocking
    assert S.simulate(S.ddp(1, [1, 1, 1], [1e6] * 3, 0.5, group=2, overlap=False), LINK).seconds == 7.5


def test_fsdp_without_and_with_prefetch():
    args = ([1, 1], [2, 2], [2e6, 2e6], 0.5)
    # no prefetch: AG0 [0,1] F0 [1,2] AG1 [2,3] F1 [3,4] | AG1 again [4,5] B1 [5,7] RS1 [7,8]
    # AG0 again queues behind RS1 on the one link [8,9] B0 [9,11] RS0 [11,12] | optimizer 12.5
    plain = S.simulate(S.fsdp(*args, group=2, prefetch=False), LINK)
    assert plain.span("all_gather backward unit 0").start == 8 and plain.seconds == 12.5
    # prefetch: AG1 rides beside F0 [1,2], F1 [2,3] | AG1 again [3,4], AG0 beside B1 [4,5],
    # B1 [4,6] RS1 [6,7] B0 [6,8] RS0 [8,9] | optimizer 9.5
    pre = S.simulate(S.fsdp(*args, group=2, prefetch=True), LINK)
    assert pre.span("all_gather forward unit 1").start == 1 and pre.span("backward unit 0").start == 6
    assert pre.seconds == 9.5 and pre.exposed == 9.5 - 6.5
    # reshard_after_forward=False keeps the gathered units: no second all-gather
    keep = S.simulate(S.fsdp(*args, group=2, prefetch=False, reshard_after_forward=False), LINK)
    assert keep.seconds == 1 + 1 + 1 + 1 + 2 + 2 + 1 + 0.5  # B0 starts at 6 beside RS1: RS0 [8,9]


def test_hsdp_on_two_links():
    # dp_outer 2x slower: a unit's 1 MB shard all-reduced over 2 domains takes 2 s, starting
    # when its reduce-scatter ends. No reshard: AG0 [0,1] F0 [1,2] AG1 [2,3] F1 [3,4] B1 [4,6]
    # RS1 [6,7] AR1 outer [7,9] B0 [6,8] RS0 [8,9] AR0 outer [9,11] (after RS0 and AR1) | 11.5
    links = {**LINK, "dp_outer": S.Link(alpha=0.0, beta=0.5e6)}
    r = S.simulate(S.fsdp([1, 1], [2, 2], [2e6, 2e6], 0.5, group=2, prefetch=False,
                          reshard_after_forward=False, outer=2), links)
    assert r.span("all_reduce unit 1 over dp_outer").start == 7
    assert r.span("all_reduce unit 0 over dp_outer").start == 9 and r.seconds == 11.5
    assert r.comm("dp_outer") == 4 and r.comm("dp_shard") == 4


def test_latency_counts_per_ring_step_and_schedules_are_checked():
    link = {"dp_shard": S.Link(alpha=0.25, beta=1e6)}
    # all-reduce over 4 ranks: 2(g-1) = 6 steps of α, and 2·3/4 of 4 MB at 1 MB/s
    r = S.simulate([S.Block("ar", "all_reduce", 4e6, "dp_shard", group=4)], link)
    assert r.seconds == 6 * 0.25 + 6.0
    with pytest.raises(ValueError, match="never waited for"):
        S.simulate([S.Issue("x", "all_reduce", 1, "dp_shard", 2)], link)
    with pytest.raises(ValueError, match="no link for axis 'dp_outer'"):
        S.simulate(S.Block("x", "all_reduce", 1, "dp_outer", 2), link)
    with pytest.raises(ValueError, match="waits for \\['y'\\], never issued"):
        S.simulate([S.Wait("y")], link)


def _rec(op, payload, t_start, t_end, waited, axis="dp_shard", step=1, group=2, tag="t"):
    """A ledger record as the timeline holds it (`reports.CommRecord`), only what replay reads set."""
    from zeroedu.reports import CommRecord

    return CommRecord(op, tag, axis, group, payload, 0.0, step, t_start, t_end, waited=waited)


def test_replay_reads_compute_between_issues_and_waits_less_the_time_waited():
    # A calibration step [10, 20]: two all-reduces issued at 12 and 15 (backward goes on),
    # both waited for at 17; the second ended at 18, so the rank stood 1 s: 9 s of compute,
    # 2 before the first issue, 3 between the issues, 2 to the wait, 2 after it.
    comm = [_rec("all_reduce", 1e6, 12, 13, 17), _rec("all_reduce", 2e6, 15, 18, 17),
            _rec("all_reduce", 5e6, 1, 2, 1, step=0)]  # another step's: left out
    prog = S.replay(comm, 1, 10, 20)
    assert [op.seconds for op in prog if isinstance(op, S.Compute)] == [2, 3, 2, 2]
    assert [type(op).__name__ for op in prog] == ["Compute", "Issue", "Compute", "Issue", "Compute", "Wait",
                                                  "Wait", "Compute"]
    # on 1 MB/s: AR1 [2, 3], AR2 [5, 7]; waited at 7 (compute reached 7 too): step 7 + 2 = 9
    (p,) = S.predict(comm, [StepTime(1, 10, 9, 1, start=10)], LINK)
    assert (p.seconds, p.compute, p.exposed, p.comm) == (9, 9, 0, {"dp_shard": 3})
    # on 0.25 MB/s: AR1 [2, 6], AR2 [6, 14] (behind AR1 on the link); the wait at 7 ends at 14
    (q,) = S.predict(comm, [StepTime(1, 10, 9, 1, start=10)], {"dp_shard": S.Link(0, 0.25e6)})
    assert (q.seconds, q.exposed, q.comm) == (16, 7, {"dp_shard": 12})


def test_replay_blocking_unwaited_and_unpaced_collectives():
    # blocking: issued and waited at 11, took 2 s (gone from compute); the async one at 14 is
    # never waited for, so the step's end waits for it; the "world" axis has no link and keeps
    # its recorded 0.5 s
    comm = [_rec("reduce_scatter", 2e6, 11, 13, 11), _rec("all_gather", 2e6, 14, 14.2, None),
            _rec("all_reduce", 4, 15, 15.5, 15, axis="world")]
    prog = S.replay(comm, 1, 10, 17, recorded=frozenset({"world"}))
    assert [op.seconds for op in prog if isinstance(op, S.Compute)] == [1, 1, 1, 1.5]
    # on 1 MB/s: RS [1, 2] blocking; compute 2..3; AG issued at 3 -> [3, 4]; world [4, 4.5]
    # blocking; compute to 6; the step waits for AG (ended at 4): 6
    (p,) = S.predict(comm, [StepTime(1, 7, 4.5, 2.5, start=10)], LINK)
    assert p.seconds == 6 and p.comm == {"dp_shard": 2, "world": 0.5}
    with pytest.raises(ValueError, match="no link for axis 'world'"):
        S.simulate(S.replay(comm, 1, 10, 17), LINK)


def test_transport_floor_a_collective_takes_the_longer_of_the_link_and_the_machine():
    # calibration on a free link: AR1 issued at 11 took 2 s (the machine's own cost), AR2 issued
    # at 12 waited behind it on the axis until 13 and took 0.5 s; both waited for at 14
    comm = [_rec("all_reduce", 1e6, 11, 13, 14), _rec("all_reduce", 1e6, 12, 13.5, 14)]
    steps = [StepTime(1, 5, 5, 0, start=10)]
    # on 1 MB/s each takes 1 s: with the floors AR1 takes 2 s [1, 3], AR2 1 s (> 0.5) [3, 4];
    # waited at 4, compute 1 s more
    (p,) = S.predict(comm, steps, LINK, transport=True)
    assert (p.seconds, p.comm) == (5, {"dp_shard": 3})
    # without the floors: [1, 2], [2, 3]
    (q,) = S.predict(comm, steps, LINK)
    assert (q.seconds, q.comm) == (5, {"dp_shard": 2})


def test_the_overlap_bound_is_the_busiest_resource_plus_what_cannot_overlap():
    # DDP: compute P = 1 + 3 + 0.5; the first bucket exists after forward and its backward share,
    # the optimizer needs the last: three 1 MB buckets give max(4.5, 2 + 3 + 0.5) = 5.5, which
    # the schedule reaches; one 3 MB bucket max(4.5, 4 + 3 + 0.5) = 7.5, reached too
    three = S.ddp(1, [1, 1, 1], [1e6] * 3, 0.5, group=2)
    assert S.bound(three, LINK) == 5.5 == S.simulate(three, LINK).seconds
    one = S.ddp(1, [3], [3e6], 0.5, group=2)
    assert S.bound(one, LINK) == 7.5 == S.simulate(one, LINK).seconds
    # FSDP, two units, 1 s per gather or reduce-scatter: P = 6.5, and two collectives have nothing
    # to hide behind: unit 0's gather before the first layer and unit 0's reduce-scatter between
    # the last gradient and the optimizer: 6.5 + 2 = 8.5. Prefetch reaches 9.5: it re-gathers
    # unit 1 as backward starts, which a schedule could have done during forward (its shard
    # exists from the start), or skipped by keeping it (reshard_after_forward=False reaches 8.5)
    pre = S.fsdp([1, 1], [2, 2], [2e6, 2e6], 0.5, group=2, prefetch=True)
    assert S.bound(pre, LINK) == 8.5 and S.simulate(pre, LINK).seconds == 9.5
    keep = S.fsdp([1, 1], [2, 2], [2e6, 2e6], 0.5, group=2, prefetch=True, reshard_after_forward=False)
    assert S.bound(keep, LINK) == 8.5 == S.simulate(keep, LINK).seconds
    # a slow link: the link is the bound, 0 + 24 + 0.5
    assert S.bound(pre, {"dp_shard": S.Link(0, 0.25e6)}) == 24.5


def test_gaps_name_what_each_stream_waited_for():
    """The pauses that keep a step above its bound, worked by hand (schedules above)."""
    one = S.simulate(S.ddp(1, [3], [3e6], 0.5, group=2), LINK)
    assert S.gaps(one, "dp_shard") == [S.Gap("wait", 4, 7, "all_reduce bucket 0")]
    three = S.simulate(S.ddp(1, [1, 1, 1], [1e6] * 3, 0.5, group=2), LINK)
    assert S.gaps(three, "dp_shard") == [S.Gap("wait", 4, 5, "all_reduce bucket 2")]  # the link never pauses
    # FSDP with prefetch: the compute waits for the first gathers and the last reduce-scatter;
    # the link pauses while F1, B1 and B0 compute what it carries next
    pre = S.simulate(S.fsdp([1, 1], [2, 2], [2e6, 2e6], 0.5, group=2, prefetch=True), LINK)
    assert S.gaps(pre, "dp_shard") == [
        S.Gap("wait", 0, 1, "all_gather forward unit 0"), S.Gap("idle", 2, 3, "all_gather backward unit 1"),
        S.Gap("wait", 3, 4, "all_gather backward unit 1"), S.Gap("idle", 5, 6, "reduce_scatter unit 1"),
        S.Gap("idle", 7, 8, "reduce_scatter unit 0"), S.Gap("wait", 8, 9, "reduce_scatter unit 0")]
    assert pre.seconds - sum(g.end - g.start for g in S.gaps(pre, "dp_shard") if g.kind == "wait") == pre.compute


def test_the_bound_reads_where_data_exists_not_where_the_program_issued():
    """A replayed timeline has a few microseconds of bookkeeping between an issue and its wait;
    they hide nothing. A gradient's reduction starts after its gradient and must end before the
    optimizer; a parameter gather may start at the step's start, so a late prefetch is the
    schedule's loss, not the bound's; the gather of updated parameters after the optimizer (ZeRO-1)
    depends on it. 1 s per collective (2 MB over 2 ranks on 1 MB/s)."""
    eps = 1e-6
    prog = [S.Issue("ag0", "all_gather", 2e6, "dp_shard", 2), S.Compute("bookkeeping", eps), S.Wait("ag0"),
            S.Compute("forward 0", 1), S.Issue("ag1", "all_gather", 2e6, "dp_shard", 2), S.Compute("bk", eps),
            S.Wait("ag1"), S.Compute("forward 1 and backward", 2),
            S.Issue("rs", "reduce_scatter", 2e6, "dp_shard", 2), S.Compute("bk", eps), S.Wait("rs"),
            S.Compute("optimizer", 0.5)]
    # ag0 and rs: 1 s each, less the bookkeeping; ag1 could have been gathered during forward 0
    assert S.bound(prog, LINK) == pytest.approx(3.5 + 2, abs=1e-5)
    assert S.simulate(prog, LINK).seconds == pytest.approx(3.5 + 3, abs=1e-5)
    # ZeRO-1: reduce-scatter after backward, the optimizer on the shard, then the gather of the
    # updated parameters, waited for at once: both exposed, P + 2
    zero1 = [S.Compute("forward and backward", 3), *S.Block("rs", "reduce_scatter", 2e6, "dp_shard", 2),
             S.Compute("optimizer", 0.5), *S.Block("ag", "all_gather", 2e6, "dp_shard", 2)]
    assert S.bound(zero1, LINK) == 5.5 == S.simulate(zero1, LINK).seconds
