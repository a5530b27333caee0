"""Notebook 10 (hybrid sharding): HFSDP's bytes per GPU, which axis carries what on the wire,
two broken hybrids, the time model's two readings, cross-domain bytes and the smallest M."""
from __future__ import annotations

from ... import theory
from ...theory import mistakes
from ...theory.hybrid import cross_domain_bytes, step_comm_time
from ...reports import RunReport
from . import Exercise, Wrong, mistaken, example_report, register

GB = 10**9


def _outer_share(report: RunReport) -> float:
    w = report.ranks[0].wire
    return w.by_axis["dp_outer"] / w.sent


def _example_hsdp_report() -> dict:
    # what notebook 10's HSDP run on gpt-small (2 x 2 mesh) reports for rank 0's wire
    return example_report({"wire": {"sent": 12974384, "by_axis": {"dp_outer": 3245540, "dp_shard": 9728844}}})


def _faster_striped() -> str:
    flat = step_comm_time("flat_zero3", 7e9, 8, 2, flat_ring="striped")
    hsdp = step_comm_time("hsdp", 7e9, 8, 2, flat_ring="striped")
    return "a" if flat < hsdp else ("b" if hsdp < flat else "c")


def _smallest_m(limit=6 * GB) -> int:
    return next(m for m in range(1, 65) if theory.model_states("hfsdp", 7e9, 8, m).total <= limit)


BUG_OPTIONS = {
    "a": "the outer all-reduce runs on each unit's full (unsharded) gradient instead of the 1/N shard "
         "that the inner reduce-scatter leaves",
    "b": "the outer all-gather of the updated parameter sub-chunk after the optimizer step is missing, so the "
         "replicas drift apart from the second step on",
    "c": "the summed gradient is divided by N instead of N·M",
    "d": "the two mesh axes are swapped: the inner reduce-scatter runs over dp_outer and the outer all-reduce "
         "over dp_shard, so each collective crosses the other link",
}

register(
    Exercise(
        id="10.1", kind="number", style="formula",
        prompt="HFSDP with mixed-bf16, Ψ = 13e9, N = 8 ranks per domain, M = 4 domains: model-state bytes "
               "per GPU?",
        expected=lambda: theory.model_states("hfsdp", 13e9, 8, 4).total,
        hint="parameters and gradients are sharded N ways (4Ψ/N), the optimizer state N·M ways (12Ψ/(N·M)).",
        wrong=(mistaken(mistakes.other_stage_states("hfsdp", "hsdp", 13e9, 8, 4),
                        "that is HSDP, 16Ψ/N: HFSDP also splits the optimizer state across the M domains"),
               mistaken(mistakes.other_stage_states("hfsdp", "fsdp1", 13e9, 32),
                        "that is flat ZeRO-3 over all 32 ranks: HFSDP shards parameters and gradients only "
                        "inside a domain, N ways"),
               mistaken(mistakes.optimizer_over_m_only(13e9, 8, 4),
                        "the optimizer state is split N·M = 32 ways, not M ways")),
    ),
    Exercise(
        id="10.2", kind="choice", style="predict",
        prompt="Before the run: on the 2 x 2 mesh with mixed-bf16, which sends more bytes per rank per step "
               "over dp_outer (the axis that crosses domains), HSDP or HFSDP?",
        options={"a": "HSDP: an all-reduce sends 2(M-1)/M of the gradient shard",
                 "b": "HFSDP: it runs two collectives on dp_outer instead of one",
                 "c": "the same payload: HFSDP's reduce-scatter plus all-gather equal HSDP's all-reduce when "
                      "parameters and gradients have the same dtype (only gloo's framing differs, a few kB)",
                 "d": "neither: only dp_shard carries traffic"},
        expected=lambda: "c",
        hint="an all-reduce is a reduce-scatter plus an all-gather; HFSDP puts the optimizer step in between.",
        wrong=(Wrong("a", "HFSDP also moves the shard twice: (M-1)/M of it reduce-scattered, (M-1)/M of the "
                          "updated parameters all-gathered"),
               Wrong("b", "two collectives of (M-1)/M each send what one all-reduce of 2(M-1)/M sends"),
               Wrong("d", "the replicas of a shard live in different domains: their gradients must be summed "
                          "over dp_outer")),
    ),
    Exercise(
        id="10.3", kind="number", style="measure",
        prompt="From reports['hsdp']: what fraction of rank 0's bytes on the wire per step went over "
               "dp_outer (report.ranks[0].wire)?",
        expected=_outer_share,
        rel=1e-2,
        example=lambda: {"report": _example_hsdp_report()},
        hint="wire['by_axis']['dp_outer'] divided by wire['sent'].",
        wrong=(mistaken(mistakes.complement, "that is dp_shard's share, the traffic that stays inside a domain",
                        given=lambda report: (_outer_share(report),)),
               mistaken(mistakes.one_over_m(2), "1/M is not it: the inner axis moves parameters twice and gradients "
                                                "once, the outer axis only a 1/N gradient shard"),
               mistaken(mistakes.part_over_rest,
                        "that is dp_outer divided by dp_shard; the question asks for dp_outer's share of the total",
                        given=lambda report: (_outer_share(report),))),
    ),
    Exercise(
        id="10.4", kind="choice", style="find-the-bug",
        prompt="`BuggyHSDP` trained on the 2 x 2 mesh (report `bug_a`). Which mistake is in it?",
        options=BUG_OPTIONS,
        expected=lambda: "a",
        hint="compare the wire by axis with the prediction, and the losses with single-process training.",
        wrong=(Wrong("b", "HSDP has no outer all-gather; and the losses equal single-process training, so "
                          "the replicas did not drift apart"),
               Wrong("c", "a wrong divisor changes every update: the losses would leave the reference, "
                          "but they match it"),
               Wrong("d", "dp_shard carries exactly its predicted collectives and bytes; only dp_outer is off")),
    ),
    Exercise(
        id="10.5", kind="choice", style="find-the-bug",
        prompt="`BuggyHFSDP` trained on the 2 x 2 mesh in fp32 (report `bug_b`). Which mistake is in it?",
        options=BUG_OPTIONS,
        expected=lambda: "b",
        hint="which collective is missing from dp_outer, and what do the losses do?",
        wrong=(Wrong("a", "a full-gradient outer all-reduce would add bytes on dp_outer; here dp_outer "
                          "carries fewer than predicted"),
               Wrong("c", "a wrong divisor leaves the wire as predicted; here a whole collective is missing"),
               Wrong("d", "dp_shard carries exactly its predicted collectives and bytes")),
    ),
    Exercise(
        id="10.6", kind="choice", style="predict",
        prompt="7B on 2 domains of 8 GPUs, 8 NICs of 50 GB/s per node, NVLink 450 GB/s. If flat ZeRO-3's "
               "rings are striped over all 8 NICs of a node (flat_ring='striped'), which spends less time "
               "communicating per step, nothing overlapped?",
        options={"a": "flat ZeRO-3 over 16 ranks", "b": "HSDP (8 x 2)", "c": "the same: both wait on the slow link for the same bytes"},
        expected=_faster_striped,
        hint="striped: flat ZeRO-3 runs at min(NVLink, 8 NICs x 50 GB/s) = 400 GB/s; HSDP pays NVLink inside "
             "and one NIC's 50 GB/s per rank for its outer all-reduce.",
        wrong=(Wrong("b", "true on the single-ring reading (787.5 ms); striped over 8 NICs flat ZeRO-3 takes "
                          "39.4 GB / 400 GB/s = 98 ms against HSDP's 82 + 35 = 117 ms"),
               Wrong("c", "work out both: 39.375 GB at 400 GB/s vs 36.75 GB at 450 GB/s + 1.75 GB at 50 GB/s")),
    ),
    Exercise(
        id="10.7", kind="number", style="formula",
        prompt="HSDP, mixed-bf16, Ψ = 7e9, N = 8, M = 4: bytes per rank per step that cross domains?",
        expected=lambda: cross_domain_bytes("hsdp", 7e9, 8, 4),
        hint="an all-reduce of the rank's Ψ/N-element bf16 gradient shard over M ranks sends 2(M-1)/M of it.",
        wrong=(mistaken(mistakes.other_mode, "that is M = 2: with 4 domains the ring sends 2·3/4 of the shard, "
                                             "not 2·1/2",
                        given=lambda: (cross_domain_bytes("hsdp", 7e9, 8, 2), "M = 2")),
               mistaken(mistakes.whole_buffer_sent("all_reduce", 7e9 / 8 * 2, 4),
                        "a ring all-reduce sends 2(M-1)/M of the buffer, not twice all of it"),
               mistaken(mistakes.elements_for_bytes(2 * 3 / 4 * 7e9 / 8 * 2, 2),
                        "that counts elements; bf16 has 2 bytes per element")),
    ),
    Exercise(
        id="10.8", kind="number", style="formula",
        prompt="7B, N = 8, mixed-bf16: the smallest M for which HFSDP's model states fit in 6 GB per GPU?",
        expected=_smallest_m,
        rel=0,
        hint="4Ψ/N = 3.5 GB stays whatever M is; 12Ψ/(N·M) = 10.5 GB / M must fit in what is left.",
        wrong=(mistaken(mistakes.off_by_one(5), "at M = 4: 3.5 + 10.5/4 = 6.125 GB, just over 6 GB"),
               mistaken(mistakes.power_of_two_habit(5), "8 fits, but it is not the smallest: 3.5 + 10.5/5 = 5.6 GB"),
               mistaken(mistakes.optimizer_over_m_only,
                        "that splits the optimizer state M ways only; it is split over all N·M ranks",
                        of=lambda: next(m for m in range(1, 1025)
                                        if mistakes.optimizer_over_m_only(7e9, 8, m).value <= 6 * GB))),
    ),
)
