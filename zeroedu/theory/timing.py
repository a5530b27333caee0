"""Time from bytes: the ring model's bandwidth term, and the α–β model that adds latency.

**Bandwidth term.** A ring collective over n ranks moves data in rounds of S/n bytes, so with
per-link bandwidth B (bytes/s)::

    all_gather(S) = reduce_scatter(S) = (n-1)/n · S / B
    all_reduce(S) = 2 (n-1)/n · S / B

That is "bytes this rank sends / B", so `comm_time` just divides each mesh axis's bytes by that
axis's bandwidth. Defaults are H100/H200 class: 450 GB/s per GPU on NVLink inside a domain
(``dp_shard``) and 50 GB/s across domains (``dp_outer``): the line rate of one 400 Gb/s NIC per
GPU. What NCCL achieves is lower: 46-48 GB/s per 400 Gb/s NDR NIC (NVIDIA's nccl-tests issue
#290), about 370 GB/s ring bus bandwidth on NVLink 4 (nccl-tests #212); pass those as
`bandwidth` for achieved rather than line-rate figures.

**α–β model** (the cost of one message, α + n·(time per byte), that Thakur, Rabenseifner &
Gropp 2005, "Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1), use
for every collective; the bandwidth-optimal ring all-reduce of Patarasuk & Yuan 2009, "Bandwidth
optimal all-reduce algorithms for clusters of workstations", JPDC 69(2)). Here β is a bandwidth
in bytes/s (Thakur et al.'s β is its inverse, seconds per byte). A ring collective over g ranks
runs in steps; in each step every rank sends one S/g-byte piece to its neighbour, paying a
start-up latency α per step::

    reduce_scatter(S), all_gather(S)    g - 1 steps     t = (g-1)·α + (g-1)/g · S/β
    all_reduce(S) (RS, then AG)       2(g - 1) steps    t = 2(g-1)·α + 2(g-1)/g · S/β

(The reduction's arithmetic, Thakur's γ term, is left out: it hides behind the transfer on a GPU.)
The latency term grows with g and with the number of collectives, the bandwidth term with the
bytes; so many small messages are latency-bound and a few big ones bandwidth-bound.

**Bucket sizing.** DDP and ZeRO reduce gradients in buckets. A bucket of S bytes spends
steps·α on latency and sent/β on bytes; its bandwidth share is

    E(S) = (sent/β) / (steps·α + sent/β),   and E(S) >= e  when  S >= e/(1-e) · g·α·β

(for all three collectives: steps/sent = g/S for each). `bucket_time` gives the split,
`min_bucket_bytes` the size at which a bucket reaches efficiency e, `bucketed_time` the time of
a whole buffer cut into buckets. Example: g = 8, α = 5 µs, β = 50 GB/s: 90 % needs
S >= 9 · 8 · 5e-6 · 50e9 = 18 MB.

`DEFAULT_ALPHA` is an assumed order of magnitude (a few microseconds per ring step), not a
measurement: fit your own from small-message all-reduce times (t ≈ 2(g-1)·α as S -> 0).
"""
from __future__ import annotations

import math
from fractions import Fraction

from ..kinds import DP_OUTER as OUTER, DP_SHARD as INNER
from .comm import COLLECTIVES
from .inputs import check_count

# Line rates, not achieved ones: NVLink 4's 450 GB/s per GPU per direction and one 400 Gb/s NIC's
# 50 GB/s. NCCL reaches about 370 and 46 GB/s of them (nccl-tests issues #212, #290), the rates
# `theory.projection` uses; the README's table "Which bandwidth is which" lists every β the suite uses.
DEFAULT_BANDWIDTH = {INNER: 450e9, OUTER: 50e9}
DEFAULT_ALPHA = {INNER: 2e-6, OUTER: 5e-6}  # seconds per ring step; assumed, see the docstring


def _check(nbytes, n, bandwidth, alpha=0.0) -> int:
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth!r}")
    if not (alpha >= 0 and math.isfinite(alpha)):
        raise ValueError(f"alpha must be a finite number of seconds >= 0, got {alpha!r}")
    return check_count(n, "n")


def ring_steps(collective: str, n: int) -> int:
    """Steps of a ring collective over n ranks: g - 1 for a reduce-scatter or all-gather,
    2(g - 1) for an all-reduce."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; choose one of {', '.join(COLLECTIVES)}")
    n = check_count(n, "n")
    return (2 if collective == "all_reduce" else 1) * (n - 1)


def ring_time(collective: str, nbytes, n, bandwidth, alpha=0.0) -> float:
    """α–β time of one ring collective: steps·α + bytes this rank sends / β."""
    n = _check(nbytes, n, bandwidth, alpha)
    steps = ring_steps(collective, n)
    sent = (2 if collective == "all_reduce" else 1) * Fraction(n - 1, n) * Fraction(nbytes)
    return steps * alpha + float(sent) / bandwidth


def all_gather_time(nbytes, n, bandwidth, alpha=0.0) -> float:
    """Seconds to all-gather an output of `nbytes` over n ranks."""
    return ring_time("all_gather", nbytes, n, bandwidth, alpha)


def reduce_scatter_time(nbytes, n, bandwidth, alpha=0.0) -> float:
    """Seconds to reduce-scatter an input of `nbytes` over n ranks."""
    return ring_time("reduce_scatter", nbytes, n, bandwidth, alpha)


def ring_allreduce_time(nbytes, n, bandwidth, alpha=0.0) -> float:
    """Seconds for a ring all-reduce of `nbytes` over n ranks: reduce-scatter + all-gather."""
    return ring_time("all_reduce", nbytes, n, bandwidth, alpha)


def bucket_time(bucket_bytes, n, bandwidth, alpha, collective="all_reduce") -> dict:
    """One bucket: {"latency": steps·α, "transfer": sent/β, "total", "efficiency": transfer share}."""
    total = ring_time(collective, bucket_bytes, n, bandwidth, alpha)
    latency = ring_steps(collective, n) * alpha
    transfer = total - latency
    return {"latency": latency, "transfer": transfer, "total": total,
            "efficiency": transfer / total if total else 1.0}


def min_bucket_bytes(n, bandwidth, alpha, efficiency=0.9) -> float:
    """Smallest bucket whose bandwidth share reaches `efficiency`: e/(1-e) · g·α·β bytes (the same
    for all-reduce, reduce-scatter and all-gather). 0 for one rank, which sends nothing."""
    _check(0, n, bandwidth, alpha)
    if not 0 < efficiency < 1:
        raise ValueError(f"efficiency must be in (0, 1), got {efficiency!r}")
    return 0.0 if n == 1 else efficiency / (1 - efficiency) * n * alpha * bandwidth


def bucketed_time(total_bytes, bucket_bytes, n, bandwidth, alpha, collective="all_reduce") -> float:
    """A buffer of `total_bytes` reduced in ⌈total/bucket⌉ buckets, one after another (nothing
    overlapped): the latency is paid per bucket, the bytes once."""
    if not bucket_bytes > 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes!r}")
    n = _check(total_bytes, n, bandwidth, alpha)
    k = max(1, math.ceil(total_bytes / bucket_bytes))
    return k * ring_steps(collective, n) * alpha + ring_time(collective, total_bytes, n, bandwidth)


def alpha_by_axis(alpha) -> dict:
    """None -> no latency; a number -> that α on every axis; a dict -> per mesh axis."""
    if alpha is None:
        return {}
    out = dict(alpha) if isinstance(alpha, dict) else {INNER: alpha, OUTER: alpha}
    for axis, a in out.items():
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not (a >= 0 and math.isfinite(a)):
            raise ValueError(f"alpha for mesh axis {axis!r} must be a finite number of seconds >= 0, got {a!r}")
    return out


def comm_time(comm, bandwidth: dict | None = None, alpha=None) -> float:
    """Seconds per step if nothing overlaps: Σ over mesh axes of bytes sent / axis bandwidth,
    plus, with `alpha` (seconds per ring step: a number, or a dict per mesh axis), steps·α for
    every collective in `comm.ops`. `alpha=None` is the bandwidth term alone."""
    bw = {**DEFAULT_BANDWIDTH, **(bandwidth or {})}
    lat = alpha_by_axis(alpha)
    t = 0.0
    for axis in comm:
        sent = comm.axis_total(axis)
        if sent:
            if not bw.get(axis, 0) > 0:
                raise ValueError(f"no positive bandwidth for mesh axis {axis!r}")
            t += float(sent) / bw[axis]
    for op in getattr(comm, "ops", ()) if lat else ():
        t += ring_steps(op.collective, op.group) * lat.get(op.axis, 0.0)
    return t


__all__ = ["DEFAULT_BANDWIDTH", "DEFAULT_ALPHA", "ring_steps", "ring_time", "all_gather_time",
           "reduce_scatter_time", "ring_allreduce_time", "bucket_time", "min_bucket_bytes",
           "bucketed_time", "alpha_by_axis", "comm_time"]
