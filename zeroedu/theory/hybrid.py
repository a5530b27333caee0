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

**Time model** (bandwidth term; latency optional, overlap left out, as in `theory.timing`). Its
assumptions are inputs: ``bandwidth`` (per-GPU NVLink for ``dp_shard``; per-NIC for
``dp_outer``), ``nics_per_node`` (default N: one NIC per GPU, as in DGX-class nodes),
``nic_bandwidth`` (per NIC, default ``bandwidth["dp_outer"]`` = 50 GB/s, the line rate of
400 Gb/s; NCCL achieves 46-48 GB/s per NDR NIC: nccl-tests issue #290), ``alpha`` (seconds per ring
step, default none; a number or a dict per axis) with ``units`` (collectives per step scale with
the number of FSDP units), and ``flat_ring``, how flat ZeRO-3's ring crosses the boundary:

* ``"single"`` (default; the pessimistic reading): one ring over the M·N ranks in lockstep.
  Every one of its g - 1 rounds waits for the round's slowest hop, and M of the ring's hops
  cross domains over one NIC each, so the whole collective runs at one NIC's speed:
  t = (g-1)/g · S / B_nic, although most bytes travel over NVLink.
* ``"striped"``: NCCL runs several rings (channels) and stripes them over the node's NICs. Per
  collective each node sends, across its boundary, one ring hop's worth, (g-1)/g · S: exactly one
  rank's sent bytes. Striped over the node's NICs that takes sent / (nics · B_nic), while each GPU
  pushes its own sent bytes over NVLink in sent / B_nvlink; pipelined, the slower sets the pace:
  t = sent / min(B_nvlink, nics · B_nic). With 8 NICs of 50 GB/s that is 400 GB/s, close to
  NVLink, as NVIDIA's measurements suggest (NVIDIA/nccl issue #812: eight 200 Gb/s NICs per
  DGX-A100 node give 192 GB/s all-reduce bus bandwidth across nodes, about the NICs' sum).

The hybrids' outer collectives are rings over M ranks, one per inner rank; the N inner ranks of
a node share its NICs, so each gets nics · B_nic / N (B_nic with one NIC per GPU), striped or
not. Latency: steps·α per collective and unit (`timing.ring_steps`), α of the slow link for any
ring that crosses domains.

Quick check, 7B, N = 8, M = 2, ``mixed-bf16``, defaults: flat ZeRO-3 sends 3 · 15/16 · 14 GB =
39.375 GB per rank per step: 787.5 ms on a single ring at 50 GB/s, 98.4 ms striped over 8 NICs
(39.375 GB / 400 GB/s); HSDP 81.7 ms inside (36.75 GB / 450 GB/s) + 35 ms across (1.75 GB /
50 GB/s) = 116.7 ms. Bytes across the boundary: flat 4.92 GB per rank vs HSDP 1.75 GB, 2.8x more.

**Cross-domain bytes per rank per step**: bytes crossing the domain boundary, averaged over all
ranks. For a ring of g = M·N ranks each of the M boundary hops carries the full (g-1)/g · S of
a collective, so per rank that is M/g · (g-1)/g · S = (g-1)/g · S / N. For HSDP/HFSDP it is the
``dp_outer`` axis's bytes (every rank sends over its own NIC).

Quick check, 7B, N = 8, M = 2, ``mixed-bf16``: flat ZeRO-3 7 GB per rank, HSDP 14 GB,
HFSDP 8.75 GB; HSDP and HFSDP each move 1.75 GB per rank across domains per step.
"""
from __future__ import annotations

from fractions import Fraction

from ..kinds import DP_OUTER as OUTER, DP_SHARD as INNER
from .comm import comm_per_rank
from .inputs import check_count, check_psi
from .memory import model_states
from .timing import DEFAULT_BANDWIDTH, alpha_by_axis, ring_steps

LAYOUTS = ("flat_zero3", "hsdp", "hfsdp")
FLAT_RINGS = ("single", "striped")  # one lockstep ring over one NIC, or rings striped over all NICs


def _bandwidth(bandwidth: dict | None) -> dict:
    bw = {**DEFAULT_BANDWIDTH, **(bandwidth or {})}
    for axis in (INNER, OUTER):
        if not bw.get(axis, 0) > 0:
            raise ValueError(f"bandwidth for mesh axis {axis!r} must be > 0 bytes/s, got {bw.get(axis)!r}")
    return bw


def _links(n, bandwidth, nics_per_node, nic_bandwidth) -> dict:
    """{"nvlink": per-GPU NVLink, "nic": one NIC, "node": all the node's NICs, "outer_rank": what
    one inner rank gets across domains} in bytes/s."""
    bw = _bandwidth(bandwidth)
    nics = n if nics_per_node is None else check_count(nics_per_node, "nics_per_node")
    nic = bw[OUTER] if nic_bandwidth is None else nic_bandwidth
    if not nic > 0:
        raise ValueError(f"nic_bandwidth must be > 0 bytes/s, got {nic_bandwidth!r}")
    return {"nvlink": bw[INNER], "nic": nic, "node": nics * nic, "outer_rank": nics * nic / n}


def _latency(comm, alpha, units, cross: bool) -> float:
    """units × Σ steps·α over `comm.ops`; a ring that crosses domains pays the slow link's α."""
    lat = alpha_by_axis(alpha)
    if not lat:
        return 0.0
    units = check_count(units, "units")
    a_of = lambda axis: lat.get(OUTER if cross else axis, 0.0)
    return units * sum(ring_steps(op.collective, op.group) * a_of(op.axis) for op in comm.ops)


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


def step_comm_time(layout: str, psi, n, m, recipe=None, bandwidth: dict | None = None,
                   nics_per_node: int | None = None, nic_bandwidth=None, alpha=None,
                   flat_ring: str = "single", units: int = 1) -> float:
    """Seconds of communication per step (nothing overlapped), by the time model of the module
    docstring. Defaults reproduce the single-ring reading (7B, 8 x 2: flat 787.5 ms, HSDP 116.7)."""
    psi, n, m = check_psi(psi), check_count(n, "n"), check_count(m, "m")
    if flat_ring not in FLAT_RINGS:
        raise ValueError(f"flat_ring must be one of {', '.join(FLAT_RINGS)}, got {flat_ring!r}")
    link = _links(n, bandwidth, nics_per_node, nic_bandwidth)
    if layout == "flat_zero3":
        flat = flat_zero3_cross_domain(psi, n, m, recipe)
        sent = float(flat["sent"])
        if m == 1:  # inside one domain the ring never leaves NVLink
            t = sent / link["nvlink"]
        elif flat_ring == "single":  # lockstep: paced by the one NIC on each boundary hop
            t = sent / link["nic"]
        else:  # striped over the node's NICs; NVLink or the NICs, whichever is slower
            t = sent / min(link["nvlink"], link["node"])
        return t + _latency(flat["comm"], alpha, units, cross=m > 1)
    if layout in ("hsdp", "hfsdp"):
        c = comm_per_rank(layout, psi, n, m, recipe)
        t = float(c.axis_total(INNER)) / link["nvlink"] + float(c.axis_total(OUTER)) / link["outer_rank"]
        return t + _latency(c, alpha, units, cross=False)
    raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")


def cross_domain_table(psi, n, m, recipe=None, bandwidth: dict | None = None,
                       nics_per_node: int | None = None, nic_bandwidth=None, alpha=None,
                       flat_ring: str = "single", units: int = 1) -> list[dict]:
    """One row per layout (flat ZeRO-3 over M·N, HSDP, HFSDP) for an M × N cluster.

    Each row: ``layout``, ``ranks``, ``bytes_per_rank`` (model states), ``sent_per_rank`` (all
    bytes one rank sends per step), ``cross_domain_per_rank``, ``comm_seconds`` (the reading
    `flat_ring` picks), ``comm_seconds_single_ring`` and ``comm_seconds_striped`` (both readings
    of the time model, module docstring; they differ only for flat ZeRO-3 across domains), and
    ``outer_collectives_per_unit`` (how many collectives per unit and step use the slow link: all
    three of flat ZeRO-3's, on the critical path of forward and backward; one or two for the
    hybrids, once per step after backward). Byte figures are exact Fractions.
    """
    psi, n, m = check_psi(psi), check_count(n, "n"), check_count(m, "m")
    model = dict(bandwidth=bandwidth, nics_per_node=nics_per_node, nic_bandwidth=nic_bandwidth,
                 alpha=alpha, units=units)
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
        times = {r: step_comm_time(layout, psi, n, m, recipe, flat_ring=r, **model) for r in FLAT_RINGS}
        if flat_ring not in times:
            raise ValueError(f"flat_ring must be one of {', '.join(FLAT_RINGS)}, got {flat_ring!r}")
        rows.append({
            "layout": layout,
            "world_size": n * m,
            "bytes_per_rank": states.total,
            "sent_per_rank": sent,
            "cross_domain_per_rank": cross_domain_bytes(layout, psi, n, m, recipe),
            "comm_seconds": times[flat_ring],
            "comm_seconds_single_ring": times["single"],
            "comm_seconds_striped": times["striped"],
            "outer_collectives_per_unit": per_unit if m > 1 else 0,
        })
    return rows


__all__ = ["LAYOUTS", "FLAT_RINGS", "cross_domain_table", "cross_domain_bytes", "step_comm_time",
           "flat_zero3_cross_domain"]
