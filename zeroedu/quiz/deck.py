"""Interview cards: the data-parallel questions interviewers ask, answered in 30 seconds.

Each card holds the question in English and Chinese, a 30-second model answer, the *checks*
that grade an answer automatically, the must-hit points the learner ticks after reading the
model answer, follow-ups, the figures, and the evidence that proves them (a notebook section,
a ``zeroedu run`` command, a module, a primary source).

Grading (`zeroedu.quiz.grading`): a card's checks are short sub-answers with one right answer:
a `Number` graded against a `zeroedu.theory` figure within 1 %, a `Choice` graded exactly, a
`Term` compared after normalization. The must-hit `Point`s are self-ticked and reported apart.
Every card has at least one check; keyword-stuffed text earns nothing (tests/test_deck_grading.py).

Figures are never free text. A template says ``{z2}`` and the card's `figures` map that name
to a `Fig`: a Python expression over the theory layer (`NAMESPACE`), evaluated when the card is
rendered or graded. Assumptions that are not outputs of the theory (a GPU's memory, an achieved
FLOP rate, a PCIe link, a latency) are `Fig`s too, marked ``input=True``, so they are shown
once, with a note, and never typed into the prose. tests/test_quiz.py checks that no template
hard-codes a figure with a unit (`HARD_CODED`) and that every rendered figure is the output
of its expression.

Notebook evidence points at `NOTEBOOKS`, the one list of notebook paths (the numbering after
06_activations is inserted); `notebook_sections()` lists the section headings the cards cite.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Iterable, Sequence

from .. import catalog, recipes, theory
from ..fmt import significant
from ..theory import activations, hybrid
from .grading import CardGrade, Choice, Number, Point, Term, grade_checks

# Names a figure expression may use: the theory layer and nothing else.
NAMESPACE = {"theory": theory, "hybrid": hybrid, "activations": activations, "recipes": recipes,
             "catalog": catalog, "Fraction": Fraction, "float": float}
THEORY_NAMES = ("theory", "hybrid", "activations", "recipes", "catalog")

fmt_number = significant  # the package's one formatter for quoted figures (`zeroedu.fmt`)


@dataclass(frozen=True)
class Fig:
    """A figure quoted in a card: an expression over `NAMESPACE`, shown divided by `scale` with
    `unit`. `input=True` marks an assumption (hardware, a library default), not a theory output;
    `note` says where it comes from."""

    expr: str
    unit: str = "GB"
    scale: float = 1e9
    digits: int = 4
    input: bool = False
    note: str = ""

    def value(self):
        """The expression's value (exact Fraction or int where the theory gives one)."""
        return eval(self.expr, dict(NAMESPACE))  # noqa: S307 - our own expressions, not input

    def shown(self) -> float:
        return float(self.value()) / self.scale

    def text(self) -> str:
        num = fmt_number(self.shown(), self.digits)
        if self.unit in ("×", "%", ""):
            return num + self.unit
        return f"{num} {self.unit}"


@dataclass(frozen=True)
class Evidence:
    """Where a figure or claim is shown: kind is notebook | run | module | lab | source."""

    kind: str
    target: str  # notebook path, CLI command, module path, lab id, or a source file / citation
    detail: str = ""  # notebook section heading, what to look at

    def text(self) -> str:
        return f"[{self.kind}] {self.target}" + (f" — {self.detail}" if self.detail else "")


@dataclass(frozen=True)
class Card:
    id: str
    topic: str
    question: str
    question_zh: str
    answer: str  # template: {name} refers to figures[name]
    checks: tuple  # grading.Number | Choice | Term: auto-graded, at least one
    must_hit: tuple[Point, ...]  # self-ticked after the model answer is shown
    follow_ups: tuple[tuple[str, str], ...] = ()  # (question, answer template)
    evidence: tuple[Evidence, ...] = ()
    figures: dict = field(default_factory=dict)
    sources: tuple[str, ...] = ()

    # ------------------------------------------------------------ figures and templates
    def figure(self, name: str) -> Fig:
        return self.figures[name]

    def figure_texts(self) -> dict[str, str]:
        return {k: f.text() for k, f in self.figures.items()}

    def render(self, template: str) -> str:
        return template.format_map(self.figure_texts())

    def rendered_answer(self) -> str:
        return self.render(self.answer)

    def rendered_follow_ups(self) -> list[tuple[str, str]]:
        return [(self.render(q), self.render(a)) for q, a in self.follow_ups]

    def check_templates(self) -> list[str]:
        out = []
        for c in self.checks:
            out.append(c.prompt)
            out += list(getattr(c, "options", ())) + ([c.why] if getattr(c, "why", "") else [])
        return out

    def templates(self) -> list[str]:
        """Every text with {figure} placeholders: answer, follow-ups, check prompts and options."""
        return [self.answer] + [t for qa in self.follow_ups for t in qa] + self.check_templates()

    # ------------------------------------------------------------ checks and grading
    def check_prompt(self, i: int) -> str:
        """Check i as shown to the learner: prompt, unit or answer-format hint, lettered options."""
        c = self.checks[i]
        fig = self.figures.get(c.figure) if isinstance(c, Number) else None
        lines = [f"{self.render(c.prompt)} {c.hint(fig)}"]
        if isinstance(c, Choice):
            lines += ["    " + self.render(o) for o in c.option_lines()]
        return "\n".join(lines)

    def check_answer(self, i: int) -> str:
        """The right answer of check i, as shown after grading."""
        c = self.checks[i]
        fig = self.figures.get(c.figure) if isinstance(c, Number) else None
        return self.render(c.expected_text(fig))

    def model_responses(self) -> list[str]:
        """One line per check that earns full marks (what a script pipes in for 100 %)."""
        return [c.model_response(self.figures.get(c.figure) if isinstance(c, Number) else None)
                for c in self.checks]

    def grade(self, answers: Sequence[str], ticked: Iterable[int] | None = None) -> CardGrade:
        """Auto-grade `answers` (one string per check, in order) and record the self-ticked
        must-hit points (0-based indices; None: not ticked yet)."""
        results = grade_checks(self.checks, list(answers), self.figure)
        results = [type(r)(r.ok, r.given, self.render(r.expected), self.render(r.note)) for r in results]
        t = None if ticked is None else tuple(sorted(set(int(i) for i in ticked)))
        if t is not None and any(not 0 <= i < len(self.must_hit) for i in t):
            raise ValueError(f"ticked points must be in 0..{len(self.must_hit) - 1}, got {t}")
        missed = [p.text for i, p in enumerate(self.must_hit) if t is not None and i not in t]
        return CardGrade(self.id, results, len(self.must_hit), t, missed)

    # ------------------------------------------------------------ text
    def as_text(self, width: int = 0) -> str:
        lines = [f"Q [{self.id}] {self.question}", f"   {self.question_zh}", "",
                 "30-second answer:", "  " + self.rendered_answer(), "", "Checks (auto-graded):"]
        for i in range(len(self.checks)):
            prompt = self.check_prompt(i).splitlines()
            lines.append(f"  {i + 1}. {prompt[0]}")
            lines += [f"     {p.strip()}" for p in prompt[1:]]
            lines.append(f"     -> {self.check_answer(i)}")
        lines += ["", "Must hit (self-ticked):"]
        lines += [f"  {i + 1}. {p.text}" for i, p in enumerate(self.must_hit)]
        if self.follow_ups:
            lines += ["", "Follow-ups:"]
            for q, a in self.rendered_follow_ups():
                lines += [f"  Q: {q}", f"  A: {a}"]
        computed = {k: f for k, f in self.figures.items() if not f.input}
        inputs = {k: f for k, f in self.figures.items() if f.input}
        if computed:
            lines += ["", "Figures (zeroedu.theory):"]
            lines += [f"  {k} = {f.text()}  <- {f.expr}" for k, f in computed.items()]
        if inputs:
            lines += ["", "Inputs (assumed):"]
            lines += [f"  {k} = {f.text()}" + (f"  ({f.note})" if f.note else "") for k, f in inputs.items()]
        if self.evidence:
            lines += ["", "Proof:"] + [f"  {e.text()}" for e in self.evidence]
        if self.sources:
            lines += ["", "Sources: " + "; ".join(self.sources)]
        return "\n".join(lines)


# ----------------------------------------------------------------------------- notebooks
# The one list of notebook paths the cards cite (numbering with 06_activations inserted).
NOTEBOOKS = {
    "collectives": "notebooks/01_collectives.ipynb",
    "ddp": "notebooks/02_ddp.ipynb",
    "zero1": "notebooks/03_zero1.ipynb",
    "zero2": "notebooks/04_zero2.ipynb",
    "zero3": "notebooks/05_zero3_fsdp.ipynb",
    "activations": "notebooks/06_activations.ipynb",
    "fsdp_linear": "notebooks/07_fsdp_linear.ipynb",
    "fsdp1_vs_fsdp2": "notebooks/08_fsdp1_vs_fsdp2.ipynb",
    "megatron": "notebooks/09_megatron_distopt.ipynb",
    "hybrid": "notebooks/10_hybrid_sharding.ipynb",
    "dashboard": "notebooks/11_dashboard.ipynb",
    "rehearsal": "notebooks/12_interview_rehearsal.ipynb",
    "fact_check": "notebooks/13_fact_check.ipynb",
}


def nb(key: str, section: str) -> Evidence:
    return Evidence("notebook", NOTEBOOKS[key], section)


def rehearsal(card_id: str) -> Evidence:
    """The card's own section in the rehearsal notebook, where its proof cells run."""
    return nb("rehearsal", f"Card {card_id}")


ZERO_PAPER = "Rajbhandari et al. 2019 (ZeRO, arXiv:1910.02054)"
FSDP_PAPER = "Zhao et al. 2023 (PyTorch FSDP, arXiv:2304.11277)"
DDP_PAPER = "Li et al. 2020 (PyTorch DDP, arXiv:2006.15704)"
KORTHIKANTI = "Korthikanti et al. 2022 (Reducing Activation Recomputation, arXiv:2205.05198)"
ZEROPP_PAPER = "Wang et al. 2023 (ZeRO++, arXiv:2306.10209)"
OFFLOAD_PAPER = "Ren et al. 2021 (ZeRO-Offload, USENIX ATC '21)"
DS = "DeepSpeed v0.16.4"  # the snapshot the DeepSpeed line numbers refer to
COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "broadcast")


# ----------------------------------------------------------------------------- figure helpers
def _ms(strategy, psi="7e9", n=8, m=1, recipe=None, part="total"):
    r = f", recipe={recipe!r}" if recipe else ""
    mm = f", m={m}" if m != 1 else ""
    return Fig(f"theory.model_states({strategy!r}, {psi}, {n}{mm}{r}).{part}")


def _sent(strategy, psi="7e9", n=8, m=1, recipe=None, k=1, extra=""):
    args = f"{strategy!r}, {psi}, {n}" + (f", {m}" if m != 1 else "") + (f", recipe={recipe!r}" if recipe else "")
    args += (f", micro_batches={k}" if k != 1 else "") + extra
    return Fig(f"theory.comm_per_rank({args}).total()")


def _ratio(a, b, psi="7e9", n=8):
    return Fig(f"theory.comm_per_rank({a!r}, {psi}, {n}).total() / "
               f"theory.comm_per_rank({b!r}, {psi}, {n}).total()", unit="×", scale=1)


def _in(expr, unit, scale, note, digits=4):
    return Fig(expr, unit=unit, scale=scale, digits=digits, input=True, note=note)


BPP = Fig("recipes.get_recipe('mixed-bf16').total_bytes", unit="bytes", scale=1)
K_BYTES = Fig("recipes.get_recipe('mixed-bf16').optim_bytes", unit="bytes", scale=1)
GPU = _in("80e9", "GB", 1e9, "an 80 GB H100 / A100")
NVLINK = Fig("theory.DEFAULT_BANDWIDTH['dp_shard']", unit="GB/s", scale=1e9)
NIC = Fig("theory.DEFAULT_BANDWIDTH['dp_outer']", unit="GB/s", scale=1e9)
FLOPS = "400e12"  # assumed achieved bf16 FLOP/s per GPU
PCIE = "25e9"  # assumed achieved host<->device bytes/s per direction
TORCH_BUCKET = "25 * 2**20"  # torch DDP's default bucket_cap_mb = 25 (MiB)


def _pts(*texts: str) -> tuple[Point, ...]:
    return tuple(Point(t) for t in texts)


def _collective(prompt: str, right: str, why: str = "") -> Choice:
    return Choice(prompt, COLLECTIVES, (COLLECTIVES.index(right),), why)


# ============================================================================= the deck
CARDS: list[Card] = [
    # ------------------------------------------------------------------------- ddp
    Card(
        id="ddp_overlap", topic="ddp",
        question="How does DDP overlap communication with backward?",
        question_zh="DDP 怎么让梯度通信和 backward 重叠?",
        answer=(
            "Every rank keeps a whole replica and runs backward on its own micro-batch. DDP assigns "
            "the parameters to buckets in roughly the reverse of their forward order, which is the "
            "order backward produces their gradients (torch's default cap is {bucket}, with a small "
            "first bucket of {first}). An autograd hook marks each gradient ready; once a bucket is "
            "complete DDP launches an asynchronous all-reduce of it while backward keeps computing "
            "earlier layers. Before the optimizer step it waits for every bucket, and averaging over "
            "N gives the mean gradient. Traffic is one all-reduce of the gradients, {sent} per rank "
            "per step for 7B in bf16 at N = 8; memory is the full {bpp} per parameter on every rank."),
        checks=(
            _collective("Which collective does DDP run on each gradient bucket?", "all-reduce"),
            Choice("When is a bucket's collective launched?",
                   ("after the whole backward pass has finished, so that every gradient in the bucket is final",
                    "as soon as every gradient in the bucket is ready, while backward continues",
                    "before the next forward pass",
                    "inside the optimizer step"), (1,)),
            Number("Bytes one rank sends per step, 7B parameters, bf16 gradients, N = 8 (ring model)",
                   "sent"),
        ),
        must_hit=_pts("gradients grouped into buckets, filled in reverse layer order",
                      "an autograd hook launches an async all-reduce per ready bucket during backward",
                      "wait for all buckets before the step; average over N",
                      "traffic: one all-reduce of the gradients, 2Ψ elements per rank"),
        follow_ups=(
            ("Why reverse order?", "Gradients appear from the last layer backwards, so buckets fill "
             "in that order and the first one can leave while most of backward remains."),
            ("What does no_sync do?", "It skips the all-reduce on accumulation micro-batches; only the "
             "last micro-batch communicates, so traffic per optimizer step stays one all-reduce."),
            ("Why not one bucket per parameter?", "Each collective pays a fixed latency; many tiny "
             "all-reduces are latency-bound (see card alpha_beta). One huge bucket could not start "
             "before backward ends. Buckets of a few MiB sit between."),
        ),
        evidence=(Evidence("run", "zeroedu run --strategy ddp_bucketed --world-size 4", "comm launched inside backward"),
                  Evidence("module", "zeroedu/strategies/ddp_bucketed.py", "start_grad_sync / finish_grad_sync"),
                  nb("ddp", "Hiding the all-reduce: buckets"), rehearsal("ddp_overlap"),
                  Evidence("source", "torch/nn/parallel/distributed.py", "_DEFAULT_BUCKET_CAP_MB = 25 (MiB)")),
        figures={"sent": _sent("ddp"), "bpp": BPP,
                 "bucket": _in(TORCH_BUCKET, "MiB", 2 ** 20, "torch DDP bucket_cap_mb default"),
                 "first": _in("2**20", "MiB", 2 ** 20, "torch dist._DEFAULT_FIRST_BUCKET_BYTES")},
        sources=(f"{DDP_PAPER} §3.2",),
    ),
    # ------------------------------------------------------------------------- zero
    Card(
        id="zero_stages", topic="zero",
        question="What do ZeRO stages 1, 2 and 3 shard, and how much memory per GPU?",
        question_zh="ZeRO 1/2/3 各切了什么?每张卡要多少显存?",
        answer=(
            "With mixed-precision Adam a parameter costs 2 bytes of bf16 weight, 2 of bf16 gradient and "
            "{k} of fp32 optimizer state (master copy, m, v). Plain data parallelism keeps all {bpp} on "
            "every GPU: {ddp} for a 7B model. Stage 1 splits the optimizer state N ways, 4Ψ + 12Ψ/N: "
            "{z1} at N = 8. Stage 2 splits the gradients as well, 2Ψ + 14Ψ/N: {z2}. Stage 3 splits the "
            "weights too, 16Ψ/N: {z3}. Activations and temporarily gathered layers come on top."),
        checks=(
            Choice("Which of these does ZeRO stage 2 shard across the N ranks?",
                   ("the optimizer state (fp32 master, m, v)", "the gradients", "the bf16 weights",
                    "the activations"), (0, 1)),
            Number("Model-state bytes per parameter with mixed-precision Adam, unsharded", "bpp"),
            Number("Model-state bytes per GPU with ZeRO-1, 7B, N = 8", "z1"),
            Number("Model-state bytes per GPU with ZeRO-2, 7B, N = 8", "z2"),
        ),
        must_hit=_pts("stage 1 shards the optimizer state", "stage 2 adds the gradients",
                      "stage 3 adds the parameters", "16 bytes per parameter with mixed-precision Adam",
                      "a concrete figure, e.g. 7B at N = 8"),
        follow_ups=(
            ("Why is the optimizer state 12 bytes, not 2×Ψ?", "Adam keeps m and v in fp32 (4 + 4) and "
             "mixed precision adds an fp32 master copy of the weights (4): {k}."),
            ("Does 7B fit a GPU of {gpu} with DDP?", "No: {ddp} of model states. ZeRO-1 at N = 8 does "
             "({z1}), before activations."),
        ),
        evidence=(nb("zero1", "The formula"), nb("zero2", "The formula"), nb("fact_check", "Claim 2"),
                  Evidence("run", "zeroedu run --strategy zero2 --world-size 4", "measured bytes = theory"),
                  Evidence("module", "zeroedu/theory/memory.py", "model_states"), rehearsal("zero_stages")),
        figures={"ddp": _ms("ddp"), "z1": _ms("zero1"), "z2": _ms("zero2"), "z3": _ms("fsdp1"),
                 "bpp": BPP, "k": K_BYTES, "gpu": GPU},
        sources=(f"{ZERO_PAPER} §3.1, §5.1, Fig. 1",),
    ),
    Card(
        id="zero3_comm", topic="zero",
        question="How much more communication does ZeRO-3 need than DDP?",
        question_zh="ZeRO-3 比 DDP 多多少通信?",
        answer=(
            "DDP all-reduces the gradients once, which is a reduce-scatter plus an all-gather: 2Ψ "
            "elements per rank. ZeRO-3 all-gathers the parameters before forward, all-gathers them again "
            "before backward because they were freed, and reduce-scatters the gradients: 3Ψ elements. "
            "When parameters and gradients travel in the same dtype that is {ratio} DDP's bytes, not "
            "double: {ddp} vs {z3} per rank per step for 7B in bf16 at N = 8. The ratio is in elements; "
            "if the gradients are reduced in fp32 while the parameters are gathered in bf16, the bytes "
            "compare differently. Keeping parameters from forward to backward "
            "(reshard_after_forward=False) drops the second gather: {noreshard}."),
        checks=(
            Number("ZeRO-3 bytes sent per rank per step divided by DDP's, same dtype for parameters and "
                   "gradients", "ratio"),
            Choice("Which collectives make up ZeRO-3's 3Ψ per step?",
                   ("all-gather before forward, all-gather before backward, reduce-scatter of gradients",
                    "two all-reduces of the gradients and one broadcast",
                    "an all-reduce of the gradients and an all-gather of the parameters",
                    "a reduce-scatter of the gradients before backward, another after it, and one all-gather of the parameters"), (0,)),
            Number("Bytes one rank sends per step with ZeRO-3, 7B in bf16, N = 8", "z3"),
            Number("FSDP gathering bf16 parameters but reduce-scattering fp32 gradients, divided by a "
                   "bf16 DDP's bytes, 7B, N = 8", "r_mixed"),
        ),
        must_hit=_pts("DDP = 2Ψ: an all-reduce is a reduce-scatter plus an all-gather",
                      "ZeRO-3 = 3Ψ: two parameter all-gathers and one gradient reduce-scatter",
                      "one and a half times DDP, not double, when params and grads share a dtype",
                      "reshard_after_forward=False brings it back to 2Ψ at a memory cost"),
        follow_ups=(
            ("Where does \"double\" come from in some notes?", "Counting the all-gather plus the "
             "reduce-scatter as two all-reduces. The measured ratio is {ratio}."),
            ("Is the ratio in bytes always the same?", "Only with one dtype on the wire. torchtitan reduces FSDP "
             "gradients in fp32 by default while gathering bf16 parameters: {fsdp_mixed} per rank, "
             "{r_mixed} a bf16 DDP ({ddp}); against a DDP that also reduces in fp32 ({ddp_fp32}) it "
             "is {r_same}."),
        ),
        evidence=(nb("fact_check", "Claim 1"), nb("zero3", "The formulas"),
                  Evidence("run", "zeroedu run --strategy fsdp1 --world-size 4", "sent by all_gather vs reduce_scatter"),
                  Evidence("run", "zeroedu run --strategy fsdp1 --world-size 4 --no-reshard-after-forward", "one all-gather"),
                  rehearsal("zero3_comm"),
                  Evidence("source", "torchtitan/config/configs.py", "mixed_precision_reduce = 'float32'")),
        figures={"ratio": _ratio("fsdp1", "ddp"), "ddp": _sent("ddp"), "z3": _sent("fsdp1"),
                 "noreshard": _sent("fsdp1", extra=", reshard_after_forward=False"),
                 "fsdp_mixed": _sent("fsdp1", extra=", reduce_dtype='fp32'"),
                 "ddp_fp32": _sent("ddp", extra=", reduce_dtype='fp32'"),
                 "r_mixed": Fig("theory.comm_per_rank('fsdp1', 7e9, 8, reduce_dtype='fp32').total() / "
                                "theory.comm_per_rank('ddp', 7e9, 8).total()", unit="×", scale=1),
                 "r_same": Fig("theory.comm_per_rank('fsdp1', 7e9, 8, reduce_dtype='fp32').total() / "
                               "theory.comm_per_rank('ddp', 7e9, 8, reduce_dtype='fp32').total()", unit="×", scale=1)},
        sources=(f"{ZERO_PAPER} §7.1, §7.2.2", f"{FSDP_PAPER} §3.2.1"),
    ),
    Card(
        id="zero1_vs_zero2_comm", topic="zero",
        question="ZeRO stage 1 vs stage 2: is there a communication difference, and a gap between paper and code?",
        question_zh="ZeRO-1 和 ZeRO-2 通信量有区别吗?论文和代码有 gap 吗?",
        answer=(
            "In the paper both move 2Ψ, like DDP: reduce-scatter the gradients so each rank gets the sum "
            "for its own shard, update that shard, all-gather the new weights. Stage 2 differs in memory, "
            "it frees the gradients it does not own ({z2} vs {z1} at 7B, N = 8), and in timing: it must "
            "reduce in backward hooks on every micro-batch, while stage 1 can wait for the "
            "gradient-accumulation boundary. The gap is in DeepSpeed's defaults: since v0.12.4 "
            "use_multi_rank_bucket_allreduce is true, so stages 1 and 2 all-reduce each gradient bucket "
            "and each rank keeps only its own slices. With the parameter all-gather that is about 3Ψ: "
            "{z1ar} per rank instead of the paper's {z1s}, {gap}. Setting the flag false sends "
            "per-owner reduces, reduce-scatter volume (2Ψ); reduce_scatter: false forces a plain "
            "all-reduce."),
        checks=(
            Number("Bytes one rank sends per step with the paper's ZeRO-1/2 (reduce-scatter + all-gather), "
                   "7B in bf16, N = 8", "z1s"),
            Number("The same when the gradients are all-reduced instead of reduce-scattered", "z1ar"),
            Choice("With DeepSpeed's defaults (v0.12.4 and later), how are ZeRO-1/2 gradient buckets reduced?",
                   ("a reduce-scatter of each bucket",
                    "an all-reduce of each bucket; each rank keeps only its own slices",
                    "one reduce per slice, sent to the rank that owns that slice of the optimizer state",
                    "not at all until the optimizer step"), (1,)),
            Choice("Which stage reduces gradients during backward on every micro-batch?",
                   ("stage 1", "stage 2", "both", "neither"), (1,)),
        ),
        must_hit=_pts("paper: both stages 2Ψ, the same as DDP",
                      "stage 2 frees non-owned gradients: memory, and it reduces every micro-batch",
                      "DeepSpeed default (v0.12.4+): bucket all-reduce, about 3Ψ",
                      "use_multi_rank_bucket_allreduce=false gives reduce-scatter volume"),
        follow_ups=(
            ("And with K accumulation micro-batches?", "Stage 1 still reduces once per optimizer step; "
             "stage 2 reduces on each of the K micro-batches (DeepSpeed's engine also refuses no_sync "
             "for stage 2 and above)."),
        ),
        evidence=(Evidence("run", "zeroedu run --strategy zero1_allreduce --world-size 4", "all_reduce + all_gather"),
                  Evidence("run", "zeroedu run --strategy zero1 --world-size 4", "reduce_scatter + all_gather"),
                  nb("zero1", "Paper vs code: reduce-scatter or all-reduce?"), rehearsal("zero1_vs_zero2_comm"),
                  Evidence("source", "deepspeed/runtime/zero/stage_1_and_2.py",
                           f"{DS}: average_tensor (l.1051) -> allreduce_and_scatter when "
                           "use_multi_rank_bucket_allreduce, else allreduce_no_retain per owner; "
                           "reduce_scatter=False -> gradient_reduction_w_predivide (all-reduce)"),
                  Evidence("source", "deepspeed/runtime/zero/config.py",
                           f"{DS}: reduce_scatter: bool = True (l.104); use_multi_rank_bucket_allreduce: "
                           "bool = True (l.115), added in PR #4695, first in v0.12.4"),
                  Evidence("source", "deepspeed/runtime/engine.py",
                           f"{DS}: stage >= 2 reduces on non-boundary micro-batches (l.2051); no_sync "
                           "refused for stage >= 2 (l.2065)")),
        figures={"z1": _ms("zero1"), "z2": _ms("zero2"), "gap": _ratio("zero1_allreduce", "zero1"),
                 "z1ar": _sent("zero1_allreduce"), "z1s": _sent("zero1")},
        sources=(f"{ZERO_PAPER} §5.1, §5.2, §7.2.1",),
    ),
    Card(
        id="zero_pp", topic="zero",
        question="What is ZeRO++, and where does its \"4x less communication\" come from?",
        question_zh="ZeRO++ 是什么?它说的通信量减少 4 倍是怎么来的?",
        answer=(
            "Three changes to ZeRO-3's traffic across nodes. qwZ all-gathers the weights quantized to "
            "int8 in blocks, half the bytes of bf16. hpZ keeps a second copy of each parameter sharded "
            "only inside the node (zero_hpz_partition_size = GPUs per node), so the backward all-gather "
            "never leaves the node; it costs a bf16 shard over the node's GPUs, {hpz_mem} per GPU for "
            "7B on nodes of 8. qgZ replaces the gradient reduce-scatter with a quantized (int4) "
            "all-to-all. Counting elements across nodes as the paper does, Ψ + Ψ + Ψ becomes "
            "Ψ/2 + 0 + Ψ/4: {zpp} less. hpZ is not HSDP: the primary shards, the optimizer state and "
            "the gradient reduction still span every rank. DeepSpeed's HSDP analogue is MiCS "
            "(mics_shard_size): shard inside a group, replicate across groups."),
        checks=(
            Choice("Which part of ZeRO++ keeps the backward parameter all-gather inside a node?",
                   ("qwZ", "hpZ", "qgZ", "MiCS"), (1,)),
            Choice("Is hpZ the same as HSDP?",
                   ("yes: it shards everything inside the node and replicates across nodes, exactly the layout of HSDP",
                    "no: optimizer state and gradient reduction still span all ranks; MiCS is the HSDP analogue",
                    "yes, but only for the optimizer state"), (1,)),
            Number("ZeRO-3's cross-node bytes per rank (bf16) divided by ZeRO++'s (int8 weights, no "
                   "cross-node backward gather, int4 gradients)", "zpp"),
        ),
        must_hit=_pts("qwZ: int8 block-quantized weight all-gather", "hpZ: secondary intra-node partition, backward gather stays in the node",
                      "qgZ: quantized gradient all-to-all", "3Ψ -> 0.75Ψ elements across nodes",
                      "hpZ is not HSDP; MiCS is"),
        follow_ups=(
            ("What does hpZ cost?", "Memory: a secondary bf16 shard over the node's GPUs, {hpz_mem} per "
             "GPU here, rebuilt every step; torch's analogue is fully_shard's "
             "reshard_after_forward=<int>."),
        ),
        evidence=(Evidence("source", "docs/_tutorials/zeropp.md", "DeepSpeed ZeRO++ tutorial: qwZ, hpZ, qgZ"),
                  Evidence("source", "deepspeed/runtime/zero/partition_parameters.py",
                           f"{DS}: _partition_param_sec (l.1673) builds the secondary tensor"),
                  Evidence("source", "deepspeed/runtime/zero/config.py",
                           f"{DS}: zero_hpz_partition_size (l.294), zero_quantized_weights (l.298), "
                           "zero_quantized_gradients (l.310), mics_shard_size (l.326)"),
                  nb("hybrid", "In the real frameworks"), rehearsal("zero_pp")),
        figures={"zpp": Fig("theory.comm_per_rank('fsdp1', 7e9, 8).total() / "
                            "(theory.sent_bytes('all_gather', 7e9 * 1, 8) + theory.sent_bytes('reduce_scatter', 7e9 / 2, 8))",
                            unit="×", scale=1),
                 "hpz_mem": _ms("fsdp1", part="param")},
        sources=(ZEROPP_PAPER,),
    ),
    Card(
        id="zero_equivalence", topic="zero",
        question="Does ZeRO or FSDP change the model you train, compared with DDP?",
        question_zh="ZeRO / FSDP 训练出来的模型和 DDP 一样吗?",
        answer=(
            "In exact arithmetic, no: every stage computes the same mean gradient over the global batch "
            "and applies the same Adam update; only where the bytes live and which collective moves "
            "them change (7B on 8 GPUs: {ddp} per GPU with DDP, {zero3} with ZeRO-3, the same model "
            "trained). Runs differ in the last bits because floating-point addition is not "
            "associative: a reduce-scatter sums in a different order than an all-reduce or a single "
            "process, the reduction dtype (bf16 vs fp32) rounds differently, and where the division by "
            "N happens (before or after the sum) changes the rounding. So compare against a "
            "single-process run on the global batch with a tolerance, never bit for bit. Adam amplifies "
            "round-off on parameters whose true gradient is zero, so leave those out of equality checks."),
        checks=(
            Choice("Where do small differences between a DDP and an FSDP run come from?",
                   ("floating-point summation order and the reduction dtype",
                    "FSDP uses a different optimizer", "FSDP drops the gradients of parameters another rank owns before they are reduced",
                    "FSDP sees different data"), (0,)),
            Choice("What is the independent reference for checking a sharded run?",
                   ("single-process training on the global batch",
                    "the same sharded run repeated on another number of ranks with the same initial weights", "the loss going down", "the run's own log"), (0,)),
        ),
        must_hit=_pts("same gradient, same update in exact arithmetic",
                      "differences from summation order / reduction dtype / where you divide",
                      "check against a single-process run on the global batch, with a tolerance"),
        evidence=(Evidence("run", "zeroedu run --strategy zero2 --world-size 4", "loss matches the single-process reference"),
                  Evidence("module", "zeroedu/train/reference.py", "single-process training on the global batch"),
                  Evidence("module", "zeroedu/references/torch_fsdp2.py", "torch's fully_shard as an oracle"),
                  nb("fsdp1_vs_fsdp2", "torch's `fully_shard` beside zeroedu's FSDP2"), rehearsal("zero_equivalence")),
        figures={"ddp": _ms("ddp"), "zero3": _ms("fsdp1")},
        sources=(f"{ZERO_PAPER} §5",),
    ),
    # ------------------------------------------------------------------------- fsdp
    Card(
        id="fsdp_how", topic="fsdp",
        question="How does torch FSDP work?",
        question_zh="PyTorch FSDP 是怎么工作的?",
        answer=(
            "FSDP is ZeRO-3 in PyTorch. The model is wrapped in units (usually one per block); each rank "
            "stores 1/N of every unit's parameters, gradients and optimizer state. Before a unit's "
            "forward it all-gathers the full parameters (unshard), computes, and frees them again "
            "(reshard). In backward it gathers again, computes the gradients, and reduce-scatters them "
            "so each rank keeps only its gradient shard; the optimizer then updates the local shard. "
            "Per rank that is 16Ψ/N of model states ({z3} for 7B at N = 8) plus the largest gathered "
            "unit, and {ratio} DDP's traffic."),
        checks=(
            Choice("What does FSDP do right before a unit's forward?",
                   ("all-gather the unit's parameter shards", "reduce-scatter the unit's gradients",
                    "all-reduce the unit's parameters so that every rank holds their average", "broadcast the unit from rank 0"), (0,)),
            _collective("Which collective turns a unit's full gradients into each rank's gradient shard?",
                        "reduce-scatter"),
            Choice("What does each rank keep sharded between steps?",
                   ("parameters", "gradients", "optimizer state", "activations"), (0, 1, 2)),
            Number("Model-state bytes per GPU, 7B, N = 8 (before the gathered unit)", "z3"),
        ),
        must_hit=_pts("parameters sharded; a unit is all-gathered just before use",
                      "freed after use (reshard), gathered again in backward",
                      "gradients reduce-scattered", "memory = sharded states + one full unit"),
        follow_ups=(
            ("What is a unit?", "The granularity of gathering: a wrapped submodule. Smaller units mean "
             "lower peak memory but more, smaller collectives."),
        ),
        evidence=(Evidence("run", "zeroedu run --strategy fsdp1 --world-size 4", "unit all-gather / reshard events"),
                  Evidence("module", "zeroedu/strategies/fsdp_units.py", "unshard / reshard / post_backward"),
                  nb("zero3", "One step of a unit's life"), nb("fact_check", "Claim 5"), rehearsal("fsdp_how")),
        figures={"z3": _ms("fsdp1"), "ratio": _ratio("fsdp1", "ddp")},
        sources=(f"{FSDP_PAPER} §3", f"{ZERO_PAPER} §5.3"),
    ),
    Card(
        id="fsdp_hide_comm", topic="fsdp",
        question="How does FSDP hide its communication?",
        question_zh="FSDP 怎么把通信藏起来?",
        answer=(
            "It issues a unit's all-gather on a separate stream before the compute that needs it, so "
            "gathering overlaps the previous unit's compute. In backward it prefetches the next unit's "
            "parameters by default (backward runs the units in reverse); forward prefetch is optional "
            "and helps when the CPU cannot run ahead of the GPU. Reduce-scatters of finished units run "
            "asynchronously while backward goes on. A rate limiter caps how many gathered units are "
            "alive at once, trading overlap for peak memory. The numbers are friendly: gathering one of "
            "the 32 blocks of a 7B model over N = 8 on NVLink ({nvl}) takes {t_block}, short next to a "
            "block's compute for a few thousand tokens."),
        checks=(
            Choice("What does FSDP prefetch in backward by default?",
                   ("nothing", "the all-gather of the unit backward needs next",
                    "the reduce-scatter of the next unit, issued before its gradients exist", "the optimizer state"), (1,)),
            Choice("What does the rate limiter (FSDP1 limit_all_gathers) bound?",
                   ("the number of gathered units / in-flight all-gathers, to cap peak memory",
                    "the bandwidth each rank may use for all-gathers, so that the reduce-scatters are never starved", "the number of ranks", "the bucket size"), (0,)),
            Number("Time to all-gather one of 32 blocks of a 7B model in bf16 over N = 8 at {nvl} "
                   "(bandwidth term only)", "t_block"),
        ),
        must_hit=_pts("prefetch the next unit's all-gather", "separate stream, asynchronous",
                      "reduce-scatter overlaps the rest of backward",
                      "a limit on in-flight units trades overlap for memory"),
        evidence=(Evidence("run", "zeroedu run --strategy fsdp1 --world-size 4 --prefetch both", "overlap fraction"),
                  Evidence("module", "zeroedu/strategies/fsdp_units.py", "prefetch options"),
                  nb("zero3", "The knobs side by side"), rehearsal("fsdp_hide_comm")),
        figures={"t_block": Fig("theory.all_gather_time(7e9 / 32 * 2, 8, theory.DEFAULT_BANDWIDTH['dp_shard'])",
                                unit="ms", scale=1e-3),
                 "nvl": NVLINK},
        sources=(f"{FSDP_PAPER} §3.3, §3.4.2",),
    ),
    Card(
        id="fsdp1_vs_fsdp2", topic="fsdp",
        question="What is the difference between FSDP1 and FSDP2?",
        question_zh="FSDP2 和 FSDP1 有什么区别?",
        answer=(
            "FSDP1 flattens all parameters of a unit into one FlatParameter, pads it to a multiple of N "
            "and cuts it into equal chunks, so a chunk can straddle parameters. FSDP2 shards each "
            "parameter on its own along dim 0 as a DTensor, so a rank holds whole rows, sometimes none. "
            "That makes per-parameter state (dtype, requires_grad, optimizer) simple, composes with "
            "tensor parallelism, gives sharded state dicts without gathering, and replaces FSDP1's "
            "CPU-blocking rate limiter with stream-based memory management. Bytes are the same 16Ψ/N "
            "up to padding ({fsdp} per GPU for 7B on 8 GPUs in either)."),
        checks=(
            Choice("How does FSDP2 shard a parameter?",
                   ("flattened with the unit's other parameters into one FlatParameter, cut in N equal pieces",
                    "each parameter on its own along dim 0, as a DTensor",
                    "each parameter along its last dim", "it does not shard parameters"), (1,)),
            Choice("FSDP2 on 3 ranks, a weight with 10 rows: how many rows does each rank hold?",
                   ("4, 4 and 2", "3, 3 and 4", "10 each", "4, 3 and 3"), (0,),
                   why="torch.chunk gives ceil(10/3) = 4 rows to each rank until the rows run out"),
            Choice("What does per-parameter sharding make simpler?",
                   ("different dtypes or requires_grad inside one unit", "composing with tensor parallelism",
                    "sharded state dicts without an all-gather", "sending fewer bytes per step"), (0, 1, 2)),
        ),
        must_hit=_pts("FSDP1: one flat, padded parameter per unit", "FSDP2: per-parameter dim-0 DTensor shards",
                      "composability: TP, per-parameter dtypes, sharded state dicts"),
        evidence=(Evidence("run", "zeroedu run --strategy fsdp2 --world-size 3", "uneven shards per rank"),
                  Evidence("module", "zeroedu/shard.py", "FlatLayout vs dim0_rows"),
                  nb("fsdp1_vs_fsdp2", "Who owns which element"), rehearsal("fsdp1_vs_fsdp2")),
        figures={"fsdp": _ms("fsdp2")},
        sources=("PyTorch docs: torch.distributed.fsdp.fully_shard",),
    ),
    Card(
        id="fsdp_linear", topic="fsdp",
        question="Write the FSDP version of one linear layer (forward and backward).",
        question_zh="手写一层 FSDP 的 linear(前向和反向)。",
        answer=(
            "Each rank stores a slice of W's rows. Forward: all-gather the slices into the full W, "
            "compute Y = X Wᵀ on the local batch, free W. Backward: all-gather W again, dX = dY W "
            "(local, no reduction: each rank has its own batch), dW = dYᵀ X on the local batch (full "
            "shape), then reduce-scatter dW over ranks so each keeps the summed rows it owns, divided "
            "by N for the mean. Pad W's rows to a multiple of N on the wire when they do not divide. "
            "Per step each rank sends two all-gathers and one reduce-scatter of W, each (N−1)/N of its "
            "bytes: {layer} for one 4096 × 4096 bf16 weight on 8 ranks."),
        checks=(
            Choice("In backward, how is dX computed?",
                   ("dX = dY W on each rank, no communication", "an all-reduce of dX, since each rank holds only its shard of W",
                    "a reduce-scatter of dX", "an all-gather of dX"), (0,)),
            _collective("Which collective leaves each rank with its own summed rows of dW?", "reduce-scatter"),
            Choice("What shape is dW before that collective?",
                   ("the full weight's shape", "the rank's shard of rows", "the transposed shard"), (0,)),
        ),
        must_hit=_pts("store a shard of rows; all-gather before use", "dX = dY W locally",
                      "dW = dYᵀ X, then reduce-scatter", "free the gathered weight; gather again in backward"),
        evidence=(Evidence("lab", "lab3_fsdp_linear", "python -m zeroedu.labs check 3"),
                  nb("fsdp_linear", "The formulas"), rehearsal("fsdp_linear")),
        figures={"layer": Fig("3 * theory.sent_bytes('all_gather', 2 * 4096 * 4096, 8)", unit="MB", scale=1e6)},
        sources=(f"{FSDP_PAPER} §3.2",),
    ),
    Card(
        id="fsdp_comm_bound", topic="fsdp",
        question="When is FSDP communication-bound? How many tokens per GPU hide its traffic?",
        question_zh="FSDP 什么时候是通信瓶颈?每张卡每步要多少 token 才能把通信藏住?",
        answer=(
            "Training costs about 6Ψ FLOPs per token (2Ψ forward, 4Ψ backward), so T tokens per GPU take "
            "6ΨT/F seconds at an achieved F. FSDP sends 3Ψ elements per step, 3·(N-1)/N·2Ψ bytes in "
            "bf16, taking that over the bandwidth B. Compute hides the traffic when "
            "6ΨT/F ≥ 6·(N-1)/N·Ψ/B, i.e. T ≥ (N-1)/N·F/B: the model size cancels. At F = {flops}, "
            "inside an NVLink node (B = {nvl}, N = 8) that is {t_nvl} per GPU per step; flat across "
            "nodes (B = {nic}, N = 16) it is {t_ib}, whose traffic alone takes {comm_ib} per step for "
            "7B. Below the threshold the step waits on the network: raise the tokens per GPU, shard "
            "only inside the node (HSDP), or keep parameters between forward and backward."),
        checks=(
            Number("Tokens per GPU per step needed to hide flat FSDP traffic across nodes: N = 16, "
                   "B = {nic}, F = {flops}", "t_ib"),
            Number("FSDP communication time per step for 7B in bf16, flat over N = 16 at {nic}", "comm_ib"),
            Choice("How does that token threshold change from a 7B to a 70B model?",
                   ("it grows in proportion to Ψ", "it does not change: Ψ cancels",
                    "it shrinks in proportion to Ψ"), (1,)),
        ),
        must_hit=_pts("compute ≈ 6Ψ FLOPs per token", "FSDP comm ≈ 3Ψ elements (bf16: 6Ψ bytes) per step",
                      "threshold T ≈ (N-1)/N · F/B tokens per GPU, independent of Ψ",
                      "remedies: more tokens per GPU, HSDP, no reshard after forward"),
        follow_ups=(
            ("Same for 70B across nodes?", "Yes: {t_ib_70b}. Bigger models take longer to communicate "
             "and longer to compute, in the same proportion."),
        ),
        evidence=(Evidence("module", "zeroedu/theory/timing.py", "comm_time"),
                  nb("hybrid", "What the split is worth at scale"), rehearsal("fsdp_comm_bound")),
        figures={"flops": _in(FLOPS, "TFLOP/s", 1e12, "assumed achieved bf16 rate per GPU, well below an H100's dense peak"),
                 "nvl": NVLINK, "nic": NIC,
                 "t_nvl": Fig(f"theory.comm_time(theory.comm_per_rank('fsdp1', 7e9, 8)) * {FLOPS} / (6 * 7e9)",
                              unit="tokens", scale=1),
                 "t_ib": Fig(f"theory.comm_time(theory.comm_per_rank('fsdp1', 7e9, 16), "
                             f"{{'dp_shard': theory.DEFAULT_BANDWIDTH['dp_outer']}}) * {FLOPS} / (6 * 7e9)",
                             unit="tokens", scale=1),
                 "t_ib_70b": Fig(f"theory.comm_time(theory.comm_per_rank('fsdp1', 70e9, 16), "
                                 f"{{'dp_shard': theory.DEFAULT_BANDWIDTH['dp_outer']}}) * {FLOPS} / (6 * 70e9)",
                                 unit="tokens", scale=1),
                 "comm_ib": Fig("theory.comm_time(theory.comm_per_rank('fsdp1', 7e9, 16), "
                                "{'dp_shard': theory.DEFAULT_BANDWIDTH['dp_outer']})", unit="ms", scale=1e-3)},
        sources=(f"{FSDP_PAPER} §3.3", "Kaplan et al. 2020 (6Ψ FLOPs per token)"),
    ),
    Card(
        id="reshard_after_forward", topic="fsdp",
        question="What does FSDP's reshard_after_forward=False (FSDP1's SHARD_GRAD_OP) trade?",
        question_zh="FSDP 的 reshard_after_forward=False(FSDP1 的 SHARD_GRAD_OP)用什么换什么?",
        answer=(
            "Normally FSDP frees a unit's gathered parameters after its forward and gathers them again "
            "before its backward. Keeping them skips the backward all-gather: traffic drops from 3Ψ to "
            "2Ψ elements, {keep} instead of {reshard} per rank for 7B at N = 8, DDP's volume. The price "
            "is memory: every unit's unsharded parameters stay alive from its forward to its backward, "
            "up to the whole model's bf16 weights ({full}) when backward starts, a ZeRO-2-like profile. "
            "torch keeps the root module unsharded by default (backward needs it first). An integer "
            "value reshards to a smaller group after forward, e.g. the GPUs of one node, so the backward "
            "gather stays inside the node for {int_mem} more per GPU: torch's analogue of ZeRO++'s hpZ."),
        checks=(
            Number("Bytes one rank sends per step with reshard_after_forward=False, 7B in bf16, N = 8", "keep"),
            Choice("What does it cost?",
                   ("the unsharded parameters of each unit stay alive from forward to backward",
                    "the optimizer state is no longer sharded, since every rank needs all of it in backward", "the gradients are no longer sharded",
                    "nothing"), (0,)),
            Choice("reshard_after_forward=8 on a 64-GPU job means:",
                   ("after forward, keep the parameters sharded over 8 ranks so backward gathers within a node",
                    "8 units stay unsharded", "prefetch the parameters of the next 8 units during backward instead of gathering one unit at a time", "reshard every 8 steps"), (0,)),
        ),
        must_hit=_pts("skips the backward all-gather: 3Ψ -> 2Ψ", "memory: gathered params live from forward to backward",
                      "int value = reshard to a smaller (intra-node) group"),
        evidence=(Evidence("run", "zeroedu run --strategy fsdp1 --world-size 4 --no-reshard-after-forward", "one all-gather per unit"),
                  nb("zero3", "The knobs side by side"), rehearsal("reshard_after_forward"),
                  Evidence("source", "torch/distributed/fsdp/_fully_shard/_fully_shard.py",
                           "fully_shard docstring: reshard_after_forward bool | int")),
        figures={"keep": _sent("fsdp1", extra=", reshard_after_forward=False"), "reshard": _sent("fsdp1"),
                 "full": _ms("ddp", n=1, part="param"), "int_mem": _ms("fsdp1", part="param")},
        sources=(f"{FSDP_PAPER} §3.2.1", "PyTorch docs: fully_shard(reshard_after_forward)"),
    ),
    # ------------------------------------------------------------------------- megatron
    Card(
        id="megatron_level", topic="megatron",
        question="Which ZeRO level is Megatron's distributed optimizer?",
        question_zh="Megatron 的 distributed optimizer 相当于 ZeRO 几?",
        answer=(
            "ZeRO-1: it shards only the optimizer state (fp32 master, m, v) across the data-parallel "
            "ranks. The bf16 weights and the gradient buffer stay whole on every rank, and in "
            "Megatron-LM's bf16 training the gradient buffer is fp32 for accurate accumulation, so the "
            "unsharded part is 6 bytes per parameter: 6Ψ + 12Ψ/N, {dist} for 7B at N = 8 instead of "
            "{full} without sharding. Each step reduce-scatters the fp32 gradient buffer and all-gathers "
            "the updated bf16 weights."),
        checks=(
            Term("Which ZeRO stage is it? (e.g. ZeRO-2)", ("ZeRO-1", "zero stage 1", "stage 1", "1", "P_os")),
            Number("Model-state bytes per GPU, 7B, N = 8, bf16 weights and fp32 gradients", "dist"),
            Number("Bytes one rank sends in its gradient reduce-scatter per step, 7B, N = 8", "mega_rs"),
            Choice("What stays whole (unsharded) on every rank?",
                   ("the bf16 weights", "the fp32 gradient buffer", "the fp32 master weights",
                    "Adam's m and v"), (0, 1)),
        ),
        must_hit=_pts("ZeRO-1: optimizer state only", "fp32 gradient buffer kept whole: 6Ψ + 12Ψ/N",
                      "reduce-scatter of gradients + all-gather of weights"),
        follow_ups=(
            ("Why is its gradient traffic bigger than ZeRO-1's?", "Its reduce-scatter moves fp32 "
             "gradients: {mega_rs} per rank against {z1_rs} for ZeRO-1's bf16 reduce-scatter (7B, "
             "N = 8). Both then all-gather bf16 weights, so the totals are {mega_total} vs {z1_total}."),
            ("Can it reduce in bf16?", "Yes, --grad-reduce-in-bf16 in Megatron-LM (Megatron Core's "
             "DistributedDataParallelConfig.grad_reduce_in_fp32 defaults to False; the training script "
             "turns it on for bf16). That halves the reduce-scatter bytes at some accuracy cost."),
        ),
        evidence=(Evidence("run", "zeroedu run --strategy megatron_distopt --world-size 4", "grad in fp32"),
                  Evidence("module", "zeroedu/strategies/megatron_distopt.py"),
                  nb("megatron", "The formula"), rehearsal("megatron_level"),
                  Evidence("source", "megatron/training/arguments.py", "bf16 with fp32 main grads sets accumulate_allreduce_grads_in_fp32")),
        figures={"dist": _ms("megatron_distopt"), "full": _ms("megatron_distopt", n=1),
                 "mega_rs": Fig("theory.comm_per_rank('megatron_distopt', 7e9, 8).by_collective()['reduce_scatter']"),
                 "z1_rs": Fig("theory.comm_per_rank('zero1', 7e9, 8).by_collective()['reduce_scatter']"),
                 "mega_total": _sent("megatron_distopt"), "z1_total": _sent("zero1")},
        sources=("Megatron Core docs: Distributed Optimizer (bf16 params, fp32 grads: 6 + 12/d)",),
    ),
    Card(
        id="own_optimizer", topic="megatron",
        question="Why does Megatron-FSDP have its own optimizer instead of reusing the distributed optimizer?",
        question_zh="为什么 Megatron-FSDP 不复用 DistributedOptimizer,要自己写 optimizer?",
        answer=(
            "A sharded optimizer is built around one memory layout. Megatron's distributed optimizer "
            "cuts its shard ranges out of the contiguous parameter-and-gradient buffer that Megatron's "
            "DDP owns (ParamAndGradBuffer). Under FSDP the parameters themselves are sharded and the "
            "buffers belong to FSDP, so reusing it meant routing around DDP code paths with branches "
            "(v1's reuse was shallow). A dedicated optimizer works directly on the FSDP shards. The "
            "layout also sets the memory: for 7B on 8 GPUs "
            "the distributed optimizer over DDP's buffer keeps {distopt} per GPU (bf16 parameters and "
            "fp32 gradients stay whole on every rank), Megatron-FSDP sharding all three {fsdp}. The "
            "general point: the optimizer must know who owns which elements."),
        checks=(
            Choice("What does Megatron's DistributedOptimizer assume?",
                   ("DDP's contiguous parameter-and-gradient buffer, out of which it cuts its ranges",
                    "FSDP's per-parameter DTensors, so that each rank can take its slice of every parameter's state", "nothing about the wrapper", "CPU offload"), (0,)),
        ),
        must_hit=_pts("distributed optimizer assumes DDP's param/grad buffer",
                      "under FSDP the params are sharded and FSDP owns the buffers",
                      "v1 reuse was shallow: branches around DDP code"),
        evidence=(Evidence("module", "zeroedu/strategies/megatron_distopt.py", "buffer-wide / local ranges"),
                  nb("megatron", "Three index spaces"), rehearsal("own_optimizer"),
                  Evidence("source", "Megatron-LM PR #5865", "FullyShardedOptimizer")),
        figures={"distopt": _ms("megatron_distopt"), "fsdp": _ms("fsdp2")},
        sources=("Megatron-LM PR #5865",),
    ),
    # ------------------------------------------------------------------------- hybrid
    Card(
        id="hybrid_sharding", topic="hybrid",
        question="Sharding across nodes is too slow. What do you do?",
        question_zh="跨机全切太慢怎么办?",
        answer=(
            "Hybrid sharding: shard inside a node (or NVLink domain) and replicate across nodes. The "
            "per-layer all-gathers and reduce-scatters then stay on NVLink; across nodes only one "
            "all-reduce of each rank's gradient shard per step remains, {cross_h} per rank for 7B on "
            "2 nodes × 8. The price is memory: HSDP keeps 16Ψ/N per GPU ({hsdp}) instead of 16Ψ/(NM) "
            "({flat}). How much time that saves depends on the network: in a bandwidth-only model where "
            "the flat ring runs in lockstep over one {nic} NIC per node boundary, the step's "
            "communication drops from {t_flat} to {t_hsdp}; with the flat ring's traffic striped over "
            "the node's eight NICs (one per GPU), flat ZeRO-3 takes {t_flat_striped} and is the faster "
            "one, and the case for HSDP rests on its {cross_ratio} fewer cross-node bytes (less NIC contention, "
            "slower or shared networks). It is opt-in, not a default: FSDP1's default strategy is FULL_SHARD, FSDP2 "
            "shards flat unless given a 2-D mesh, and torchtitan's default is flat FSDP over every rank "
            "(data_parallel_replicate_degree = 1). DeepSpeed's analogue is MiCS."),
        checks=(
            Number("HSDP model-state bytes per GPU, 7B, 2 nodes × 8 GPUs", "hsdp"),
            Number("Bytes one rank sends across the node boundary per step with HSDP, same setup", "cross_h"),
            Choice("What is FSDP1's default sharding strategy?",
                   ("FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP", "NO_SHARD"), (0,)),
            Choice("DeepSpeed's analogue of HSDP (shard in a group, replicate across groups)?",
                   ("hpZ", "MiCS", "ZeRO-Offload", "qgZ"), (1,)),
        ),
        must_hit=_pts("shard inside the node, replicate across (HSDP)", "gathers stay on the fast link",
                      "cost: more memory per GPU", "opt-in: FULL_SHARD / flat FSDP are the defaults"),
        follow_ups=(
            ("Can you cut the replica cost?", "Yes: shard the optimizer state across nodes too (HFSDP, "
             "ZeRO-1 on the outer axis): {hfsdp} per GPU with the same cross-node bytes."),
        ),
        evidence=(Evidence("run", "zeroedu run --strategy hsdp --world-size 4 --outer 2"),
                  Evidence("module", "zeroedu/theory/hybrid.py", "cross_domain_table"),
                  Evidence("lab", "lab4_hfsdp_memory"), nb("hybrid", "What each GPU holds"), rehearsal("hybrid_sharding"),
                  Evidence("source", "torch/distributed/fsdp/fully_sharded_data_parallel.py", "sharding_strategy (Default: FULL_SHARD)"),
                  Evidence("source", "torchtitan/config/configs.py", "data_parallel_replicate_degree = 1, data_parallel_shard_degree = -1")),
        figures={"hsdp": _ms("hsdp", m=2), "flat": _ms("fsdp1", n=16), "hfsdp": _ms("hfsdp", m=2),
                 "cross_h": Fig("hybrid.cross_domain_bytes('hsdp', 7e9, 8, 2)"),
                 "t_flat": Fig("hybrid.step_comm_time('flat_zero3', 7e9, 8, 2)", unit="ms", scale=1e-3),
                 "t_hsdp": Fig("hybrid.step_comm_time('hsdp', 7e9, 8, 2)", unit="ms", scale=1e-3),
                 "t_flat_striped": Fig("hybrid.step_comm_time('flat_zero3', 7e9, 8, 2, flat_ring='striped')",
                                       unit="ms", scale=1e-3),
                 "nic": NIC,
                 "cross_ratio": Fig("hybrid.cross_domain_bytes('flat_zero3', 7e9, 8, 2) "
                                    "/ hybrid.cross_domain_bytes('hsdp', 7e9, 8, 2)", unit="×", scale=1, digits=3)},
        sources=(f"{FSDP_PAPER} §3.2.2",),
    ),
    Card(
        id="mfsdp_v2", topic="hybrid",
        question="What is Megatron-FSDP v2, and which ZeRO levels can it shard to?",
        question_zh="Megatron-FSDP v2 是什么?能切到哪一级 ZeRO?",
        answer=(
            "Megatron's own fully sharded data parallelism (Megatron-FSDP). Its levels are named no_shard, "
            "optim, optim_grads and optim_grads_params (DDP, ZeRO-1, 2, 3). Version 1, the default "
            "(megatron_fsdp_version = 1), arranges the data-parallel ranks on two mesh axes, an inner "
            "dp_shard (--data-parallel-sharding-strategy) and an outer dp_outer "
            "(--outer-dp-sharding-strategy), each with its own level: ZeRO-3 inside plus no_shard outside "
            "is HSDP ({hsdp} per GPU for 7B, 2 × 8 GPUs); ZeRO-3 inside plus optim outside is HFSDP "
            "({hfsdp}); flat ZeRO-3 over all 16 is {flat}. The Megatron Core 0.20.0 release notes "
            "present v2 as an experimental adapter; in the code today (Megatron-LM main at 0.20.0, "
            "FullyShardedDataParallelV2._validate_config in megatron/core/distributed/fsdp/"
            "mcore_fsdp_adapter.py) v2 shards over one flat data-parallel mesh: it requires "
            "optim_grads_params, refuses outer DP sharding (\"MFSDP v2 does not currently support outer "
            "DP sharding\") and requires TP = PP = CP = 1. HSDP and HFSDP are version 1's."),
        checks=(
            Number("HFSDP model-state bytes per GPU, 7B, 2 domains × 8 GPUs", "hfsdp"),
            Choice("Megatron-FSDP's level name for ZeRO-2?",
                   ("no_shard", "optim", "optim_grads", "optim_grads_params"), (2,)),
            Choice("ZeRO-3 on dp_shard plus optim (ZeRO-1) on dp_outer is:",
                   ("HSDP", "HFSDP", "flat ZeRO-3", "DDP"), (1,)),
            Choice("In Megatron-LM main (0.20.0), which Megatron-FSDP version accepts an outer DP sharding "
                   "level (HSDP, HFSDP)?",
                   ("version 1, the default", "version 2", "both", "neither"), (0,)),
        ),
        must_hit=_pts("four levels no_shard / optim / optim_grads / optim_grads_params",
                      "two axes: dp_shard inner, dp_outer outer, a level each (v1)", "HSDP and HFSDP as combinations",
                      "v2: flat mesh, optim_grads_params only, no outer sharding, TP = PP = CP = 1"),
        evidence=(Evidence("run", "zeroedu run --strategy hfsdp --world-size 4 --outer 2"),
                  Evidence("module", "zeroedu/catalog.py", "per-axis levels"),
                  nb("hybrid", "The code: a composition"), rehearsal("mfsdp_v2")),
        figures={"hsdp": _ms("hsdp", m=2), "hfsdp": _ms("hfsdp", m=2), "flat": _ms("fsdp1", n=16)},
        sources=("Megatron Core 0.20.0 release notes (Parallelism)", "Megatron-FSDP design doc",
                 "Megatron-LM main at 0.20.0 (d98e8a6): megatron/core/distributed/fsdp/mcore_fsdp_adapter.py, "
                 "FullyShardedDataParallelV2._validate_config; distributed_data_parallel_config.py, "
                 "megatron_fsdp_version = 1"),
    ),
    Card(
        id="nvlink_levels", topic="hybrid",
        question="Why pick different sharding levels inside and across NVLink domains?",
        question_zh="为什么 NVLink domain 内外用不同的 ZeRO 级别?",
        answer=(
            "Because the two links differ about {bw_ratio} in bandwidth per GPU ({nvl} NVLink vs one "
            "{nic} NIC). ZeRO-3 gathers every layer twice per step and sits on the critical path, so it "
            "belongs on NVLink. Across domains you want traffic that happens once per step, after "
            "backward: a gradient all-reduce (HSDP) or a reduce-scatter plus parameter all-gather "
            "(HFSDP). For 7B on 2 × 8 GPUs each rank sends {cross_flat} across the boundary with flat "
            "ZeRO-3 but {cross_h} with HSDP/HFSDP."),
        checks=(
            Number("NVLink bandwidth per GPU divided by one NIC's, in the theory's defaults", "bw_ratio"),
            Number("Bytes one rank sends across the domain boundary per step with flat ZeRO-3 over "
                   "2 × 8 GPUs, 7B in bf16", "cross_flat"),
            Choice("Which traffic belongs on the slow cross-domain link?",
                   ("the per-layer parameter all-gathers of both forward and backward", "the once-per-step gradient reduction after backward",
                    "activations", "none: everything should cross"), (1,)),
        ),
        must_hit=_pts("NVLink much faster than the inter-node network",
                      "ZeRO-3 gathers per layer, on the critical path", "the outer axis communicates once per step"),
        follow_ups=(
            ("Is the per-link gap the whole story?", "No: it compares one NVLink port with one NIC. A "
             "ring over nodes that each have one NIC per GPU uses all of them at once, so measured "
             "cross-node bus bandwidth can come much closer to NVLink's; the link model is a bound."),
        ),
        evidence=(Evidence("module", "zeroedu/theory/hybrid.py", "cross_domain_table"),
                  nb("hybrid", "What the split is worth at scale"), rehearsal("nvlink_levels")),
        figures={"bw_ratio": Fig("theory.DEFAULT_BANDWIDTH['dp_shard'] / theory.DEFAULT_BANDWIDTH['dp_outer']",
                                 unit="×", scale=1),
                 "nvl": NVLINK, "nic": NIC,
                 "cross_flat": Fig("hybrid.cross_domain_bytes('flat_zero3', 7e9, 8, 2)"),
                 "cross_h": Fig("hybrid.cross_domain_bytes('hsdp', 7e9, 8, 2)")},
        sources=("Megatron Core 0.20.0 release notes", "PyTorch FSDP docs: ShardingStrategy.HYBRID_SHARD"),
    ),
    # ------------------------------------------------------------------------- comm
    Card(
        id="ring_allreduce", topic="comm",
        question="What does an all-reduce cost, and why is it a reduce-scatter plus an all-gather?",
        question_zh="all-reduce 的通信量是多少?为什么说 all-reduce = reduce-scatter + all-gather?",
        answer=(
            "In a ring of N ranks a buffer of S bytes is cut into N chunks. In the first N-1 steps each "
            "rank passes a chunk to its neighbour and adds what it receives: afterwards each rank holds "
            "the full sum of one chunk. That is a reduce-scatter. In the next N-1 steps the summed "
            "chunks travel round the ring until everyone has all of them: an all-gather. Each rank sends "
            "2(N-1)/N·S in 2(N-1) steps: {ar8} for the bf16 gradients of 7B at N = 8 and {ar64} at "
            "N = 64. Bytes per rank barely grow with N, so the bandwidth term is flat; the number of "
            "steps, and with it the latency term, grows with N."),
        checks=(
            Number("Bytes one rank sends in a ring all-reduce of 7B bf16 gradients, N = 8", "ar8"),
            Number("The same at N = 64", "ar64"),
            Choice("After the reduce-scatter phase, what does each rank hold?",
                   ("the full sum of every chunk, ready for the optimizer step", "the full sum of its own 1/N chunk",
                    "only its own unreduced gradient", "nothing yet"), (1,)),
            Choice("How many sequential ring steps does the all-reduce take?",
                   ("N-1", "2(N-1)", "log2 N", "N²"), (1,)),
        ),
        must_hit=_pts("reduce-scatter then all-gather, N-1 steps each",
                      "each rank sends 2(N-1)/N · S", "per-rank bytes ~flat in N; steps (latency) grow with N"),
        evidence=(nb("collectives", "Deriving the bytes"), nb("collectives", "The ring algorithm, from send/recv"),
                  Evidence("run", "zeroedu run --strategy ddp --world-size 4", "all_reduce bytes on the wire"),
                  Evidence("module", "zeroedu/theory/comm.py", "sent_bytes"), rehearsal("ring_allreduce")),
        figures={"ar8": Fig("theory.sent_bytes('all_reduce', 7e9 * 2, 8)"),
                 "ar64": Fig("theory.sent_bytes('all_reduce', 7e9 * 2, 64)")},
        sources=(f"{ZERO_PAPER} §7.1", "Patarasuk & Yuan 2009 (bandwidth-optimal all-reduce)"),
    ),
    Card(
        id="alpha_beta", topic="comm",
        question="Model the time of a collective with latency and bandwidth. How big should DDP's buckets be?",
        question_zh="用 α–β 模型估计一次集合通信的时间。DDP 的 bucket 该多大?",
        answer=(
            "The α–β model: a message costs a fixed latency α plus its bytes over the bandwidth B. A ring "
            "all-reduce of S bytes over N ranks takes 2(N-1) steps, so "
            "T = 2(N-1)·α + 2(N-1)/N·S/B. The latency term does not shrink with S: small buckets are "
            "latency-bound. The two terms are equal at S = N·α·B, {s_star} for N = 8, α = {alpha}, "
            "B = {nic}; for 90 % of the time on bytes a bucket needs nine times that, {s90}. They "
            "should not be huge either: the "
            "first bucket cannot leave before it is full, and the last one's all-reduce is exposed "
            "after backward ends. torch's default of {bucket} then takes {t_bucket} in this model. "
            "The break-even size grows with N, one reason NCCL can switch to tree algorithms for "
            "smaller messages at scale."),
        checks=(
            Number("Bucket size at which the latency and bandwidth terms of a ring all-reduce are equal: "
                   "N = 8, α = {alpha}, B = {nic}", "s_star"),
            Number("Smallest bucket that spends 90 % of its all-reduce time on bytes, same N, α, B", "s90"),
            Number("Time of one all-reduce of a {bucket} bucket in the same model", "t_bucket"),
            Choice("Buckets far below that size: what dominates their time?",
                   ("the latency term", "the bandwidth term", "compute", "memory copies"), (0,)),
        ),
        must_hit=_pts("T = steps·α + bytes/B; ring all-reduce: 2(N-1)α + 2(N-1)/N · S/B",
                      "break-even S = N·α·B; buckets well above it",
                      "too large: the first bucket starts late, the last one is exposed"),
        evidence=(nb("ddp", "Hiding the all-reduce: buckets"),
                  Evidence("run", "zeroedu run --strategy ddp_bucketed --world-size 4 --bucket-bytes 4096", "more, smaller all-reduces"),
                  Evidence("module", "zeroedu/theory/timing.py", "ring_time, min_bucket_bytes"),
                  rehearsal("alpha_beta")),
        figures={"alpha": Fig("theory.DEFAULT_ALPHA['dp_outer']", unit="µs", scale=1e-6), "nic": NIC,
                 "bucket": _in(TORCH_BUCKET, "MiB", 2 ** 20, "torch DDP bucket_cap_mb default"),
                 "s_star": Fig("theory.min_bucket_bytes(8, theory.DEFAULT_BANDWIDTH['dp_outer'], "
                               "theory.DEFAULT_ALPHA['dp_outer'], efficiency=0.5)", unit="MB", scale=1e6),
                 "s90": Fig("theory.min_bucket_bytes(8, theory.DEFAULT_BANDWIDTH['dp_outer'], "
                            "theory.DEFAULT_ALPHA['dp_outer'], efficiency=0.9)", unit="MB", scale=1e6),
                 "t_bucket": Fig(f"theory.ring_allreduce_time({TORCH_BUCKET}, 8, theory.DEFAULT_BANDWIDTH['dp_outer'], "
                                 "theory.DEFAULT_ALPHA['dp_outer'])", unit="ms", scale=1e-3)},
        sources=("Thakur, Rabenseifner & Gropp 2005 (collectives in MPICH: the α–β cost model)",
                 f"{DDP_PAPER} §3.2, §5.2"),
    ),
    Card(
        id="debug_hang", topic="comm",
        question="Training hangs in a collective, or one rank is much slower. How do you find the culprit?",
        question_zh="训练卡在某个集合通信里,或者某个 rank 特别慢,怎么定位?",
        answer=(
            "A collective finishes only when every rank of the group joins, so a hang is usually one "
            "rank that never arrived (crashed, stuck in data loading, took another code path, or "
            "called collectives in a different order) while its peers wait. Set a timeout in "
            "init_process_group and keep the watchdog's error handling on "
            "(TORCH_NCCL_ASYNC_ERROR_HANDLING), so a stuck collective becomes an error that names the "
            "operation and its sequence number instead of hanging forever. The flight recorder keeps "
            "each rank's recent collectives, on by default in torch 2.13 (2000 entries; "
            "TORCH_FR_BUFFER_SIZE, formerly TORCH_NCCL_TRACE_BUFFER_SIZE, sets how many, 0 turns it "
            "off); TORCH_NCCL_DUMP_ON_TIMEOUT=1 makes each rank dump it when a collective times out, "
            "and the rank whose sequence number lags or whose op differs is the culprit. NCCL_DEBUG=INFO logs NCCL's setup (topology, transports) and errors; py-spy dump "
            "shows where the silent rank's Python is. A healthy collective is short: a {bucket} bucket's "
            "all-reduce over 8 GPUs on NVLink takes {t_ar} in the α–β model, so a wait of seconds "
            "means a missing rank, not a slow link. For a straggler rather than a hang, compare "
            "time spent waiting in collectives per rank: the slow rank waits least. zeroedu's harness "
            "does this for you: it names the rank that never reached the collective."),
        checks=(
            Choice("In a hang, which rank is usually the culprit?",
                   ("the rank that never entered the collective its peers are waiting in",
                    "the first rank to report a timeout, since its collective is the one that failed first", "always rank 0", "the rank with the most memory"), (0,)),
            Term("Environment setting that makes NCCL log its setup and errors (NAME=VALUE)",
                 ("NCCL_DEBUG=INFO",)),
            Choice("What does the flight recorder keep?",
                   ("each rank's recent collectives (op, sizes, sequence number, state), dumped on timeout",
                    "GPU memory snapshots", "the gradients and parameters of the last few steps on every rank, to replay the step that failed", "network packets"), (0,)),
        ),
        must_hit=_pts("a hang = one rank missing from a collective; peers wait",
                      "timeout + watchdog error handling turn it into an error",
                      "flight recorder dumps: compare sequence numbers across ranks",
                      "NCCL_DEBUG=INFO; py-spy on the silent rank; stragglers wait least"),
        evidence=(Evidence("module", "zeroedu/runtime/cluster.py", "RankError: rank(s) never reached the collective"),
                  Evidence("module", "zeroedu/runtime/faults.py", "hang_on"),
                  rehearsal("debug_hang"),
                  Evidence("source", "torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp",
                           "TORCH_NCCL_ASYNC_ERROR_HANDLING, TORCH_NCCL_DUMP_ON_TIMEOUT"),
                  Evidence("source", "torch/csrc/distributed/c10d/FlightRecorder.hpp",
                           "max_entries_ = getCvarInt({\"TORCH_FR_BUFFER_SIZE\", \"TORCH_NCCL_TRACE_BUFFER_SIZE\"}, 2000)")),
        figures={"bucket": _in(TORCH_BUCKET, "MiB", 2 ** 20, "torch DDP bucket_cap_mb default"),
                 "t_ar": Fig(f"theory.ring_allreduce_time({TORCH_BUCKET}, 8, theory.DEFAULT_BANDWIDTH['dp_shard'], "
                             "theory.DEFAULT_ALPHA['dp_shard'])", unit="ms", scale=1e-3)},
        sources=("PyTorch docs: torch.distributed NCCL environment variables", "NVIDIA NCCL docs: NCCL_DEBUG"),
    ),
    # ------------------------------------------------------------------------- memory
    Card(
        id="activation_memory", topic="memory",
        question="How much activation memory does a transformer layer need, and what do selective and full recompute save?",
        question_zh="一层 transformer 的激活要多少显存?selective 和 full recompute 各省多少?",
        answer=(
            "Korthikanti et al. count, per layer with 16-bit activations and no tensor parallelism, "
            "sbh(34 + 5as/h) bytes: 34sbh for what the matmuls, GeLU and LayerNorms keep plus two "
            "dropout masks, and 5as²b for the softmax output, its dropout mask and the dropped-out "
            "probabilities that multiply V. For "
            "s = 2048, b = 1, h = 4096, a = 32 (a 7B-class layer) that is {none} per layer, {none32} for "
            "32 layers. Selective recompute keeps the 34sbh and recomputes only the attention core, "
            "cheap to redo but large: {sel} per layer. Full recompute keeps only the layer input, 2sbh "
            "({full}), and reruns the whole forward in backward, about a third more compute. That count "
            "stores the scores; trainers today run fused attention (FlashAttention, torch's "
            "scaled_dot_product_attention, Transformer Engine's fused attention), which never writes them "
            "and keeps one fp32 log-sum-exp per row instead: 34sbh + 4asb per layer ({fused}), so selective "
            "recompute is left with almost nothing to save, and the choice is between none and full. Data "
            "parallelism does not shard activations: they depend on the micro-batch per GPU, so ZeRO-3 "
            "leaves them unchanged."),
        checks=(
            Number("Activation bytes of one layer, no recompute: s = 2048, b = 1, h = 4096, a = 32", "none"),
            Number("The same with selective recompute", "sel"),
            Number("The same layer with fused attention (FlashAttention-style), no recompute", "fused"),
            Choice("What does selective recompute recompute?",
                   ("the attention core: QKᵀ, softmax, its dropout, attention over V", "the MLP",
                    "the whole transformer layer, its MLP and its attention, from the saved layer input", "only the LayerNorms"), (0,)),
            Choice("Does ZeRO-3 at N = 8 reduce activation memory per GPU?",
                   ("yes, by N: each GPU keeps only its 1/N shard of every saved activation tensor", "no: activations depend on the micro-batch per GPU, not on sharding",
                    "yes, by half"), (1,)),
        ),
        must_hit=_pts("sbh(34 + 5as/h) per layer (16-bit, no TP)", "selective: keep 34sbh, recompute attention core",
                      "full: keep 2sbh, one extra forward", "fused attention stores no scores: 34sbh + 4asb",
                      "DP/ZeRO do not shard activations"),
        evidence=(nb("activations", "Korthikanti et al. 2022"),
                  Evidence("run", "zeroedu run --strategy ddp --world-size 2 --model gpt-tiny --recompute selective",
                           "activation bytes measured = predicted"),
                  Evidence("module", "zeroedu/theory/activations.py", "korthikanti_layer_bytes"), rehearsal("activation_memory")),
        figures={"none": Fig("activations.korthikanti_layer_bytes(2048, 1, 4096, 32)"),
                 "none32": Fig("activations.korthikanti_layer_bytes(2048, 1, 4096, 32) * 32"),
                 "sel": Fig("activations.korthikanti_layer_bytes(2048, 1, 4096, 32, 'selective')"),
                 "full": Fig("activations.korthikanti_layer_bytes(2048, 1, 4096, 32, 'full')", unit="MB", scale=1e6),
                 "fused": Fig("activations.korthikanti_layer_bytes_tp(2048, 1, 4096, 32, 1, 'none', 2, 'fused')")},
        sources=(f"{KORTHIKANTI} §4.1 Eq. (1), §5, Table 2",
                 "torch 2.13: F.scaled_dot_product_attention on CPU saves q, k, v, its output and an fp32 "
                 "log-sum-exp (ScaledDotProductFlashAttentionForCpuBackward0), measured in notebook 06"),
    ),
    Card(
        id="meta_init", topic="memory",
        question="The model does not fit on one device even to initialize it. How do you build it?",
        question_zh="模型大到单卡连初始化都放不下,怎么构建?",
        answer=(
            "Build it on the meta device (with torch.device(\"meta\")): shapes and dtypes, no storage. "
            "Apply the parallelism first: FSDP2's fully_shard keeps meta parameters on meta, now as "
            "DTensor shards. Then allocate only the local shards with model.to_empty(device=...) and "
            "fill them under no_grad with each module's reset_parameters() (or the model's own "
            "init_weights). Each rank then allocates its 16Ψ/N, never the whole model: a 70B model's "
            "bf16 weights alone are {p70}, more than a {gpu} GPU, while FSDP over 64 GPUs needs "
            "{fsdp70} of model states per GPU. Alternatively load the shards straight from a sharded "
            "checkpoint. FSDP1 offered param_init_fn, or sync_module_states to broadcast rank 0's "
            "weights; DeepSpeed's deepspeed.zero.Init context partitions each submodule's parameters "
            "as soon as its __init__ returns, optionally onto CPU or NVMe."),
        checks=(
            Term("Which torch device creates tensors without allocating memory?", ("meta", "meta device", "torch.device('meta')")),
            Choice("Which call allocates real storage for meta-device parameters?",
                   ("model.to_empty(device=...)", "model.to(device)", "torch.load", "fully_shard(model)"), (0,)),
            Number("bf16 weight bytes of a 70B model, unsharded", "p70"),
            Choice("DeepSpeed's way to build a model already partitioned?",
                   ("the deepspeed.zero.Init context", "ZeRO-Offload, which builds the whole model in CPU memory first", "hpZ", "MiCS"), (0,)),
        ),
        must_hit=_pts("construct on the meta device: no storage", "shard first (fully_shard keeps meta on meta)",
                      "to_empty + reset_parameters / init_weights on the local shards",
                      "DeepSpeed: zero.Init partitions during construction"),
        evidence=(nb("fsdp1_vs_fsdp2", "torch's `fully_shard` beside zeroedu's FSDP2"), rehearsal("meta_init"),
                  Evidence("source", "torch/distributed/fsdp/_fully_shard/_fsdp_init.py", "keep meta-device tensors on meta for deferred init"),
                  Evidence("source", "torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py",
                           "error text: call module.to_empty(device) and module.reset_parameters()"),
                  Evidence("source", "torchtitan/trainer.py", "build on meta, parallelize, to_empty, init_weights"),
                  Evidence("source", "deepspeed/runtime/zero/partition_parameters.py", f"{DS}: class Init (l.824)")),
        figures={"p70": _ms("ddp", psi="70e9", n=1, part="param"), "fsdp70": _ms("fsdp2", psi="70e9", n=64),
                 "gpu": GPU},
        sources=(f"{FSDP_PAPER} §3.1 (deferred initialization)",),
    ),
    Card(
        id="offload", topic="memory",
        question="What does ZeRO-Offload move to the CPU, and what limits it?",
        question_zh="ZeRO-Offload 把什么放到 CPU?瓶颈在哪里?",
        answer=(
            "ZeRO-Offload keeps the optimizer state (fp32 master, m, v), the fp32 gradient shard and the "
            "Adam step on the host. With ZeRO-2 the GPU keeps the 16-bit weights, 2Ψ = {dev} for 7B, and "
            "each rank's host holds its shard of optimizer state and fp32 gradients, (12 + 4)Ψ/N = "
            "{host} at N = 8. Every step the "
            "gradient shard goes down to the host and the updated weights come back over PCIe. "
            "DeepSpeed's ZeRO-2 path moves fp32 both ways (it casts the gradient to fp32 on the GPU "
            "before the copy, and copies the fp32 partition back before writing the 16-bit weights): "
            "{pcie_bytes} per GPU per step at N = 8, {pcie_t} at {pcie_bw} if nothing overlaps. A PCIe "
            "4.0 x16 link is {pcie4} per direction nominal, PCIe 5.0 x16 {pcie5}; the CPU Adam step over "
            "the shard is the other bound. Offload pays when memory, not speed, is the limit; "
            "offloading the parameters as well (ZeRO-Infinity, offload_param) needs stage 3."),
        checks=(
            Choice("With ZeRO-2 + ZeRO-Offload, what lives on the CPU?",
                   ("the fp32 master weights", "Adam's m and v", "the 16-bit weights used in forward",
                    "the fp32 gradient shard and the optimizer step"), (0, 1, 3)),
            Number("Weight bytes left on each GPU, 7B under ZeRO-2 with optimizer offload", "dev"),
            Number("Bytes crossing PCIe per GPU per step in DeepSpeed's ZeRO-2 offload path, 7B, N = 8", "pcie_bytes"),
        ),
        must_hit=_pts("optimizer state + fp32 grads + step on the CPU; 16-bit weights on the GPU",
                      "per step: gradient shard down, updated weights up over PCIe",
                      "PCIe (and CPU Adam) bound the step time", "param offload needs stage 3"),
        evidence=(nb("dashboard", "Beyond data parallelism"), rehearsal("offload"),
                  Evidence("module", "zeroedu/theory/extensions.py", "offload"),
                  Evidence("source", "deepspeed/runtime/zero/stage_1_and_2.py",
                           f"{DS}: async_inplace_copy_grad_to_fp32_buffer_from_gpu (l.1268, .float() before the "
                           "copy); step() copies the fp32 partition back to the device (l.1879-1882)"),
                  Evidence("source", "docs/_tutorials/zero.md", "ZeRO-Offload: optimizer and gradient states to CPU within ZeRO-2")),
        figures={"dev": Fig("theory.offload('zero2', 7e9, 8)['device'].param"),
                 "host": Fig("theory.offload('zero2', 7e9, 8)['host'].total"),
                 "pcie_bytes": Fig("theory.offload('zero2', 7e9, 8)['host'].grad + theory.offload('zero2', 7e9, 8)['host'].master"),
                 "pcie_t": Fig("(theory.offload('zero2', 7e9, 8)['host'].grad + theory.offload('zero2', 7e9, 8)['host'].master)"
                               f" / {PCIE}", unit="ms", scale=1e-3),
                 "pcie_bw": _in(PCIE, "GB/s", 1e9, "assumed achieved host<->device rate per direction"),
                 "pcie4": _in("31.5e9", "GB/s", 1e9, "PCIe 4.0: 16 GT/s x 16 lanes, 128b/130b"),
                 "pcie5": _in("63e9", "GB/s", 1e9, "PCIe 5.0: 32 GT/s x 16 lanes, 128b/130b")},
        sources=(OFFLOAD_PAPER, "Rajbhandari et al. 2021 (ZeRO-Infinity)"),
    ),
    Card(
        id="fit_stage", topic="memory",
        question="How do you pick the ZeRO stage for a model and a cluster? Take 13B on 8 H100s.",
        question_zh="怎么为一个模型和集群选 ZeRO 级别?以 13B、8 张 H100 为例。",
        answer=(
            "Start from the bytes per GPU of each stage and compare them with the GPU minus room for "
            "activations, gathered units, buffers and fragmentation. For 13B on 8 GPUs: DDP {ddp}, "
            "ZeRO-1 {z1}, ZeRO-2 {z2}, ZeRO-3 {z3}. Keeping {reserve} of an {gpu} GPU for activations, "
            "ZeRO-1 does not fit and ZeRO-2 does, so take ZeRO-2. On a ring it sends what DDP sends, 2Ψ "
            "per step (a reduce-scatter of the gradients and an all-gather of the parameters); with K "
            "micro-batches accumulated it reduce-scatters each one, (K+1)Ψ; with DeepSpeed's default "
            "gradient path (each bucket all-reduced, each rank keeping its slice) about 3Ψ. ZeRO-3 "
            "would add half again and gather every micro-batch. Take the lowest stage that fits; "
            "go to ZeRO-3 when ZeRO-2 does not, then add offload, tensor or pipeline parallelism."),
        checks=(
            Number("ZeRO-1 model-state bytes per GPU, 13B, N = 8", "z1"),
            Number("ZeRO-2 model-state bytes per GPU, 13B, N = 8", "z2"),
            Choice("Lowest stage that fits with {reserve} kept for activations on {gpu} GPUs?",
                   ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"), (2,)),
        ),
        must_hit=_pts("compare bytes per GPU with the GPU minus an activation reserve",
                      "the lowest stage that fits: fewer bytes on the wire",
                      "then ZeRO-3, offload, TP/PP"),
        evidence=(nb("dashboard", "Which fits in 80 GB?"),
                  Evidence("module", "zeroedu/theory/extensions.py", "fits(reserve_bytes=...)"), rehearsal("fit_stage")),
        figures={"ddp": _ms("ddp", psi="13e9"), "z1": _ms("zero1", psi="13e9"), "z2": _ms("zero2", psi="13e9"),
                 "z3": _ms("fsdp1", psi="13e9"), "gpu": GPU,
                 "reserve": _in("20e9", "GB", 1e9, "assumed room for activations and buffers")},
        sources=(f"{ZERO_PAPER} §5.1",),
    ),
    Card(
        id="precision_bytes", topic="memory",
        question="Why 16 bytes per parameter, and how does the count change with the precision recipe?",
        question_zh="为什么每个参数 16 字节?换精度方案时怎么变?",
        answer=(
            "Mixed-precision Adam keeps bf16 weights (2) for compute, bf16 gradients (2), and {k} of "
            "fp32 optimizer state: a master copy of the weights (4) plus Adam's m and v (4 + 4), {mixed} "
            "in all. The master copy is needed because a bf16 weight cannot absorb a small update: with "
            "8 significant bits, w + lr·g rounds back to w. Megatron's bf16 recipe keeps the gradients "
            "in fp32 for accumulation: {meg}. fp16 with an fp32 main-gradient copy inside the optimizer "
            "costs {fp16}. Pure fp32 needs no master copy, the weight is the master: {fp32}. A plain "
            "torch Adam on a bf16 model keeps m and v in bf16, 2 bytes each, and no master."),
        checks=(
            Number("Bytes per parameter, fp16 weights and gradients with fp32 master, fp32 main-gradient "
                   "copy, fp32 m and v", "fp16"),
            Number("Bytes per parameter, Megatron's bf16 recipe (bf16 weights, fp32 gradients, fp32 master, m, v)", "meg"),
            Choice("Why keep an fp32 master copy of bf16 weights?",
                   ("a small update added to a bf16 weight rounds away", "NCCL needs fp32",
                    "Adam's m and v must have the same dtype as the weights they update", "to save memory"), (0,)),
        ),
        must_hit=_pts("2 + 2 + 12: weights, gradients, fp32 master + m + v",
                      "master copy because bf16 cannot absorb small updates",
                      "recipe changes it: fp32 grads 18, fp16 + main grad 20, fp32 16"),
        evidence=(Evidence("module", "zeroedu/recipes.py", "RECIPES"), nb("ddp", "Deriving 16Ψ"),
                  nb("fact_check", "Claim 3"), nb("megatron", "Why fp32 gradients?"), rehearsal("precision_bytes")),
        figures={"k": K_BYTES, "mixed": BPP,
                 "meg": Fig("recipes.get_recipe('megatron-bf16').total_bytes", unit="bytes", scale=1),
                 "fp16": Fig("recipes.get_recipe('fp16').total_bytes", unit="bytes", scale=1),
                 "fp32": Fig("recipes.get_recipe('fp32').total_bytes", unit="bytes", scale=1)},
        sources=(f"{ZERO_PAPER} §3.1", "Micikevicius et al. 2018 (mixed precision training)"),
    ),
    # ------------------------------------------------------------------------- training
    Card(
        id="grad_accumulation", topic="training",
        question="With gradient accumulation over K micro-batches, when does each strategy communicate?",
        question_zh="梯度累积 K 个 micro-batch 时,DDP、ZeRO-1/2/3 各在什么时候通信?",
        answer=(
            "DDP, ZeRO-1 and Megatron's distributed optimizer keep a full gradient buffer, so under "
            "no_sync they accumulate locally and reduce once, on the last micro-batch: traffic per "
            "optimizer step does not grow with K. ZeRO-2 frees the gradients it does not own after each "
            "backward, so it reduce-scatters on every micro-batch and accumulates its shard. ZeRO-3 "
            "also gathers the parameters for every micro-batch's forward and backward. For 7B in bf16 "
            "at N = 8 and K = 4, per rank per optimizer step: ZeRO-1 {z1k}, ZeRO-2 {z2k}, ZeRO-3 {z3k} "
            "(against {z3} at K = 1). This is what zeroedu implements and measures. torch FSDP can "
            "skip the reductions under no_sync (set_requires_gradient_sync(False) in FSDP2) only by "
            "keeping full, unsharded gradients, giving back the memory ZeRO-2/3 saved; DeepSpeed's "
            "engine refuses no_sync for stage 2 and above."),
        checks=(
            Choice("Which reduce the gradients only once per optimizer step under no_sync?",
                   ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "Megatron's distributed optimizer"), (0, 1, 4)),
            Number("ZeRO-2 bytes per rank per optimizer step, 7B in bf16, N = 8, K = 4", "z2k"),
            Number("ZeRO-3 bytes per rank per optimizer step, same setup", "z3k"),
        ),
        must_hit=_pts("full gradient buffer (DDP, ZeRO-1, Megatron): reduce once at the boundary",
                      "ZeRO-2: reduce-scatter every micro-batch", "ZeRO-3: gather and reduce-scatter every micro-batch",
                      "skipping reductions in FSDP costs full unsharded gradients"),
        evidence=(Evidence("run", "zeroedu run --strategy zero2 --world-size 4 --micro-batches 4", "reduce_scatter per micro-batch"),
                  Evidence("run", "zeroedu run --strategy zero1 --world-size 4 --micro-batches 4", "one reduce_scatter per step"),
                  Evidence("module", "zeroedu/strategies/base.py", "no_sync: who can postpone"),
                  nb("megatron", "Why fp32 gradients?"), rehearsal("grad_accumulation"),
                  Evidence("source", "deepspeed/runtime/engine.py", f"{DS}: no_sync refused for stage >= 2 (l.2065)"),
                  Evidence("source", "torch/distributed/fsdp/fully_sharded_data_parallel.py",
                           "no_sync: accumulates full model gradients until the sync")),
        figures={"z1k": _sent("zero1", k=4), "z2k": _sent("zero2", k=4), "z3k": _sent("fsdp1", k=4),
                 "z3": _sent("fsdp1")},
        sources=(f"{FSDP_PAPER} §3.3.4", f"{DDP_PAPER} §3.2"),
    ),
    Card(
        id="grad_clipping", topic="training",
        question="How do you clip the global gradient norm when the gradients are sharded?",
        question_zh="梯度被切分后怎么做全局梯度裁剪(clip grad norm)?",
        answer=(
            "The global norm is the square root of the sum of squares over the whole mean gradient. Each "
            "rank sums the squares of its own shard, one all-reduce (SUM) of that single fp32 number "
            "runs over the ranks whose shards are disjoint, and after the square root every rank scales "
            "its shard by min(1, C/(norm + ε)). The cost is one tiny all-reduce, {norm_bytes} per rank "
            "under ZeRO-2 at N = 8, never a gather. Do not count replicas twice: under HSDP the replicas "
            "on dp_outer hold the same shard after the outer all-reduce, so the sum runs over dp_shard "
            "only (summing over both would multiply the squared norm by M). HFSDP shards across the "
            "outer axis too, so it sums over the whole world. DDP needs no communication at all: every "
            "rank holds the whole gradient. Clip after the reduction, on the mean gradient."),
        checks=(
            Choice("What is all-reduced to get the global norm?",
                   ("the full gradients", "one number per rank: the sum of squares of its shard",
                    "the per-rank gradient norms, averaged across the ranks to give the global norm", "the largest element"), (1,)),
            Choice("Under HSDP (shard on dp_shard, replicate on dp_outer), over which axis is the squared "
                   "norm summed?", ("dp_shard only", "dp_outer only", "both axes (the whole world)",
                                     "neither"), (0,)),
            Number("Bytes one rank sends for the norm all-reduce under ZeRO-2, N = 8 (ring model)", "norm_bytes"),
        ),
        must_hit=_pts("local sum of squares of the shard", "one all-reduce of one fp32 number over disjoint shards",
                      "HSDP: not over the replica axis (no double counting)", "scale by min(1, C/norm) after reduction"),
        evidence=(Evidence("run", "zeroedu run --strategy hsdp --world-size 4 --outer 2 --clip-grad-norm 1.0", "norm all-reduce on dp_shard"),
                  Evidence("module", "zeroedu/strategies/base.py", "clip_coefficient / norm_axes"),
                  Evidence("module", "zeroedu/theory/comm.py", "_norm_ops"), nb("ddp", "In the real frameworks"),
                  rehearsal("grad_clipping")),
        figures={"norm_bytes": Fig("theory.comm_per_rank('zero2', 7e9, 8, clip=True).by_collective()['all_reduce']",
                                   unit="bytes", scale=1)},
        sources=("Pascanu et al. 2013 (gradient norm clipping)", "PyTorch docs: clip_grad_norm_"),
    ),
    Card(
        id="loss_scaling", topic="training",
        question="Do you need loss scaling, and in which dtype should gradients be reduced?",
        question_zh="需要 loss scaling 吗?梯度应该用什么精度做 reduce?",
        answer=(
            "fp16 has 5 exponent bits, so small gradients underflow to zero. fp16 training multiplies "
            "the loss by a scale S before backward and divides the gradients by S before the step. "
            "Dynamic scaling starts high (2^16 in torch's GradScaler and in DeepSpeed), skips the step "
            "when a gradient is inf or NaN and lowers the scale, and raises it again after a run of "
            "good steps (2000 in torch, a window of 1000 in DeepSpeed). When it lowers it differs: "
            "torch's GradScaler halves the scale at the first overflow; DeepSpeed waits for "
            "`hysteresis` overflows (default 2), so its first overflow skips the step and keeps the "
            "scale. bf16 has fp32's 8 exponent bits and "
            "needs no scaling; DeepSpeed's ZeRO asserts that only fp16 uses dynamic loss scaling. The "
            "reduction dtype is a separate choice: summing many bf16 gradients loses precision, so "
            "Megatron-LM reduces in fp32 with --bf16 and torchtitan sets FSDP's reduce dtype to fp32. "
            "That doubles the gradient bytes on the wire: {rs_fp32} instead of {rs_bf16} for the "
            "reduce-scatter of 7B at N = 8."),
        checks=(
            Choice("Which format needs loss scaling?", ("fp16", "bf16", "both", "neither"), (0,)),
            Choice("Dynamic loss scaling, when a gradient is inf or NaN:",
                   ("skip the step and lower the scale", "clip the non-finite gradients to the largest finite value and step",
                    "raise the scale", "switch to bf16"), (0,)),
            Number("Bytes one rank sends in the gradient reduce-scatter of 7B at N = 8 when reducing in fp32", "rs_fp32"),
        ),
        must_hit=_pts("fp16: 5 exponent bits, gradients underflow -> scale the loss",
                      "dynamic: skip + back off on overflow, grow after good steps", "bf16: no scaling needed",
                      "reduce in fp32 for accuracy: twice the gradient bytes"),
        evidence=(nb("megatron", "Why fp32 gradients?"),
                  Evidence("run", "zeroedu run --strategy megatron_distopt --world-size 4", "fp32 gradient reduce-scatter"),
                  rehearsal("loss_scaling"),
                  Evidence("source", "torch/amp/grad_scaler.py", "init_scale=2.0**16, growth_interval=2000, backoff_factor=0.5"),
                  Evidence("source", "deepspeed/runtime/constants.py", "FP16_HYSTERESIS_DEFAULT = 2"),
                  Evidence("source", "deepspeed/runtime/fp16/loss_scaler.py",
                           "DynamicLossScaler.update_scale: the scale drops only when cur_hysteresis is 1, "
                           "else cur_hysteresis -= 1"),
                  Evidence("source", "deepspeed/runtime/zero/stage_1_and_2.py", f"{DS}: only fp16 uses dynamic loss scaling (l.541)"),
                  Evidence("source", "megatron/training/arguments.py", "bf16: accumulate_allreduce_grads_in_fp32")),
        figures={"rs_fp32": Fig("theory.sent_bytes('reduce_scatter', 7e9 * recipes.get_recipe('megatron-bf16').grad_bytes, 8)"),
                 "rs_bf16": Fig("theory.sent_bytes('reduce_scatter', 7e9 * recipes.get_recipe('mixed-bf16').grad_bytes, 8)")},
        sources=("Micikevicius et al. 2018 (mixed precision training)",),
    ),
    Card(
        id="checkpoint_reshard", topic="training",
        question="You trained on 64 GPUs and must resume on 48. How do you load a sharded checkpoint at another world size?",
        question_zh="64 卡训练的 sharded checkpoint 怎么在 48 卡上恢复?",
        answer=(
            "Save every rank's shards with metadata saying where each piece sits in the global, "
            "unsharded tensor: torch.distributed.checkpoint (DCP) records each tensor's global shape "
            "and each saved chunk's offsets. On load, each new rank asks for the global ranges of its "
            "new shard and the planner reads the overlapping pieces from whichever files hold them; "
            "nothing is gathered on one rank. The optimizer state reshards the same way and is most of "
            "the bytes: {opt} of the {total} of model states for 7B with mixed-precision Adam. Save a "
            "per-parameter (sharded) state dict, not FSDP1's flat buffers, whose chunks mix parameters "
            "and padding; keep the data position and RNG state; and commit atomically: all rank files, "
            "then a manifest, then the 'latest' pointer. zeroedu.checkpoint writes pieces "
            "(parameter, range) per rank and reloads into any strategy and world size."),
        checks=(
            Choice("What lets a checkpoint load at a different world size?",
                   ("metadata with the global offsets of every saved piece", "saving with the same N",
                    "gathering the full model and optimizer state on rank 0 at every save and every load", "pickling the optimizer object"), (0,)),
            Number("Optimizer-state bytes (fp32 master, m, v) in a 7B checkpoint", "opt"),
            Choice("In which order are files committed so that a crash mid-save leaves the previous checkpoint usable?",
                   ("rank files, then the manifest, then the 'latest' pointer",
                    "the 'latest' pointer first, then the manifest, then the rank files in rank order", "any order", "rank 0's file last"), (0,)),
        ),
        must_hit=_pts("per-piece global offsets (DCP metadata)", "each new rank reads only its new ranges",
                      "optimizer state reshards too (most bytes)", "atomic commit: files, manifest, latest"),
        evidence=(Evidence("module", "zeroedu/checkpoint/reshard.py", "load_checkpoint: full tensors from pieces"),
                  Evidence("module", "zeroedu/checkpoint/dcp.py", "DCP export / load"),
                  nb("fsdp1_vs_fsdp2", "A state dict without an all-gather"), rehearsal("checkpoint_reshard")),
        figures={"opt": _ms("ddp", n=1, part="optim"), "total": _ms("ddp", n=1)},
        sources=("PyTorch docs: torch.distributed.checkpoint",),
    ),
    # ------------------------------------------------------------------------- composition
    Card(
        id="fsdp_tp", topic="composition",
        question="How do you combine FSDP with tensor parallelism?",
        question_zh="FSDP 怎么和张量并行(TP)组合?",
        answer=(
            "Put the ranks on a 2-D mesh, init_device_mesh(\"cuda\", (dp, tp), mesh_dim_names=(\"dp\", "
            "\"tp\")), with tp as the inner axis so each TP group sits inside a node: TP's collectives "
            "on activations run in every layer, on the critical path, and need NVLink. First "
            "parallelize_module(model, mesh[\"tp\"], plan) turns the weights into TP-sharded DTensors; "
            "then fully_shard each block with mesh=mesh[\"dp\"], which shards those TP shards again over "
            "the data-parallel axis (per-parameter DTensors are what make this compose). Passing the "
            "whole 2-D mesh to fully_shard would mean HSDP instead. Per GPU: 16Ψ/(tp·dp) of model states, "
            "{ms} for 70B with tp = 8 and dp = 8, and FSDP traffic of a Ψ/tp model over dp ranks, "
            "{dp_sent} per step, across nodes."),
        checks=(
            Choice("In which order are they applied?",
                   ("parallelize_module on mesh['tp'], then fully_shard on mesh['dp']",
                    "fully_shard on mesh['dp'] first, then parallelize_module on mesh['tp'] over the sharded parameters", "either order",
                    "fully_shard on the whole 2-D mesh"), (0,)),
            Choice("Which axis should stay inside a node?", ("tp", "dp"), (0,)),
            Number("Model-state bytes per GPU, 70B, tp = 8, dp = 8, mixed-precision Adam", "ms"),
            Choice("fully_shard given the whole 2-D (dp, tp) mesh does:",
                   ("HSDP: replicate on the first axis, shard on the second", "FSDP + TP", "raises an error"), (0,)),
        ),
        must_hit=_pts("2-D mesh (dp, tp), tp inside the node", "parallelize_module on the tp sub-mesh first",
                      "then fully_shard on the dp sub-mesh", "memory 16Ψ/(tp·dp)"),
        evidence=(nb("dashboard", "Beyond data parallelism"), rehearsal("fsdp_tp"),
                  Evidence("module", "zeroedu/theory/extensions.py", "compose(tp=...)"),
                  Evidence("source", "torch/distributed/tensor/parallel/api.py", "parallelize_module takes a 1-D mesh (mesh['tp'])"),
                  Evidence("source", "torch/distributed/device_mesh.py", "init_device_mesh(..., mesh_dim_names=('dp', 'tp'))")),
        figures={"ms": Fig("theory.compose('fsdp2', 70e9, 8, tp=8).total"),
                 "dp_sent": Fig("theory.comm_per_rank('fsdp2', 70e9 / 8, 8).total()")},
        sources=("PyTorch tutorial: Large Scale Transformer model training with Tensor Parallel (TP)",
                 "Shoeybi et al. 2019 (Megatron-LM)"),
    ),
    Card(
        id="pp_zero", topic="composition",
        question="Can you combine pipeline parallelism with ZeRO-2 or ZeRO-3?",
        question_zh="流水线并行能和 ZeRO-2/3 一起用吗?",
        answer=(
            "DeepSpeed's pipeline engine says no: it asserts the ZeRO stage is below 2, so pipeline plus "
            "ZeRO-1 is the combination it allows. The reason is micro-batches. A pipeline runs many "
            "micro-batches per step to keep its stages busy; ZeRO-2 must reduce-scatter the gradients of "
            "every micro-batch, and ZeRO-3 must also gather the parameters for each micro-batch's "
            "forward and backward. For one stage holding a quarter of 7B on N = 8 data-parallel ranks "
            "and 16 micro-batches: ZeRO-1 sends {z1} per rank per step, ZeRO-2 {z2}, ZeRO-3 {z3}. Other "
            "stacks do combine FSDP with pipelines (torchtitan), but by default stop resharding after "
            "forward when PP is on, to avoid per-micro-batch gathers, and pay with the stage's "
            "unsharded parameters."),
        checks=(
            Choice("Highest ZeRO stage DeepSpeed's pipeline engine accepts?",
                   ("0", "1", "2", "3"), (1,)),
            Number("ZeRO-2 bytes per rank per step for that stage: Ψ = 7B/4, N = 8, 16 micro-batches, bf16", "z2"),
            Choice("Why does pipelining clash with ZeRO-2/3?",
                   ("they communicate on every micro-batch and a pipeline runs many",
                    "pipelines need fp32", "they need different process groups, and a rank cannot be in two groups at once",
                    "pipelines cannot shard memory"), (0,)),
        ),
        must_hit=_pts("DeepSpeed pipeline engine: ZeRO stage ≤ 1", "ZeRO-2/3 communicate every micro-batch",
                      "PP runs many micro-batches: traffic multiplies",
                      "torchtitan FSDP+PP: no reshard after forward by default"),
        evidence=(nb("fact_check", "Claim 6"), rehearsal("pp_zero"),
                  Evidence("run", "zeroedu run --strategy zero2 --world-size 4 --micro-batches 4", "reduce_scatter per micro-batch"),
                  Evidence("source", "deepspeed/runtime/pipe/engine.py",
                           f"{DS}: assert zero stage < gradients, 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism' (l.77-78)"),
                  Evidence("source", "torchtitan/distributed/fsdp.py", "get_fsdp_reshard_after_forward_policy: default = not pp_enabled")),
        figures={"z1": _sent("zero1", psi="7e9 / 4", k=16), "z2": _sent("zero2", psi="7e9 / 4", k=16),
                 "z3": _sent("fsdp1", psi="7e9 / 4", k=16)},
        sources=("DeepSpeed issue #4164 (why ZeRO-2/3 and pipelines do not mix)",),
    ),
]

BY_ID = {c.id: c for c in CARDS}
TOPICS = tuple(sorted({c.topic for c in CARDS}))

# The ZeRO paper's own worked example (Fig. 1): Ψ = 7.5B, N = 64, K = 12 gives 120 / 31.4 /
# 16.6 / 1.9 GB. tests/test_quiz.py checks the theory against these printed values.
PAPER_FIG1 = {"ddp": 120, "zero1": 31.4, "zero2": 16.6, "fsdp1": 1.9}

# A figure with a unit written straight into a template (e.g. "112 GB", "1.5×", "25 MiB",
# "450 GB/s") is a hard-coded figure; tests reject it. ("2 × 8 GPUs" is a shape, not a ratio.)
HARD_CODED = re.compile(
    r"\d+(?:\.\d+)?\s*(?:GB/s|TFLOP/s|GB|GiB|TB|MB|MiB|KiB|ms|µs|tokens|×(?!\s*\d))(?![\w])")


# (card id, check index) -> its number among the deck's single-answer choices, in deck order
_CHOICE_INDEX = {key: i for i, key in enumerate(
    (card.id, j) for card in CARDS for j, c in enumerate(card.checks) if isinstance(c, Choice) and not c.multi)}


def cards(topic: str | None = None) -> list[Card]:
    if topic is None or topic == "all":
        return list(CARDS)
    if topic not in TOPICS:
        raise ValueError(f"unknown topic {topic!r}; choose one of {', '.join(TOPICS)}, all")
    return [c for c in CARDS if c.topic == topic]


def get_card(card_id: str) -> Card:
    try:
        return BY_ID[card_id]
    except KeyError:
        raise ValueError(f"unknown card {card_id!r}; one of {', '.join(BY_ID)}") from None


def for_learner(card: Card, seed: int) -> Card:
    """`card` with its choices' options in this learner's order (`answers.learner_seed`).

    Balanced rather than random: the deck's single-answer choices are numbered in deck order, and
    the i-th puts its right option at position (i + seed) mod k (k options), the others in an
    order drawn from the seed; so for every learner the right answer sits at each position about
    equally often, whichever cards they are given, and neither the letter nor the order the
    options were written in gives it away. Pick-all-that-apply choices are shuffled by the seed."""
    rng = random.Random(f"{seed}:{card.id}")
    checks = []
    for j, c in enumerate(card.checks):
        if isinstance(c, Choice):
            k = len(c.options)
            rest = [i for i in range(k) if i not in c.answer]
            rng.shuffle(rest)
            if c.multi:
                order = list(c.answer) + rest
                rng.shuffle(order)
            else:
                at = (_CHOICE_INDEX[(card.id, j)] + seed) % k
                order = rest[:at] + [c.answer[0]] + rest[at:]
            c = c.reordered(order)
        checks.append(c)
    return replace(card, checks=tuple(checks))


def notebook_sections() -> dict[str, list[str]]:
    """Notebook path -> the section headings the cards cite there (for whoever writes them)."""
    out: dict[str, list[str]] = {}
    for c in CARDS:
        for e in c.evidence:
            if e.kind == "notebook" and e.detail not in out.setdefault(e.target, []):
                out[e.target].append(e.detail)
    return out


__all__ = ["for_learner", "Card", "Fig", "Evidence", "Point", "Number", "Choice", "Term", "CARDS", "BY_ID", "TOPICS",
           "NOTEBOOKS", "PAPER_FIG1", "HARD_CODED", "cards", "get_card", "notebook_sections", "fmt_number"]
