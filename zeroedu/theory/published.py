"""Published training runs the planner (`theory.planner`) is checked against: each run's model
shape, its configuration and the throughput it reported, with the source. Three tables: NeMo
24.12's H100 runs (`RUNS`), Narayanan et al. 2021's Table 1 and Korthikanti et al. 2022's
configurations on A100s (`PAPER_RUNS`).

NVIDIA NeMo Framework 24.12, "Performance Benchmarks", pretraining at FP8 precision on H100 GPUs
(docs.nvidia.com/nemo-framework/user-guide/24.12/nemotoolkit/performance/performance_summary.html):
per row the GPUs, global batch (GBS), micro-batch (MBS), sequence, TP, PP, CP, VP (interleaved
chunks per pipeline rank), tokens per second per GPU and "Model TFLOP / sec / GPU". The model
FLOPs convention is the planner's (`planner.step_flops`, no recompute: 2 FLOPs per weight, 4·s·h
per token and layer for attention with the causal mask not exploited, 2hV for the logits, backward
twice the forward): Llama-2-7B's 16,934 tokens/s/GPU x 46.07 GFLOP per token = 780 TFLOP/s, the
published figure (tests/test_planner.py). The distributed optimizer is ZeRO-1. Rows whose model
shape the page does not give (GPT3-5B, GPT3-20B, Nemotron) are left out.

Model shapes: the published configs (Llama-2: Touvron et al. 2023 and its released configs;
Llama-3 8B/70B: Meta's released configs, vocabulary 128,256, 8 KV heads; GPT-3 175B:
`planner.GPT3_175B`).
"""
from __future__ import annotations

from dataclasses import dataclass

from .planner import GPT3_175B, LLAMA2_70B, LLAMA2_7B, ModelShape

LLAMA2_13B = ModelShape("Llama-2-13B", 40, 5120, 40, 40, 13824, 32000, 4096)
LLAMA3_8B = ModelShape("Llama-3-8B", 32, 4096, 32, 8, 14336, 128256, 8192)
LLAMA3_70B = ModelShape("Llama-3-70B", 80, 8192, 64, 8, 28672, 128256, 8192)

NEMO_24_12 = "NeMo Framework 24.12 performance summary, pretraining, FP8, H100"


@dataclass(frozen=True)
class PublishedRun:
    name: str
    model: ModelShape
    gpus: int
    global_batch: int
    micro_batch: int
    tp: int
    pp: int
    cp: int
    vp: int  # interleaved chunks per pipeline rank (1: none)
    tokens_per_gpu: float  # tokens per second per GPU, as published
    model_tflops: float  # model TFLOP/s per GPU, as published
    fp8: bool
    gpu: str  # `planner.GPUS` key
    source: str

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp * self.cp)


def _nemo(name, model, gpus, gbs, mbs, tp, pp, cp, vp, tokens, tflops) -> PublishedRun:
    return PublishedRun(name, model, gpus, gbs, mbs, tp, pp, cp, vp, tokens, tflops, True, "h100-sxm", NEMO_24_12)


RUNS = [
    _nemo("GPT3-175B", GPT3_175B, 128, 256, 1, 4, 8, 1, 6, 716, 771),
    _nemo("GPT3-175B", GPT3_175B, 512, 2048, 2, 4, 8, 1, 6, 825, 888),
    _nemo("LLAMA2-7B", LLAMA2_7B, 8, 128, 1, 1, 1, 1, 1, 16934, 780),
    _nemo("LLAMA2-13B", LLAMA2_13B, 16, 128, 1, 1, 4, 1, 10, 8715, 760),
    _nemo("LLAMA2-70B", LLAMA2_70B, 64, 128, 1, 4, 4, 1, 20, 1728, 768),
    _nemo("LLAMA3-8B", LLAMA3_8B, 8, 128, 1, 1, 1, 2, 1, 12273, 711),
    _nemo("LLAMA3-70B", LLAMA3_70B, 64, 128, 1, 4, 4, 2, 5, 1524, 734),
]


# ------------------------------------------------------------------ the two Megatron papers' tables
# GPT shapes as both papers build them (Megatron-LM's GPT: a 4h GELU MLP, biases, LayerNorms,
# learned positions, the output layer tied to the input embedding), vocabulary 51,200 and 2,048
# tokens ("All models use a vocabulary size of 51,200 and a sequence length of 2048", the
# Megatron-LM README of that time, which gives the same weak-scaling study).
def megatron_gpt(name: str, heads: int, hidden: int, layers: int) -> ModelShape:
    return ModelShape(name, layers, hidden, heads, heads, 4 * hidden, 51200, 2048, gated=False, biases=True,
                      tied=True, positions=2048)


NARAYANAN_2021 = ("Narayanan et al. 2021, Table 1 (weak scaling, A100 80 GB, mixed precision, "
                  "activation recompute; TFLOP/s by Eq. (3), the recomputed forward counted)")
KORTHIKANTI_2022 = ("Korthikanti et al. 2022, Table 3 configurations and the model FLOPs utilization of "
                    "selective recompute with sequence parallelism (A100 80 GB; MFU from the Megatron-LM README)")
A100_PEAK_TFLOPS = 312  # dense BF16/FP16, what both papers' "% of peak" divides by


@dataclass(frozen=True)
class PaperRun:
    """One row of a paper's table: the shape, the GPUs, the global batch, tp and pp (dp the rest;
    no cp), and the throughput as the paper counts it. The micro-batch size and the pipeline's
    interleaving are not in these tables (None): the benchmark tries the ones the planner knows."""
    name: str
    model: ModelShape
    gpus: int
    global_batch: int
    tp: int
    pp: int
    published_tflops: float  # per GPU, as the paper counts it (`counts_recompute`)
    counts_recompute: bool  # True: the recomputed forward is counted (Narayanan's Eq. (3))
    recompute: str  # what the run did: "full" (Narayanan) or "selective" (Korthikanti)
    source: str
    gpu: str = "a100-80gb"
    zero: int = 0  # neither paper's runs shard the optimizer (Korthikanti's have dp = 1)

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def model_tflops(self) -> float:
        """The published figure in the planner's convention, model FLOPs (no recompute):
        Eq. (3)'s figure times the ratio of the two step FLOPs of this shape."""
        if not self.counts_recompute:
            return self.published_tflops
        from .planner import step_flops

        return self.published_tflops * float(step_flops(self.model, 1, "none") / step_flops(self.model, 1, "full"))


def _narayanan(billions, heads, hidden, layers, tp, pp, gpus, batch, tflops) -> PaperRun:
    return PaperRun(f"GPT {billions}B", megatron_gpt(f"GPT-{billions}B", heads, hidden, layers), gpus, batch, tp, pp,
                    tflops, True, "full", NARAYANAN_2021)


def _korthikanti(name, heads, hidden, layers, tp, pp, gpus, batch, mfu) -> PaperRun:
    return PaperRun(f"GPT {name}", megatron_gpt(f"GPT-{name}", heads, hidden, layers), gpus, batch, tp, pp,
                    mfu * A100_PEAK_TFLOPS, False, "selective", KORTHIKANTI_2022)


# Narayanan et al. 2021, Table 1: parameters (billions), heads, hidden, layers, tp, pp, GPUs,
# batch, achieved TFLOP/s per GPU
NARAYANAN_RUNS = [
    _narayanan(1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    _narayanan(3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    _narayanan(7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    _narayanan(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    _narayanan(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    _narayanan(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    _narayanan(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    _narayanan(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    _narayanan(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    _narayanan(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
# Korthikanti et al. 2022, Table 3 (heads, hidden, layers, tp, pp, GPUs, global batch; dp = 1) and
# the model FLOPs utilization the Megatron-LM README gives for them (22B 41.5 %, 175B 51.4 %,
# 530B 56.0 %, 1T 56.3 %; hardware FLOPs 43.7, 52.8, 57.0, 57.0 %)
KORTHIKANTI_RUNS = [
    _korthikanti("22B", 64, 6144, 48, 8, 1, 8, 4, 0.415),
    _korthikanti("175B", 96, 12288, 96, 8, 8, 64, 64, 0.514),
    _korthikanti("530B", 128, 20480, 105, 8, 35, 280, 280, 0.560),
    _korthikanti("1T", 160, 25600, 128, 8, 64, 512, 512, 0.563),
]
PAPER_RUNS = NARAYANAN_RUNS + KORTHIKANTI_RUNS

# The papers' tables give neither the micro-batch size nor the interleaving: a row is evaluated at
# the fastest of these the planner finds (every v that divides a stage's layers: 105 on 35 stages, 3)
PAPER_MICRO_BATCHES, PAPER_INTERLEAVES = (1, 2, 4, 8), tuple(range(1, 9))


def cluster_of(run: "PublishedRun | PaperRun", efficiency: float | None = None):
    """The run's GPUs as its preset gives them (`planner.GPUS`: the matmuls' calibrated share of
    peak), `efficiency` overriding that share when given."""
    from .planner import Cluster

    return Cluster.of(run.gpu, run.gpus, **({} if efficiency is None else {"efficiency": efficiency}))


def plan_of(run: "PublishedRun") -> "Plan":
    """A NeMo row's configuration as a planner `Plan` (ZeRO-1: the distributed optimizer; selective
    recompute; a fused attention kernel)."""
    from .planner import Plan

    return Plan(run.dp, run.tp, run.pp, run.cp, 1, fp8=run.fp8, micro_batch=run.micro_batch, v=run.vp)


def paper_plans(run: PaperRun, cluster) -> list:
    """A paper row's tp, pp and dp at every micro-batch size and interleaving the planner knows that
    can exist (its recompute and ZeRO level; the scores through HBM, as those runs' kernels had them)."""
    from .planner import Plan, refusal

    tried = [Plan(run.dp, run.tp, run.pp, 1, run.zero, micro_batch=b, recompute=run.recompute, v=v, flash=False)
             for b in PAPER_MICRO_BATCHES for v in PAPER_INTERLEAVES]
    return [pl for pl in tried if refusal(run.model, cluster, pl, run.global_batch) is None]


def predicted(run: "PublishedRun | PaperRun", efficiency: float | None = None):
    """The planner's `Estimate` of the published configuration (a paper row's at its fastest
    micro-batch and interleaving that fit), or None where none can exist."""
    from .planner import estimate, refusal

    cluster = cluster_of(run, efficiency)
    if isinstance(run, PublishedRun):
        pl = plan_of(run)
        return None if refusal(run.model, cluster, pl, run.global_batch) else estimate(run.model, cluster, pl,
                                                                                        run.global_batch)
    ests = [estimate(run.model, cluster, pl, run.global_batch) for pl in paper_plans(run, cluster)]
    return min(ests, key=lambda e: (not e.fits, e.step)) if ests else None


def calibrate(runs, step: float = 0.025) -> tuple[float, float]:
    """The matmuls' share of peak, on a grid of `step` from 30 to 80 %, whose largest miss
    |predicted/published - 1| over `runs` (their published configurations, `predicted`) is
    smallest: (share, miss). How the GPU presets' shares were set (`planner.A100_EFFICIENCY`)."""
    best = None
    for i in range(round(0.3 / step), round(0.8 / step) + 1):
        share = round(i * step, 4)
        miss = max(abs(predicted(r, share).throughput(r.gpus) / 1e12 / r.model_tflops - 1) for r in runs)
        if best is None or miss < best[1] - 1e-12:
            best = (share, miss)
    return best

__all__ = ["A100_PEAK_TFLOPS", "KORTHIKANTI_2022", "KORTHIKANTI_RUNS", "LLAMA2_13B", "LLAMA3_70B", "LLAMA3_8B",
           "NARAYANAN_2021", "NARAYANAN_RUNS", "NEMO_24_12", "PAPER_INTERLEAVES", "PAPER_MICRO_BATCHES", "PAPER_RUNS",
           "PaperRun", "PublishedRun", "RUNS", "calibrate", "cluster_of", "megatron_gpt", "paper_plans", "plan_of", "predicted"]
