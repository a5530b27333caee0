"""Notebook 04 (Megatron's distributed optimizer): 6Ψ + 12Ψ/N, what fp32 gradients cost on the
wire, gradient accumulation into the fp32 buffer, and a distributed optimizer that reduces in bf16."""
from __future__ import annotations

from ... import theory
from ...reports import RunReport
from ...theory import mistakes
from . import Exercise, Wrong, mistaken, example_records, example_report, register

PSI_13B = 13e9


def _share(report: RunReport, rank: int = 0) -> float:
    comm = report.ranks[rank].measured.comm
    return comm["reduce_scatter"] / (comm["reduce_scatter"] + comm["all_gather"])


def _reduce_scatters(report: RunReport, rank: int = 0) -> int:
    last = report.steps - 1
    return len(report.ranks[rank].timeline.comm_of(step=last, op="reduce_scatter"))


def _example_comm() -> dict:
    # gpt-small, megatron-bf16, N = 4: the padded buffers hold 3,242,084 elements
    return {"report": example_report({"measured": {"comm": {"reduce_scatter": 9726252.0, "all_gather": 4863126.0}}})}


def _example_accumulation() -> dict:
    return {"report": example_report({"timeline": {"comm": example_records(*["reduce_scatter"] * 6, *["all_gather"] * 6)}},
                                     steps=2)}


register(
    Exercise(
        id="04.1", kind="number", style="formula",
        prompt="Bytes of model states per GPU for Ψ = 13e9 parameters on N = 16 with Megatron's distributed "
               "optimizer and `megatron-bf16` (bf16 weights, fp32 gradients, fp32 master, m, v)?",
        expected=lambda: theory.model_states("megatron_distopt", PSI_13B, 16).total,
        hint="(P + G)Ψ + KΨ/N with P = 2, G = 4, K = 12.",
        wrong=(mistaken(mistakes.other_stage_states("megatron_distopt", "zero1", PSI_13B, 16),
                        "that is ZeRO-1 with bf16 gradients (G = 2); this optimizer keeps them in fp32"),
               mistaken(mistakes.optimizer_forgotten("megatron_distopt", PSI_13B, 16),
                        "the optimizer state's 12Ψ/N is missing"),
               mistaken(mistakes.all_sharded("megatron_distopt", PSI_13B, 16),
                        "only the optimizer state is sharded: weights and gradients stay whole")),
    ),
    Exercise(
        id="04.2", kind="number", style="formula",
        prompt="How many bytes per GPU more than ZeRO-1 with `mixed-bf16` (bf16 gradients) does the distributed "
               "optimizer with `megatron-bf16` hold, for Ψ = 13e9, at any N?",
        expected=lambda: (theory.model_states("megatron_distopt", PSI_13B, 16).total
                          - theory.model_states("zero1", PSI_13B, 16).total),
        hint="only G changes, from 2 to 4 bytes per parameter.",
        wrong=(mistaken(mistakes.baseline_forgotten(4 * PSI_13B),
                        "4Ψ is the whole fp32 buffer, but ZeRO-1 already holds a 2Ψ bf16 one"),
               mistaken(mistakes.elements_for_bytes(2 * PSI_13B, 2), "a gradient grows by 2 bytes, not 1")),
    ),
    Exercise(
        id="04.3", kind="number", style="formula",
        prompt="For which N does the `fp32` recipe (8 + 8/N bytes per parameter) need exactly as much as "
               "`megatron-bf16` (6 + 12/N)?",
        expected=lambda: next(n for n in range(1, 100)
                              if theory.model_states("megatron_distopt", 1, n, recipe="fp32").total
                              == theory.model_states("megatron_distopt", 1, n, recipe="megatron-bf16").total),
        hint="solve 8 + 8/N = 6 + 12/N.",
        wrong=(mistaken(mistakes.off_by_one(2), "at N = 1: 16 against 18"),
               mistaken(mistakes.power_of_two_habit(3), "at N = 4: 8 + 2 = 10 against 6 + 3 = 9")),
    ),
    Exercise(
        id="04.4", kind="choice", style="predict",
        prompt="Before the run: with `megatron-bf16` on 4 ranks, which collective sends more bytes per step?",
        options={"a": "the all-gather of the updated parameters",
                 "b": "the reduce-scatter of the gradients: twice the all-gather's bytes",
                 "c": "neither: both move every element once",
                 "d": "an all-reduce of the gradients, 2(N-1)/N of the buffer, since the optimizer needs the whole summed gradient"},
        expected=lambda: "b",
        hint="both buffers have the same number of elements; compare their dtypes.",
        wrong=(Wrong("a", "the parameters travel in bf16 (2 bytes), the gradients in fp32 (4 bytes)"),
               Wrong("c", "the same elements, but not the same bytes: fp32 gradients, bf16 parameters"),
               Wrong("d", "each rank only needs the summed gradient of its own chunk: a reduce-scatter")),
    ),
    Exercise(
        id="04.5", kind="number", style="measure",
        prompt="From the run's report (`rep`): what share of rank 0's ring-model bytes per step is the gradient "
               "reduce-scatter? (A fraction between 0 and 1.)",
        expected=_share,
        hint="rep.ranks[0].measured.comm has the bytes of each collective.",
        wrong=(mistaken(mistakes.ring_model_share("reduce_scatter", "zero1", PSI_13B, 4),
                        "a half would mean equal dtypes, ZeRO-1 with bf16 gradients; here the gradients are fp32"),
               mistaken(mistakes.complement, "that is the all-gather's share", given=lambda report: (_share(report),))),
        example=_example_comm,
    ),
    Exercise(
        id="04.6", kind="choice", style="predict",
        prompt="Before the run: with K = 2 micro-batches per optimizer step (gradient accumulation), how many "
               "bytes does the gradient reduce-scatter send per optimizer step, compared with K = 1?",
        options={"a": "the same: both micro-batches add into the fp32 buffer, which is reduced once",
                 "b": "twice as many: one reduce-scatter per micro-batch, each moving the whole fp32 gradient buffer",
                 "c": "half as many: each micro-batch is half the batch",
                 "d": "none until the next step"},
        expected=lambda: "a",
        hint="the gradient buffer stays whole on every rank between micro-batches.",
        wrong=(Wrong("b", "that is ZeRO-2 and ZeRO-3, whose full gradients do not outlive a backward; "
                          "this buffer does"),
               Wrong("c", "the buffer has one element per parameter whatever the batch size"),
               Wrong("d", "the step's last backward launches the reduce-scatters; the step waits for them")),
    ),
    Exercise(
        id="04.7", kind="number", style="measure",
        prompt="From the accumulation run's report (`acc`): how many reduce-scatters did rank 0 issue in the "
               "last optimizer step?",
        expected=_reduce_scatters,
        hint="count the last step's records in acc.ranks[0].timeline.comm_of(step=..., op=\"reduce_scatter\").",
        wrong=(mistaken(mistakes.once_per_micro_batch,
                        "one per micro-batch and unit would be ZeRO-2; here it is one per unit and optimizer step",
                        given=lambda report: (_reduce_scatters(report), 2)),
               mistaken(mistakes.per_step_not_per_unit(6, 6),
                        "there is one reduce-scatter per unit (gpt-small has 6), not one per step")),
        example=_example_accumulation,
    ),
    Exercise(
        id="04.8", kind="choice", style="find-the-bug",
        prompt="`BrokenDistOpt` is the distributed optimizer with one mistake. Read its memory, its bytes "
               "by collective against the prediction, and its losses. Which mistake is it?",
        options={"a": "it reduce-scatters a bf16 copy of the fp32 gradient buffer",
                 "b": "it all-reduces the gradients instead of reduce-scattering them",
                 "c": "it all-gathers the parameters in fp32",
                 "d": "Adam on rank r updates the chunk of rank r + 1"},
        expected=lambda: "a",
        hint="which collective's bytes are off, and by what factor?",
        wrong=(Wrong("b", "an all-reduce sends twice the reduce-scatter's bytes, not half"),
               Wrong("c", "the all-gather's bytes match the prediction; an fp32 all-gather would double them"),
               Wrong("d", "every byte would match, and the losses would leave the reference at once")),
    ),
)
