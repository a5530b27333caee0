"""Interview cards: the data-parallel questions interviewers ask, answered in 30 seconds.

Every card holds the question in English and in Chinese, a short answer, the points an answer
must hit, follow-ups, and the evidence that proves each figure (a notebook section, a
``zeroedu run`` command, a module). Figures are never free text: an answer says ``{ddp}`` and
the card's `figures` map that name to a `zeroedu.theory` call (`Fig.expr`), evaluated when the
card is rendered. tests/test_quiz.py checks that no card hard-codes a GB or ×-figure, and that
every rendered figure is the theory's output.

The questions are the ones in the seed interview cards (DDP overlap; per-stage bytes; torch
FSDP; ZeRO-3 vs DDP traffic; Megatron's distributed optimizer; ZeRO-1 vs ZeRO-2 and the paper
vs code gap; hiding FSDP traffic; FSDP1 vs FSDP2; hybrid sharding; a hand-written FSDP linear
layer; Megatron-FSDP v2 per-axis levels; levels inside vs across NVLink domains; its own
optimizer). The answers are this project's own wording.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction

from .. import catalog, recipes, theory
from ..fmt import significant
from ..theory import hybrid

# Names a figure expression may use: the theory layer and nothing else.
NAMESPACE = {"theory": theory, "hybrid": hybrid, "recipes": recipes, "catalog": catalog,
             "Fraction": Fraction, "float": float}


fmt_number = significant  # the package's one formatter for quoted figures (`zeroedu.fmt`)


@dataclass(frozen=True)
class Fig:
    """A figure quoted in a card: a theory expression, shown divided by `scale` with `unit`."""

    expr: str
    unit: str = "GB"
    scale: float = 1e9
    digits: int = 4

    def value(self):
        """The theory's output (exact Fraction or int where theory gives one)."""
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
    target: str  # notebook path, CLI command, module path, lab id, or a citation
    detail: str = ""  # notebook section heading, what to look at

    def text(self) -> str:
        return f"[{self.kind}] {self.target}" + (f" — {self.detail}" if self.detail else "")


@dataclass(frozen=True)
class Point:
    """A must-hit point and the words whose presence in an answer counts as hitting it."""

    text: str
    keywords: tuple[str, ...]

    def hit(self, answer: str) -> bool:
        a = answer.lower()
        return any(k.lower() in a for k in self.keywords)


@dataclass(frozen=True)
class Card:
    id: str
    topic: str  # ddp | zero | fsdp | megatron | hybrid
    question: str
    question_zh: str
    answer: str  # template: {name} refers to figures[name]
    must_hit: tuple[Point, ...]
    follow_ups: tuple[tuple[str, str], ...] = ()  # (question, answer template)
    evidence: tuple[Evidence, ...] = ()
    figures: dict = field(default_factory=dict)
    sources: tuple[str, ...] = ()

    def figure_texts(self) -> dict[str, str]:
        return {k: f.text() for k, f in self.figures.items()}

    def render(self, template: str) -> str:
        return template.format_map(self.figure_texts())

    def rendered_answer(self) -> str:
        return self.render(self.answer)

    def rendered_follow_ups(self) -> list[tuple[str, str]]:
        return [(self.render(q), self.render(a)) for q, a in self.follow_ups]

    def templates(self) -> list[str]:
        return [self.answer] + [t for qa in self.follow_ups for t in qa]

    def score(self, answer: str) -> tuple[int, int, list[Point]]:
        """(points hit, points total, points missed) by keyword."""
        missed = [p for p in self.must_hit if not p.hit(answer)]
        return len(self.must_hit) - len(missed), len(self.must_hit), missed

    def as_text(self, width: int = 0) -> str:
        lines = [f"Q [{self.id}] {self.question}", f"   {self.question_zh}", "",
                 "30-second answer:", "  " + self.rendered_answer(), "", "Must hit:"]
        lines += [f"  - {p.text}" for p in self.must_hit]
        if self.follow_ups:
            lines += ["", "Follow-ups:"]
            for q, a in self.rendered_follow_ups():
                lines += [f"  Q: {q}", f"  A: {a}"]
        if self.figures:
            lines += ["", "Figures (zeroedu.theory):"]
            lines += [f"  {k} = {f.text()}  <- {f.expr}" for k, f in self.figures.items()]
        if self.evidence:
            lines += ["", "Proof:"] + [f"  {e.text()}" for e in self.evidence]
        if self.sources:
            lines += ["", "Sources: " + "; ".join(self.sources)]
        return "\n".join(lines)


NB11 = "notebooks/11_interview_rehearsal.ipynb"
NB12 = "notebooks/12_fact_check.ipynb"
ZERO_PAPER = "Rajbhandari et al. 2019 (ZeRO)"
FSDP_PAPER = "Zhao et al. 2023 (PyTorch FSDP)"
DDP_PAPER = "Li et al. 2020 (PyTorch DDP)"


def _ms(strategy, psi="7e9", n=8, m=1, recipe=None, part="total"):
    r = f", recipe={recipe!r}" if recipe else ""
    mm = f", m={m}" if m != 1 else ""
    return Fig(f"theory.model_states({strategy!r}, {psi}, {n}{mm}{r}).{part}")


def _sent(strategy, psi="7e9", n=8):
    return Fig(f"theory.comm_per_rank({strategy!r}, {psi}, {n}).total()")


def _ratio(a, b, psi="7e9", n=8):
    return Fig(f"theory.comm_per_rank({a!r}, {psi}, {n}).total() / "
               f"theory.comm_per_rank({b!r}, {psi}, {n}).total()", unit="×", scale=1)


BPP = Fig("recipes.get_recipe('mixed-bf16').total_bytes", unit="bytes", scale=1)
GPU = Fig("80e9")  # an input (an 80 GB H100/A100), not a theory output
K_BYTES = Fig("recipes.get_recipe('mixed-bf16').optim_bytes", unit="bytes", scale=1)

CARDS: list[Card] = [
    Card(
        "ddp_overlap", "ddp",
        "How does DDP overlap communication with backward?",
        "DDP 怎么让梯度通信和 backward 重叠?",
        "Every rank keeps a whole replica and runs backward on its own micro-batch. DDP groups the "
        "gradients into buckets in roughly reverse layer order; when the last gradient of a bucket "
        "is produced, an autograd hook launches an asynchronous all-reduce of that bucket while "
        "backward keeps computing earlier layers. Before the optimizer step it waits for all "
        "buckets and divides by N. Traffic is one all-reduce of the gradients, {sent} per rank per "
        "step for 7B in bf16 at N = 8; the memory is a full {bpp} per parameter.",
        (Point("bucketed gradients, hooks fire when a bucket is ready", ("bucket",)),
         Point("asynchronous all-reduce launched during backward", ("async", "during backward", "overlap")),
         Point("wait before the optimizer step, average over N", ("wait", "average", "divide")),
         Point("traffic = one all-reduce of the gradients (2Ψ elements)", ("all-reduce", "allreduce"))),
        (("Why reverse order?", "Gradients appear from the last layer backwards, so buckets are "
          "filled in that order and the first bucket can leave while most of backward remains."),
         ("What does no_sync do?", "It skips the all-reduce on accumulation micro-batches; only the "
          "last micro-batch communicates, so traffic per optimizer step stays one all-reduce.")),
        (Evidence("run", "zeroedu run --strategy ddp_bucketed --world-size 4", "comm launched inside backward"),
         Evidence("module", "zeroedu/strategies/ddp_bucketed.py", "start_grad_sync / finish_grad_sync"),
         Evidence("notebook", NB11, "Card ddp_overlap")),
        {"sent": _sent("ddp"), "bpp": BPP},
        (f"{DDP_PAPER} §3.2",),
    ),
    Card(
        "zero_stages", "zero",
        "What do ZeRO stages 1, 2 and 3 shard, and how much memory per GPU?",
        "ZeRO 1/2/3 各切了什么?每张卡要多少显存?",
        "With mixed-precision Adam a parameter costs 2 bytes of bf16 weight, 2 of bf16 gradient and "
        "{k} of fp32 optimizer state (master, m, v). Plain DP keeps all {bpp} on every GPU: {ddp} "
        "for a 7B model. Stage 1 cuts the optimizer state N ways, 4Ψ + 12Ψ/N: {z1} at N = 8. "
        "Stage 2 also cuts the gradients, 2Ψ + 14Ψ/N: {z2}. Stage 3 also cuts the weights, 16Ψ/N: "
        "{z3}. Activations and temporary gathered layers come on top.",
        (Point("stage 1 shards the optimizer state", ("optimizer state", "optimizer states", "optim")),
         Point("stage 2 adds gradients", ("gradient",)),
         Point("stage 3 adds parameters", ("parameter", "weights")),
         Point("16 bytes per parameter with mixed-precision Adam", ("16",)),
         Point("a concrete figure, e.g. 7B at N = 8", ("112", "38.5", "26.25", "14"))),
        (("Why is the optimizer state 12 bytes, not 2×Ψ?", "Adam keeps m and v in fp32 (4 + 4) and "
          "mixed precision adds an fp32 master copy of the weights (4): {k}."),
         ("Does 7B fit a GPU of {gpu} with DDP?", "No: {ddp} of model states. ZeRO-1 at N = 8 does "
          "({z1}), before activations.")),
        (Evidence("notebook", NB11, "Card zero_stages"),
         Evidence("notebook", NB12, "Claim 2"),
         Evidence("run", "zeroedu run --strategy zero2 --world-size 4", "measured bytes = theory"),
         Evidence("module", "zeroedu/theory/memory.py", "model_states")),
        {"ddp": _ms("ddp"), "z1": _ms("zero1"), "z2": _ms("zero2"), "z3": _ms("fsdp1"),
         "bpp": BPP, "k": K_BYTES, "gpu": GPU},
        (f"{ZERO_PAPER} §3.1, §5.1, Fig. 1",),
    ),
    Card(
        "fsdp_how", "fsdp",
        "How does torch FSDP work?",
        "PyTorch FSDP 是怎么工作的?",
        "FSDP is ZeRO-3 in PyTorch. The model is wrapped in units (usually one per block); each rank "
        "stores 1/N of every unit's parameters, gradients and optimizer state. Before a unit's "
        "forward it all-gathers the full parameters (unshard), computes, and frees them again "
        "(reshard). In backward it gathers again, computes the gradients, and reduce-scatters them "
        "so each rank keeps only its gradient shard; the optimizer then updates the local shard. "
        "Per rank that is 16Ψ/N of model states ({z3} for 7B at N = 8) plus the largest "
        "gathered unit, and {ratio} DDP's traffic.",
        (Point("parameters sharded; units gathered just in time", ("all-gather", "allgather", "unshard")),
         Point("freed after use (reshard)", ("free", "reshard", "release")),
         Point("gradients reduce-scattered", ("reduce-scatter", "reducescatter", "reduce scatter")),
         Point("memory = sharded states + one full unit", ("unit", "layer", "block"))),
        (("What is a unit?", "The granularity of gathering: a wrapped submodule. Smaller units mean "
          "lower peak memory but more, smaller collectives."),),
        (Evidence("run", "zeroedu run --strategy fsdp1 --world-size 4", "unit all-gather / reshard events"),
         Evidence("module", "zeroedu/strategies/fsdp_units.py", "unshard / reshard / post_backward"),
         Evidence("notebook", NB11, "Card fsdp_how")),
        {"z3": _ms("fsdp1"), "ratio": _ratio("fsdp1", "ddp")},
        (f"{FSDP_PAPER} §3", f"{ZERO_PAPER} §5.3"),
    ),
    Card(
        "zero3_comm", "zero",
        "How much more communication does ZeRO-3 need than DDP?",
        "ZeRO-3 比 DDP 多多少通信?",
        "DDP all-reduces the gradients once: a reduce-scatter plus an all-gather, 2Ψ elements per "
        "rank. ZeRO-3 all-gathers the parameters in forward, all-gathers them again in backward "
        "because they were freed, and reduce-scatters the gradients: 3Ψ, i.e. {ratio} DDP, not double. "
        "For 7B in bf16 at N = 8: {ddp} vs {z3} sent per rank per step. Keeping parameters "
        "between forward and backward (reshard_after_forward=False) removes the second gather "
        "and brings it back to {noreshard}.",
        (Point("DDP = 2Ψ (all-reduce = reduce-scatter + all-gather)", ("2ψ", "2psi", "2 psi", "all-reduce")),
         Point("ZeRO-3 = 3Ψ: two all-gathers + one reduce-scatter", ("3ψ", "3psi", "3 psi", "two all-gather")),
         Point("1.5×, not 2×", ("1.5",))),
        (("Where does \"double\" come from in some notes?", "Counting all-gather + reduce-scatter as two "
          "all-reduces. The measured ratio here is {ratio}."),),
        (Evidence("notebook", NB12, "Claim 1"),
         Evidence("run", "zeroedu run --strategy fsdp1 --world-size 4", "sent by all_gather vs reduce_scatter"),
         Evidence("run", "zeroedu run --strategy fsdp1 --world-size 4 --no-reshard-after-forward", "one all-gather")),
        {"ratio": _ratio("fsdp1", "ddp"), "ddp": _sent("ddp"), "z3": _sent("fsdp1"),
         "noreshard": Fig("theory.comm_per_rank('fsdp1', 7e9, 8, reshard_after_forward=False).total()")},
        (f"{ZERO_PAPER} §7.2-7.3",),
    ),
    Card(
        "megatron_level", "megatron",
        "Which ZeRO level is Megatron's distributed optimizer?",
        "Megatron 的 distributed optimizer 相当于 ZeRO 几?",
        "ZeRO-1: it shards only the optimizer state (fp32 master, m, v) across the data-parallel "
        "ranks. Weights (bf16) and the gradient buffer stay whole on every rank, and the gradient "
        "buffer is fp32 for accurate accumulation, so the unsharded part is 6 bytes per parameter: "
        "6Ψ + 12Ψ/N, {dist} for 7B at N = 8 instead of {full} without sharding. Communication is a "
        "reduce-scatter of the fp32 gradient buffer plus an all-gather of the updated bf16 weights.",
        (Point("ZeRO-1 / optimizer state only", ("zero-1", "zero1", "stage 1", "optimizer state")),
         Point("fp32 gradient buffer kept whole", ("fp32 grad", "fp32 gradient", "main_grad", "fp32")),
         Point("reduce-scatter grads + all-gather params", ("reduce-scatter", "reduce scatter"))),
        (("Why is its reduce-scatter bigger than ZeRO-1's?", "The gradients travel in fp32 (4 bytes) "
          "instead of bf16: {mega_sent} vs {z1_sent} per rank per step at 7B, N = 8."),),
        (Evidence("run", "zeroedu run --strategy megatron_distopt --world-size 4", "grad in fp32"),
         Evidence("module", "zeroedu/strategies/megatron_distopt.py"),
         Evidence("notebook", NB11, "Card megatron_level")),
        {"dist": _ms("megatron_distopt"), "full": _ms("megatron_distopt", n=1),
         "mega_sent": _sent("megatron_distopt"), "z1_sent": _sent("zero1")},
        ("Megatron Core docs: Distributed Optimizer",),
    ),
    Card(
        "zero1_vs_zero2_comm", "zero",
        "ZeRO stage 1 vs stage 2: is there a communication difference, and a gap between paper and code?",
        "ZeRO-1 和 ZeRO-2 通信量有区别吗?论文和代码有 gap 吗?",
        "In the paper both move 2Ψ, the same as DDP: reduce-scatter the gradients so each rank gets "
        "the sum for its own shard, update that shard, all-gather the new weights. Stage 2 differs "
        "only in memory: it frees the gradients it does not own ({z2} vs {z1} at 7B, N = 8). The "
        "gap: implementations of stage 1 often keep DDP's all-reduce of the full gradient and then "
        "all-gather the weights, 3Ψ, {gap} the paper's figure ({z1ar} vs {z1s} per rank).",
        (Point("both 2Ψ in the paper", ("2ψ", "2psi", "2 psi", "same as ddp")),
         Point("stage 2 frees non-owned gradients (memory, not traffic)", ("free", "memory")),
         Point("code gap: all-reduce + all-gather = 3Ψ", ("3ψ", "3psi", "3 psi", "all-reduce"))),
        (),
        (Evidence("run", "zeroedu run --strategy zero1_allreduce --world-size 4", "all_reduce + all_gather"),
         Evidence("run", "zeroedu run --strategy zero1 --world-size 4", "reduce_scatter + all_gather"),
         Evidence("notebook", NB11, "Card zero1_vs_zero2_comm")),
        {"z1": _ms("zero1"), "z2": _ms("zero2"), "gap": _ratio("zero1_allreduce", "zero1"),
         "z1ar": _sent("zero1_allreduce"), "z1s": _sent("zero1")},
        (f"{ZERO_PAPER} §5.1, §7.2",),
    ),
    Card(
        "fsdp_hide_comm", "fsdp",
        "How does FSDP hide its communication?",
        "FSDP 怎么把通信藏起来?",
        "It issues the next unit's all-gather before the current unit's compute finishes, on a "
        "separate stream, so gathering overlaps compute. In backward it prefetches the previous "
        "unit's parameters by default; forward prefetch is optional and mostly useful when the CPU "
        "cannot run ahead. Reduce-scatters of finished units also run asynchronously while "
        "backward goes on. A rate limiter bounds how many gathered units are alive, trading "
        "overlap for peak memory.",
        (Point("prefetch the next unit's all-gather", ("prefetch",)),
         Point("separate stream / async", ("stream", "async")),
         Point("reduce-scatter overlaps backward", ("reduce-scatter", "reduce scatter")),
         Point("bounded in-flight units (memory vs overlap)", ("limit", "memory", "peak"))),
        (),
        (Evidence("run", "zeroedu run --strategy fsdp1 --world-size 4 --prefetch both", "overlap fraction"),
         Evidence("module", "zeroedu/strategies/fsdp_units.py", "prefetch options")),
        {},
        (f"{FSDP_PAPER} §3.3",),
    ),
    Card(
        "fsdp1_vs_fsdp2", "fsdp",
        "What is the difference between FSDP1 and FSDP2?",
        "FSDP2 和 FSDP1 有什么区别?",
        "FSDP1 flattens all parameters of a unit into one FlatParameter, pads it to a multiple of N "
        "and cuts it into equal chunks, so a chunk can straddle parameters. FSDP2 shards each "
        "parameter on its own along dim 0 as a DTensor, so a rank holds whole rows, sometimes none. "
        "That makes per-parameter state (dtype, requires_grad, optimizer) simple, composes with "
        "tensor parallelism, gives sharded state dicts without gathering, and replaces FSDP1's "
        "CPU-blocking rate limiter with stream-based memory management. Bytes are the same 16Ψ/N "
        "up to padding.",
        (Point("FSDP1 flat parameter", ("flat",)),
         Point("FSDP2 per-parameter dim-0 sharding / DTensor", ("dim-0", "dim 0", "dtensor", "per-parameter")),
         Point("composability / state dict", ("tensor parallel", "tp", "state dict", "compos"))),
        (),
        (Evidence("run", "zeroedu run --strategy fsdp2 --world-size 3", "uneven shards per rank"),
         Evidence("module", "zeroedu/shard.py", "FlatLayout vs dim0_rows"),
         Evidence("notebook", NB11, "Card fsdp1_vs_fsdp2")),
        {},
        ("PyTorch docs: torch.distributed.fsdp.fully_shard",),
    ),
    Card(
        "hybrid_sharding", "hybrid",
        "Sharding across nodes is too slow. What do you do?",
        "跨机全切太慢怎么办?",
        "Hybrid sharding: shard inside a node (or NVLink domain) and replicate across nodes. The "
        "per-layer all-gathers and reduce-scatters then stay on NVLink; across nodes only one "
        "all-reduce of each rank's gradient shard per step remains. The price is memory: HSDP keeps "
        "16Ψ/N per GPU ({hsdp}) instead of 16Ψ/(NM) ({flat}) for 7B on 2 nodes × 8. In the "
        "bandwidth-only model the step's communication drops from {t_flat} to {t_hsdp}.",
        (Point("shard inside, replicate across (HSDP)", ("hsdp", "hybrid", "replicate")),
         Point("gathers stay on the fast link", ("nvlink", "intra", "inside")),
         Point("cost: more memory per GPU", ("memory",))),
        (("Can you cut the replica cost?", "Yes: shard the optimizer state across nodes too (HFSDP, "
          "ZeRO-1 on the outer axis): {hfsdp} per GPU with the same cross-node bytes."),),
        (Evidence("run", "zeroedu run --strategy hsdp --world-size 4 --outer 2"),
         Evidence("module", "zeroedu/theory/hybrid.py", "cross_domain_table"),
         Evidence("lab", "lab4_hfsdp_memory")),
        {"hsdp": _ms("hsdp", m=2), "flat": _ms("fsdp1", n=16), "hfsdp": _ms("hfsdp", m=2),
         "t_flat": Fig("hybrid.step_comm_time('flat_zero3', 7e9, 8, 2)", unit="ms", scale=1e-3),
         "t_hsdp": Fig("hybrid.step_comm_time('hsdp', 7e9, 8, 2)", unit="ms", scale=1e-3)},
        (f"{FSDP_PAPER} §3.2.2",),
    ),
    Card(
        "fsdp_linear", "fsdp",
        "Write the FSDP version of one linear layer (forward and backward).",
        "手写一层 FSDP 的 linear(前向和反向)。",
        "Each rank stores a slice of W's rows. Forward: all-gather the slices into the full W, "
        "compute Y = X Wᵀ on the local batch, free W. Backward: all-gather W again, dX = dY W "
        "(local, no reduction: each rank has its own batch), dW = dYᵀ X on the local batch (full "
        "shape), then reduce-scatter dW over ranks so each keeps the summed rows it owns, divided "
        "by N for the mean. Pad W's rows to a multiple of N on the wire when they do not divide.",
        (Point("store a shard of rows; all-gather before use", ("all-gather", "allgather", "gather")),
         Point("dX = dY W locally", ("dx",)),
         Point("dW = dYᵀX then reduce-scatter", ("reduce-scatter", "reduce scatter")),
         Point("free the gathered weight / regather in backward", ("free", "again", "regather"))),
        (),
        (Evidence("lab", "lab3_fsdp_linear", "python -m zeroedu.labs check 3"),
         Evidence("notebook", NB11, "Card fsdp_linear")),
        {},
        (f"{FSDP_PAPER} §3.2",),
    ),
    Card(
        "mfsdp_v2", "hybrid",
        "What is Megatron-FSDP v2, and which ZeRO levels can it shard to?",
        "Megatron-FSDP v2 是什么?能切到哪一级 ZeRO?",
        "Megatron's own fully sharded data parallelism. Its levels are named no_shard, optim, "
        "optim_grads and optim_grads_params (DDP, ZeRO-1, 2, 3), and it arranges the data-parallel "
        "ranks on two mesh axes, an inner dp_shard and an outer dp_outer, each with its own level. "
        "ZeRO-3 inside plus no_shard outside is HSDP ({hsdp} per GPU for 7B, 2 × 8 GPUs); ZeRO-3 "
        "inside plus optim outside is HFSDP ({hfsdp}); flat ZeRO-3 over all 16 is {flat}. "
        "In core 0.20.0 the adapter is experimental (TP = 1).",
        (Point("four levels no_shard / optim / optim_grads / optim_grads_params", ("optim_grads", "no_shard", "zero-3")),
         Point("two axes: dp_shard inner, dp_outer outer", ("dp_outer", "outer", "two axes", "axis")),
         Point("HSDP / HFSDP as combinations", ("hsdp", "hfsdp"))),
        (),
        (Evidence("run", "zeroedu run --strategy hfsdp --world-size 4 --outer 2"),
         Evidence("module", "zeroedu/catalog.py", "per-axis levels"),
         Evidence("notebook", NB11, "Card mfsdp_v2")),
        {"hsdp": _ms("hsdp", m=2), "hfsdp": _ms("hfsdp", m=2), "flat": _ms("fsdp1", n=16)},
        ("Megatron Core 0.20.0 release notes (Parallelism)", "Megatron-FSDP design doc"),
    ),
    Card(
        "nvlink_levels", "hybrid",
        "Why pick different sharding levels inside and across NVLink domains?",
        "为什么 NVLink domain 内外用不同的 ZeRO 级别?",
        "Because the two links differ about {bw_ratio} in bandwidth (NVLink vs one NIC per GPU). "
        "ZeRO-3 gathers every layer twice per step and sits on the critical path, so it belongs on "
        "NVLink. Across domains you want traffic that happens once per step, after backward: a "
        "gradient all-reduce (HSDP) or a reduce-scatter plus parameter all-gather (HFSDP). For 7B on "
        "2 × 8 GPUs each rank sends {cross_flat} across the boundary with flat ZeRO-3 but {cross_h} "
        "with HSDP/HFSDP. That the release notes give no reason is worth saying; this is the reading.",
        (Point("NVLink much faster than the inter-node network", ("nvlink", "bandwidth")),
         Point("ZeRO-3 gathers per layer, on the critical path", ("per layer", "every layer", "critical")),
         Point("outer axis communicates once per step", ("once per step", "once", "per step"))),
        (),
        (Evidence("module", "zeroedu/theory/hybrid.py", "cross_domain_table"),
         Evidence("notebook", NB11, "Card nvlink_levels")),
        {"bw_ratio": Fig("theory.DEFAULT_BANDWIDTH['dp_shard'] / theory.DEFAULT_BANDWIDTH['dp_outer']",
                         unit="×", scale=1),
         "cross_flat": Fig("hybrid.cross_domain_bytes('flat_zero3', 7e9, 8, 2)"),
         "cross_h": Fig("hybrid.cross_domain_bytes('hsdp', 7e9, 8, 2)")},
        ("Megatron Core 0.20.0 release notes", "PyTorch FSDP docs: ShardingStrategy.HYBRID_SHARD"),
    ),
    Card(
        "own_optimizer", "megatron",
        "Why does Megatron-FSDP have its own optimizer instead of reusing the distributed optimizer?",
        "为什么 Megatron-FSDP 不复用 DistributedOptimizer,要自己写 optimizer?",
        "The distributed optimizer is built around DDP's classes: its shard ranges are cut out of "
        "the contiguous parameter-and-gradient buffer that Megatron's DDP owns. Under FSDP the "
        "parameters themselves are sharded and the buffers belong to FSDP, so reusing it meant "
        "routing around DDP code paths with branches (v1's shallow reuse). A dedicated optimizer "
        "works directly on the FSDP shards, and the same code serves every per-axis level.",
        (Point("distributed optimizer assumes DDP / its param-grad buffer", ("ddp", "buffer")),
         Point("FSDP owns sharded params and buffers", ("shard",)),
         Point("v1 reuse was shallow / branches", ("shallow", "branch", "if "))),
        (),
        (Evidence("module", "zeroedu/strategies/megatron_distopt.py", "buffer-wide / local ranges"),
         Evidence("source", "Megatron-LM PR #5865 (FullyShardedOptimizer)")),
        {},
        ("Megatron-LM PR #5865",),
    ),
]

BY_ID = {c.id: c for c in CARDS}
TOPICS = tuple(sorted({c.topic for c in CARDS}))

# The ZeRO paper's own worked example (Fig. 1): Ψ = 7.5B, N = 64, K = 12 gives 120 / 31.4 /
# 16.6 / 1.9 GB. tests/test_quiz.py checks the theory against these printed values.
PAPER_FIG1 = {"ddp": 120, "zero1": 31.4, "zero2": 16.6, "fsdp1": 1.9}

# A figure with a unit written straight into a template (e.g. "112 GB", "1.5×") is a
# hard-coded figure; tests reject it. ("2 × 8 GPUs" is a shape, not a ratio.)
HARD_CODED = re.compile(r"\d+(?:\.\d+)?\s*(?:GB|GiB|TB|MB|ms|×(?!\s*\d))(?![\w])")


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


__all__ = ["Card", "Fig", "Evidence", "Point", "CARDS", "BY_ID", "TOPICS", "PAPER_FIG1",
           "HARD_CODED", "cards", "get_card", "fmt_number"]
