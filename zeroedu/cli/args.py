"""Argument types every subcommand shares: parameter counts (7e9, 7B), positive ints and floats.

Each raises `argparse.ArgumentTypeError`, which argparse turns into its usual
``zeroedu: error: argument --psi: ...`` line and exit status 2.
"""
from __future__ import annotations

import argparse
import math

SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
MAX_PSI = 1e15  # a thousand times today's largest models: beyond it a figure is a typo


def parse_psi(text: str):
    """'7e9', '7000000000', '7B', '1.5T', '125M' -> a whole number of parameters in [1, 1e15]."""
    t = text.strip().replace("_", "").replace(",", "")
    scale = 1
    if t and t[-1].upper() in SUFFIXES:
        t, scale = t[:-1], SUFFIXES[t[-1].upper()]
    try:
        value = float(t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid parameter count {text!r}; use e.g. 7e9, 7B, 125M, 1.5T") from None
    if not math.isfinite(value) or value < 1 or value > MAX_PSI:
        raise argparse.ArgumentTypeError(f"parameter count must be between 1 and {MAX_PSI:.0e}, got {text!r}")
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"a parameter count is a whole number, got {text!r} = {value:g}")
    return int(value)


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return v


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return v
