"""Emulated links: each mesh axis a latency α and a bandwidth β, on which communication really
overlaps compute.

Why: on this machine gloo's collectives are CPU work on the same cores as the backward they
should hide behind, and loopback moves gigabytes a second, so communication is neither separate
from compute nor slow beside it. On a GPU cluster both hold: NCCL runs beside the kernels, and
the link (NVLink, above all the network between nodes) is the bottleneck overlap exists to hide.
An emulated link restores both: zeroedu's ring collectives send every message at once, and the
receiver *holds* it until the moment it would have arrived on the link,

    arrival = start + α + bytes / β,     start = max(send time, when the link is free again)

sleeping meanwhile, so the rank's compute runs during the transfer as a GPU computes while NCCL
moves data. The real transfer happens inside the modelled interval (not before or after it),
which is what keeps a paced collective close to its model on two busy cores
(`../shared` design notes, "What time means here"). The bytes on the wire do not change: the
same messages are sent, only later released. Links are sequential: a message starts when the
previous one on the same link has been sent.

A message starts when the rank could have sent it, not when its thread got there: a collective's
first messages when it was issued (or the op before it on its stream ended), a ring step's when
the message it is computed from was delivered, plus the work between. On two busy cores a
thread woken from a sleep or a queue waits about a millisecond for a core and the interpreter
lock, once per ring step; a GPU's communication kernel does not, and those waits would add up
over a collective's steps (an all-gather of gpt-small's blocks on 4 ranks took its link's 15 ms
plus 2-3 ms). They are removed from the emulation (`Pacer.received` returns the lateness, the
ring hands it to the next `sending`), not added to the model; the data still travels when it is
really sent.

The sender's start time reaches the receiver through a *clock board*: a small file the pool
creates, mapped by every local rank, with one slot per (sender, receiver, message number).
CLOCK_MONOTONIC (`time.monotonic`) is one clock for every process of a Linux machine, so a time
written by one rank is a time for the other. Nothing travels over the sockets the wire meter
reads. A board needs the ranks on one machine: emulated links are a local-pool feature (under
torchrun the links are real).

Scale: two CPU cores and a sleeping comm thread are not a GPU cluster; what transfers to one is
the ratio of compute to communication, not the absolute times. The presets are chosen so that
for gpt-small at N = 2-4 here communication is between half and twice a step's compute.
"""
from __future__ import annotations

import mmap
import os
import re
import struct
import threading
import time
from dataclasses import dataclass

# --------------------------------------------------------------------------- the link model
_BW = {"B/s": 1, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "KiB/s": 1 << 10, "MiB/s": 1 << 20, "GiB/s": 1 << 30}
_LAT = {"s": 1, "ms": 1e3, "us": 1e6, "µs": 1e6, "ns": 1e9}  # divisors: 50us is 50 / 1e6 s exactly as 5e-05
_NUM = r"(\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"


@dataclass(frozen=True)
class Link:
    """A point-to-point link: `alpha` seconds of latency per message, `beta` bytes per second."""
    alpha: float
    beta: float

    def __post_init__(self):
        if not (self.alpha >= 0 and self.alpha < 10):
            raise ValueError(f"a link's latency must be in [0, 10) s, got {self.alpha!r}")
        if not (self.beta > 0 and self.beta < float("inf")):
            raise ValueError(f"a link's bandwidth must be a finite number of bytes/s > 0, got {self.beta!r}")

    def seconds(self, nbytes: int) -> float:
        """One message of `nbytes` on this link: α + bytes/β."""
        return self.alpha + nbytes / self.beta

    def __str__(self) -> str:
        return f"{self.beta / 1e6:g}MB/s,{self.alpha * 1e6:g}us"


def parse_link(text: str) -> Link:
    """"200MB/s,50us" (bandwidth and latency, either order) as a Link."""
    parts = [p.strip() for p in str(text).split(",")]
    alpha = beta = None
    for p in parts:
        m = re.fullmatch(rf"({_NUM})\s*([A-Za-zµ/]+)", p)
        unit = m.group(3) if m else None
        if unit in _BW and beta is None:
            beta = float(m.group(1)) * _BW[unit]
        elif unit in _LAT and alpha is None:
            alpha = float(m.group(1)) / _LAT[unit]
        else:
            alpha = beta = None
            break
    if alpha is None or beta is None or len(parts) != 2:
        raise ValueError(f"a link is a bandwidth and a latency, e.g. 200MB/s,50us (units "
                         f"{', '.join(_BW)}; {', '.join(_LAT)}), got {text!r}")
    return Link(alpha, beta)


# A fast domain (the NVLink of one node) and the link between domains 9x slower: a DGX H100's
# NVLink moves about 450 GB/s each way per GPU and its per-GPU network card 50 GB/s, the ratio
# the source documents give (seeds, hybrid sharding). Scaled down so that gpt-small's gradients
# (13 MB in fp32) take about as long to move as a step takes to compute on two cores.
DOMAIN = Link(alpha=50e-6, beta=80e6)
BETWEEN_DOMAINS = Link(alpha=500e-6, beta=80e6 / 9)


@dataclass(frozen=True)
class Links:
    """The link of each mesh axis (None: that axis is not paced). A flat strategy's one axis is
    `dp_shard`; a hybrid's world group (its one gradient-norm all-reduce) crosses domains and
    takes the slower of the two."""
    dp_shard: Link | None = None
    dp_outer: Link | None = None
    preset: str | None = None  # the preset's name, when one was asked for

    def for_axis(self, axis: str) -> Link | None:
        if axis == "dp_shard":
            return self.dp_shard
        if axis == "dp_outer":
            return self.dp_outer
        given = [x for x in (self.dp_shard, self.dp_outer) if x is not None]
        return min(given, key=lambda x: x.beta) if given else None  # "world"

    def instant(self) -> "Links":
        """The same axes paced on links that cost nothing (α = 0, β = 1 EB/s): the messages go
        through the same ring, board and holds, so a run on them takes only what moving its
        bytes costs this machine (what a step-time prediction calibrates on)."""
        fast = Link(0.0, 1e18)
        return Links(fast if self.dp_shard else None, fast if self.dp_outer else None, preset="instant")

    def __str__(self) -> str:
        if self.preset:
            return self.preset
        return " ".join(f"{a}={x}" for a, x in (("dp_shard", self.dp_shard), ("dp_outer", self.dp_outer))
                        if x is not None)

    def plain(self) -> dict:
        return {"preset": self.preset, **{a: None if x is None else {"alpha": x.alpha, "beta": x.beta}
                                          for a, x in (("dp_shard", self.dp_shard), ("dp_outer", self.dp_outer))}}

    @staticmethod
    def from_plain(d: dict | None) -> "Links | None":
        if d is None or isinstance(d, Links):
            return d
        return Links(*(None if d.get(a) is None else Link(**d[a]) for a in ("dp_shard", "dp_outer")),
                     preset=d.get("preset"))


PRESETS = {
    # every axis one fast domain
    "domain": Links(DOMAIN, DOMAIN, preset="domain"),
    # hybrid sharding's picture: dp_shard inside a domain, dp_outer between domains (9x slower)
    "two-domains": Links(DOMAIN, BETWEEN_DOMAINS, preset="two-domains"),
}


def parse_links(specs) -> Links | None:
    """`--link` values: a preset name, a bare link for every axis ("200MB/s,50us"), or one per
    axis ("dp_shard=200MB/s,50us", "dp_outer=20MB/s,500us"). None or [] : no links."""
    if specs is None or isinstance(specs, Links):
        return specs
    if isinstance(specs, str):
        specs = [specs]
    specs = list(specs)
    if not specs:
        return None
    if len(specs) == 1 and specs[0] in PRESETS:
        return PRESETS[specs[0]]
    axes: dict[str, Link] = {}
    for s in specs:
        axis, eq, value = str(s).partition("=")
        if not eq:
            if s in PRESETS:
                raise ValueError(f"the preset {s!r} names every axis's link: give it alone")
            if axes or len(specs) > 1:
                raise ValueError(f"a bare link ({s!r}) applies to every axis: give it alone")
            link = parse_link(s)
            return Links(link, link)
        axis = axis.strip()
        if axis not in ("dp_shard", "dp_outer"):
            raise ValueError(f"a link names a mesh axis, dp_shard or dp_outer, got {axis!r} "
                             f"(presets: {', '.join(PRESETS)})")
        if axis in axes:
            raise ValueError(f"two links for {axis}")
        axes[axis] = parse_link(value)
    return Links(axes.get("dp_shard"), axes.get("dp_outer"))


# --------------------------------------------------------------------------- the clock board
SLOTS = 256  # message numbers per (sender, receiver) pair kept on the board, round robin
BOARD_NAME = "links.board"


def create_board(folder: str, world_size: int) -> str:
    """The board file for `world_size` local ranks, zeroed, in the pool's folder."""
    path = os.path.join(folder, BOARD_NAME)
    with open(path, "wb") as f:
        f.truncate(world_size * world_size * SLOTS * 8)
    return path


class Board:
    """A rank's map of the clock board: float64 start times at [sender, receiver, message % SLOTS].
    A slot is reused SLOTS messages later; a ring collective's sender runs at most a step ahead
    of its receiver, so a slot is always read before it is written again."""

    def __init__(self, path: str, world_size: int):
        self.world_size = world_size
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, world_size * world_size * SLOTS * 8)
        finally:
            os.close(fd)

    def _offset(self, src: int, dst: int, seq: int) -> int:
        return ((src * self.world_size + dst) * SLOTS + seq % SLOTS) * 8

    def post(self, src: int, dst: int, seq: int, t: float) -> None:
        struct.pack_into("d", self._map, self._offset(src, dst, seq), t)

    def read(self, src: int, dst: int, seq: int) -> float:
        return struct.unpack_from("d", self._map, self._offset(src, dst, seq))[0]


class Pacer:
    """One rank's side of the emulated links: counts its messages per peer (both ends count the
    same messages in the same order, so a number names one message), keeps when each of its
    outgoing links is free again, posts each message's start on the board and holds each
    arrived message until its arrival time. Thread-safe: the ring's stream thread and the
    caller's thread (inline synchronous collectives) both use it."""

    def __init__(self, board: Board, rank: int, clock=time.monotonic, sleep=time.sleep):
        self.board, self.rank, self.clock, self.sleep = board, rank, clock, sleep
        self._sent: dict[int, int] = {}
        self._received: dict[int, int] = {}
        self._free: dict[int, float] = {}
        self._lock = threading.Lock()
        self.held = 0.0  # seconds this rank held arrived messages (slept)

    def on(self, link: Link) -> "Pace":
        return Pace(self, link)

    def sending(self, link: Link, dst: int, nbytes: int, late: float = 0.0) -> None:
        """`late`: how long after the link delivered the message this one is computed from the
        rank got to it (`received`'s return): the message starts that much earlier, as it would
        have had the rank woken on time (see `received`)."""
        with self._lock:
            seq = self._sent.get(dst, 0)
            self._sent[dst] = seq + 1
            start = max(self.clock() - late, self._free.get(dst, 0.0))
            self._free[dst] = start + nbytes / link.beta
        self.board.post(self.rank, dst, seq, start)

    def received(self, link: Link, src: int, nbytes: int) -> float:
        """Hold the message until the link delivers it; return how late the rank got past that
        moment (woken after its sleep, or the message itself later than the link).

        A ring step's next message is computed from this one, so a late wake-up would push
        every later step back: on two busy cores a thread woken from a sleep waits for a core
        and for the interpreter lock, about a millisecond each time, which a GPU's
        communication kernel never does. The ring passes the lateness to `sending`, which
        starts the next message that much earlier on the link: the late wake-ups are removed
        from the emulation, not added to the model. A message's data still travels when it
        really is sent, so a receiver never gets it before the machine could deliver it."""
        with self._lock:
            seq = self._received.get(src, 0)
            self._received[src] = seq + 1
        arrival = self.board.read(src, self.rank, seq) + link.seconds(nbytes)
        wait = arrival - self.clock()
        if wait > 0:
            self.sleep(wait)  # sleeps: the link's waiting costs no CPU
            with self._lock:
                self.held += wait
        return max(0.0, self.clock() - arrival)


@dataclass(frozen=True)
class Pace:
    """A Pacer bound to the link of one axis: what the ring engine calls around each message."""
    pacer: Pacer
    link: Link

    def sending(self, dst_global: int, nbytes: int, late: float = 0.0) -> None:
        self.pacer.sending(self.link, dst_global, nbytes, late)

    def received(self, src_global: int, nbytes: int) -> float:
        return self.pacer.received(self.link, src_global, nbytes)
