"""One module per strategy. `build` looks a name up in `zeroedu.catalog` and imports its class.

The registry maps catalog names to "module:Class"; a strategy exists for `zeroedu run` exactly
when it is listed here.
"""
from __future__ import annotations

import importlib

from ..catalog import get_spec

REGISTRY: dict[str, str] = {
    "ddp": "zeroedu.strategies.ddp:DDP",
    "fsdp1": "zeroedu.strategies.fsdp1:FSDP1",
    "fsdp2": "zeroedu.strategies.fsdp2:FSDP2",
    "ddp_bucketed": "zeroedu.strategies.ddp_bucketed:DDPBucketed",
    "zero1": "zeroedu.strategies.zero1:ZeRO1",
    "zero1_allreduce": "zeroedu.strategies.zero1:ZeRO1AllReduce",
    "zero2": "zeroedu.strategies.zero2:ZeRO2",
    "megatron_distopt": "zeroedu.strategies.megatron_distopt:MegatronDistOpt",
    "hsdp": "zeroedu.strategies.hybrid:HSDP",
    "hfsdp": "zeroedu.strategies.hybrid:HFSDP",
}


def available() -> list[str]:
    return list(REGISTRY)


def strategy_class(name: str):
    spec = get_spec(name)
    ref = REGISTRY.get(spec.name)
    if ref is None:
        raise ValueError(f"strategy {name!r} is not implemented yet; available: {', '.join(REGISTRY)}")
    mod, _, cls = ref.partition(":")
    return getattr(importlib.import_module(mod), cls)


def build(name: str, model, dist, recipe, adam=None, **opts):
    return strategy_class(name)(model, dist, recipe, adam, **opts)


def option_names(name: str) -> tuple[str, ...]:
    """The options a strategy's constructor accepts (its OPTIONS, or its keyword parameters)."""
    import inspect

    cls = strategy_class(name)
    if hasattr(cls, "OPTIONS"):
        return tuple(cls.OPTIONS)
    skip = {"self", "model", "dist", "recipe", "adam"}
    return tuple(p for p, v in inspect.signature(cls.__init__).parameters.items()
                 if p not in skip and v.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)

