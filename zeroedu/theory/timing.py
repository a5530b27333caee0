"""Time from bytes: the bandwidth term of the ring model (latency and overlap left out).

A ring collective over n ranks moves data in n-1 rounds of S/n bytes each, so with per-link
bandwidth B (bytes/s)::

    all_gather(S) = reduce_scatter(S) = (n-1)/n · S / B
    all_reduce(S) = 2 (n-1)/n · S / B

That is "bytes this rank sends / B", so `comm_time` just divides each mesh axis's bytes by that
axis's bandwidth. Defaults are H100/H200 class: 450 GB/s per GPU on NVLink inside a domain
(``dp_shard``) and 50 GB/s (400 Gb/s InfiniBand) across domains (``dp_outer``).
"""
from __future__ import annotations

from fractions import Fraction

from ..catalog import INNER, OUTER
from .inputs import check_count

DEFAULT_BANDWIDTH = {INNER: 450e9, OUTER: 50e9}


def _check(nbytes, n, bandwidth) -> int:
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth!r}")
    return check_count(n, "n")


def all_gather_time(nbytes, n, bandwidth) -> float:
    """Seconds to all-gather an output of `nbytes` over n ranks."""
    n = _check(nbytes, n, bandwidth)
    return float(Fraction(n - 1, n) * Fraction(nbytes)) / bandwidth


def reduce_scatter_time(nbytes, n, bandwidth) -> float:
    """Seconds to reduce-scatter an input of `nbytes` over n ranks."""
    return all_gather_time(nbytes, n, bandwidth)


def ring_allreduce_time(nbytes, n, bandwidth) -> float:
    """Seconds for a ring all-reduce of `nbytes` over n ranks: reduce-scatter + all-gather."""
    return 2 * all_gather_time(nbytes, n, bandwidth)


def comm_time(comm, bandwidth: dict | None = None) -> float:
    """Seconds per step if nothing overlaps: Σ over mesh axes of bytes sent / axis bandwidth."""
    bw = {**DEFAULT_BANDWIDTH, **(bandwidth or {})}
    t = 0.0
    for axis in comm:
        sent = comm.axis_total(axis)
        if sent:
            if not bw.get(axis, 0) > 0:
                raise ValueError(f"no positive bandwidth for mesh axis {axis!r}")
            t += float(sent) / bw[axis]
    return t


__all__ = ["DEFAULT_BANDWIDTH", "all_gather_time", "reduce_scatter_time", "ring_allreduce_time",
           "comm_time"]
