"""Notebook 09 (activations and the rest of memory): Korthikanti et al.'s per-layer bytes, what
selective recompute saves at two sequence lengths, reading what full recompute saves, which strategies
pay for gradient accumulation on the wire, and a DDP that syncs every micro-batch."""
from __future__ import annotations

from ... import theory
from ...kinds import RECOMPUTE_MODES
from ...models import PRESETS
from ...theory.activations import korthikanti_layer_bytes
from ...theory import mistakes
from . import Exercise, Wrong, mistaken, example_report, register

# GPT-3 175B's layer (Korthikanti et al. 2022, Table 3): s = 2048, b = 1, h = 12288, a = 96
S175, B175, H175, A175 = 2048, 1, 12288, 96
ACCUMULATING = ("ddp", "zero1", "zero2", "megatron_distopt", "fsdp1", "hsdp")
_LETTERS = "abcdef"


def _selective_share() -> float:
    """Share of gpt-small's activations (B = 2 per rank, bf16) that selective recompute drops."""
    cfg = PRESETS["gpt-small"]
    none, sel = cfg.activation_bytes(2, 2, "none"), cfg.activation_bytes(2, 2, "selective")
    return 1 - sel / none


def _share_answer() -> str:
    options = {"a": 0.8, "b": 0.1, "c": 0.0, "d": 0.5}
    share = _selective_share()
    return min(options, key=lambda k: abs(options[k] - share))


def _grows_with_k() -> list[str]:
    """The strategies whose bytes per optimizer step grow with K (closed forms, K = 4 vs 1)."""
    out = []
    for letter, s in zip(_LETTERS, ACCUMULATING):
        m = 2 if s == "hsdp" else 1
        one = theory.comm_per_rank(s, 1e9, 4, m, micro_batches=1).total()
        four = theory.comm_per_rank(s, 1e9, 4, m, micro_batches=4).total()
        if four > one:
            out.append(letter)
    return out


def _activations(mode: str):
    return lambda reports: reports[mode].ranks[0].measured.activations


def _example_reports() -> dict:
    # gpt-small, N = 4 (2 sequences per rank), mixed-bf16: the closed forms' figures
    cfg = PRESETS["gpt-small"]
    return {"reports": {mode: example_report({"measured": {"activations": cfg.activation_bytes(2, 2, mode)}})
                        for mode in RECOMPUTE_MODES}}


register(
    Exercise(
        id="09.1", kind="number", style="formula",
        prompt="Korthikanti et al. 2022, Eq. (1): activation bytes of one GPT-3 175B layer (s = 2048, b = 1, "
               "h = 12288, a = 96 heads), no recompute, no tensor parallelism, 16-bit activations.",
        expected=lambda: korthikanti_layer_bytes(S175, B175, H175, A175),
        hint="sbh(34 + 5as/h): 34sbh for the linear-size tensors, 5as²b for the attention scores, their "
             "dropout mask and the masked scores.",
        wrong=(mistaken(mistakes.other_recompute("none", "selective", S175, B175, H175, A175),
                        "that is selective recompute: the 5as²b of the attention core is missing"),
               mistaken(mistakes.other_recompute("none", "full", S175, B175, H175, A175),
                        "that is full recompute: only the layer's input is kept"),
               mistaken(mistakes.heads_alone(S175, B175, H175, A175))),
    ),
    Exercise(
        id="09.2", kind="choice", style="predict",
        prompt="Before the runs: gpt-small (S = 128, D = 256, 4 heads, 2 sequences per rank). Which share of "
               "its activations does selective recompute (re-running the attention core in backward) drop?",
        options={"a": "about 80 %, as for a 7B model at S = 4096", "b": "about 10 %",
                 "c": "nothing: the same tensors are saved", "d": "about half"},
        expected=_share_answer,
        hint="selective drops the B·H·S² softmax outputs; compare a·B·H·S² with a block's other terms, "
             "16a·B·S·D, at S = 128 and D = 256.",
        wrong=(Wrong("a", "at S = 4096, h = 4096, 32 heads the scores dominate (5as/h = 160 against 34); at "
                          "S = 128 with D = 256 they are a small part"),
               Wrong("c", "the softmax outputs, a·B·H·S² per layer, are not saved any more"),
               Wrong("d", "work out H·S² against 16·S·D per sequence: 65,536 against 524,288")),
    ),
    Exercise(
        id="09.3", kind="number", style="measure",
        prompt="From the three runs (`reports['none' | 'selective' | 'full']`): how many bytes of activations "
               "did full recompute save on rank 0, against no recompute, for one micro-batch?",
        expected=lambda reports: _activations("none")(reports) - _activations("full")(reports),
        hint="report.ranks[0].measured.activations is what the ledger counted at 'forward end'.",
        wrong=(mistaken(mistakes.other_mode, "that is what selective recompute saves",
                        given=lambda reports: (_activations("none")(reports) - _activations("selective")(reports),
                                               "selective recompute")),
               mistaken(mistakes.kept_for_saved, "that is what full recompute keeps, not what it saves",
                        given=lambda reports: (_activations("full")(reports),)),
               mistaken(mistakes.nothing_kept, "that is everything without recompute; full recompute still keeps "
                                               "each block's input",
                        given=lambda reports: (_activations("none")(reports),))),
        example=_example_reports,
    ),
    Exercise(
        id="09.4", kind="set", style="predict",
        prompt="Before the runs: which strategies send MORE bytes per optimizer step when the step is split "
               "into K = 4 micro-batches instead of 1? Give the letters, e.g. ['a', 'c'].",
        options={letter: s for letter, s in zip(_LETTERS, ACCUMULATING)},
        expected=_grows_with_k,
        hint="a reduction can wait for the last micro-batch only if a full-size buffer keeps the running sum; "
             "ZeRO-3 also has to gather the parameters for every forward and backward.",
        wrong=(Wrong(["c"], "ZeRO-2 yes; but ZeRO-3 (fsdp1, and hsdp on its inner axis) repeats all its "
                            "traffic every micro-batch too"),
               Wrong(["c", "e"], "hsdp's inner axis is ZeRO-3: it gathers and reduce-scatters every "
                                 "micro-batch; only its outer all-reduce waits"),
               Wrong(["a", "b", "c", "d", "e", "f"], "DDP, ZeRO-1 and Megatron keep full gradient buffers "
                                                     "and reduce once at the step")),
    ),
    Exercise(
        id="09.5", kind="choice", style="find-the-bug",
        prompt="`DDPBroken` trained gpt-tiny with K = 2 micro-batches (fp32): its memory matches the closed "
               "form, its all-reduce bytes and its losses do not. Which mistake is it?",
        options={"a": "it all-reduces the running gradient sum after every micro-batch, and again at the step",
                 "b": "it all-reduces each micro-batch's gradient into a fresh buffer and adds the K reduced buffers up before the step",
                 "c": "it forgets to divide the gradient by K",
                 "d": "it never all-reduces"},
        expected=lambda: "a",
        hint="divide the measured all-reduce bytes by the predicted ones; then ask which options change "
             "the losses.",
        wrong=(Wrong("b", "that sends K times the bytes but sums each micro-batch once: the losses would match"),
               Wrong("c", "a missing 1/K leaves the bytes as predicted, and Adam nearly cancels a constant "
                          "factor on every gradient"),
               Wrong("d", "then no all_reduce bytes at all, and every rank would train on its own data")),
    ),
    Exercise(
        id="09.6", kind="number", style="formula",
        prompt="A 7B GPT (L = 32, h = 4096, a = 32) at sequence 4096, micro-batch 1, selective recompute: "
               "Korthikanti's activation bytes for its 32 layers (16-bit, no tensor parallelism; the terms "
               "outside the layers aside)?",
        expected=lambda: 32 * korthikanti_layer_bytes(4096, 1, 4096, 32, "selective"),
        hint="34sbh per layer with selective recompute.",
        wrong=(mistaken(mistakes.other_recompute("selective", "none", 4096, 1, 4096, 32, layers=32),
                        "that is without recompute: sbh(34 + 5as/h)"),
               mistaken(mistakes.other_recompute("selective", "full", 4096, 1, 4096, 32, layers=32),
                        "that is full recompute: 2sbh per layer"),
               mistaken(mistakes.one_layer_only(4096, 1, 4096, 32, "selective", 32))),
    ),
)
