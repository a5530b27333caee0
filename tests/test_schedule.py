"""The step-time simulator (`zeroedu.theory.schedule`) against schedules worked by hand.

Links of 1 MB/s and no latency on two ranks, so that a collective's time is round: a 2 MB
all-gather or reduce-scatter takes (g-1)/g · 2 MB / 1 MB/s = 1 s, a 1 MB all-reduce
2(g-1)/g · 1 MB / 1 MB/s = 1 s."""
from __future__ import annotations

import pytest

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
