"""One module per strategy. `build` looks a name up in `zeroedu.catalog` and imports its class.

The catalog is the registry: each `StrategySpec.impl` names the implementing class
("module:Class" in this package), so a strategy's name is written once, there.
"""
from __future__ import annotations

import importlib

from .. import catalog


def available() -> list[str]:
    """Every strategy the catalog lists (each has an implementation)."""
    return list(catalog.STRATEGIES)


def strategy_class(name: str):
    spec = catalog.get_spec(name)
    mod, _, cls = spec.impl.partition(":")
    return getattr(importlib.import_module(f"{__name__}.{mod}"), cls)


def build(name: str, model, dist, recipe, adam=None, **options):
    """Construct a strategy: `Strategy(model, dist, recipe, adam, **options)`."""
    return strategy_class(name)(model, dist, recipe, adam, **options)


def option_names(name: str) -> tuple[str, ...]:
    """The options a strategy takes (the keys of its class's `OPTIONS` table)."""
    return tuple(strategy_class(name).OPTIONS)
