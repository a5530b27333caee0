"""Notebook 07 (ZeRO-3 / FSDP): model states per GPU, when "1.5x DDP" holds in bytes, the
saw-tooth's teeth, what reshard_after_forward=False keeps, an FSDP that never reshards after
forward, and why one big unit does not bring back DDP's memory."""
from __future__ import annotations

from ... import shard, theory
from ...theory import mistakes
from . import Exercise, Wrong, mistaken, example_report, register

GB = 1e9


def _unit_bytes(n: int = 4) -> list[int]:
    """gpt-small's flat units gathered in bf16: each unit's elements padded to a multiple of n, 2 bytes each."""
    from ...models import get_model, unit_shapes  # torch is imported only when an answer is checked

    return [2 * shard.padded_numel(sum(shard.numel(s) for s in unit), n)
            for unit in unit_shapes(get_model("gpt-small").build())]


def _gathered_closed_form() -> int:
    return sum(_unit_bytes())


def _largest_unit() -> int:
    return max(_unit_bytes())


def _wire_ratio(keep, default) -> float:
    return keep.ranks[0].wire.sent / default.ranks[0].wire.sent


def _example_wire() -> dict:
    # gpt-small, N = 4, mixed-bf16: rank 0's kernel counts, framing included
    return {"keep": example_report({"wire": {"sent": 9_731_436}}), "default": example_report({"wire": {"sent": 14_597_154}})}


def _teeth_answer() -> str:
    # a tooth per unshard, and an unshard per all-gather: count them for 6 units, resharding
    units = [[(8,)]] * 6
    gathers = sum(op.collective == "all_gather" for op in theory.exact_comm("fsdp1", units, 4).ops)
    return {6: "a", 12: "b", 1: "c", 18: "d"}[gathers]


def _ratio_fp32_reduce() -> float:
    psi, n = 7e9, 8
    return float(theory.comm_per_rank("fsdp1", psi, n, reduce_dtype="fp32").total()
                 / theory.comm_per_rank("ddp", psi, n).total())


register(
    Exercise(
        id="07.1", kind="number", style="formula",
        prompt="A 70B-parameter model trains with ZeRO-3 on N = 512 GPUs, mixed-bf16. How many bytes of model "
               "states does each GPU hold (between uses of the units)?",
        expected=lambda: theory.model_states("fsdp1", 70e9, 512).total,
        hint="parameters, gradients and optimizer state are all cut N ways: (P + G + K)Ψ/N.",
        wrong=(mistaken(mistakes.other_stage_states("fsdp1", "zero2", 70e9, 512),
                        "that is ZeRO-2: ZeRO-3 shards the bf16 parameters too"),
               mistaken(mistakes.only_optimizer_shard("fsdp1", 70e9, 512),
                        "only the optimizer state: parameters and gradients are sharded as well"),
               mistaken(mistakes.other_stage_states("fsdp1", "ddp", 70e9, 512), "that is DDP: nothing sharded")),
    ),
    Exercise(
        id="07.2", kind="number", style="formula",
        prompt="bf16 parameters, gradients reduce-scattered in fp32 (FSDP2's reduce_dtype=torch.float32, "
               "Megatron's default), against a DDP that all-reduces bf16 gradients: how many times DDP's "
               "bytes per step does ZeRO-3 send (ring model, Ψ = 7B, N = 8)?",
        expected=_ratio_fp32_reduce,
        hint="count bytes, not elements: two bf16 all-gathers of Ψ and one fp32 reduce-scatter of Ψ, "
             "against two bf16 halves of an all-reduce.",
        wrong=(mistaken(mistakes.elements_ratio(3, 2),
                        "3Ψ vs 2Ψ counts elements; in bytes it holds only when every pass uses the same dtype"),
               mistaken(mistakes.fp32_gradients, "that is against a DDP that also reduces in fp32 (8 bytes per "
                                                 "parameter each)",
                        of=lambda: float(theory.comm_per_rank("fsdp1", 7e9, 8, reduce_dtype="fp32").total())
                        / mistakes.fp32_gradients("ddp", 7e9, 8).value),
               mistaken(mistakes.allreduce_counted_once, "DDP's all-reduce is two passes over Ψ, not one",
                        of=lambda: float(theory.comm_per_rank("fsdp1", 7e9, 8, reduce_dtype="fp32").total())
                        / mistakes.allreduce_counted_once("ddp", 7e9, 8).value)),
    ),
    Exercise(
        id="07.3", kind="choice", style="predict",
        prompt="Before the runs: gpt-small has 6 units (embedding, 4 blocks, head). With prefetching off, how "
               "many teeth (an unshard followed by its reshard) does the gathered-parameters band show per "
               "training step?",
        options={"a": "6: one per unit", "b": "12: two per unit, before its forward and again before its backward",
                 "c": "1: the whole model is gathered once per step", "d": "18: three per unit, one for each of its two all-gathers and one for the reduce-scatter of its gradients"},
        expected=_teeth_answer,
        hint="reshard_after_forward=True frees a unit after its forward; what must happen before its backward?",
        wrong=(Wrong("a", "after its forward a unit is resharded, so backward has to gather it again"),
               Wrong("c", "a unit is gathered around its own use only; that is what keeps the peak low"),
               Wrong("d", "the reduce-scatter moves gradients into shards; it gathers no parameters")),
    ),
    Exercise(
        id="07.4", kind="number", style="predict",
        prompt="Before the runs: gpt-small (Ψ = 3,242,081 in 6 flat units, each padded to a multiple of N = 4) "
               "in mixed-bf16 with reshard_after_forward=False. How many bytes of gathered (unsharded) "
               "parameters will rank 0 hold at the end of forward?",
        expected=lambda: float(_gathered_closed_form()),
        rel=1e-3,  # the 6 bytes of padding are not the lesson
        hint="which units are still gathered when the last one's forward ends, and how many bytes is one "
             "gathered bf16 element?",
        wrong=(mistaken(mistakes.other_mode(0, "resharding after forward"),
                        "that is with resharding after forward; this run keeps every unit gathered"),
               mistaken(mistakes.other_mode, "that is one block; with resharding off every unit stays gathered "
                                             "until backward",
                        given=lambda: (_largest_unit(), "one unit: resharding keeps one gathered at a time")),
               mistaken(mistakes.elements_for_bytes, "that counts elements; a bf16 element is 2 bytes",
                        given=lambda: (_gathered_closed_form(), 2)),
               mistaken(mistakes.whole_for_shard, "that is N times the gathered model; each rank gathers one copy",
                        given=lambda: (_gathered_closed_form(), 4))),
    ),
    Exercise(
        id="07.7", kind="number", style="measure",
        prompt="From the knobs table's wire column (the kernel's count, framing included): rank 0's bytes with "
               "reshard_after_forward=False divided by the default's (backward_prefetch). Does it show the 2Ψ "
               "against 3Ψ the text claims?",
        expected=_wire_ratio, example=_example_wire, rel=1e-3,
        hint="two numbers of the wire column, the fourth row over the second; the ring model says 2/3",
        wrong=(mistaken(mistakes.upside_down, "upside down: the default's bytes over the kept run's",
                        given=lambda keep, default: (_wire_ratio(keep, default),)),
               mistaken(mistakes.assumed_equal("ratio"), "the wire column differs between the two rows: read each"))),
    Exercise(
        id="07.5", kind="choice", style="find-the-bug",
        prompt="`FSDPBroken` ran on 4 ranks beside FSDP1: its model states match, its losses equal "
               "single-process training, its bytes do not match the closed form, and its timeline looks "
               "different. Which mistake is it?",
        options={"a": "it does not all-gather a unit again before its backward",
                 "b": "it never reshards a unit after its forward",
                 "c": "it skips the reduce-scatter of one unit",
                 "d": "it all-gathers the parameters in fp32 instead of bf16"},
        expected=lambda: "b",
        hint="compare all_gather and reduce_scatter bytes with the prediction, and the gathered band at the "
             "forward/backward boundary.",
        wrong=(Wrong("a", "backward would then run on freed parameters: wrong gradients or a crash, not "
                          "equal losses; and here the unit never needed a new gather"),
               Wrong("c", "the reduce_scatter bytes match; a missing one would also leave a stale gradient "
                          "shard and the losses would drift"),
               Wrong("d", "fp32 would double the all_gather bytes; here they are 2/3 of the prediction")),
    ),
    Exercise(
        id="07.6", kind="number", style="formula",
        prompt="A 7B model wrapped as ONE FSDP unit on N = 8 GPUs, mixed-bf16: how many bytes does a GPU "
               "hold in backward, when the unit's full bf16 parameters and its full bf16 gradient are alive "
               "beside the sharded model states (activations aside)?",
        expected=lambda: theory.model_states("fsdp1", 7e9, 8).total + (2 + 2) * 7e9,
        hint="the sharded states stay 16Ψ/N; the unit adds PΨ of gathered parameters and GΨ of full gradient.",
        wrong=(mistaken(mistakes.other_stage_states("fsdp1", "ddp", 7e9, 8),
                        "that is DDP's 112 GB: but the fp32 master, m and v stay sharded"),
               mistaken(mistakes.transient_forgotten(theory.model_states("fsdp1", 7e9, 8).total),
                        "the unit's gathered parameters and full gradient are missing"),
               mistaken(mistakes.transient_forgotten(theory.model_states("fsdp1", 7e9, 8).total, 2 * 7e9),
                        "the full gradient before its reduce-scatter is missing")),
    ),
)
