"""Input checks shared by every closed form, so each function rejects bad input the same way.

Sizes are turned into `Fraction`s here: the closed forms then divide by N and M exactly, and a
figure such as 7e9 * (4 + 12/8) comes out as exactly 38.5e9 bytes, not a float near it.
"""
from __future__ import annotations

import math
from fractions import Fraction
from numbers import Rational, Real

from .. import catalog, recipes
from ..catalog import StrategySpec
from ..recipes import Recipe


def check_psi(psi) -> Fraction:
    """Ψ: a positive, finite number of parameters (int, float or Fraction)."""
    if isinstance(psi, bool) or not isinstance(psi, Real):
        raise ValueError(f"psi must be a positive number of parameters, got {psi!r}")
    if not isinstance(psi, Rational) and not math.isfinite(psi):
        raise ValueError(f"psi must be finite and > 0, got {psi!r}")
    if psi <= 0:
        raise ValueError(f"psi must be > 0, got {psi!r}")
    return Fraction(psi)


def check_count(value, name: str) -> int:
    """A rank count (n, m, tp, pp): an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def resolve(strategy: str | StrategySpec, recipe: str | Recipe | None) -> tuple[StrategySpec, Recipe]:
    """Strategy spec (aliases allowed) and recipe; no recipe means the strategy's own default."""
    spec = strategy if isinstance(strategy, StrategySpec) else catalog.get_spec(strategy)
    return spec, recipes.get_recipe(spec.default_recipe if recipe is None else recipe)


def check_counts(spec: StrategySpec, n, m) -> tuple[int, int]:
    """N and M. Non-hybrid strategies have no outer axis, so M is checked but then treated as 1."""
    n, m = check_count(n, "n"), check_count(m, "m")
    return n, (m if spec.hybrid else 1)


def check_units(units) -> list[list[tuple[int, ...]]]:
    """Exact-mode model description: a list of units, each a list of parameter shapes."""
    out = []
    for u in units:
        shapes = []
        for s in u:
            s = tuple(s)
            if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in s):
                raise ValueError(f"a parameter shape must be a tuple of ints >= 0, got {s!r}")
            shapes.append(s)
        out.append(shapes)
    return out
