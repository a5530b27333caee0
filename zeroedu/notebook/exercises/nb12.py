"""Notebook 12, interview rehearsal: predict a card's claim before a run shows it, read the
figure off the run, and find which card a broken run contradicts.

12.1 predict  ZeRO-2's model-state bytes per parameter at N = 4, before the gpt-small run measures
              them (card zero_stages)
12.2 predict  FSDP's bytes on the wire against DDP's, before the FSDP run (card zero3_comm)
12.3 measure  the same ratio, read off the two reports' wire counters
12.4 predict  ZeRO-2 against ZeRO-1 with four micro-batches, before the runs (card grad_accumulation)
12.5 find-the-bug  a ZeRO-2 with one mistake (`zeroedu.notebook.bugs.nb12`): which card's claim it breaks

The predictions are graded by the closed forms (`zeroedu.theory`), the measurements by the
report the notebook just produced.
"""
from __future__ import annotations

from functools import lru_cache

from ... import theory
from ...reports import RunReport
from ...theory import mistakes
from . import Exercise, Wrong, mistaken, example_report, register

N = 4  # the notebook's runs use four ranks
K = 4  # micro-batches in the accumulation runs


@lru_cache(maxsize=None)
def _psi(model: str) -> int:
    from ...models import param_count  # torch is imported only when an answer is checked

    return param_count(model)


def _nearest(options: dict[str, float], value: float) -> str:
    """The option letter whose factor is closest to `value`."""
    return min(options, key=lambda k: abs(options[k] - float(value)))


# ---------------------------------------------------------------- 12.2 / 12.3: FSDP vs DDP bytes
RATIO_OPTIONS = {"a": "about the same", "b": "about 1.5×", "c": "about 2×", "d": f"about {N}× (N times)"}
_RATIO_VALUES = {"a": 1.0, "b": 1.5, "c": 2.0, "d": float(N)}


def _fsdp_over_ddp() -> str:
    psi = _psi("gpt-small")
    ratio = theory.comm_per_rank("fsdp1", psi, N).total() / theory.comm_per_rank("ddp", psi, N).total()
    return _nearest(_RATIO_VALUES, ratio)


def _wire(report: RunReport, rank: int = 0) -> int:
    return report.ranks[rank].wire.sent


def _wire_ratio(ddp: RunReport, fsdp: RunReport) -> float:
    return _wire(fsdp) / _wire(ddp)


def _wire_example() -> dict:
    # gpt-small at N = 4: DDP's all-reduce vs FSDP's two all-gathers and one reduce-scatter,
    # gloo's framing included (what the two reports' wire counters read)
    return {"ddp": example_report({"wire": {"sent": 9_733_107}}),
            "fsdp": example_report({"wire": {"sent": 14_597_154}})}


# ---------------------------------------------------------------- 12.1: ZeRO-2 bytes per parameter
# ---------------------------------------------------------------- 12.4: accumulation
ACCUM_OPTIONS = {"a": "the same bytes", "b": "about 1.5×", "c": "about 2.5×", "d": f"about {K}× ({K} micro-batches)"}
_ACCUM_VALUES = {"a": 1.0, "b": 1.5, "c": 2.5, "d": float(K)}


def _zero2_over_zero1_accum() -> str:
    psi = _psi("gpt-tiny")
    z2 = theory.comm_per_rank("zero2", psi, N, micro_batches=K).total()
    z1 = theory.comm_per_rank("zero1", psi, N, micro_batches=K).total()
    return _nearest(_ACCUM_VALUES, z2 / z1)


# ---------------------------------------------------------------- 12.5: the broken ZeRO-2
BUG_OPTIONS = {
    "a": "its full gradient buffers outlive their reduce-scatter, so it holds more gradient bytes "
         "than 2Ψ + 14Ψ/N allows (card zero_stages)",
    "b": "it all-reduces the gradients instead of reduce-scattering them, 3Ψ on the wire instead "
         "of 2Ψ (card zero1_vs_zero2_comm)",
    "c": "it forgets to average the summed gradients, so it trains a different model than "
         "single-process training (card zero_equivalence)",
    "d": "it gathers the parameters again before backward as well, like ZeRO-3, and so sends a third more bytes "
         "per step than ZeRO-2 needs (card zero3_comm)",
}

register(
    Exercise(
        id="12.2", kind="choice", style="predict",
        prompt=("Before the FSDP run: on the same gpt-small model at N = 4, how will the bytes one rank "
                "sends per step with FSDP (ZeRO-3) compare with DDP's?"),
        expected=lambda: _fsdp_over_ddp(),
        options=RATIO_OPTIONS,
        hint=("list the collectives of one step for each, and what each sends per rank; an all-reduce "
              "is a reduce-scatter followed by an all-gather"),
        wrong=(Wrong("c", "that counts an all-gather and a reduce-scatter as two all-reduces: each is "
                          "half an all-reduce"),
               Wrong("a", "FSDP gathers the parameters a second time, before backward, because it freed "
                          "them after forward"),
               Wrong("d", "sharding N ways does not multiply the traffic by N: every collective sends "
                          "(N-1)/N of its buffer per rank")),
    ),
    Exercise(
        id="12.3", kind="number", style="measure",
        prompt=("Read rank 0's bytes on the wire (`report.ranks[0].wire.sent`) in both reports: "
                "FSDP's divided by DDP's."),
        expected=_wire_ratio,
        example=_wire_example,
        hint=("the cell above prints both counters; they include gloo's framing, so the ratio sits a "
              "little off the ring model's"),
        wrong=(mistaken(mistakes.upside_down, "upside down: FSDP's bytes over DDP's",
                        given=lambda ddp, fsdp: (_wire_ratio(ddp, fsdp),)),
               mistaken(mistakes.assumed_equal("ratio"), "the counters differ: read each report's own wire bytes")),
    ),
    Exercise(
        id="12.1", kind="number", style="predict",
        prompt=(f"Before the run: with mixed-bf16 (2-byte weights and gradients, 12 bytes of fp32 Adam state per "
                f"parameter) and ZeRO-2 on N = {N} ranks, how many bytes of model states will rank 0 hold per "
                f"parameter?"),
        expected=lambda: float(theory.model_states("zero2", 1, N).total),
        hint="which of the three categories does ZeRO-2 shard over the N ranks, and which does each rank keep whole?",
        wrong=(mistaken(mistakes.other_stage_states, "16 bytes is what DDP holds: nothing sharded",
                        given=lambda: ("zero2", "ddp", 1, N)),
               mistaken(mistakes.other_stage_states, "that is ZeRO-1: the gradients are sharded too",
                        given=lambda: ("zero2", "zero1", 1, N)),
               mistaken(mistakes.other_stage_states, "that is ZeRO-3: ZeRO-2 keeps the bf16 weights whole",
                        given=lambda: ("zero2", "fsdp1", 1, N)),
               mistaken(mistakes.not_per_parameter, "that is gpt-small's total in bytes; divide by Ψ",
                        given=lambda: (theory.model_states("zero2", _psi("gpt-small"), N).total,)))),
    Exercise(
        id="12.4", kind="choice", style="predict",
        prompt=(f"Before the runs: ZeRO-1 and ZeRO-2 each accumulate gradients over {K} micro-batches "
                f"(gpt-tiny, N = {N}). How do ZeRO-2's bytes per optimizer step compare with ZeRO-1's?"),
        expected=lambda: _zero2_over_zero1_accum(),
        options=ACCUM_OPTIONS,
        hint=("where does each keep its gradients between two micro-batches, and which collective "
              "therefore runs how often?"),
        wrong=(Wrong("a", "ZeRO-2 has nowhere to accumulate the full gradient, so it reduce-scatters "
                          "after every micro-batch"),
               Wrong("d", f"only the reduce-scatter repeats {K} times; the parameter all-gather runs "
                          "once per optimizer step"),
               Wrong("b", "count again: K reduce-scatters plus one all-gather, against one of each")),
    ),
    Exercise(
        id="12.5", kind="choice", style="find-the-bug",
        prompt=("The run above is ZeRO-2 with one mistake. From its predicted-vs-measured table and its "
                "losses: what is wrong, and which card's claim does it contradict?"),
        expected=lambda: "a",
        options=BUG_OPTIONS,
        hint="compare each row of the table: which category disagrees, and do the losses and the wire agree?",
        wrong=(Wrong("b", "the bytes sent agree with the ring model of ZeRO-2 and the wire: no extra gather"),
               Wrong("c", "the losses equal single-process training: the model trained is the same"),
               Wrong("d", "the all-gather bytes equal the prediction: one gather per step")),
    ),
)
