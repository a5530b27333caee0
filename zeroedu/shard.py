"""Shard index math: the one place that says which elements a rank owns.

Every sharded strategy and the exact mode of `zeroedu.theory` call these functions, so the
strategies and the closed forms cannot drift apart. They are pure integer arithmetic (no torch)
and are property-tested in `tests/test_shard.py`.

Two representations, the two that real frameworks use:

* **Flat** (FSDP1's FlatParameter, ZeRO-1/2, Megatron's distributed optimizer): a group of
  parameters is flattened and concatenated into one buffer, padded with zeros to a multiple of
  the shard count, and cut into equal chunks. Rank r owns the chunk ``[r*c, (r+1)*c)``.
  Three index spaces are named, as in Megatron's ``DistributedOptimizer``:

  - *buffer-wide* range: positions in the whole padded flat buffer;
  - *local* range: positions inside this rank's shard (``0 .. c``);
  - *per-parameter* range: positions inside one parameter's own flattened tensor.

* **Dim-0** (FSDP2's per-parameter sharding): each parameter is cut along tensor dim 0 into
  chunks of ``ceil(d0 / n)`` rows; the last rank(s) may hold fewer rows, or none. Nothing is
  padded in storage; a collective pads to equal chunks only on the wire.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Sequence

Shape = tuple[int, ...]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_n(n: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"shard count must be an integer >= 1, got {n!r}")


@dataclass(frozen=True)
class Range:
    """Half-open interval [start, end) of element positions."""

    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)

    def intersect(self, other: "Range") -> "Range":
        s, e = max(self.start, other.start), min(self.end, other.end)
        return Range(s, max(s, e))

    def shift(self, by: int) -> "Range":
        return Range(self.start + by, self.end + by)


def numel(shape: Shape) -> int:
    return int(prod(shape))


# ---------------------------------------------------------------- flat representation
def padded_numel(total: int, n: int) -> int:
    """Length of a flat buffer of `total` elements padded to a multiple of `n`."""
    _check_n(n)
    return ceil_div(total, n) * n


def shard_numel(total: int, n: int) -> int:
    """Elements in each rank's chunk of the padded flat buffer (all ranks equal)."""
    return padded_numel(total, n) // n


def shard_range(total: int, n: int, rank: int) -> Range:
    """Buffer-wide range owned by `rank` (may reach into the padding)."""
    _check_n(n)
    if not 0 <= rank < n:
        raise ValueError(f"rank must be in [0, {n}), got {rank}")
    c = shard_numel(total, n)
    return Range(rank * c, (rank + 1) * c)


def data_range(total: int, n: int, rank: int) -> Range:
    """Buffer-wide range of `rank`'s chunk that is real data (padding excluded)."""
    return shard_range(total, n, rank).intersect(Range(0, total))


@dataclass(frozen=True)
class ParamSlice:
    """Where one parameter meets one rank's shard, in all three index spaces."""

    index: int  # which parameter in the group
    buffer: Range  # buffer-wide positions
    param: Range  # positions inside the parameter's flattened tensor
    local: Range  # positions inside the rank's shard


class FlatLayout:
    """A group of parameters flattened into one buffer padded to a multiple of `n`."""

    def __init__(self, shapes: Sequence[Shape], n: int):
        _check_n(n)
        self.shapes = [tuple(s) for s in shapes]
        self.n = n
        self.numels = [numel(s) for s in self.shapes]
        self.offsets = []
        off = 0
        for k in self.numels:
            self.offsets.append(off)
            off += k
        self.numel = off
        self.padded_numel = padded_numel(off, n)
        self.shard_numel = self.padded_numel // n

    def param_range(self, i: int) -> Range:
        """Buffer-wide range of parameter `i`."""
        return Range(self.offsets[i], self.offsets[i] + self.numels[i])

    def shard_range(self, rank: int) -> Range:
        return shard_range(self.numel, self.n, rank)

    def param_slices(self, rank: int) -> list[ParamSlice]:
        """Every parameter that overlaps `rank`'s shard, with the overlap in each index space."""
        mine = self.shard_range(rank)
        out = []
        for i in range(len(self.shapes)):
            buf = self.param_range(i).intersect(mine)
            if buf.size:
                out.append(ParamSlice(i, buf, buf.shift(-self.offsets[i]), buf.shift(-mine.start)))
        return out


# ---------------------------------------------------------------- dim-0 representation
def dim0_chunk_rows(d0: int, n: int) -> int:
    """Rows per chunk when dim 0 is cut into `n` chunks (torch.chunk's rule)."""
    _check_n(n)
    return ceil_div(d0, n)


def dim0_rows(d0: int, n: int, rank: int) -> Range:
    """Rows of a dim-0-sharded parameter that `rank` holds; empty for trailing ranks if d0 < n*c."""
    c = dim0_chunk_rows(d0, n)
    return Range(min(rank * c, d0), min((rank + 1) * c, d0))


def dim0_shard_numel(shape: Shape, n: int, rank: int) -> int:
    """Elements `rank` stores of a parameter sharded on dim 0 (unpadded)."""
    if len(shape) == 0:
        raise ValueError("a 0-dim parameter cannot be sharded on dim 0")
    rest = numel(shape[1:])
    return dim0_rows(shape[0], n, rank).size * rest


def dim0_padded_numel(shape: Shape, n: int) -> int:
    """Elements an all-gather moves for one dim-0-sharded parameter: every chunk padded to c rows."""
    return dim0_chunk_rows(shape[0], n) * n * numel(shape[1:])
