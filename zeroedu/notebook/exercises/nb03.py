"""Notebook 03 (ZeRO-1): 2Ψ vs 3Ψ on the wire, a broken ZeRO-1 to diagnose, and the closed forms.

Context the measure exercise reads: `runs`, notebook 03's reports keyed by
(strategy, collectives), e.g. runs["zero1", "ring"]; report.ranks[r].wire.sent is what
the kernel counted on rank r's sockets in the last optimizer step.
"""
from __future__ import annotations

from ... import theory
from ...theory import mistakes
from ...models import get_model, make_model, unit_shapes
from . import Exercise, Wrong, mistaken, example_report, register


def _on_the_wire(strategy: str, implementation: str, model="gpt-small", n=4):
    shapes = unit_shapes(make_model(get_model(model)))
    return theory.comm.on_the_wire(theory.exact_comm(strategy, shapes, n, recipe="mixed-bf16"), implementation)


def _ring_prediction() -> str:
    """2Ψ vs 3Ψ with zeroedu's ring collectives, from the closed forms of what goes on the wire."""
    a, b = _on_the_wire("zero1", "ring"), _on_the_wire("zero1_allreduce", "ring")
    return "b" if a == b else ("a" if 3 * a == 2 * b else "c")


def _wire(report, rank=0):
    return report.ranks[rank].wire.sent


def _predicted_comm(report, rank=0):
    return sum(report.ranks[rank].predicted.comm.values())


def _runs_example():
    def rep(wire, comm):
        return example_report({"wire": {"sent": wire}, "predicted": {"comm": comm}})

    return {"runs": {("zero1", "ring"): rep(9_731_436, {"all_gather": 4_863_126.0, "reduce_scatter": 4_863_126.0}),
                     ("zero1_allreduce", "ring"): rep(14_602_342, {"all_gather": 4_863_126.0,
                                                                    "all_reduce": 9_726_252.0})}}


register(
    Exercise(
        id="03.1", kind="choice", style="predict",
        prompt="Before the runs: zero1 (reduce-scatter, then all-gather) and zero1_allreduce (all-reduce, then "
               "all-gather) with zeroedu's ring collectives. What will the wire show?",
        options={"a": "zero1 sends 2/3 of zero1_allreduce's bytes (2Ψ against 3Ψ)",
                 "b": "both send the same bytes",
                 "c": "zero1 sends half of zero1_allreduce's bytes"},
        expected=lambda **_: _ring_prediction(),
        hint="a ring reduce-scatter is the first half of a ring all-reduce (notebook 01)",
        wrong=(Wrong("b", "a reduce-scatter sends half an all-reduce's bytes on a ring: ΨG against 2ΨG for the "
                          "gradients, then the same all-gather of the parameters (gloo's own reduce-scatter, an "
                          "all-reduce underneath, would show this: the table's backend rows)"),
               Wrong("c", "the parameter all-gather is the same in both; only the gradient half differs"))),
    Exercise(
        id="03.2", kind="number", style="measure",
        prompt="With zeroedu's ring collectives: how many bytes per step does rank 0 put on the wire for the "
               "all-reduce's wasted all-gather half, i.e. zero1_allreduce's wire bytes minus zero1's?",
        expected=lambda runs, **_: _wire(runs["zero1_allreduce", "ring"]) - _wire(runs["zero1", "ring"]),
        rel=1e-4, example=_runs_example,
        hint="subtract report.ranks[0].wire.sent of the two ring runs",
        wrong=(mistaken(mistakes.framing_left_out,
                        "that is the ring model's difference, (N-1)/N · ΨG; the wire also carries gloo's framing, "
                        "and the all-reduce sends more messages than the ring reduce-scatter: read the wire",
                        given=lambda runs, **_: (_predicted_comm(runs["zero1_allreduce", "ring"])
                                                 - _predicted_comm(runs["zero1", "ring"]),)),
               mistaken(mistakes.assumed_equal("difference"),
                        "with the ring collectives the two differ: 3Ψ against 2Ψ"))),
    Exercise(
        id="03.3", kind="choice", style="find-the-bug",
        prompt="BuggyZeRO1 has one mistake. Its memory, its collectives and its wire bytes equal ZeRO-1's, but "
               "its losses leave single-process training's. Which mistake is it?",
        options={"a": "it forgets to multiply the summed gradient by 1/N",
                 "b": "each owner updates its slice with the summed gradient of its neighbour's slice",
                 "c": "it skips the all-gather after the update",
                 "d": "it all-reduces the gradients instead of reduce-scattering them, so every rank updates all the slices"},
        expected=lambda **_: "b",
        hint="rule out each option by the figure it would change: bytes, replicas, or only the losses",
        wrong=(Wrong("a", "Adam divides m by √v: a constant factor N on every gradient scales both and cancels "
                          "(up to eps), so the losses would still match single-process training"),
               Wrong("c", "then no all-gather bytes would be on the wire and the comm match would be False, "
                          "and the ranks would disagree; the report shows the all-gather ran"),
               Wrong("d", "then the wire would carry 3Ψ: an all-reduce of the gradients; the report shows a "
                          "reduce-scatter, on the ring bound"))),
    Exercise(
        id="03.4", kind="number", style="formula",
        prompt="A 13B-parameter model trains with ZeRO-1 on N = 16 GPUs, mixed-bf16. How many bytes of model "
               "states does each GPU hold?",
        expected=lambda **_: theory.model_states("zero1", 13e9, 16).total,
        hint="(P + G)Ψ stays whole, KΨ is split N ways",
        wrong=(mistaken(mistakes.other_stage_states("zero1", "ddp", 13e9, 16),
                        "that is DDP's 16Ψ; ZeRO-1 splits the optimizer state N ways"),
               mistaken(mistakes.other_stage_states("zero1", "fsdp1", 13e9, 16),
                        "16Ψ/N shards everything: that is ZeRO-3; ZeRO-1 keeps the bf16 weights and gradients whole"),
               mistaken(mistakes.only_optimizer_shard("zero1", 13e9, 16),
                        "that is the optimizer shard alone; the whole bf16 weights and gradients (4Ψ) stay on every "
                        "GPU"))),
    Exercise(
        id="03.5", kind="number", style="formula",
        prompt="Same model and N: how many bytes does each GPU send per step with the all-reduce variant "
               "(zero1_allreduce), ring model, bf16 gradients and parameters?",
        expected=lambda **_: theory.comm_per_rank("zero1_allreduce", 13e9, 16).total(),
        hint="an all-reduce of S sends 2(N-1)/N · S, an all-gather of S sends (N-1)/N · S",
        wrong=(mistaken(mistakes.other_stage_comm("zero1_allreduce", "zero1", 13e9, 16),
                        "that is zero1 with a reduce-scatter (2Ψ); the all-reduce variant adds a wasted all-gather"),
               mistaken(mistakes.ring_factor_dropped("zero1_allreduce", 13e9, 16),
                        "3 × Ψ × 2 bytes drops the ring's (N-1)/N factor"))),
    Exercise(
        id="03.6", kind="number", style="formula",
        prompt="What is the smallest N for which ZeRO-1's model states of a 7B model fit in a 40 GB GPU? "
               "(Solve 4Ψ + 12Ψ/N ≤ 40 GB for N.)",
        expected=lambda **_: next(k for k in range(1, 1025) if theory.model_states("zero1", 7e9, k).total <= 40e9),
        hint="4Ψ = 28 GB stays whatever N is; the remaining 12 GB must hold 12Ψ/N",
        wrong=(mistaken(mistakes.only_optimizer_shard,
                        "12Ψ/N ≤ 40 GB forgets the 4Ψ of bf16 weights and gradients that every GPU keeps",
                        of=lambda **_: next(k for k in range(1, 1025)
                                            if mistakes.only_optimizer_shard("zero1", 7e9, k).value <= 40e9)),
               mistaken(mistakes.power_of_two_habit(7), "8 fits, but it is not the smallest: try N = 7, 28 + 12 = 40 GB"),
               mistaken(mistakes.off_by_one(7), "at N = 6: 28 + 14 = 42 GB, just over"))),
)
