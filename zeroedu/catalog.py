"""The strategies zeroedu knows, by name: their ZeRO level on each mesh axis and their layout.

Pure data (no torch), shared by `zeroedu.theory` (closed forms), `zeroedu.strategies` (the
implementations) and the CLI, so a name means the same thing everywhere.

Levels follow Megatron-FSDP's names: ``no_shard`` (DDP), ``optim`` (ZeRO-1), ``optim_grads``
(ZeRO-2), ``optim_grads_params`` (ZeRO-3). A level says which of param / grad / optimizer
state is sharded on that mesh axis.

Layouts (what the exact mode of the closed forms needs to know about storage):

* ``replicated``: every parameter a tensor of its own, nothing padded (DDP).
* ``flat``: each unit (one top-level layer by default) is one flat buffer padded to a multiple
  of the number of shards on all sharding axes (N, or N*M for hybrid); see `zeroedu.shard`.
* ``dim0``: every parameter sharded on its own along tensor dim 0, uneven last shard (FSDP2).
"""
from __future__ import annotations

from dataclasses import dataclass

LEVELS = ("no_shard", "optim", "optim_grads", "optim_grads_params")


def shards(level: str) -> dict[str, bool]:
    """Which model-state categories a ZeRO level shards."""
    if level not in LEVELS:
        raise ValueError(f"unknown ZeRO level {level!r}; choose one of {', '.join(LEVELS)}")
    k = LEVELS.index(level)
    return {"optim": k >= 1, "grad": k >= 2, "param": k >= 3}


@dataclass(frozen=True)
class StrategySpec:
    name: str
    inner: str  # ZeRO level on the dp_shard axis
    outer: str = "no_shard"  # ZeRO level on the dp_outer axis (hybrid only)
    layout: str = "flat"
    hybrid: bool = False
    default_recipe: str = "mixed-bf16"
    grad_sync: str = "reduce_scatter"  # how gradients are reduced: all_reduce | reduce_scatter
    summary: str = ""
    impl: str = ""  # the implementing class, "module:Class" inside zeroedu.strategies
    # The strategy discards its fp32 gradients after the update, so Adam scales them in place
    # (1/(N·K)) instead of reading them through its scratch buffer (`optim.scratch_elements`).
    scales_grads_in_place: bool = False
    # One collective per parameter (naive DDP's loop), not one per unit or buffer: the bytes are
    # the same, the calls (and their ring steps, each a message's fixed cost) many more.
    per_parameter_calls: bool = False


STRATEGIES: dict[str, StrategySpec] = {
    s.name: s
    for s in [
        StrategySpec("ddp", "no_shard", layout="replicated", grad_sync="all_reduce",
                     summary="naive DDP: all-reduce every gradient after backward", impl="ddp:DDP",
                     per_parameter_calls=True),
        StrategySpec("ddp_bucketed", "no_shard", layout="replicated", grad_sync="all_reduce",
                     summary="DDP: bucketed async all-reduce overlapped with backward",
                     impl="ddp_bucketed:DDPBucketed", scales_grads_in_place=True),
        StrategySpec("zero1", "optim", summary="ZeRO-1: optimizer state sharded, reduce-scatter grads",
                     impl="zero1:ZeRO1"),
        StrategySpec("zero1_allreduce", "optim", grad_sync="all_reduce",
                     summary="ZeRO-1 as often coded: all-reduce grads + all-gather params (3Ψ)",
                     impl="zero1:ZeRO1AllReduce"),
        StrategySpec("zero2", "optim_grads", summary="ZeRO-2: gradients sharded too", impl="zero2:ZeRO2"),
        StrategySpec("fsdp1", "optim_grads_params",
                     summary="ZeRO-3 / FSDP1: flat-parameter units gathered per layer", impl="fsdp1:FSDP1"),
        StrategySpec("fsdp2", "optim_grads_params", layout="dim0",
                     summary="FSDP2: per-parameter dim-0 sharding", impl="fsdp2:FSDP2"),
        StrategySpec("megatron_distopt", "optim", default_recipe="megatron-bf16",
                     summary="Megatron distributed optimizer: fp32 grad buffer, sharded optimizer",
                     impl="megatron_distopt:MegatronDistOpt"),
        StrategySpec("hsdp", "optim_grads_params", "no_shard", hybrid=True,
                     summary="HSDP: ZeRO-3 inside a domain, replicate across domains", impl="hybrid:HSDP"),
        StrategySpec("hfsdp", "optim_grads_params", "optim", hybrid=True,
                     summary="HFSDP: ZeRO-3 inside a domain, ZeRO-1 across domains", impl="hybrid:HFSDP"),
    ]
}

ALIASES = {"no_shard": "ddp", "optim": "zero1", "optim_grads": "zero2",
           "optim_grads_params": "fsdp1", "zero3": "fsdp1", "fsdp": "fsdp1"}


def get_spec(name: str) -> StrategySpec:
    key = ALIASES.get(name, name)
    try:
        return STRATEGIES[key]
    except KeyError:
        allowed = ", ".join(list(STRATEGIES) + list(ALIASES))
        raise ValueError(f"unknown strategy {name!r}; choose one of {allowed}") from None
