"""Notebook 05 (ZeRO-2): bytes per GPU, what the wire carries compared with ZeRO-1, gradient
accumulation's price, and a ZeRO-2 that loses micro-batches."""
from __future__ import annotations

from ... import theory
from ...theory import mistakes
from . import Exercise, Wrong, mistaken, example_report, register


def _r0(report, key: str):
    return getattr(report.ranks[0].measured, key)


def _fake(total: int, grad: int, comm: dict, wire: int):
    return example_report({"measured": {"total": total, "grad": grad, "comm": comm}, "wire": {"sent": wire}})


def _example_pair() -> dict:
    # gpt-small on N = 4, mixed-bf16: ZeRO-1 keeps the full bf16 gradient, ZeRO-2 a quarter of it
    return {"zero1": _fake(22_694_588, 6_484_168, {}, 0), "zero2": _fake(17_831_462, 1_621_042, {}, 0)}


def _example_k4() -> dict:
    comm = {"all_gather": 4_863_126.0, "reduce_scatter": 19_452_504.0}
    return {"report": _fake(17_831_462, 1_621_042, comm, 24_335_190)}


def _reduction_share(report) -> float:
    """The reduce-scatters' ring-model bytes over the wire's count (rank 0, the last step)."""
    return report.ranks[0].measured.comm["reduce_scatter"] / report.ranks[0].wire.sent


def _ratio(strategy: str, k: int) -> int:
    """Gradient-reduction bytes per optimizer step at K micro-batches over K = 1 (closed form)."""
    def grads(kk):
        return theory.comm_per_rank(strategy, 1e9, 8, micro_batches=kk).by_collective()["reduce_scatter"]
    return int(grads(k) / grads(1))


def _accumulation_answer() -> str:
    z1, z2 = _ratio("zero1", 4), _ratio("zero2", 4)
    return {(1, 1): "a", (4, 4): "b", (1, 4): "c", (4, 1): "d"}[(z1, z2)]


register(
    Exercise(
        id="05.1", kind="number", style="formula",
        prompt="A 30B-parameter model trains with ZeRO-2 on N = 64 GPUs, mixed-bf16 (P, G, K = 2, 2, 12 "
               "bytes per parameter). How many bytes of model states does each GPU hold?",
        expected=lambda: theory.model_states("zero2", 30e9, 64).total,
        hint="only the bf16 parameters stay whole; gradients and optimizer state are cut N ways.",
        wrong=(mistaken(mistakes.other_stage_states("zero2", "zero1", 30e9, 64),
                        "that is ZeRO-1: it keeps the whole gradient; ZeRO-2 keeps GΨ/N"),
               mistaken(mistakes.other_stage_states("zero2", "fsdp1", 30e9, 64),
                        "that is ZeRO-3: ZeRO-2 still keeps every parameter whole"),
               mistaken(mistakes.missing_gradients("zero2", 30e9, 64),
                        "the gradient slice is missing: each rank keeps GΨ/N of it"),
               mistaken(mistakes.other_stage_states("zero2", "ddp", 30e9, 64), "that is DDP: nothing sharded")),
    ),
    Exercise(
        id="05.2", kind="choice", style="predict",
        prompt="Before the run: ZeRO-2 holds far less gradient memory than ZeRO-1. How many bytes does each "
               "rank send per step, compared with ZeRO-1?",
        options={"a": "the same: one reduce-scatter of the gradients and one all-gather of the parameters",
                 "b": "more: launching one reduce-scatter per unit during backward costs extra bytes on top of the one all-gather",
                 "c": "half: the gradients are sharded, so only half of them travel",
                 "d": "1.5 times: the gradient slices must be all-gathered again before the step"},
        expected=lambda: "a" if theory.comm_per_rank("zero2", 1e9, 8).total() ==
        theory.comm_per_rank("zero1", 1e9, 8).total() else "b",
        hint="what ZeRO-1 already sends is a reduce-scatter of the gradients; what does ZeRO-2 change about it?",
        wrong=(Wrong("b", "splitting a reduce-scatter by unit moves the same bytes in more, smaller messages"),
               Wrong("c", "ZeRO-1 already reduce-scatters: every rank only ever received its own slice"),
               Wrong("d", "nobody reads another rank's gradient slice; the updated parameters are gathered, "
                          "as in ZeRO-1")),
    ),
    Exercise(
        id="05.3", kind="number", style="measure",
        prompt="From the two reports (`zero1`, `zero2`): how many bytes does rank 0 of ZeRO-2 save at the "
               "optimizer step against ZeRO-1 (the measured totals)?",
        expected=lambda zero1, zero2: _r0(zero1, "total") - _r0(zero2, "total"),
        hint="report.ranks[0].measured.total is what the ledger counted at the optimizer step.",
        wrong=(mistaken(mistakes.own_shard_forgotten,
                        "that is ZeRO-1's whole gradient; ZeRO-2 still keeps its own 1/N slice of it",
                        given=lambda zero1, zero2: (_r0(zero1, "grad"),)),
               mistaken(mistakes.assumed_equal("difference"), "the totals differ: look at the grad category"),
               mistaken(mistakes.sign_flipped, "the sign: ZeRO-2 is the smaller one",
                        given=lambda zero1, zero2: (_r0(zero1, "total") - _r0(zero2, "total"),))),
        example=_example_pair,
    ),
    Exercise(
        id="05.4", kind="choice", style="predict",
        prompt="Before the accumulation runs: with K = 4 micro-batches per optimizer step, how many bytes of "
               "gradient reduce-scatter does each rank send per optimizer step, relative to K = 1?",
        options={"a": "1x for both: gradients are summed locally and reduced once at the step",
                 "b": "4x for both: every backward reduces its gradients",
                 "c": "ZeRO-1 1x, ZeRO-2 4x: ZeRO-2's full gradient does not outlive one backward",
                 "d": "ZeRO-1 4x, ZeRO-2 1x: ZeRO-2 keeps only its slices of the gradients, so it can wait for the step to reduce them"},
        expected=_accumulation_answer,
        hint="where does each strategy keep the sum of the micro-batches' gradients until the step?",
        wrong=(Wrong("a", "ZeRO-2 frees each unit's full gradient right after its reduce-scatter, so it "
                          "cannot sum the next micro-batch into it: it must reduce every micro-batch"),
               Wrong("b", "ZeRO-1 keeps the full gradient buffer all step: the micro-batches sum into it "
                          "and one reduce-scatter at the step suffices"),
               Wrong("d", "the other way round: the slice can only receive reduced sums, so ZeRO-2 reduces "
                          "every micro-batch")),
    ),
    Exercise(
        id="05.5", kind="number", style="measure",
        prompt="From the ZeRO-2 run with K = 4 (`report`): what share of the bytes rank 0 put on the wire in its "
               "optimizer step (kernel counters) is gradient reduction, the reduce-scatters' payload? Before you "
               "divide, say what the closed forms make it.",
        expected=_reduction_share, example=_example_k4, rel=1e-4,
        hint="K reduce-scatters of the gradients and one all-gather of the parameters, each the same size: "
             "K/(K + 1) of the payload, a little less of the wire, which adds each message's framing",
        wrong=(mistaken(mistakes.complement, "that is the all-gather's share (and the framing's)",
                        given=lambda report: (_reduction_share(report),)),
               mistaken(mistakes.part_over_rest, "that divides by the rest of the wire, not by all of it",
                        given=lambda report: (_reduction_share(report),)),
               mistaken(mistakes.one_part_only, "that is the reduce-scatters' bytes: divide by the wire",
                        given=lambda report: (report.ranks[0].measured.comm, "reduce_scatter"))),
    ),
    Exercise(
        id="05.6", kind="choice", style="find-the-bug",
        prompt="`ZeRO2Broken` trained with K = 2 micro-batches (fp32): its memory and its bytes match the "
               "closed forms, its losses do not match single-process training. Which mistake is it?",
        options={"a": "it never frees the full gradient buffers",
                 "b": "it all-reduces the gradients instead of reduce-scattering them, then keeps only its own shard of the sum",
                 "c": "each micro-batch's reduce-scatter overwrites the shard instead of adding to it",
                 "d": "it skips the all-gather of the updated parameters"},
        expected=lambda: "c",
        hint="for each option, which figure of the report would show it: memory, bytes, or losses only?",
        wrong=(Wrong("a", "full buffers kept alive would show in the grad bytes at the optimizer step, "
                          "which match ZeRO-2's closed form"),
               Wrong("b", "an all-reduce sends twice a reduce-scatter's bytes: the ring model and the wire "
                          "would not match"),
               Wrong("d", "no all-gather would show on the wire (no all_gather bytes), and the ranks would "
                          "train on different parameters")),
    ),
)
