"""How the package writes numbers, in one place: tables, reports, cards and figure labels.

* `number`: exact counts with thousands separators (``13,232``); a non-integer keeps six
  significant digits (``1,240.5``), so a ring-model byte figure such as 2(N-1)/N · S at N = 3
  reads the same in the CLI, the notebooks and the tests.
* `human_bytes`: decimal units, as GPU memory is quoted (``1.50 GB``).
* `significant`: at most `digits` significant digits, no trailing zeros (``38.5``, ``26.25``).
* `gb`: a fixed-width column of gigabytes for text tables.
"""
from __future__ import annotations

from fractions import Fraction

_UNITS = (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def _real(x) -> float | int:
    if isinstance(x, Fraction):
        return int(x) if x.denominator == 1 else float(x)
    return x


def number(x) -> str:
    """13232 -> '13,232'; 2481.0 -> '2,481'; 1240.5 -> '1,240.5'."""
    x = _real(x)
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    return f"{x:,}" if isinstance(x, int) else f"{x:,.6g}"


def human_bytes(x) -> str:
    """1.5e9 -> '1.50 GB' (decimal units)."""
    x = float(x)
    for unit, scale in _UNITS:
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} B"


def byte_scale(values) -> tuple[float, str]:
    """A common unit for a plot axis or a table column: (divisor, label)."""
    top = max([abs(float(v)) for v in values] + [0.0])
    for unit, scale in _UNITS:
        if top >= scale:
            return scale, unit
    return 1.0, "bytes"


def significant(x, digits: int = 4) -> str:
    """112, 38.5, 26.25, 1.5: at most `digits` significant digits, no trailing zeros."""
    x = float(x)
    if x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.{digits}g}"


def gb(x, width: int = 10, decimals: int = 2) -> str:
    """A right-aligned column of GB (1e9 bytes)."""
    return f"{float(x) / 1e9:{width}.{decimals}f}"


def params(psi) -> str:
    """A parameter count as people say it: 7e9 -> '7B', 1.5e9 -> '1.5B', 3242081 -> '3.24M'."""
    x = float(psi)
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{significant(x / scale, 3)}{unit}"
    return significant(x, 3)



def table(head: list[str], rows: list[list[str]]) -> str:
    """Right-aligned columns under a header and a rule."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths))
                     for r in [head, ["-" * w for w in widths]] + rows)
