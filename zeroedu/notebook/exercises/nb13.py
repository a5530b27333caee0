"""Notebook 13 (fact-check): ZeRO-1 on a ring against DDP, on gloo's wire (its appendix), a share read off the wire, ZeRO-2's factor
at N = 64, and a ZeRO-2 built from a wrong description."""
from __future__ import annotations

from ... import theory
from ...theory import mistakes
from . import Exercise, Wrong, mistaken, register


def _rs_share(claim: dict) -> float:
    return claim["wire_by_collective"]["zero1_gloo"]["reduce_scatter"] / claim["wire"]["zero1_gloo"]


def _example_claim8() -> dict:
    # what factcheck.zero1_sends_like_ddp() reports for gpt-small on 4 ranks (rank 0, one step)
    return {"claim": {"wire": {"ddp": 9819562, "zero1_ring": 9731436, "zero1_gloo": 14604934},
                      "wire_by_collective": {"zero1_gloo": {"all_gather": 4868310, "reduce_scatter": 9736624}}}}


register(
    Exercise(
        id="13.1", kind="choice", style="predict",
        prompt="Before the runs: with a ring reduce-scatter (zeroedu's, or NCCL's Ring algorithm), how many bytes "
               "does a ZeRO-1 rank write to the wire per step, compared with a DDP rank's all-reduce?",
        options={"a": "the same, 2Ψ: a reduce-scatter plus an all-gather is an all-reduce",
                 "b": "about 1.5x: the reduce-scatter sends as much as an all-reduce, then the all-gather",
                 "c": "about half: ZeRO-1 only reduces its own 1/N",
                 "d": "about twice: two collectives instead of one, each sending as much as the all-reduce it replaces"},
        expected=lambda: "a",
        hint="an all-reduce on a ring is a reduce-scatter followed by an all-gather.",
        wrong=(Wrong("b", "that is a reduce-scatter built as an all-reduce that keeps one chunk (gloo's own, and "
                          "DeepSpeed's default gradient path: the runs show it); a ring reduce-scatter sends "
                          "(N-1)/N of its input, half an all-reduce"),
               Wrong("c", "every rank still sends (N-1)/N of the gradient in the reduction, whichever chunk it keeps"),
               Wrong("d", "the all-gather sends (N-1)/N of the parameters: half an all-reduce, not a whole one")),
    ),
    Exercise(
        id="13.2", kind="number", style="measure",
        prompt="From claim 8's measurement (`c8`): what fraction of ZeRO-1's wire bytes per step with gloo's "
               "reduce-scatter went to the reduce-scatter?",
        expected=_rs_share,
        rel=1e-2,
        example=_example_claim8,
        hint="c8['wire_by_collective']['zero1_gloo']['reduce_scatter'] over c8['wire']['zero1_gloo'].",
        wrong=(mistaken(mistakes.ring_model_share("reduce_scatter", "zero1", 7e9, 4),
                        "that is the share with a ring reduce-scatter; gloo's sends twice the ring bound"),
               mistaken(mistakes.complement, "that is the all-gather's share", given=lambda claim: (_rs_share(claim),))),
    ),
    Exercise(
        id="13.3", kind="number", style="formula",
        prompt="mixed-bf16: by what factor does ZeRO-2 cut model-state memory per GPU against DDP at N = 64?",
        expected=lambda: theory.model_states("ddp", 7e9, 64).total / theory.model_states("zero2", 7e9, 64).total,
        hint="16Ψ against 2Ψ + 14Ψ/N: the bf16 parameters are never sharded by ZeRO-2.",
        wrong=(mistaken(mistakes.large_n_limit, "8 = 16/2 is the limit as N -> infinity; at N = 64 the 14Ψ/N term "
                                                "still counts",
                        of=lambda: theory.model_states("ddp", 7e9, 64).total / mistakes.large_n_limit("zero2", 7e9).value),
               mistaken(mistakes.other_mode, "that is N = 8",
                        given=lambda: (theory.model_states("ddp", 7e9, 8).total
                                       / theory.model_states("zero2", 7e9, 8).total, "N = 8")),
               mistaken(mistakes.all_sharded, "only ZeRO-3 divides all three categories by N",
                        of=lambda: theory.model_states("ddp", 7e9, 64).total / mistakes.all_sharded("zero2", 7e9, 64).value)),
    ),
    Exercise(
        id="13.4", kind="choice", style="find-the-bug",
        prompt="`MysteryZeRO2` was written from a description of ZeRO-2 and trained on 4 ranks in fp32 "
               "(report `bug`). Which mistake is in it?",
        options={"a": "after the step it all-gathers the reduced gradients instead of the updated parameters",
                 "b": "it skips the all-gather after the step",
                 "c": "it keeps optimizer state for every chunk, not only its own, so each rank updates the whole model",
                 "d": "it all-reduces the gradients instead of reduce-scattering them"},
        expected=lambda: "a",
        hint="which figures match their prediction (memory, bytes on the wire), and which do not (losses)?",
        wrong=(Wrong("b", "the wire carries ZeRO-2's all-gather bytes, as predicted: an all-gather ran"),
               Wrong("c", "the model states equal the closed form: 12Ψ/N of optimizer state"),
               Wrong("d", "the wire shows ZeRO-2's bytes, and no all-reduce")),
    ),
)
