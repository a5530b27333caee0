"""Published training runs the planner (`theory.planner`) is checked against: each run's model
shape, its configuration and the throughput it reported, with the source.

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

__all__ = ["LLAMA2_13B", "LLAMA3_70B", "LLAMA3_8B", "NEMO_24_12", "PublishedRun", "RUNS"]
