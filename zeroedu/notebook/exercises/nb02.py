"""Notebook 02 (DDP): what each GPU holds, when the bucket all-reduces start, what gradient
accumulation costs on the wire, and DDP's closed forms.

Context the measure exercises read: `base` and `acc`, the reports of bucketed DDP with one
micro-batch per step and with K = 4 (report.ranks[r].wire.sent: bytes the kernel
counted on rank r's sockets in the last optimizer step); `sweep`, the bucket-size lesson's
committed rows (`time_lessons.results("ddp_buckets")`, smallest buckets first), and `link`, the
emulated link it ran on (`runtime.links.DOMAIN`).

The best bucket size (02.8), for N ranks, S bytes of gradients produced at a steady rate over a
backward pass of T_b, and a bucket of b bytes all-reduced in a + b·r (a: what each all-reduce
pays whatever its size; r = 2(N-1)/(N·β)): the link is busy (S/b)·a + S·r per step, and while
that fits inside backward all that stays exposed is about the last bucket's all-reduce, a + b·r,
smaller for smaller buckets. The best bucket is the smallest the link keeps up with:
b* = S·a / (T_b − S·r).
"""
from __future__ import annotations

import statistics

from ... import theory
from ...theory import mistakes
from ...runtime.links import DOMAIN
from ...models import get_model, make_model, unit_shapes
from . import Exercise, Wrong, mistaken, example_report, register

_CATEGORY_OPTIONS = {"a": "parameters (bf16)", "b": "gradients (bf16)",
                     "c": "optimizer state (fp32 master, Adam m and v)",
                     "d": "activations saved for backward (one micro-batch)"}


def _largest_category(model="gpt-small", n=4, micro_batch=2, recipe="mixed-bf16") -> str:
    """Which of the four per-rank figures the closed forms make largest for notebook 02's run."""
    spec = get_model(model)
    ms = theory.exact_model_states("ddp", unit_shapes(make_model(spec)), n, recipe=recipe)
    sizes = {"a": ms.param, "b": ms.grad, "c": ms.optim, "d": spec.activation_bytes(micro_batch, 2)}
    return max(sizes, key=sizes.get)


def _wire(report, rank=0):
    return report.ranks[rank].wire.sent


_N = 2  # the bucket-size lesson's ranks


def _grad_bytes(model="gpt-small") -> int:
    """S: the bytes of one step's gradients (bf16, every parameter)."""
    return 2 * sum(p.numel() for p in make_model(get_model(model)).parameters())


def _seconds_per_byte(link) -> float:
    """r: the all-reduce's time per byte of payload on `link`, ring model."""
    return 2 * (_N - 1) / (_N * link.beta)


def _fixed_cost(sweep, link, busy=None) -> float:
    """a, from the smallest buckets' row: the link's busy time, less the bytes' time, per all-reduce."""
    row = sweep[0]
    return ((row.link_busy if busy is None else busy) - _grad_bytes() * _seconds_per_byte(link)) / row.collectives


def _backward(sweep) -> float:
    return statistics.median(r.backward for r in sweep)


def _best_bucket(sweep, link, a=None, slack=None) -> float:
    s = _grad_bytes()
    a = _fixed_cost(sweep, link) if a is None else a
    slack = _backward(sweep) - s * _seconds_per_byte(link) if slack is None else slack
    return s * a / slack


def _sweep_example():
    from ..time_lessons import TimedRun

    rows = [TimedRun(f"{b} buckets", b, 0.3, 0.3, 0.3, 0.05, 0.05, 1, backward=t, collectives=n, link_busy=busy)
            for b, t, n, busy in ((1 << 10, 0.150, 36, 0.240), (1 << 20, 0.140, 7, 0.086), (16 << 20, 0.145, 1, 0.082))]
    return {"sweep": rows, "link": DOMAIN}


def _accumulation_example():
    sent = example_report({"wire": {"sent": 9_738_346}})
    return {"base": sent, "acc": sent}


register(
    Exercise(
        id="02.1", kind="choice", style="predict",
        prompt="Before the run: DDP trains gpt-small (Ψ ≈ 3.2 M) on 4 ranks with mixed-bf16, 2 sequences "
               "of 128 tokens per rank. Which of these will the ledger measure as the largest on rank 0?",
        options=_CATEGORY_OPTIONS,
        expected=lambda **_: _largest_category(),
        hint="bytes per parameter for each model state, against the activations of a small micro-batch",
        wrong=(Wrong("a", "bf16 parameters are 2 bytes per parameter; Adam's state is 12"),
               Wrong("b", "bf16 gradients are 2 bytes per parameter; Adam's state is 12"),
               Wrong("d", "activations grow with the micro-batch; at 2 × 128 tokens they are a few MB, "
                          "while the fp32 master, m and v take 12 bytes for each of the 3.2 M parameters"))),
    Exercise(
        id="02.2", kind="choice", style="predict",
        prompt="Before the run: bucketed DDP on gpt-small, buckets of about 1 MiB. Where on rank 0's timeline "
               "will the buckets' all-reduces start?",
        options={"a": "all after backward has finished, like naive DDP, so that no bucket leaves before every gradient is final",
                 "b": "during backward, each as soon as its bucket's gradients are all there",
                 "c": "before backward starts",
                 "d": "only at the next forward"},
        expected=lambda **_: "b",
        hint="read start_grad_sync and the hook that calls it",
        wrong=(Wrong("a", "that is naive DDP; the post-accumulate-grad hook launches a bucket as soon as "
                          "its last gradient has been accumulated, while autograd goes on"),
               Wrong("c", "nothing can be reduced before backward has produced it"),
               Wrong("d", "the optimizer step needs the reduced gradients, so they are waited for before it"))),
    Exercise(
        id="02.3", kind="number", style="measure",
        prompt="Bucketed DDP with K = 4 micro-batches per optimizer step (4× the batch): bytes on the wire "
               "per optimizer step on rank 0, divided by those of the run with K = 1?",
        expected=lambda base, acc, **_: _wire(acc) / _wire(base),
        example=_accumulation_example,
        hint="divide report.ranks[0].wire.sent of the two runs",
        wrong=(mistaken(mistakes.once_per_micro_batch(1, 4),
                        "one all-reduce per micro-batch would send 4×; inside no_sync the hooks stay quiet "
                        "and only the last backward of the step launches the buckets"),
               mistaken(mistakes.split_over_micro_batches(1, 4),
                        "the bytes do not shrink either: the gradient is as large as the model, whatever "
                        "the batch"))),
    Exercise(
        id="02.4", kind="number", style="formula",
        prompt="Bytes per GPU of model states for DDP with Ψ = 1.5e9 and the mixed-bf16 recipe?",
        expected=lambda **_: theory.model_states("ddp", 1.5e9, 8).total,
        hint="16 bytes per parameter",
        wrong=(mistaken(mistakes.optimizer_forgotten("ddp", 1.5e9, 8),
                        "4Ψ counts bf16 weights and gradients only; Adam's fp32 master, m and v add 12 bytes per "
                        "parameter"),
               mistaken(mistakes.parameters_only("ddp", 1.5e9, 8), "2Ψ is the bf16 weights alone"),
               mistaken(mistakes.only_optimizer_shard("ddp", 1.5e9, 8),
                        "12Ψ is Adam's state alone; add the bf16 weights and gradients"))),
    Exercise(
        id="02.5", kind="number", style="formula",
        prompt="Bytes one GPU sends per step, ring model, bf16 gradients, for Ψ = 1.5e9 on N = 16?",
        expected=lambda **_: theory.comm_per_rank("ddp", 1.5e9, 16).total(),
        hint="2 (N-1)/N × Ψ × 2 bytes",
        wrong=(mistaken(mistakes.ring_factor_dropped("ddp", 1.5e9, 16),
                        "2 × Ψ × 2 bytes is the limit for large N; at N = 16 the factor is 2·15/16"),
               mistaken(mistakes.allreduce_counted_once("ddp", 1.5e9, 16),
                        "that is one half of the ring; an all-reduce is a reduce-scatter and an all-gather"),
               mistaken(mistakes.fp32_gradients("ddp", 1.5e9, 16)))),
    Exercise(
        id="02.6", kind="choice", style="formula",
        prompt="Going from N = 8 to N = 64 GPUs, what happens to DDP's model-state bytes per GPU?",
        options={"a": "they shrink 8×", "b": "they stay the same", "c": "they grow: each GPU must hold a larger share of the gradients"},
        expected=lambda **_: ("b" if theory.model_states("ddp", 1.5e9, 8).total
                              == theory.model_states("ddp", 1.5e9, 64).total else "a"),
        hint="what does DDP split across GPUs?",
        wrong=(Wrong("a", "DDP splits the batch, not the model: every GPU keeps a full replica"),
               Wrong("c", "nothing per GPU depends on N: every GPU keeps one full replica"))),
    Exercise(
        id="02.7", kind="number", style="measure",
        prompt="The sweep's smallest buckets (sweep[0]: one gradient tensor per bucket): the prediction keeps the "
               "link busy sweep[0].link_busy seconds per step for its sweep[0].collectives all-reduces, which "
               "carry S = 2Ψ bytes of gradients in all over N = 2 ranks. What does one all-reduce cost whatever "
               "its size (the fixed cost a, in seconds)?",
        expected=lambda sweep, link, **_: _fixed_cost(sweep, link),
        example=_sweep_example,
        hint="the busy time is the all-reduces' fixed costs plus the bytes' time, S · 2(N-1)/(N·β)",
        wrong=(mistaken(mistakes.bytes_time_kept,
                        "that shares the bytes' time among the all-reduces too; take S · 2(N-1)/(N·β) out first",
                        given=lambda sweep, **_: (sweep[0].link_busy, sweep[0].collectives)),
               mistaken(mistakes.latency_alone,
                        "that is the link's latency alone, 2(N-1) messages of α; the busy time says what each "
                        "all-reduce costs on this machine, launching it and handing its messages over included",
                        given=lambda link, **_: (link.alpha, _N)))),
    Exercise(
        id="02.8", kind="number", style="formula",
        prompt="Backward lasts T_b (the median of the sweep's rows' `backward`) and produces the S bytes of "
               "gradients at a steady rate; a bucket of b bytes is all-reduced in a + b·r, with a your answer to "
               "02.7 and r = 2(N-1)/(N·β). What bucket size (bytes) is the smallest whose all-reduces the link "
               "finishes within backward?",
        expected=lambda sweep, link, **_: _best_bucket(sweep, link),
        example=_sweep_example,
        hint="the link's time per step, (S/b)·a + S·r, must fit inside T_b",
        wrong=(mistaken(mistakes.bytes_time_ignored,
                        "the bytes' own time, S·r, has to fit inside backward too: only T_b − S·r is left for the "
                        "fixed costs",
                        given=lambda sweep, link, **_: (_grad_bytes(), _fixed_cost(sweep, link), _backward(sweep))),
               mistaken(mistakes.latency_alone,
                        "with the link's latency alone as a; each all-reduce costs this machine more than that "
                        "(02.7), and the sweep's small buckets pay it",
                        of=lambda sweep, link, **_: _best_bucket(
                            sweep, link, a=mistakes.latency_alone(link.alpha, _N).value)))),
)
