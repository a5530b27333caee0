"""Planning a large job over dp × tp × pp × cp with a ZeRO level, a micro-batch size and an
activation recompute mode: memory per GPU and a step-time model, every term a closed form with its
source. Used by `zeroedu plan`.

Model (`ModelShape`, presets in `MODELS`, any other from a dict): a decoder of L layers of width h,
a heads of which a_kv carry keys and values (grouped-query attention), an MLP of width f (SwiGLU's
three matrices or GELU's two), vocabulary V, sequence s. Parameters per layer 2h² + 2h·(h·a_kv/a)
(q, o; k, v) + 3hf or 2hf + the norms (and biases where the shape has them); plus the embeddings
(`ModelShape.params`; Llama-2-70B: 68,976,648,192, the count of its published weights).

Placement (`Plan`): the N GPUs as pp × dp × cp × tp, tp innermost (one node's NVLink; a tp that
spans nodes runs on the NIC), then cp, then dp, then pp; the global batch of B sequences split
over dp into m = B/(dp·b) micro-batches of b sequences. When pp does not divide L the busiest
stage holds ⌈L/pp⌉ layers (`stage_layers`) and sets the pipeline's pace.

Memory per GPU (mixed precision with Adam: 2 + 2 + 12 bytes per parameter, ZeRO §3):
    parameters per model-parallel rank  Ψ_r = Ψ / (tp·pp)  (layers split evenly; the embeddings
                                         counted as if spread too: an approximation of ~1 %)
    ZeRO over the g = dp·cp ranks that hold the same Ψ_r (context-parallel ranks replicate it):
        0: 16Ψ_r    1: 4Ψ_r + 12Ψ_r/g    2: 2Ψ_r + 14Ψ_r/g    3: 16Ψ_r/g + 2·(2·Ψ_layer/tp)
        (stage 3 also holds two gathered bf16 layers, the one computing and the one prefetched)
    activations  per layer and micro-batch on a tp rank with sequence parallelism, at s/cp tokens
        (Korthikanti et al. 2022, Table 2): selective recompute 34·s·b·h/tp; none
        s·b·h·(34 + 5as/h)/tp (the scores kept); full 2·s·b·h/tp (the layer's input) plus, once,
        one layer's whole activations rebuilt during backward; held for ⌈L/pp⌉ layers by
        min(pp, m) micro-batches on the first stage under 1F1B (§4.2.3)
    optimizer offload (`Plan.offload`, ZeRO-1..3; Ren et al. 2021): the fp32 master, the moments and
        the fp32 gradient partition live on the host, 16Ψ_r/g there; the device keeps
        1: 4Ψ_r (stage 1's whole 16-bit gradients wait for their reduce)  2: 2Ψ_r  3: 2Ψ_r/g
        (`theory.offload`, checked against DeepSpeed's estimators)
    FP8 (`Plan.fp8`; `theory.fp8`): model states as above (the fp32 master stays); the four linear
        layers' saved inputs take 1 byte, 27 of the 34 (`fp8.layer_activation_bytes`); ZeRO-3's
        gathered layers are FP8 copies, 1 byte per element

Time per step (each term a lower bound; `Estimate`):
    compute   the step's FLOPs from the shapes (`step_flops`: 2 per weight of each matrix multiplication
              and 4·s·h for attention per token and layer, 2hV for the logits, backward twice the
              forward, plus what recompute runs again), over N GPUs at `efficiency` of peak (a
              model: one share per GPU, calibrated on its published runs, `A100_EFFICIENCY`), times
              pp·⌈L/pp⌉/L for the busiest stage
    scores    with `Plan.flash` off (the scores written to HBM between kernels, as the 2021-22 papers'
              runs did): per layer and micro-batch 10·a·(s/cp)·s·b/tp bytes of traffic per forward pass
              (Korthikanti et al. 2022's 5as²b bytes, each written once and read once), backward twice,
              recompute once more, at HBM bandwidth (memory-bound). It is why a small model reaches a
              smaller share of peak: a layer's matmuls grow as h², this as a·s
    bubble    the pipeline idles (pp − 1)/(v·m + pp − 1) of the step (§2.2; v = 1 without interleaving)
    pp        the sends on the pipeline's critical path: 2·v·(pp − 1) of one micro-batch's
              b·(s/cp)·h·2/tp bytes (scatter/gather, §4.1), on NVLink or the NIC
    tp        4 all-reduce-equivalents of b·(s/cp)·h·2 bytes per layer and micro-batch (2 forward,
              2 backward, 2 more for full recompute's second forward; with SP as all-gather +
              reduce-scatter, the same bytes), on NVLink inside a node, on the NIC when tp spans
              nodes; blocking: exposed whole
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
              the GPU's PCIe link (`Cluster.pcie`), and between them the CPU's Adam step, memory-bound: 30 bytes
              per element of the partition (reads the fp32 master, gradient and two moments, writes
              the master, the moments and the 16-bit copy) at `Cluster.host_memory` per GPU
    ep        a mixture of experts: four all-to-alls per MoE layer and micro-batch of each rank's
              k·b·(s/cp)/tp token rows, (ep − 1)/ep of them off the rank, exposed
    FP8       the linear layers' FLOPs at the FP8 peak, attention's and the logits' at the BF16 peak
              (`Cluster.fp8_flops`: H100 SXM dense FP8 is twice BF16; an A100 has none)
Ranked by the sum: (compute + scores)/(1 − bubble) + tp + cp exposed + dp exposed + pp sends + ep + offload exposed.
Experts (`ModelShape.experts`, `Plan.ep`): each layer's E experts split over ep of the dp × cp
ranks, ZeRO over the dp·cp/ep ranks that hold the same ones; a token's forward multiplies by its
top-k experts and the router; its activations save the MLP's for each of its k experts.
Refused as one framework's rule, not physics: optimizer offload with a pipeline beyond ZeRO-1
(DeepSpeed's `PipelineEngine`, whose offload data flow this models, refuses ZeRO-2 and -3).
Not modelled yet: the other memory-bound work (norms, activations, dropout: fused in the runs
calibrated on), a matmul's efficiency at small shapes, a flash kernel's saved statistics in place of
the scores under no recompute (the scores are counted kept), a router's imbalance (every expert gets its share), tp's
communication overlapped with compute. Checked against published runs: `theory.published`,
benchmarks/bench_planner.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
import re
from itertools import product

from ..answers import read_plan
from ..kinds import RECOMPUTE_MODES, RecomputeMode
from . import fp8 as fp8_forms
from .context import ring_bytes
from .experts import balanced_bytes

GB = 1e9
CPU_ADAM_BYTES = 30  # per element of the host's partition: reads 4 x fp32, writes 3 x fp32 and a 16-bit copy


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape. Defaults are Llama's (SwiGLU, RMSNorm, no biases, rotary
    positions, untied embeddings); `gated=False, biases=True` with `positions` is GPT-2/3's (a
    GELU MLP of two matrices, LayerNorms and linears with biases, learned positions)."""
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    gated: bool = True  # SwiGLU: gate, up and down (3 matrices); False: up and down (2)
    biases: bool = False  # every linear and norm has a bias (LayerNorm: weight and bias)
    tied: bool = False  # one matrix for the input embedding and the output layer
    positions: int = 0  # rows of learned position embeddings; 0: rotary (no parameters)
    experts: int = 0  # a mixture of experts: E MLPs of width ffn per layer and a router (0: dense)
    top_k: int = 2  # with experts: the experts each token is routed to

    @property
    def kv_width(self) -> int:
        return self.hidden // self.heads * self.kv_heads

    def mlp_params(self) -> int:
        """One MLP (one expert): 3 (gated) or 2 matrices of h x ffn, and their biases if any."""
        h, f = self.hidden, self.ffn
        return (3 if self.gated else 2) * h * f + (((2 if self.gated else 1) * f + h) if self.biases else 0)

    def layer_matmul_params(self) -> int:
        """Weights one token's forward multiplies by in a layer: q and o (h x h), k and v
        (h x kv_width), the MLP's 3 (gated) or 2 matrices of h x ffn, with experts top-k of them
        and the router (h x E)."""
        h = self.hidden
        mlp = (3 if self.gated else 2) * h * self.ffn
        return 2 * h * h + 2 * h * self.kv_width + (self.top_k * mlp + h * self.experts if self.experts else mlp)

    def expert_layer_params(self) -> int:
        """A layer's expert parameters (what expert parallelism splits); 0 for a dense model."""
        return self.experts * self.mlp_params()

    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv_width
        attention = 2 * h * h + 2 * h * kv + ((2 * h + 2 * kv) if self.biases else 0)
        mlps = self.expert_layer_params() + h * self.experts if self.experts else self.mlp_params()
        return attention + mlps + 2 * h * (2 if self.biases else 1)  # + two norms

    def params(self) -> int:
        h, V = self.hidden, self.vocab
        out = 0 if self.tied else V * h + (V if self.biases else 0)  # an untied output layer (and its bias)
        return self.layers * self.layer_params() + V * h + out + self.positions * h + h * (2 if self.biases else 1)

    def plain(self) -> dict:
        return dict(vars(self))


# Meta's Llama 2 paper (Touvron et al. 2023, Table 1 and §2.2) and the published configs of
# Llama-2-70b (80 layers, hidden 8192, 64 heads with 8 KV heads, FFN 28672, vocab 32000, 4096
# tokens) and Llama-2-7b (32 layers, hidden 4096, 32 heads, all carrying keys and values, FFN 11008).
LLAMA2_70B = ModelShape("Llama-2-70B", 80, 8192, 64, 8, 28672, 32000, 4096)
LLAMA2_7B = ModelShape("Llama-2-7B", 32, 4096, 32, 32, 11008, 32000, 4096)
# GPT-3 175B (Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, 96 heads, context 2048; the
# GPT-2 byte-pair vocabulary of 50257), the shape of Narayanan et al. 2021's and Korthikanti et
# al. 2022's 175B runs: tied embeddings, learned positions, biases, a 4h GELU MLP.
GPT3_175B = ModelShape("GPT-3-175B", 96, 12288, 96, 96, 4 * 12288, 50257, 2048, gated=False, biases=True, tied=True,
                       positions=2048)
# zeroedu's own GPTs (`models.gpt.PRESETS`; the same Ψ, tests/test_planner.py): untied, with biases
GPT_SMALL = ModelShape("gpt-small", 4, 256, 4, 4, 1024, 97, 128, gated=False, biases=True, positions=128)
GPT_TINY = ModelShape("gpt-tiny", 2, 32, 2, 2, 128, 67, 32, gated=False, biases=True, positions=32)
# A mixture of experts: Mixtral 8x7B (Jiang et al. 2024, Table 1: dim 4096, 32 layers, 32 heads with 8
# KV heads, hidden_dim 14336, vocab 32000, 8 experts, top-2), planned at 4096 of its 32768 tokens
MIXTRAL_8X7B = ModelShape("Mixtral-8x7B", 32, 4096, 32, 8, 14336, 32000, 4096, experts=8, top_k=2)
MODELS = {m.name.lower(): m for m in (LLAMA2_70B, LLAMA2_7B, GPT3_175B, MIXTRAL_8X7B, GPT_SMALL, GPT_TINY)}


def model_shape(spec: "str | dict | ModelShape") -> ModelShape:
    """A preset by name (`MODELS`, any case), or a shape given as a dict (a JSON object) with
    layers, hidden, heads, ffn, vocab, seq and optionally name, kv_heads (default heads), gated,
    biases, tied, positions, experts and top_k (a mixture of experts)."""
    if isinstance(spec, ModelShape):
        return spec
    if isinstance(spec, str):
        if spec.lower() not in MODELS:
            raise ValueError(f"unknown model {spec!r}: one of {', '.join(m.name for m in MODELS.values())}, "
                             "or a JSON shape")
        return MODELS[spec.lower()]
    need = {"layers", "hidden", "heads", "ffn", "vocab", "seq"}
    known = need | {"name", "kv_heads", "gated", "biases", "tied", "positions", "experts", "top_k"}
    if not need <= set(spec) or not set(spec) <= known:
        raise ValueError(f"a model shape needs {', '.join(sorted(need))} (and may give "
                         f"{', '.join(sorted(known - need))}); got {', '.join(sorted(spec))}")
    d = {"name": "custom", "kv_heads": spec["heads"], **spec}
    for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq", "positions", "experts", "top_k"):
        if k in d and (isinstance(d[k], bool) or not isinstance(d[k], int)
                       or d[k] < (0 if k in ("positions", "experts") else 1)):
            raise ValueError(f"{k} must be a positive integer, got {d[k]!r}")
    if d["hidden"] % d["heads"] or d["heads"] % d["kv_heads"]:
        raise ValueError("heads must divide hidden, and kv_heads the heads")
    if d.get("experts") and d.get("top_k", 2) > d["experts"]:
        raise ValueError(f"top_k = {d.get('top_k', 2)} exceeds the {d['experts']} experts")
    return ModelShape(**d)


@dataclass(frozen=True)
class Cluster:
    """N GPUs, `per_node` to an NVLink domain. Every bandwidth is a line rate per GPU per
    direction (what the link can carry; a collective reaches less), FLOP/s are dense datasheet
    peaks, and `efficiency` (the share of peak the matrix multiplications reach) and
    `host_memory` are assumptions, printed as such. The defaults are an H100 SXM node (`GPUS`)."""
    gpus: int
    per_node: int = 8
    hbm: float = 80e9  # H100 SXM: 80 GB
    nvlink: float = 450e9  # line rate per GPU per direction (`theory.timing.DEFAULT_BANDWIDTH`)
    nic: float = 50e9  # line rate: one 400 Gb/s NIC per GPU
    peak_flops: float = 989e12  # H100 SXM dense BF16 (NVIDIA's datasheet)
    efficiency: float = 0.5  # the share of peak the matrix multiplications reach: H100_EFFICIENCY, a model
    fp8_flops: float | None = 1979e12  # H100 SXM dense FP8 (the same datasheet; 3958 is with sparsity); None: none
    pcie: float = 63e9  # host link line rate per GPU per direction: PCIe 5.0 x16, 32 GT/s x 16 lanes, 128b/130b
    host_memory: float = 50e9  # an assumption: a node's ~400 GB/s of DDR5 shared by its 8 GPUs' CPU steps
    hbm_bandwidth: float = 3.35e12  # H100 SXM: 3.35 TB/s (the datasheet); what memory-bound work streams at

    @classmethod
    def of(cls, gpu: str, gpus: int, **kw) -> "Cluster":
        """`gpus` of a preset (`GPUS`), any field overridden by `kw`."""
        if gpu not in GPUS:
            raise ValueError(f"unknown GPU {gpu!r}: one of {', '.join(GPUS)}")
        return cls(gpus, **{**GPUS[gpu].fields, **kw})


@dataclass(frozen=True)
class GPU:
    """A GPU preset: its `Cluster` fields and where the numbers come from."""
    fields: dict
    source: str


# The share of peak a GPU's matrix multiplications reach in a well-tuned run: a model, one number per
# GPU, calibrated on the published runs of that GPU (`theory.published`, benchmarks/bench_planner.py):
# the A100's on Narayanan et al. 2021's Table 1 and Korthikanti et al. 2022's configurations (BF16,
# with the scores' HBM traffic those runs had, `Plan.flash`), the H100's on NeMo 24.12's FP8 runs.
# What varies with the shapes is not this share but the memory-bound work beside the matmuls.
A100_EFFICIENCY, H100_EFFICIENCY = 0.575, 0.5

# Datasheet figures (dense, no sparsity) and the links of the vendor's 8-GPU server: NVLink per
# GPU per direction (A100: 12 NVLink-3 links of 25 GB/s; H100/H200: 18 NVLink-4 links of 25 GB/s),
# one NIC per GPU (DGX A100: 200 Gb/s HDR; DGX H100/H200: 400 Gb/s NDR), PCIe 4.0 x16 (31.5 GB/s)
# or 5.0 x16 (63 GB/s). All line rates.
GPUS = {
    "a100-80gb": GPU(dict(per_node=8, hbm=80e9, nvlink=300e9, nic=25e9, peak_flops=312e12, fp8_flops=None,
                          pcie=31.5e9, hbm_bandwidth=2.039e12, efficiency=A100_EFFICIENCY),
                     "NVIDIA A100 datasheet (80 GB SXM: 312 TFLOP/s BF16, no FP8, 2,039 GB/s HBM2e), DGX A100"),
    "h100-sxm": GPU(dict(per_node=8, hbm=80e9, nvlink=450e9, nic=50e9, peak_flops=989e12, fp8_flops=1979e12,
                         pcie=63e9, hbm_bandwidth=3.35e12, efficiency=H100_EFFICIENCY),
                    "NVIDIA H100 datasheet (SXM: 989 TFLOP/s BF16, 1979 FP8, 3.35 TB/s HBM3), DGX H100"),
    "h200": GPU(dict(per_node=8, hbm=141e9, nvlink=450e9, nic=50e9, peak_flops=989e12, fp8_flops=1979e12,
                     pcie=63e9, hbm_bandwidth=4.8e12, efficiency=H100_EFFICIENCY),
                "NVIDIA H200 datasheet (SXM: 141 GB at 4.8 TB/s, the H100's compute), DGX H200"),
}

RECOMPUTE = RECOMPUTE_MODES  # none; selective (attention's core re-run); full (every layer re-run)


@dataclass(frozen=True)
class Plan:
    dp: int
    tp: int
    pp: int
    cp: int
    zero: int
    offload: bool = False  # the optimizer's partition on the host (ZeRO-Offload)
    fp8: bool = False  # the linear layers in FP8
    micro_batch: int = 1  # sequences per micro-batch, b
    recompute: str = RecomputeMode.SELECTIVE  # none; selective (attention's core re-run); full (every layer re-run)
    v: int = 1  # interleaved 1F1B: model chunks per pipeline rank (1: plain 1F1B)
    ep: int = 1  # expert parallelism: each layer's experts split over ep of the dp x cp ranks
    flash: bool = True  # attention in one fused kernel (the s x s scores stay on chip); False: the
    # scores go through HBM between kernels (Megatron's fused softmax between two batched matmuls,
    # the kernels of the 2021-22 papers' runs), memory-bound traffic the `scores` term counts

    def __str__(self) -> str:
        return (f"dp {self.dp} x tp {self.tp} x pp {self.pp} x cp {self.cp}, ZeRO-{self.zero}"
                + (" + offload" if self.offload else "") + (", FP8" if self.fp8 else "")
                + (f", b {self.micro_batch}" if self.micro_batch != 1 else "")
                + (f", interleaved v {self.v}" if self.v != 1 else "")
                + (f", ep {self.ep}" if self.ep != 1 else "") + ("" if self.flash else ", scores in HBM")
                + {RecomputeMode.NONE: ", no recompute", RecomputeMode.FULL: ", full recompute"}.get(self.recompute, ""))


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
    pp: float = 0.0  # seconds of the pipeline's point-to-point sends on its critical path
    ep: float = 0.0  # seconds of the experts' all-to-alls (exposed: each MoE layer waits for them)
    host: float = 0.0  # bytes per GPU on the host (optimizer offload)
    model_flops: float = 0.0  # the step's FLOPs without recompute (what MFU counts)
    hardware_flops: float = 0.0  # the FLOPs it runs, recompute included (the compute term's)
    scores: float = 0.0  # seconds the attention scores' HBM traffic takes, memory-bound (`Plan.flash` off)

    @property
    def memory(self) -> float:
        return self.states + self.activations

    @property
    def step(self) -> float:
        return ((self.compute + self.scores) / (1 - self.bubble) + self.tp + self.cp + self.dp + self.offload + self.pp
                + self.ep)

    def throughput(self, gpus: int) -> float:
        """Model FLOP/s per GPU: the step's FLOPs without recompute over the step time."""
        return self.model_flops / self.step / gpus

    def terms(self) -> dict[str, float]:
        """The step's parts in seconds: compute, the bubble's idle time, each axis's exposed comm
        and the host link's."""
        busy = self.compute + self.scores
        return {"compute": self.compute, "scores": self.scores, "bubble": busy / (1 - self.bubble) - busy,
                "tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp, "ep": self.ep, "offload": self.offload}


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
    """FLOPs of one training step of a GPT (FFN 4h, every head carrying keys and values), forward
    and backward, no recompute: 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)), the model FLOPs behind MFU
    (Korthikanti et al. 2022, Appendix A). Narayanan et al. 2021's Eq. (3) counts full recompute's
    second forward of the layers: 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) (`step_flops`, "full")."""
    return 72 * batch * seq * layers * hidden * hidden * (1 + Fraction(seq, 6 * hidden)
                                                          + Fraction(vocab, 12 * layers * hidden))


def step_flops(model: ModelShape, batch: int, recompute: str = RecomputeMode.NONE) -> Fraction:
    """FLOPs of one training step over `batch` sequences of `model.seq` tokens, from the shapes.
    Per token and layer the forward takes 2 FLOPs per weight of its matrix multiplications
    (`ModelShape.layer_matmul_params`) and 4·s·h for attention's QKᵀ and A·V (the causal mask not
    exploited, as the papers count); the output layer 2·h·V per token; backward twice the forward.
    Recompute re-runs forward work during backward: "full" every layer's forward, "selective"
    attention's QKᵀ and A·V (Korthikanti et al. 2022, §5). For a GPT shape "none" is `model_flops`
    and "full" Narayanan et al. 2021's Eq. (3) (tests/test_planner.py)."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    s, h, L = model.seq, model.hidden, model.layers
    layer = 2 * model.layer_matmul_params() + 4 * s * h
    forward = L * layer + 2 * h * model.vocab
    again = {RecomputeMode.NONE: 0, RecomputeMode.SELECTIVE: L * 4 * s * h, RecomputeMode.FULL: L * layer}[recompute]
    return Fraction(batch * s) * (3 * forward + again)


def training_days(tokens, params, gpus: int, flops_per_gpu) -> float:
    """End-to-end training time ≈ 8·T·P / (n·X) (Narayanan et al. 2021, §5.1, Eq. (4): 6·T·P FLOPs,
    plus the recomputed forward's 2·T·P, at X FLOP/s achieved per GPU), in days."""
    return 8 * float(tokens) * float(params) / (gpus * float(flops_per_gpu)) / 86400


def stage_layers(layers: int, pp: int) -> int:
    """Layers on the busiest pipeline stage: ⌈L/pp⌉. When pp does not divide L the other stages
    hold fewer, as a run that gives its first or last stage fewer layers does (Megatron-Core's
    `TransformerConfig.num_layers_in_first_pipeline_stage` and `num_layers_in_last_pipeline_stage`,
    megatron/core/transformer/transformer_config.py, Megatron-LM main at d2c5e8b); the busiest
    stage sets the pipeline's pace and holds the most activations."""
    return -(-layers // pp)


def refusal(model: ModelShape, cluster: Cluster, plan: Plan, global_batch: int) -> str | None:
    """Why `plan` cannot exist (one line), or None. tp may span nodes (its all-reduces then run
    on the NIC, and `estimate` charges them there); pp need not divide the layers (`stage_layers`);
    tp may exceed the KV heads when it is a multiple of them (each rank then keeps one KV head)."""
    d, t, p, c, b = plan.dp, plan.tp, plan.pp, plan.cp, plan.micro_batch
    if d * t * p * c != cluster.gpus:
        return f"dp x tp x pp x cp = {d * t * p * c}, not the {cluster.gpus} GPUs"
    if plan.zero not in (0, 1, 2, 3):
        return f"ZeRO levels are 0..3, not {plan.zero}"
    if plan.recompute not in RECOMPUTE:
        return f"recompute is one of {', '.join(RECOMPUTE)}, not {plan.recompute!r}"
    if b < 1:
        return f"a micro-batch holds at least one sequence, not {b}"
    if plan.v < 1 or (plan.v > 1 and p == 1):
        return f"interleaving cuts each pipeline rank's layers into v >= 1 chunks, with pp > 1 (v = {plan.v}, pp = {p})"
    if plan.v > 1 and model.layers % (p * plan.v):
        return f"interleaved: pp x v = {p * plan.v} chunks must divide the {model.layers} layers"
    if plan.offload and plan.zero == 0:
        return "optimizer offload moves a ZeRO optimizer's partition: ZeRO-0 has none"
    if plan.offload and p > 1 and plan.zero > 1:
        # DeepSpeed's rule, whose data flow the offload term models, not physics: its
        # PipelineEngine refuses ZeRO-2 and ZeRO-3 (deepspeed/runtime/pipe/engine.py; card pp_zero)
        return f"offload with a pipeline is DeepSpeed's, whose PipelineEngine takes ZeRO-1 at most, not ZeRO-{plan.zero}"
    if plan.fp8 and cluster.fp8_flops is None:
        return "FP8: this GPU has no FP8 matrix units"
    if plan.ep != 1 and not model.experts:
        return f"ep = {plan.ep} splits a mixture of experts: {model.name} has none"
    if model.experts and (plan.ep < 1 or model.experts % plan.ep or (d * c) % plan.ep):
        return (f"ep = {plan.ep} must divide the {model.experts} experts and dp x cp = {d * c} (the ranks that "
                "hold the same dense layers hold the experts between them)")
    if plan.fp8 and model.experts:
        return "FP8's saved inputs are counted for dense models only"
    if plan.fp8 and plan.recompute != RecomputeMode.SELECTIVE:
        return "FP8's saved inputs are counted with selective recompute only"
    if model.heads % t:
        return f"tp = {t} must divide the {model.heads} heads"
    if model.kv_heads % t and t % model.kv_heads:
        # Megatron-Core's rule (TransformerConfig.__post_init__: num_query_groups "must be a multiple
        # or divisor of tensor_model_parallel_size"); with fewer KV heads than tp ranks each rank
        # keeps one KV head, the same one on tp/kv_heads ranks (attention.py, Megatron-LM main at
        # d98e8a6, Megatron-Core 0.20.0)
        return f"tp = {t} and the {model.kv_heads} KV heads: one must divide the other"
    if p > model.layers:
        return f"pp = {p} stages exceed the {model.layers} layers"
    if model.seq % (2 * c):
        return f"cp = {c}: the sequence of {model.seq} does not split into 2cp = {2 * c} zig-zag chunks"
    if global_batch % (d * b):
        return (f"the global batch of {global_batch} sequences does not split over dp = {d}"
                + (f" in micro-batches of {b}" if b > 1 else ""))
    return None


def estimate(model: ModelShape, cluster: Cluster, plan: Plan, global_batch: int) -> Estimate:
    why = refusal(model, cluster, plan, global_batch)
    if why:
        raise ValueError(why)
    d, t, p, c, z, b = plan.dp, plan.tp, plan.pp, plan.cp, plan.zero, plan.micro_batch
    L, h, s, V, a = model.layers, model.hidden, model.seq, model.vocab, model.heads
    m = global_batch // (d * b)  # micro-batches of b sequences per replica
    k = stage_layers(L, p)
    psi = model.params()
    # the busiest stage's parameters on one tp rank (the embeddings counted as if spread over the
    # stages: an approximation of ~1 % for a large model); Ψ/(tp·pp) when pp divides L
    psi_r = Fraction(k * model.layer_params() + Fraction(psi - L * model.layer_params(), p), t)
    if t > model.kv_heads:  # each tp rank keeps one whole KV head's k and v weights, not kv_width/tp of them
        psi_r += k * (2 * h * (h // model.heads) - Fraction(2 * h * model.kv_width, t))
    g = d * c
    # with experts: a layer's experts split over ep of the g ranks, their ZeRO group the g/ep ranks
    # holding the same experts (Megatron's expert data-parallel group); the dense rest over all g
    e, ge = plan.ep, Fraction(g, plan.ep)
    expert_r = Fraction(k * model.expert_layer_params(), t * e)
    dense_r = psi_r - Fraction(k * model.expert_layer_params(), t)
    gathered_byte = 1 if plan.fp8 else 2  # ZeRO-3 gathers FP8 copies of the weights in FP8
    host = Fraction(0)
    states = states_bytes(dense_r, g, z) + states_bytes(expert_r, ge, z)
    if plan.offload:
        (dev_d, host_d), (dev_e, host_e) = offloaded_states_bytes(dense_r, g, z), offloaded_states_bytes(expert_r, ge, z)
        states, host = dev_d + dev_e, host_d + host_e
    layer_held = model.layer_params() - model.expert_layer_params() + Fraction(model.expert_layer_params(), e)
    states += 2 * gathered_byte * layer_held / t if z == 3 else 0
    # activations per layer and micro-batch on a tp rank with sequence parallelism (Korthikanti
    # et al. 2022, Table 2, at s/cp tokens; the scores of "none" for this rank's queries x every key)
    sc = s // c
    # (its 34 = attention 11 + MLP 19 + LayerNorms 4, §4.1; a token routed to k experts saves the
    # MLP's 19 for each of them: 15 + 19k, every expert's capacity taken as exactly its share)
    per_token = 34 if not model.experts else 15 + 19 * model.top_k
    whole = Fraction(per_token * sc * b * h + 5 * a * sc * s * b, t)  # a layer's, nothing recomputed
    if plan.fp8:
        act_layer = fp8_forms.layer_activation_bytes(sc, b, h, t)
    else:
        act_layer = {RecomputeMode.NONE: whole, RecomputeMode.SELECTIVE: Fraction(per_token * sc * b * h, t),
                     RecomputeMode.FULL: Fraction(2 * sc * b * h, t)}[plan.recompute]
    # the first 1F1B stage holds min(pp, m) micro-batches of its layers (§4.2.3); interleaved, pp of
    # them times 1 + (pp - 1)/(pp·v) (Megatron-LM's theoretical_memory_usage.py, "interleaved
    # schedule memory penalty"); under full recompute it also rebuilds one layer at a time in backward
    held = min(p, m) if plan.v == 1 else p * (1 + Fraction(p - 1, p * plan.v))
    activations = act_layer * k * held + (whole if plan.recompute == RecomputeMode.FULL else 0)
    flops = step_flops(model, global_batch, plan.recompute)
    passes = 4 if plan.recompute == RecomputeMode.FULL else 3  # forward, backward (2x), and full recompute's forward again
    linear = Fraction(global_batch * s) * passes * 2 * L * model.layer_matmul_params()
    per_gpu = cluster.gpus * cluster.efficiency
    fast = cluster.fp8_flops if plan.fp8 else cluster.peak_flops
    balance = Fraction(p * k, L)  # the busiest stage sets the pace: 1 when pp divides L
    compute = float(balance) * (float(linear) / (per_gpu * fast) + float(flops - linear) / (per_gpu * cluster.peak_flops))
    # the attention scores through HBM (flash off): per layer and micro-batch each forward writes the
    # 5·a·(s/cp)·s·b bytes Korthikanti et al. 2022 count (§4.1: QKᵀ 2, softmax 2, dropout mask 1,
    # over tp) and the next kernel reads them, 10·a·(s/cp)·s·b/tp of traffic; backward twice the
    # forward's; selective and full recompute run the forward's again. Memory-bound: at HBM bandwidth
    scores = 0.0
    if not plan.flash:
        passes_s = 3 + (plan.recompute != RecomputeMode.NONE)
        scores = float(m * k * passes_s * Fraction(10 * a * sc * s * b, t)) / cluster.hbm_bandwidth
    # the bubble: (pp - 1)/v micro-batch slots of idle beside m of work (Narayanan et al. 2021, §2.2.2:
    # interleaving divides the bubble's time by v), as a share of the step
    bubble = (p - 1) / (plan.v * m + p - 1)
    # pipeline sends: the critical path crosses the pp - 1 boundaries forward and backward once per
    # chunk pass, 2·v·(pp - 1) sends of one micro-batch's b·(s/cp)·h·2 bytes, each tp rank its 1/tp
    # (Narayanan et al. 2021, §4.1, scatter/gather); the other sends overlap the stages' compute.
    # Neighbouring stages are d·c·t ranks apart: another node once that reaches a node's GPUs
    pp_link = cluster.nvlink if d * c * t < cluster.per_node else cluster.nic
    pp_time = 2 * plan.v * (p - 1) * b * sc * h * 2 / t / pp_link if p > 1 else 0.0
    # tensor parallel: 4 all-reduce-equivalents per layer and micro-batch (6 under full recompute,
    # whose second forward repeats forward's 2), the busiest stage's layers; NVLink inside a node,
    # the NIC when tp spans nodes
    tp_link = cluster.nvlink if t <= cluster.per_node else cluster.nic
    tp_bytes = (6 if plan.recompute == RecomputeMode.FULL else 4) * 2 * (t - 1) / t * b * sc * h * 2
    tp_time = m * k * tp_bytes / tp_link
    # context parallel: the ring, hidden behind the attention's own compute where it is shorter
    cp_link = cluster.nvlink if t * c <= cluster.per_node else cluster.nic
    rb = ring_bytes(b, model.kv_heads // t if model.kv_heads >= t else 1, s, h // model.heads, c, 2)
    ring = rb["forward"] * (2 if plan.recompute == RecomputeMode.FULL else 1) + rb["backward"]
    cp_comm = m * k * ring / cp_link
    attn = m * k * 12 * b * s * s * h / (c * t) / (cluster.peak_flops * cluster.efficiency)
    cp_time = max(0.0, cp_comm - attn)
    # data parallel: the gradients (and ZeRO-3's gathers), hidden behind backward up to its length
    dp_link = cluster.nvlink if t * c * d <= cluster.per_node else cluster.nic
    # one bf16 reduce-scatter or all-gather of this rank's Ψ_r: the dense part over g, experts over g/ep
    one = float(2 * dense_r) * (g - 1) / g + (float(2 * expert_r * (ge - 1) / ge) if model.experts else 0.0)
    # ZeRO-0/1 keep whole gradients: one reduce per step; ZeRO-2 reduce-scatters every micro-batch
    # (card pp_zero); ZeRO-3 also gathers the parameters for every micro-batch's forward and backward
    dp_bytes = {0: 2 * one, 1: 2 * one, 2: (m + 1) * one, 3: m * one * (1 + 2 * gathered_byte / 2)}[z]
    dp_time = max(0.0, dp_bytes / dp_link - 2 / 3 * compute)
    off_time = 0.0
    if plan.offload:
        # one optimizer step of DeepSpeed's traffic (theory.offload_pcie_bytes): fp32 gradients down
        # behind backward, then the CPU's Adam step, then the 16-bit weights up before the next forward
        part = float(dense_r / g + expert_r / ge)
        off_time = (max(0.0, 4 * part / cluster.pcie - 2 / 3 * compute) + CPU_ADAM_BYTES * part / cluster.host_memory
                    + 2 * part / cluster.pcie)
    # experts: per MoE layer and micro-batch four all-to-alls (dispatch and combine, their gradients;
    # six under full recompute), each moving this rank's b·(s/cp)/tp tokens' k rows of h bf16 values,
    # (ep - 1)/ep of them to other ranks with a balanced router (`theory.experts.balanced_bytes`);
    # the ep group's ranks are tp apart, so on NVLink while ep·tp fits in a node
    ep_time = 0.0
    if model.experts and e > 1:
        ep_link = cluster.nvlink if e * t <= cluster.per_node else cluster.nic
        a2a = balanced_bytes(Fraction(b * sc, t), model.top_k, h, e, 2)
        ep_time = float(m * k * (6 if plan.recompute == RecomputeMode.FULL else 4) * a2a) / ep_link
    return Estimate(plan, m, float(states), float(activations), compute, bubble, tp_time, cp_time, dp_time,
                    float(states + activations) <= cluster.hbm, off_time, pp_time, ep_time, float(host),
                    float(step_flops(model, global_batch, RecomputeMode.NONE)), float(flops), scores=scores)


@dataclass(frozen=True)
class PlanReport:
    model: ModelShape
    cluster: Cluster
    global_batch: int
    ranked: list[Estimate]  # the plans that fit, fastest first
    too_big: int  # plans that exist but do not fit
    refused: dict[str, int] = field(default_factory=dict)  # why the rest cannot exist: count


def plan(model: ModelShape = LLAMA2_70B, cluster: Cluster = Cluster(256), global_batch: int = 1024,
         zero_levels=(0, 1, 2, 3), cp_sizes=(1, 2, 4, 8), offload=(False,), fp8=(False,),
         micro_batches=(1, 2, 4), recompute=RECOMPUTE, interleave=(1, 2, 4), ep_sizes=(1, 2, 4, 8),
         flash: bool = True) -> PlanReport:
    """Every dp × tp × pp × cp × ZeRO level × micro-batch size × recompute mode × interleaving (v
    chunks per pipeline rank, where pp > 1) × expert parallelism (a mixture of experts only) on
    `cluster` (× with and without optimizer offload, in bf16 or FP8, as `offload` and `fp8` list),
    attention's kernels as `flash` says; the ones that fit, ranked by step time (then memory)."""
    n = cluster.gpus
    divisors = [k for k in range(1, n + 1) if n % k == 0]
    ranked, too_big, refused = [], 0, {}
    for t, p, c, z, off, f8, b, rc, v, e in product(divisors, divisors, cp_sizes, zero_levels, offload, fp8,
                                                    micro_batches, recompute, interleave,
                                                    ep_sizes if model.experts else (1,)):
        if n % (t * p * c):
            continue
        if off and z == 0:
            continue  # offload has no partition to move without ZeRO: not a plan, not a refusal
        if f8 and rc != RecomputeMode.SELECTIVE:
            continue  # FP8's saved inputs are counted for selective recompute only
        if v > 1 and p == 1:
            continue  # no pipeline to interleave: the same plan as v = 1
        pl = Plan(n // (t * p * c), t, p, c, z, off, f8, b, rc, v, e, flash)
        why = refusal(model, cluster, pl, global_batch)
        if why:
            key = re.sub(r"\d+", "N", why)  # one count per kind of reason
            refused[key] = refused.get(key, 0) + 1
            continue
        est = estimate(model, cluster, pl, global_batch)
        if est.fits:
            ranked.append(est)
        else:
            too_big += 1
    ranked.sort(key=lambda x: (x.step, x.memory))
    return PlanReport(model, cluster, global_batch, ranked, too_big, refused)


def why_better(a: Estimate, b: Estimate) -> str:
    """One line: where `a`'s step is shorter than `b`'s, term by term (the largest first)."""
    ta, tb = a.terms(), b.terms()
    diffs = sorted(((tb[k] - ta[k], k) for k in ta), reverse=True)
    gains = [f"{k} {1e3 * ta[k]:.0f} vs {1e3 * tb[k]:.0f} ms" for dlt, k in diffs if dlt >= 5e-4][:2]
    costs = [f"though its {k} is {1e3 * -dlt:.0f} ms longer" for dlt, k in diffs[::-1] if dlt <= -5e-4][:1]
    if not gains:
        if round(a.memory / GB, 1) < round(b.memory / GB, 1):
            return f"as fast as {b.plan}, with less memory ({a.memory / GB:.1f} vs {b.memory / GB:.1f} GB)"
        return f"as fast as {b.plan}, in as much memory ({a.memory / GB:.1f} GB): a tie"
    return f"{1e3 * (b.step - a.step):.0f} ms faster than {b.plan}: " + "; ".join(gains + costs)


__all__ = ["Cluster", "Estimate", "GPT3_175B", "GPUS", "LLAMA2_70B", "LLAMA2_7B", "MIXTRAL_8X7B", "MODELS", "ModelShape", "Plan",
           "PlanReport", "RECOMPUTE", "estimate", "model_flops", "model_shape", "offloaded_states_bytes", "plan",
           "refusal", "stage_layers", "states_bytes", "step_flops", "training_days", "why_better"]


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


def parse_plan(text: str) -> Plan | None:
    """The plan an answer names, read by the answer engine (`answers.read_plan`: 'dp 8, tp 8, pp 4,
    ZeRO-1', '8-way data parallel, ...', numbers in words); None when dp, tp, pp or the ZeRO level
    is missing or named twice. cp is 1 unless named."""
    got = read_plan(text)
    if got is None:
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
