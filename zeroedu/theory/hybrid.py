"""Two domains or more: flat ZeRO-3 across all of them vs HSDP vs HFSDP, in bytes and seconds.

A *domain* is a group of N ranks joined by a fast link (NVLink inside a node: ~450 GB/s per
GPU on H100/H200); M domains are joined by a slow one (one 400 Gb/s NIC per GPU: ~50 GB/s).
The mesh is M × N: ``dp_shard`` (size N) runs inside a domain, ``dp_outer`` (size M) across.

Three ways to use the M·N ranks (ZeRO §5.1 for the per-rank bytes; FSDP paper §3.2 for hybrid
sharding; Megatron-FSDP's per-axis levels for HFSDP):

* **flat ZeRO-3 over M·N** (``fsdp1`` with n = M·N): smallest state, 16Ψ/(MN) with
  ``mixed-bf16``, but every layer's all-gather (forward and backward) and reduce-scatter is a
  ring over all M·N ranks, and that ring crosses the domain boundary.
* **HSDP**: ZeRO-3 inside each domain, the domains are replicas: (P+G+K)Ψ/N per rank; the only
  cross-domain traffic is one all-reduce of each rank's (Ψ/N)G gradient shard per step.
* **HFSDP**: as HSDP, plus ZeRO-1 across domains: the optimizer state is cut M times more,
  (P+G)Ψ/N + KΨ/(NM); the outer all-reduce becomes a reduce-scatter of the gradient shard plus
  an all-gather of the updated parameter shard: the same bytes as HSDP's all-reduce when P = G.

**Time model** (bandwidth term only; latency and overlap left out, as in `theory.timing`).
A collective on one mesh axis sends `sent` bytes per rank over that axis's link: t = sent / B.
For flat ZeRO-3 the ring's M·N ranks move in lockstep: every one of its g - 1 rounds waits for
the round's slowest hop, and M of the ring's hops cross domains, so the whole collective runs
at the slow link's speed: t = (g-1)/g · S / B_outer, although most bytes travel over NVLink.
This is the pessimistic single-ring picture; NCCL can stripe rings over a node's several NICs
and do better, which is why measured cross-node bus bandwidth sits between the two links.

**Cross-domain bytes per rank per step**: bytes crossing the domain boundary, averaged over all
ranks. For a ring of g = M·N ranks each of the M boundary hops carries the full (g-1)/g · S of
a collective, so per rank that is M/g · (g-1)/g · S = (g-1)/g · S / N. For HSDP/HFSDP it is the
``dp_outer`` axis's bytes (every rank sends over its own NIC).

Quick check, 7B, N = 8, M = 2, ``mixed-bf16``: flat ZeRO-3 7 GB per rank, HSDP 14 GB,
HFSDP 8.75 GB; HSDP and HFSDP each move 1.75 GB per rank across domains per step.
"""
from __future__ import annotations

from fractions import Fraction

from ..catalog import INNER, OUTER
from .comm import comm_per_rank
from .inputs import check_count, check_psi
from .memory import model_states
from .timing import DEFAULT_BANDWIDTH

LAYOUTS = ("flat_zero3", "hsdp", "hfsdp")


def _bandwidth(bandwidth: dict | None) -> dict:
    bw = {**DEFAULT_BANDWIDTH, **(bandwidth or {})}
    for axis in (INNER, OUTER):
        if not bw.get(axis, 0) > 0:
            raise ValueError(f"bandwidth for mesh axis {axis!r} must be > 0 bytes/s, got {bw.get(axis)!r}")
    return bw


def flat_zero3_cross_domain(psi, n, m, recipe=None, reshard_after_forward=True) -> dict:
    """Flat ZeRO-3 over M·N ranks: its per-rank CommBytes (all on one M·N ring) and their total."""
    c = comm_per_rank("fsdp1", psi, n * m, recipe=recipe,
                      reshard_after_forward=reshard_after_forward)
    return {"comm": c, "sent": c.total()}


def cross_domain_bytes(layout: str, psi, n, m, recipe=None) -> Fraction:
    """Bytes per rank per step that cross the domain boundary (averaged over ranks)."""
    psi, n, m = check_psi(psi), check_count(n, "n"), check_count(m, "m")
    if layout == "flat_zero3":
        if m == 1:
            return Fraction(0)
        # M boundary hops each carry every byte of the ring; spread over the M·N ranks.
        return flat_zero3_cross_domain(psi, n, m, recipe)["sent"] / n
    if layout in ("hsdp", "hfsdp"):
        return comm_per_rank(layout, psi, n, m, recipe).axis_total(OUTER)
    raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")


def step_comm_time(layout: str, psi, n, m, recipe=None, bandwidth: dict | None = None) -> float:
    """Seconds of communication per step (nothing overlapped), by the lockstep ring model."""
    psi, n, m = check_psi(psi), check_count(n, "n"), check_count(m, "m")
    bw = _bandwidth(bandwidth)
    if layout == "flat_zero3":
        sent = flat_zero3_cross_domain(psi, n, m, recipe)["sent"]
        # Inside one domain the ring never leaves NVLink; across domains it is paced by the NIC.
        return float(sent) / (bw[OUTER] if m > 1 else bw[INNER])
    if layout in ("hsdp", "hfsdp"):
        c = comm_per_rank(layout, psi, n, m, recipe)
        return sum(float(c.axis_total(a)) / bw[a] for a in (INNER, OUTER))
    raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")


def cross_domain_table(psi, n, m, recipe=None, bandwidth: dict | None = None) -> list[dict]:
    """One row per layout (flat ZeRO-3 over M·N, HSDP, HFSDP) for an M × N cluster.

    Each row: ``layout``, ``ranks``, ``bytes_per_rank`` (model states), ``sent_per_rank`` (all
    bytes one rank sends per step), ``cross_domain_per_rank`` and ``comm_seconds`` (see the
    module docstring for both models), and ``outer_collectives_per_unit`` (how many collectives
    per unit and step use the slow link: all three of flat ZeRO-3's, on the critical path of
    forward and backward; one or two for the hybrids, once per step after backward). Byte figures are exact Fractions.
    """
    psi, n, m = check_psi(psi), check_count(n, "n"), check_count(m, "m")
    bw = _bandwidth(bandwidth)
    rows = []
    for layout in LAYOUTS:
        if layout == "flat_zero3":
            states = model_states("fsdp1", psi, n * m, recipe=recipe)
            sent = flat_zero3_cross_domain(psi, n, m, recipe)["sent"]
            per_unit = 3  # two all-gathers and a reduce-scatter, all across the boundary
        else:
            states = model_states(layout, psi, n, m, recipe=recipe)
            sent = comm_per_rank(layout, psi, n, m, recipe).total()
            per_unit = 1 if layout == "hsdp" else 2
        rows.append({
            "layout": layout,
            "ranks": n * m,
            "bytes_per_rank": states.total,
            "sent_per_rank": sent,
            "cross_domain_per_rank": cross_domain_bytes(layout, psi, n, m, recipe),
            "comm_seconds": step_comm_time(layout, psi, n, m, recipe, bw),
            "outer_collectives_per_unit": per_unit if m > 1 else 0,
        })
    return rows


__all__ = ["LAYOUTS", "cross_domain_table", "cross_domain_bytes", "step_comm_time",
           "flat_zero3_cross_domain"]
