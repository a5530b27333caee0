"""Notebook 11 (dashboard): which strategies fit once activations count, which sends the most,
how bytes per rank grow with N on the wire, and a ZeRO-1 whose memory is off."""
from __future__ import annotations

from ... import catalog, theory
from ...theory import mistakes
from . import Exercise, Wrong, mistaken, example_report, register

# The "Which fits in 80 GB?" question of the notebook: 7B on N = 8 (hybrids 2 x 8), GPT shape
# inferred from Ψ, S = 4096, micro-batch 2, selective recompute, each strategy's own recipe.
FIT = dict(psi=7e9, n=8, gpu_bytes=80e9, seq=4096, micro_batch=2, recompute="selective")


def hybrid_m(strategy: str, m: int = 2) -> int:
    """The dashboard's M: 2 for the hybrids (one domain would make them flat ZeRO-3), 1 otherwise."""
    return m if catalog.get_spec(strategy).hybrid else 1


def not_fitting(psi=FIT["psi"], n=FIT["n"], gpu_bytes=FIT["gpu_bytes"], seq=FIT["seq"],
                micro_batch=FIT["micro_batch"], recompute=FIT["recompute"]) -> set[str]:
    shape = theory.transformer_shape(psi, seq=seq, micro_batch=micro_batch)
    return {s for s in catalog.STRATEGIES
            if not theory.fits(s, psi, n, hybrid_m(s), gpu_bytes=gpu_bytes, shape=shape, recompute=recompute)}


def _most_sent() -> str:
    four = ("ddp", "zero1", "zero2", "fsdp1")
    return max(four, key=lambda s: theory.comm_per_rank(s, 1e9, 4).total())


def _wire(scaling: dict, strategy: str, n: int) -> int:
    return scaling[(strategy, n)].ranks[0].wire.sent


def _growth(scaling: dict) -> float:
    return _wire(scaling, "fsdp1", 4) / _wire(scaling, "fsdp1", 2)


def _example_scaling() -> dict:
    # rank 0's wire bytes per step of the notebook's gpt-tiny runs (fsdp1 at N = 2 and 4)
    rep = lambda sent: example_report({"wire": {"sent": sent}})
    return {"scaling": {("fsdp1", 2): rep(94284), ("fsdp1", 4): rep(144018)}}


register(
    Exercise(
        id="11.1", kind="set", style="predict",
        prompt="Before the table: 7B on N = 8 GPUs of 80 GB (hybrids on 2 x 8), S = 4096, micro-batch 2, "
               "selective recompute, each strategy's own recipe. Counting model states + activations + the "
               "gathered unit, which strategies do NOT fit? (a list of names)",
        options={s: catalog.get_spec(s).summary for s in catalog.STRATEGIES},
        expected=lambda: sorted(not_fitting()),  # a list: printed in a fixed order
        hint="activations are about 38 GB here whatever the strategy; add each one's model states (ZeRO §5.1) "
             "and, for the ZeRO-3 family, one gathered layer.",
        wrong=(Wrong(lambda: not_fitting() - {"megatron_distopt"},
                     "megatron_distopt keeps fp32 gradients: 6Ψ + 12Ψ/N = 52.5 GB, plus 38 GB of activations"),
               Wrong({"ddp"}, "ddp_bucketed holds the same 16Ψ = 112 GB as ddp"),
               Wrong(lambda: not_fitting() | {"zero1", "zero1_allreduce"},
                     "ZeRO-1: 4Ψ + 12Ψ/8 = 38.5 GB plus 38 GB of activations is just under 80 GB")),
    ),
    Exercise(
        id="11.2", kind="choice", style="predict",
        prompt="Before the runs: on N = 4 ranks, which of these sends the most bytes per rank per step?",
        options={"ddp": "DDP (all-reduce)", "zero1": "ZeRO-1 (reduce-scatter + all-gather)",
                 "zero2": "ZeRO-2 (reduce-scatter in backward + all-gather)",
                 "fsdp1": "ZeRO-3 / FSDP1 (all-gather, all-gather again, reduce-scatter)"},
        expected=_most_sent,
        hint="count collectives of (N-1)/N of the model each: an all-reduce is two of them.",
        wrong=(Wrong("ddp", "an all-reduce is a reduce-scatter plus an all-gather: 2Ψ, the same as ZeRO-1 and "
                            "ZeRO-2; ZeRO-3 gathers the parameters a second time in backward, 3Ψ"),
               Wrong("zero1", "ZeRO-1 on the ring bound sends DDP's 2Ψ"),
               Wrong("zero2", "ZeRO-2 moves the reduce-scatter into backward but sends the same 2Ψ")),
    ),
    Exercise(
        id="11.3", kind="number", style="measure",
        prompt="From the scaling runs (`scaling[(strategy, n)]` are reports): rank 0's bytes on the wire per "
               "step for fsdp1 at N = 4, divided by the same at N = 2?",
        expected=_growth,
        rel=5e-2,
        example=_example_scaling,
        hint="report.ranks[0].wire.sent of each run; the ring says (3/4) / (1/2).",
        wrong=(mistaken(mistakes.doubles_with_n(2, 4),
                        "bytes per rank do not double with N: a ring sends (N-1)/N of each buffer per rank"),
               mistaken(mistakes.assumed_equal("ratio"),
                        "not constant either: (N-1)/N grows from 1/2 at N = 2 to 3/4 at N = 4"),
               mistaken(mistakes.shrinks_with_n(2, 4),
                        "upside down: more ranks, more bytes per rank, towards a limit of 3Ψ")),
    ),
    Exercise(
        id="11.4", kind="choice", style="find-the-bug",
        prompt="`MysteryZeRO1` trained on 4 ranks (report `bug`). Which mistake is in it?",
        options={"a": "it keeps optimizer state (fp32 master, m, v) for every chunk of every unit, not only "
                      "its own",
                 "b": "it all-reduces the gradients instead of reduce-scattering them",
                 "c": "it skips the all-gather of the updated parameters after the step",
                 "d": "it keeps an extra fp32 copy of the gradients for the optimizer, beside the bf16 gradients it reduce-scatters"},
        expected=lambda: "a",
        hint="read the predicted-vs-measured table category by category, then the losses.",
        wrong=(Wrong("b", "the wire carries a reduce-scatter and an all-gather with the predicted bytes"),
               Wrong("c", "the losses equal single-process training: the replicas agree, so they were gathered"),
               Wrong("d", "optim_detail's main_grad is 0; it is master, m and v that are N times the prediction")),
    ),
)
