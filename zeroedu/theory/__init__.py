"""Closed-form model of data-parallel training: memory per rank, bytes per collective, time.

Pure Python (no torch): the predictions every notebook, CLI table and test compares the
measured runs against. Submodules, each stating its formulas and paper sections:

* `memory`: model-state bytes per rank, asymptotic (ZeRO §5.1) and exact for a concrete model;
* `comm`: bytes each rank sends per step under the ring model, per mesh axis and collective;
* `timing`: seconds from bytes and link bandwidths;
* `extensions`: ZeRO-Offload / ZeRO-Infinity, composing with TP/PP, fitting a GPU.

Quick check (7B, N = 8, bf16 mixed precision): DDP 112 GB, ZeRO-1 38.5, ZeRO-2 26.25,
ZeRO-3 14; ZeRO-3 sends 1.5x DDP's bytes.
"""
from __future__ import annotations

from .. import catalog
from .comm import COLLECTIVES, CommBytes, CommOp, comm_per_rank, exact_comm, sent_bytes
from .extensions import OFFLOAD_MODES, compose, fits, offload
from .memory import OPTIM_PARTS, ModelStates, exact_model_states, model_states
from .timing import (DEFAULT_BANDWIDTH, all_gather_time, comm_time, reduce_scatter_time,
                     ring_allreduce_time)

STRATEGY_NAMES = tuple(catalog.STRATEGIES)

__all__ = [
    "STRATEGY_NAMES", "COLLECTIVES", "OFFLOAD_MODES", "OPTIM_PARTS", "DEFAULT_BANDWIDTH",
    "ModelStates", "model_states", "exact_model_states",
    "CommBytes", "CommOp", "comm_per_rank", "exact_comm", "sent_bytes",
    "ring_allreduce_time", "all_gather_time", "reduce_scatter_time", "comm_time",
    "offload", "compose", "fits",
]
