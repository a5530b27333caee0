"""Emulated links (`zeroedu.runtime.links`): a paced message never arrives before α + bytes/β after
it started, the waiting costs no CPU, and the bytes on the wire and the results are those of the
unpaced collectives. No wall-clock time is asserted as a target: only lower bounds, which load
cannot break, and CPU time far below wall time."""
from __future__ import annotations

import pytest
import torch

from zeroedu.runtime import cluster
from zeroedu.runtime.links import PRESETS, Board, Link, Links, Pacer, create_board, parse_link, parse_links


@pytest.mark.fast
def test_links_parse_and_refuse():
    assert parse_link("200MB/s,50us") == Link(50e-6, 200e6) == parse_link("50us, 200MB/s")
    assert parse_link("1GiB/s,2ms") == Link(2e-3, float(1 << 30))
    for bad in ("200MB/s", "fast", "200MB/s,50us,1ms", "-1MB/s,5us", "200MB,50us", "0MB/s,5us"):
        with pytest.raises(ValueError):
            parse_link(bad)
    assert parse_links(None) is None and parse_links([]) is None
    both = parse_links("100MB/s,10us")
    assert both.dp_shard == both.dp_outer == Link(10e-6, 100e6)
    split = parse_links(["dp_shard=200MB/s,50us", "dp_outer=20MB/s,500us"])
    assert (split.dp_shard, split.dp_outer) == (Link(50e-6, 200e6), Link(500e-6, 20e6))
    assert split.for_axis("world") == Link(500e-6, 20e6)  # a hybrid's world group crosses domains
    assert parse_links("two-domains") is PRESETS["two-domains"]
    assert PRESETS["two-domains"].dp_shard.beta == 9 * PRESETS["two-domains"].dp_outer.beta
    with pytest.raises(ValueError, match="mesh axis, dp_shard or dp_outer"):
        parse_links(["tp=1MB/s,1us"])
    with pytest.raises(ValueError, match="bare link"):
        parse_links(["1MB/s,1us", "dp_outer=1MB/s,1us"])
    assert Links.from_plain(split.plain()) == split


@pytest.mark.fast
def test_the_pacer_holds_a_message_until_the_link_delivers_it(tmp_path):
    """Two ranks' pacers on one board, a fake clock: the arithmetic of the model, exactly."""
    now = [100.0]
    slept = []
    board = Board(create_board(str(tmp_path), 2), 2)
    a = Pacer(board, 0, clock=lambda: now[0], sleep=slept.append)
    b = Pacer(board, 1, clock=lambda: now[0], sleep=slept.append)
    link = Link(alpha=0.5, beta=100.0)  # 100 B/s
    a.sending(link, 1, 200)   # starts at 100, link busy until 102
    a.sending(link, 1, 100)   # waits for the link: starts at 102
    now[0] = 100.1            # the real bytes arrived at once; the link delivers at 100 + 0.5 + 2
    b.received(link, 0, 200)
    now[0] = 102.6
    b.received(link, 0, 100)  # 102 + 0.5 + 1 = 103.5
    assert slept == pytest.approx([2.4, 0.9])
    now[0] = 200.0            # a late receiver holds nothing: the message arrived long ago
    a.sending(link, 1, 100)
    now[0] = 300.0
    b.received(link, 0, 100)
    assert len(slept) == 2 and b.held == pytest.approx(3.3)


@pytest.mark.fast
def test_a_late_wake_up_is_not_carried_into_the_next_message(tmp_path):
    """A ring step's next message is computed from the one just held: if the rank wakes late
    from the hold (a core, the interpreter lock), the next message still starts on the link as
    if it had woken on time, so late wake-ups do not add up over a collective's steps; and it
    never starts before its link is free."""
    now = [0.0]
    slept = []

    def oversleep(s):  # every sleep ends 0.3 s late
        slept.append(s)
        now[0] += s + 0.3

    board = Board(create_board(str(tmp_path), 2), 2)
    a = Pacer(board, 0, clock=lambda: now[0], sleep=oversleep)
    b = Pacer(board, 1, clock=lambda: now[0], sleep=oversleep)
    link = Link(alpha=0.5, beta=100.0)
    a.sending(link, 1, 100)                # starts at 0: delivered at 1.5
    late = b.received(link, 0, 100)        # sleeps 1.5, wakes at 1.8
    assert late == pytest.approx(0.3) and now[0] == pytest.approx(1.8)
    now[0] = 1.9                           # 0.1 s of work on the message, then the next step
    b.sending(link, 0, 100, late)          # starts at 1.6 (= 1.5 + 0.1), not 1.9
    b.sending(link, 0, 100, late)          # the link is busy until 2.6: starts then
    assert a.received(link, 1, 100) == pytest.approx(0.3)  # delivered at 1.6 + 1.5 = 3.1
    assert now[0] == pytest.approx(3.4)
    a.received(link, 1, 100)               # delivered at 2.6 + 1.5 = 4.1
    assert slept == pytest.approx([1.5, 1.2, 0.7])
    now[0] = 10.0                          # a message the machine itself delivered late
    a.sending(link, 1, 100)
    now[0] = 12.0
    assert b.received(link, 0, 100) == pytest.approx(0.5)  # due at 11.5


def _run(op, nbytes, n, alpha=None, beta=None):
    return cluster.run("tests.rank_jobs:paced", n, {"op": op, "nbytes": nbytes, "alpha": alpha, "beta": beta})


def test_a_paced_message_never_arrives_early_and_waits_without_cpu():
    alpha, beta, nbytes = 2e-3, 10e6, 2_000_000  # 0.202 s on the link
    r0, r1 = _run("p2p", nbytes, 2, alpha, beta)
    assert r1["t1"] - r0["t0"] >= alpha + nbytes / beta  # sent by rank 0, released on rank 1
    assert torch.equal(r1["out"], r0["out"])
    wall = r1["t1"] - r1["t0"]
    assert r1["cpu"] < 0.5 * wall, (r1["cpu"], wall)  # it slept while the link "moved" the bytes


@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather", "all_reduce"])
def test_paced_collectives_take_at_least_their_ring_steps_and_change_no_byte(op):
    n, nbytes, alpha, beta = 3, 3 * 400_000, 1e-3, 20e6
    paced = _run(op, nbytes, n, alpha, beta)
    plain = _run(op, nbytes, n)
    first_join = min(r["t0"] for r in paced)
    chunk = nbytes // n if op != "all_gather" else nbytes  # all_gather: each rank's input is nbytes
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    for p, q in zip(paced, plain):
        # every step the right neighbour sends this rank a chunk on its one (sequential) link,
        # and the last one arrives α after it was sent: never sooner after the first rank joined
        assert p["t1"] - first_join >= steps * chunk / beta + alpha
        assert torch.equal(p["out"], q["out"])  # the same sums (all_reduce: gloo's own, bitwise)
        assert p["sent"] == q["sent"]  # the same messages: not a byte more or less on the wire
