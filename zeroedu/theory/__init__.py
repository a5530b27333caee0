"""Closed-form model of data-parallel training: memory per rank, bytes per collective, time.

Pure Python (no torch): the predictions every notebook, CLI table and test compares the
measured runs against. Submodules, each stating its formulas and paper sections:

* `memory`: model-state bytes per rank, asymptotic (ZeRO §5.1) and exact for a concrete model,
  and FSDP's peak at lifecycle events (`fsdp_peak`);
* `activations`: activation bytes, exact for zeroedu's models and Korthikanti et al. 2022 for a
  GPT shape (`transformer_shape` infers one from Ψ);
* `comm`: bytes each rank sends per step under the ring model, per mesh axis and collective
  (with an optional gradient reduce dtype);
* `timing`: seconds from bytes and link bandwidths, and the α–β latency model;
* `schedule`: a step's time from its schedule, an event simulator with one compute stream and
  one communication stream per mesh axis (`simulate`; `ddp`, `fsdp` build the strategies';
  `replay`, `predict` read a run's own schedule from its timeline and replay it on other links);
* `projection`: the FSDP schedule filled with a 7B shape and stated H100 inputs, a step on a
  cluster as a model, with the input that dominates it;
* `extensions`: ZeRO-Offload / ZeRO-Infinity, composing with TP/PP (GPU count), and what one
  GPU holds: model states + activations + the gathered unit, and whether it fits;
* `hybrid`: flat ZeRO-3 vs HSDP vs HFSDP across domains, in bytes and seconds;
* `allocator`: what torch's CUDA caching allocator rounds a request to, the segment it takes from
  the driver and what it keeps cached beside it;
* `fp8`: FP8's two formats, per-tensor scaling and what FP8 stores;
* `tensor_parallel`: what one tp rank holds of a GPT (Megatron's column / row split) and the
  bytes tensor and sequence parallelism send per layer, for the data-parallel forms to apply to.

Quick check (7B, N = 8, bf16 mixed precision): DDP 112 GB, ZeRO-1 38.5, ZeRO-2 26.25,
ZeRO-3 14; ZeRO-3 sends 1.5x DDP's bytes.
"""
from __future__ import annotations

from .. import catalog
from .activations import TransformerShape, transformer_activation_bytes, transformer_shape
from .comm import BUS_OPS, COLLECTIVES, CommBytes, CommOp, bus_bandwidth, bus_factor, comm_per_rank, exact_comm, sent_bytes
from .extensions import (DEFAULT_RECOMPUTE, OFFLOAD_MODES, compose, device_bytes, fits,
                         gathered_unit_bytes, gpu_count, offload, offload_not_applicable,
                         offload_pcie_bytes)
from .memory import OPTIM_PARTS, ModelStates, exact_model_states, fsdp_peak, model_states
from .timing import (DEFAULT_ALPHA, DEFAULT_BANDWIDTH, all_gather_time, bucket_time,
                     bucketed_time, comm_time, min_bucket_bytes, reduce_scatter_time,
                     ring_allreduce_time, ring_steps, ring_time)

STRATEGY_NAMES = tuple(catalog.STRATEGIES)

__all__ = [
    "STRATEGY_NAMES", "COLLECTIVES", "OFFLOAD_MODES", "OPTIM_PARTS", "DEFAULT_BANDWIDTH",
    "DEFAULT_ALPHA", "DEFAULT_RECOMPUTE",
    "ModelStates", "model_states", "exact_model_states", "fsdp_peak",
    "TransformerShape", "transformer_shape", "transformer_activation_bytes",
    "CommBytes", "CommOp", "comm_per_rank", "exact_comm", "sent_bytes", "BUS_OPS", "bus_factor", "bus_bandwidth",
    "ring_allreduce_time", "all_gather_time", "reduce_scatter_time", "comm_time",
    "ring_steps", "ring_time", "bucket_time", "min_bucket_bytes", "bucketed_time",
    "offload", "offload_not_applicable", "offload_pcie_bytes", "compose", "gpu_count", "gathered_unit_bytes",
    "device_bytes", "fits",
]
