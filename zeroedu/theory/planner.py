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
    optimizer offload (`Plan.offload`, ZeRO-1..3; Ren et al. 2021): the fp32 master, the moments and
        the fp32 gradient partition live on the host, 16Ψ_r/g there; the device keeps
        1: 4Ψ_r (stage 1's whole 16-bit gradients wait for their reduce)  2: 2Ψ_r  3: 2Ψ_r/g
        (`theory.offload`, checked against DeepSpeed's estimators)
    FP8 (`Plan.fp8`; `theory.fp8`): model states as above (the fp32 master stays); the four linear
        layers' saved inputs take 1 byte, 27 of the 34 (`fp8.layer_activation_bytes`); ZeRO-3's
        gathered layers are FP8 copies, 1 byte per element

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
              backward and a reduce-scatter per micro-batch; in FP8 the 2m gathers move r/2 each,
              the gradients stay bf16); on the NIC when the g ranks span nodes, hidden behind the
              backward pass (2/3 of compute) up to its length
    offload   one optimizer step's PCIe traffic per GPU (`theory.offload_pcie_bytes`, as DeepSpeed
              moves it: the fp32 gradient partition down, 4Ψ_r/g, hidden behind backward up to its
              length; the 16-bit weights up, 2Ψ_r/g, exposed: the next forward needs them) over
              one PCIe 5.0 x16 link, and between them the CPU's Adam step, memory-bound: 30 bytes
              per element of the partition (reads the fp32 master, gradient and two moments, writes
              the master, the moments and the 16-bit copy) at `Cluster.host_memory` per GPU
    FP8       the linear layers' FLOPs (the 1 in the bracket) at the FP8 peak, attention's and the
              logits' at the BF16 peak (`Cluster.fp8_flops`: H100 SXM dense FP8 is twice BF16)
Ranked by the sum: compute·(m + pp − 1)/m + tp + cp exposed + dp exposed + offload exposed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
import re
from itertools import product

from . import fp8 as fp8_forms
from .context import ring_bytes

GB = 1e9
CPU_ADAM_BYTES = 30  # per element of the host's partition: reads 4 x fp32, writes 3 x fp32 and a 16-bit copy


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
    fp8_flops: float = 1979e12  # H100 SXM dense FP8 (the same datasheet; 3958 is with sparsity)
    pcie: float = 63e9  # host link per GPU per direction: PCIe 5.0 x16, 32 GT/s x 16 lanes, 128b/130b
    host_memory: float = 50e9  # an assumption: a node's ~400 GB/s of DDR5 shared by its 8 GPUs' CPU steps


@dataclass(frozen=True)
class Plan:
    dp: int
    tp: int
    pp: int
    cp: int
    zero: int
    offload: bool = False  # the optimizer's partition on the host (ZeRO-Offload)
    fp8: bool = False  # the linear layers in FP8

    def __str__(self) -> str:
        return (f"dp {self.dp} x tp {self.tp} x pp {self.pp} x cp {self.cp}, ZeRO-{self.zero}"
                + (" + offload" if self.offload else "") + (", FP8" if self.fp8 else ""))


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
    offload: float = 0.0  # seconds of PCIe traffic exposed
    host: float = 0.0  # bytes per GPU on the host (optimizer offload)

    @property
    def memory(self) -> float:
        return self.states + self.activations

    @property
    def step(self) -> float:
        return self.compute / (1 - self.bubble) + self.tp + self.cp + self.dp + self.offload

    def terms(self) -> dict[str, float]:
        """The step's parts in seconds: compute, the bubble's idle time, each axis's exposed comm
        and the host link's."""
        return {"compute": self.compute, "bubble": self.compute / (1 - self.bubble) - self.compute,
                "tp": self.tp, "cp": self.cp, "dp": self.dp, "offload": self.offload}


def states_bytes(psi, g: int, zero: int) -> Fraction:
    """Model-state bytes per GPU for Ψ parameters under mixed precision with Adam (2 + 2 + 12 bytes),
    ZeRO stage `zero` over g ranks (Rajbhandari et al. 2019, §3 and Fig. 1)."""
    psi = Fraction(psi)
    return {0: 16 * psi, 1: 4 * psi + 12 * psi / g, 2: 2 * psi + 14 * psi / g, 3: 16 * psi / g}[zero]


def offloaded_states_bytes(psi, g: int, zero: int) -> tuple[Fraction, Fraction]:
    """(device, host) model-state bytes per GPU under optimizer offload, ZeRO stage `zero` ≥ 1 over
    g ranks: `theory.offload` for bf16 with Adam (the planner's 2 + 2 + 12 bytes)."""
    psi = Fraction(psi)
    if zero not in (1, 2, 3):
        raise ValueError(f"optimizer offload moves a ZeRO optimizer's partition: ZeRO-1..3, not {zero}")
    return {1: 4 * psi, 2: 2 * psi, 3: 2 * psi / g}[zero], 16 * psi / g


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
    if plan.offload and plan.zero == 0:
        return "optimizer offload moves a ZeRO optimizer's partition: ZeRO-0 has none"
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
    gathered_byte = 1 if plan.fp8 else 2  # ZeRO-3 gathers FP8 copies of the weights in FP8
    host = Fraction(0)
    states = states_bytes(psi_r, g, z)
    if plan.offload:
        states, host = offloaded_states_bytes(psi_r, g, z)
    states += 2 * gathered_byte * Fraction(model.layer_params(), t) if z == 3 else 0
    act_layer = (fp8_forms.layer_activation_bytes(s // c, 1, h, t) if plan.fp8
                 else Fraction(34 * (s // c) * h, t))
    activations = act_layer * (L // p) * min(p, m)
    flops = model_flops(global_batch, s, L, h, V)
    linear = 72 * global_batch * s * L * h * h  # the bracket's 1: the linear layers' FLOPs
    per_gpu = cluster.gpus * cluster.efficiency
    compute = (float(linear) / (per_gpu * (cluster.fp8_flops if plan.fp8 else cluster.peak_flops))
               + float(flops - linear) / (per_gpu * cluster.peak_flops))
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
    dp_bytes = {0: 2 * one, 1: 2 * one, 2: (m + 1) * one, 3: m * one * (1 + 2 * gathered_byte / 2)}[z]
    dp_time = max(0.0, dp_bytes / dp_link - 2 / 3 * compute)
    off_time = 0.0
    if plan.offload:
        # one optimizer step of DeepSpeed's traffic (theory.offload_pcie_bytes): fp32 gradients down
        # behind backward, then the CPU's Adam step, then the 16-bit weights up before the next forward
        part = float(psi_r) / g
        off_time = (max(0.0, 4 * part / cluster.pcie - 2 / 3 * compute) + CPU_ADAM_BYTES * part / cluster.host_memory
                    + 2 * part / cluster.pcie)
    return Estimate(plan, m, float(states), float(activations), compute, bubble, tp_time, cp_time, dp_time,
                    float(states + activations) <= cluster.hbm, off_time, float(host))


@dataclass(frozen=True)
class PlanReport:
    model: ModelShape
    cluster: Cluster
    global_batch: int
    ranked: list[Estimate]  # the plans that fit, fastest first
    too_big: int  # plans that exist but do not fit
    refused: dict[str, int] = field(default_factory=dict)  # why the rest cannot exist: count


def plan(model: ModelShape = LLAMA2_70B, cluster: Cluster = Cluster(256), global_batch: int = 1024,
         zero_levels=(0, 1, 2, 3), cp_sizes=(1, 2, 4, 8), offload=(False,), fp8=(False,)) -> PlanReport:
    """Every dp × tp × pp × cp × ZeRO level on `cluster` (× with and without optimizer offload, in
    bf16 or FP8, as `offload` and `fp8` list); the ones that fit, ranked by step time."""
    n = cluster.gpus
    divisors = [k for k in range(1, n + 1) if n % k == 0]
    ranked, too_big, refused = [], 0, {}
    for t, p, c, z, off, f8 in product(divisors, divisors, cp_sizes, zero_levels, offload, fp8):
        if n % (t * p * c):
            continue
        if off and z == 0:
            continue  # offload has no partition to move without ZeRO: not a plan, not a refusal
        pl = Plan(n // (t * p * c), t, p, c, z, off, f8)
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


__all__ = ["Cluster", "Estimate", "LLAMA2_70B", "ModelShape", "Plan", "PlanReport", "estimate", "model_flops",
           "offloaded_states_bytes", "plan", "refusal", "states_bytes", "training_days", "why_better"]


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
