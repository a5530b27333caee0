"""Planning a large job over dp × tp × pp × cp with a ZeRO level: memory per GPU and a step-time
model, every term a closed form with its source. Used by `zeroedu plan`.

Model: a Llama-style decoder (`ModelShape`): L layers of width h, a heads of which a_kv carry keys
and values (grouped-query attention), a SwiGLU MLP of width f, vocabulary V, sequence s; untied
input and output embeddings. Parameters per layer 2h² + 2h·(h·a_kv/a) (q, o; k, v) + 3hf (gate, up,
down) + 2h (two RMSNorm weights); plus 2Vh and a final norm h (`ModelShape.params`; Llama-2-70B:
68,976,648,192, the count of its published weights).

Placement (`Plan`): the N GPUs as pp × dp × cp × tp, tp innermost (one node's NVLink), then cp,
then dp, then pp; the global batch of B sequences split over dp into m = B/(dp·b) micro-batches of
b = 1 sequence.

Memory per GPU (mixed precision with Adam: 2 + 2 + 12 bytes per parameter, ZeRO §3):
    parameters per model-parallel rank  Ψ_r = Ψ / (tp·pp)  (layers split evenly; the embeddings
                                         counted as if spread too: an approximation of ~1 %)
    ZeRO over the g = dp·cp ranks that hold the same Ψ_r (context-parallel ranks replicate it):
        0: 16Ψ_r    1: 4Ψ_r + 12Ψ_r/g    2: 2Ψ_r + 14Ψ_r/g    3: 16Ψ_r/g + 2·(2·Ψ_layer/tp)
        (stage 3 also holds two gathered bf16 layers, the one computing and the one prefetched)
    activations  34·(s/cp)·b·h/tp bytes per layer and micro-batch (Korthikanti et al. 2022,
        Table 2: tensor + sequence parallel, selective recompute), held for L/pp layers by
        min(pp, m) micro-batches on the first stage under 1F1B (§4.2.3)

Time per step (each term a lower bound; `Estimate`):
    compute   F = 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)) FLOPs (`model_flops`; a GPT's count, an
              approximation for Llama's SwiGLU and GQA) over N GPUs at `efficiency` of peak
    bubble    the pipeline idles (pp − 1)/(m + pp − 1) of the step (§2.2)
    tp        4 all-reduce-equivalents of b·(s/cp)·h·2 bytes per layer and micro-batch (2 forward,
              2 backward; with SP as all-gather + reduce-scatter, the same bytes), on NVLink inside a
              node, on the NIC when tp spans nodes; blocking: exposed whole
    cp        the ring's 2(cp − 1) + 2(cp − 1) + 2cp blocks of b·(s/cp)·(h·a_kv/a)·2 bytes per layer
              and micro-batch (`theory.context.ring_bytes`), hidden behind attention up to the
              attention's own compute (12·b·s²·h/(cp·tp) FLOPs per layer, forward and backward)
    dp        with r = 2Ψ_r·(g − 1)/g bytes (one bf16 reduce-scatter or all-gather): ZeRO-0/1 2r per
              step (whole gradients accumulate, one reduce); ZeRO-2 (m + 1)·r (a reduce-scatter per
              micro-batch, the parameters' all-gather once); ZeRO-3 3m·r (gathers forward and
              backward and a reduce-scatter per micro-batch); on the NIC when the g ranks span nodes,
              hidden behind the backward pass (2/3 of compute) up to its length
Ranked by the sum: compute·(m + pp − 1)/m + tp + cp exposed + dp exposed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
import re
from itertools import product

from .context import ring_bytes

GB = 1e9


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int

    @property
    def kv_width(self) -> int:
        return self.hidden // self.heads * self.kv_heads

    def layer_params(self) -> int:
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_width + 3 * h * self.ffn + 2 * h

    def params(self) -> int:
        return self.layers * self.layer_params() + 2 * self.vocab * self.hidden + self.hidden


# Meta's Llama 2 paper (Touvron et al. 2023, Table 1 and §2.2) and the published config of
# Llama-2-70b: 80 layers, hidden 8192, 64 heads with 8 KV heads, FFN 28672, vocab 32000, 4096 tokens.
LLAMA2_70B = ModelShape("Llama-2-70B", 80, 8192, 64, 8, 28672, 32000, 4096)


@dataclass(frozen=True)
class Cluster:
    gpus: int
    per_node: int = 8
    hbm: float = 80e9  # H100 SXM: 80 GB
    nvlink: float = 450e9  # per GPU per direction (`theory.timing.DEFAULT_BANDWIDTH`)
    nic: float = 50e9  # one 400 Gb/s NIC per GPU
    peak_flops: float = 989e12  # H100 SXM dense BF16 (NVIDIA's datasheet)
    efficiency: float = 0.5  # an assumption: the share of peak the matrix multiplications reach


@dataclass(frozen=True)
class Plan:
    dp: int
    tp: int
    pp: int
    cp: int
    zero: int

    def __str__(self) -> str:
        return f"dp {self.dp} x tp {self.tp} x pp {self.pp} x cp {self.cp}, ZeRO-{self.zero}"


@dataclass(frozen=True)
class Estimate:
    plan: Plan
    microbatches: int
    states: float  # bytes per GPU
    activations: float
    compute: float  # seconds per step, at full occupancy
    bubble: float  # share of the step
    tp: float  # seconds exposed
    cp: float
    dp: float
    fits: bool

    @property
    def memory(self) -> float:
        return self.states + self.activations

    @property
    def step(self) -> float:
        return self.compute / (1 - self.bubble) + self.tp + self.cp + self.dp

    def terms(self) -> dict[str, float]:
        """The step's parts in seconds: compute, the bubble's idle time, and each axis's exposed comm."""
        return {"compute": self.compute, "bubble": self.compute / (1 - self.bubble) - self.compute,
                "tp": self.tp, "cp": self.cp, "dp": self.dp}


def states_bytes(psi, g: int, zero: int) -> Fraction:
    """Model-state bytes per GPU for Ψ parameters under mixed precision with Adam (2 + 2 + 12 bytes),
    ZeRO stage `zero` over g ranks (Rajbhandari et al. 2019, §3 and Fig. 1)."""
    psi = Fraction(psi)
    return {0: 16 * psi, 1: 4 * psi + 12 * psi / g, 2: 2 * psi + 14 * psi / g, 3: 16 * psi / g}[zero]


def model_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> Fraction:
    """FLOPs of one training step of a GPT, forward and backward, no recompute:
    72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)) (Korthikanti et al. 2022, §6, the model FLOPs behind MFU;
    Narayanan et al. 2021, Eq. (3), is the same with 96 for full recompute's second forward)."""
    return 72 * batch * seq * layers * hidden * hidden * (1 + Fraction(seq, 6 * hidden)
                                                          + Fraction(vocab, 12 * layers * hidden))


def training_days(tokens, params, gpus: int, flops_per_gpu) -> float:
    """End-to-end training time ≈ 8·T·P / (n·X) (Narayanan et al. 2021, §5.1, Eq. (4): 6·T·P FLOPs,
    plus the recomputed forward's 2·T·P, at X FLOP/s achieved per GPU), in days."""
    return 8 * float(tokens) * float(params) / (gpus * float(flops_per_gpu)) / 86400


def refusal(model: ModelShape, cluster: Cluster, plan: Plan, global_batch: int) -> str | None:
    """Why `plan` cannot exist (one line), or None."""
    d, t, p, c = plan.dp, plan.tp, plan.pp, plan.cp
    if d * t * p * c != cluster.gpus:
        return f"dp x tp x pp x cp = {d * t * p * c}, not the {cluster.gpus} GPUs"
    if plan.zero not in (0, 1, 2, 3):
        return f"ZeRO levels are 0..3, not {plan.zero}"
    if model.heads % t or model.kv_heads % t:
        return f"tp = {t} must divide the {model.heads} heads and the {model.kv_heads} KV heads"
    if t > cluster.per_node:
        return f"tp = {t} spans nodes: its blocking all-reduces would run on the NIC ({cluster.per_node} GPUs per node)"
    if model.layers % p:
        return f"pp = {p} must divide the {model.layers} layers"
    if model.seq % (2 * c):
        return f"cp = {c}: the sequence of {model.seq} does not split into 2cp = {2 * c} zig-zag chunks"
    if global_batch % d:
        return f"the global batch of {global_batch} sequences does not split over dp = {d}"
    return None


def estimate(model: ModelShape, cluster: Cluster, plan: Plan, global_batch: int) -> Estimate:
    why = refusal(model, cluster, plan, global_batch)
    if why:
        raise ValueError(why)
    d, t, p, c, z = plan.dp, plan.tp, plan.pp, plan.cp, plan.zero
    L, h, s, V = model.layers, model.hidden, model.seq, model.vocab
    m = global_batch // d  # micro-batches of one sequence
    psi = model.params()
    psi_r = Fraction(psi, t * p)
    g = d * c
    states = states_bytes(psi_r, g, z) + (2 * 2 * Fraction(model.layer_params(), t) if z == 3 else 0)
    act_layer = Fraction(34 * (s // c) * h, t)
    activations = act_layer * (L // p) * min(p, m)
    flops = model_flops(global_batch, s, L, h, V)
    compute = float(flops) / (cluster.gpus * cluster.peak_flops * cluster.efficiency)
    bubble = (p - 1) / (m + p - 1)
    # tensor parallel: 4 all-reduce-equivalents per layer and micro-batch, this stage's L/p layers
    tp_link = cluster.nvlink if t <= cluster.per_node else cluster.nic
    tp_bytes = 4 * 2 * (t - 1) / t * (s // c) * h * 2
    tp_time = m * (L // p) * tp_bytes / tp_link
    # context parallel: the ring, hidden behind the attention's own compute where it is shorter
    cp_link = cluster.nvlink if t * c <= cluster.per_node else cluster.nic
    rb = ring_bytes(1, model.kv_heads // t if model.kv_heads >= t else 1, s, h // model.heads, c, 2)
    cp_comm = m * (L // p) * (rb["forward"] + rb["backward"]) / cp_link
    attn = m * (L // p) * 12 * s * s * h / (c * t) / (cluster.peak_flops * cluster.efficiency)
    cp_time = max(0.0, cp_comm - attn)
    # data parallel: the gradients (and ZeRO-3's gathers), hidden behind backward up to its length
    dp_link = cluster.nvlink if t * c * d <= cluster.per_node else cluster.nic
    one = float(2 * psi_r) * (g - 1) / g  # one bf16 reduce-scatter or all-gather of this rank's Ψ_r
    # ZeRO-0/1 keep whole gradients: one reduce per step; ZeRO-2 reduce-scatters every micro-batch
    # (card pp_zero); ZeRO-3 also gathers the parameters for every micro-batch's forward and backward
    dp_bytes = {0: 2 * one, 1: 2 * one, 2: (m + 1) * one, 3: 3 * m * one}[z]
    dp_time = max(0.0, dp_bytes / dp_link - 2 / 3 * compute)
    return Estimate(plan, m, float(states), float(activations), compute, bubble, tp_time, cp_time, dp_time,
                    float(states + activations) <= cluster.hbm)


@dataclass(frozen=True)
class PlanReport:
    model: ModelShape
    cluster: Cluster
    global_batch: int
    ranked: list[Estimate]  # the plans that fit, fastest first
    too_big: int  # plans that exist but do not fit
    refused: dict[str, int] = field(default_factory=dict)  # why the rest cannot exist: count


def plan(model: ModelShape = LLAMA2_70B, cluster: Cluster = Cluster(256), global_batch: int = 1024,
         zero_levels=(0, 1, 2, 3), cp_sizes=(1, 2, 4, 8)) -> PlanReport:
    """Every dp × tp × pp × cp × ZeRO level on `cluster`; the ones that fit, ranked by step time."""
    n = cluster.gpus
    divisors = [k for k in range(1, n + 1) if n % k == 0]
    ranked, too_big, refused = [], 0, {}
    for t, p, c, z in product(divisors, divisors, cp_sizes, zero_levels):
        if n % (t * p * c):
            continue
        pl = Plan(n // (t * p * c), t, p, c, z)
        why = refusal(model, cluster, pl, global_batch)
        if why:
            key = re.sub(r"\d+", "N", why)  # one count per kind of reason
            refused[key] = refused.get(key, 0) + 1
            continue
        e = estimate(model, cluster, pl, global_batch)
        if e.fits:
            ranked.append(e)
        else:
            too_big += 1
    ranked.sort(key=lambda e: (e.step, e.memory))
    return PlanReport(model, cluster, global_batch, ranked, too_big, refused)


def why_better(a: Estimate, b: Estimate) -> str:
    """One line: where `a`'s step is shorter than `b`'s, term by term (the largest first)."""
    ta, tb = a.terms(), b.terms()
    diffs = sorted(((tb[k] - ta[k], k) for k in ta), reverse=True)
    gains = [f"{k} {1e3 * ta[k]:.0f} vs {1e3 * tb[k]:.0f} ms" for dlt, k in diffs if dlt >= 5e-4][:2]
    costs = [f"though its {k} is {1e3 * -dlt:.0f} ms longer" for dlt, k in diffs[::-1] if dlt <= -5e-4][:1]
    if not gains:
        return f"as fast as {b.plan}, with less memory ({a.memory / GB:.1f} vs {b.memory / GB:.1f} GB)"
    return f"{1e3 * (b.step - a.step):.0f} ms faster than {b.plan}: " + "; ".join(gains + costs)


__all__ = ["Cluster", "Estimate", "LLAMA2_70B", "ModelShape", "Plan", "PlanReport", "estimate", "model_flops", "plan",
           "refusal", "states_bytes", "training_days", "why_better"]


# ------------------------------------------------------------------ the design exercise
# "Train Llama-2-70B on 256 GPUs (8 per node, 80 GB each), global batch 256 sequences: choose dp,
# tp, pp (cp = 1 unless named) and the ZeRO level, and defend it." A good plan exists, fits, keeps
# tensor parallelism inside a node and the bubble under BUBBLE_LIMIT of the step.
DESIGN_GPUS, DESIGN_BATCH, BUBBLE_LIMIT = 256, 256, 0.10


@dataclass(frozen=True)
class Condition:
    name: str
    held: bool
    detail: str


@dataclass(frozen=True)
class DesignGrade:
    plan: Plan | None
    conditions: list[Condition]

    @property
    def ok(self) -> bool:
        return self.plan is not None and all(c.held for c in self.conditions)

    def broken(self) -> list[Condition]:
        return [c for c in self.conditions if not c.held]


_FIELDS = {"dp": r"dp", "tp": r"tp", "pp": r"pp", "cp": r"cp", "zero": r"zero(?:[\s-]*stage)?|stage"}


def parse_plan(text: str) -> Plan | None:
    """'dp 8, tp 8, pp 4, ZeRO-1' / 'tp=8 pp=4 dp=8 zero 1' / 'DP=8 TP=8 PP=4 stage 1' -> a Plan;
    None when dp, tp, pp or the ZeRO level is missing. cp is 1 unless named."""
    t = text.lower()
    got = {}
    for key, pat in _FIELDS.items():
        m = re.search(rf"\b(?:{pat})\s*(?:=|:|-)?\s*(\d+)", t)
        if m:
            got[key] = int(m.group(1))
    if not {"dp", "tp", "pp", "zero"} <= set(got):
        return None
    return Plan(got["dp"], got["tp"], got["pp"], got.get("cp", 1), got["zero"])


def grade_design(answer: str | Plan, model: ModelShape = LLAMA2_70B,
                 cluster: Cluster = Cluster(DESIGN_GPUS), global_batch: int = DESIGN_BATCH) -> DesignGrade:
    """The design exercise's check: which of its conditions the plan holds, each with why."""
    pl = parse_plan(answer) if isinstance(answer, str) else answer
    if pl is None:
        return DesignGrade(None, [Condition("a plan", False, "name dp, tp, pp and the ZeRO level, e.g. 'dp 8, tp 8, pp 4, ZeRO-1'")])
    inside = pl.tp <= cluster.per_node
    conds = [Condition("tp inside a node", inside,
                       f"tp = {pl.tp} {'fits in' if inside else 'spans'} a node of {cluster.per_node} GPUs: "
                       + ("its all-reduces stay on NVLink" if inside else
                          "its blocking all-reduces, 4 per layer and micro-batch, would cross the NIC"))]
    why = refusal(model, cluster, pl, global_batch)
    if why and inside:
        conds.append(Condition("exists", False, why))
    if why:
        return DesignGrade(pl, conds)
    e = estimate(model, cluster, pl, global_batch)
    conds.append(Condition("exists", True, f"{pl.dp * pl.tp * pl.pp * pl.cp} GPUs, {e.microbatches} micro-batches per replica"))
    conds.append(Condition("fits in memory", e.fits,
                           f"{e.states / GB:.1f} GB of model states + {e.activations / GB:.1f} GB of activations = "
                           f"{e.memory / GB:.1f} GB of {cluster.hbm / GB:.0f} GB"))
    conds.append(Condition("small bubble", e.bubble <= BUBBLE_LIMIT,
                           f"(pp - 1)/(m + pp - 1) = {pl.pp - 1}/{e.microbatches + pl.pp - 1} = {e.bubble:.1%} of the step "
                           f"(at most {BUBBLE_LIMIT:.0%})"))
    return DesignGrade(pl, conds)


__all__ += ["Condition", "DesignGrade", "grade_design", "parse_plan"]
