"""Bytes each rank sends per training step, collective by collective, under the ring model.

**Ring model** (Patarasuk & Yuan 2009; ZeRO paper §7). Over a group of g ranks, a
reduce-scatter whose input is S bytes and an all-gather whose output is S bytes each send
(g-1)/g · S bytes per rank; an all-reduce is the two back to back, 2(g-1)/g · S. One rank
alone sends nothing. Gradients travel in the recipe's grad dtype G, parameters in its param
dtype P.

**Per step, Ψ elements** (ZeRO §7.2-7.3; FSDP paper §3.2, §3.3; Megatron-FSDP per-axis levels)::

    ddp, ddp_bucketed   all_reduce ΨG                                  = 2Ψ (DDP baseline)
    zero1, zero2        reduce_scatter ΨG + all_gather ΨP              = 2Ψ, same as DDP
    zero1_allreduce     all_reduce ΨG + all_gather ΨP                  = 3Ψ (paper vs code gap)
    megatron_distopt    reduce_scatter Ψ·4 (fp32 grads) + all_gather ΨP
    fsdp1, fsdp2        all_gather ΨP twice (forward, backward) + reduce_scatter ΨG
                        = 3Ψ = 1.5x DDP; once with reshard_after_forward=False (= 2Ψ)
    hsdp                inner as fsdp; outer (group M): all_reduce of the (Ψ/N)G grad shard
    hfsdp               inner as fsdp; outer: reduce_scatter (Ψ/N)G + all_gather (Ψ/N)P

("2Ψ" counts elements, i.e. factor (g-1)/g dropped, as the paper does.) The exact form
applies the same rules per flat unit with padded sizes, or per dim-0 parameter with each chunk
padded to equal rows on the wire (`zeroedu.shard.dim0_padded_numel`).

**Gradient accumulation**, K micro-batches per optimizer step (bytes per *optimizer step*):
a gradient reduction that can wait for the last micro-batch happens once (DDP's all-reduce,
ZeRO-1's and Megatron's reduce-scatter, the hybrids' outer axis); ZeRO-2's reduce-scatter and
all of ZeRO-3's inner traffic (two all-gathers and a reduce-scatter per unit) happen K times,
because their full gradients (and ZeRO-3's full parameters) do not outlive one backward. The
parameter all-gather after the update happens once.

**Gradient clipping** over shards adds one all-reduce of one fp32 number (4 bytes) over the
axes whose gradient shards are disjoint: the sharding axis; a hybrid with a sharded outer
level (HFSDP) over the whole world; none for DDP, whose every rank holds the whole gradient.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .. import shard
from ..catalog import INNER, OUTER, WORLD, shards
from .inputs import check_counts, check_psi, check_units, resolve

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


def sent_bytes(collective: str, nbytes, group: int) -> Fraction:
    """Bytes one rank sends in a ring collective; `nbytes` is the full (unsharded) size."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; choose one of {', '.join(COLLECTIVES)}")
    factor = Fraction(group - 1, group)
    # all-reduce = reduce-scatter then all-gather, so a ring sends the buffer twice
    return (2 if collective == "all_reduce" else 1) * factor * Fraction(nbytes)


@dataclass(frozen=True)
class CommOp:
    """One collective call: which axis, what it moves, how big, over how many ranks."""

    axis: str
    collective: str
    tag: str
    nbytes: object  # full-buffer size in bytes (S)
    group: int

    @property
    def sent(self) -> Fraction:
        return sent_bytes(self.collective, self.nbytes, self.group)


class CommBytes(dict):
    """axis -> {collective -> bytes one rank sends per step}; `ops` keeps the call list."""

    def __init__(self, ops: list[CommOp], axes: tuple[str, ...]):
        super().__init__({a: {} for a in axes})
        self.ops = list(ops)
        for op in self.ops:
            per = self.setdefault(op.axis, {})
            per[op.collective] = per.get(op.collective, Fraction(0)) + op.sent

    def by_collective(self) -> dict[str, Fraction]:
        out: dict[str, Fraction] = {}
        for per in self.values():
            for c, b in per.items():
                out[c] = out.get(c, Fraction(0)) + b
        return out

    def axis_total(self, axis: str) -> Fraction:
        return sum(self.get(axis, {}).values(), Fraction(0))

    def total(self) -> Fraction:
        return sum((self.axis_total(a) for a in self), Fraction(0))


def _ops(spec, rec, full, chunk, n, m, reshard_after_forward, tag="", micro_batches=1) -> list[CommOp]:
    """Collectives for one buffer of `full` elements whose inner-axis shard has `chunk` elements,
    per optimizer step of `micro_batches` micro-batches."""
    P, G, K = rec.param_bytes, rec.grad_bytes, micro_batches
    inner = shards(spec.inner)
    ops = []
    if inner["param"]:
        # ZeRO-3: gather before forward; after forward the params are freed (resharded), so
        # backward gathers them again. Keeping them skips the second gather at a memory cost.
        # Every micro-batch runs the whole lifecycle.
        for _ in range(K):
            ops.append(CommOp(INNER, "all_gather", tag + "params/forward", full * P, n))
            if reshard_after_forward:
                ops.append(CommOp(INNER, "all_gather", tag + "params/backward", full * P, n))
            ops.append(CommOp(INNER, "reduce_scatter", tag + "grads", full * G, n))
    elif spec.inner == "no_shard":
        ops.append(CommOp(INNER, "all_reduce", tag + "grads", full * G, n))
    else:
        # ZeRO-1/2: each rank updates its shard only, so the updated params are all-gathered.
        # ZeRO-2 frees the full gradient after each backward, so it reduces every micro-batch.
        for _ in range(K if inner["grad"] else 1):
            ops.append(CommOp(INNER, spec.grad_sync, tag + "grads", full * G, n))
        ops.append(CommOp(INNER, "all_gather", tag + "params/after_step", full * P, n))
    if spec.hybrid:
        if spec.outer == "no_shard":
            # HSDP: the outer axis is plain DDP on this rank's grad shard
            ops.append(CommOp(OUTER, "all_reduce", tag + "outer/grads", chunk * G, m))
        else:
            # HFSDP: ZeRO-1 across domains; the updated param shard goes back out
            ops.append(CommOp(OUTER, "reduce_scatter", tag + "outer/grads", chunk * G, m))
            ops.append(CommOp(OUTER, "all_gather", tag + "outer/params", chunk * P, m))
    return ops


def _norm_ops(spec, n, m) -> list[CommOp]:
    """Gradient clipping: one all-reduce of one fp32 number where the shards are disjoint."""
    if spec.inner == "no_shard":
        return []
    if spec.hybrid and spec.outer != "no_shard":
        return [CommOp(WORLD, "all_reduce", "norm/grads", 4, n * m)]
    return [CommOp(INNER, "all_reduce", "norm/grads", 4, n)]


def _axes(spec, clip: bool = False) -> tuple[str, ...]:
    axes = (INNER, OUTER) if spec.hybrid else (INNER,)
    return axes + ((WORLD,) if clip and spec.hybrid and spec.outer != "no_shard" else ())


def _check_k(micro_batches) -> int:
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches must be an integer >= 1, got {micro_batches!r}")
    return micro_batches


def comm_per_rank(strategy, psi, n, m=1, recipe=None, reshard_after_forward=True, micro_batches=1,
                  clip=False) -> CommBytes:
    """Asymptotic bytes sent by one rank per optimizer step (Fractions)."""
    spec, rec = resolve(strategy, recipe)
    psi = check_psi(psi)
    n, m = check_counts(spec, n, m)
    k = _check_k(micro_batches)
    ops = _ops(spec, rec, psi, psi / n, n, m, reshard_after_forward, micro_batches=k)
    return CommBytes(ops + (_norm_ops(spec, n, m) if clip else []), _axes(spec, clip))


def exact_comm(strategy, units, n, m=1, recipe=None, reshard_after_forward=True, micro_batches=1,
               clip=False) -> CommBytes:
    """Bytes sent by one rank per optimizer step for a concrete model, with padding on the wire."""
    spec, rec = resolve(strategy, recipe)
    n, m = check_counts(spec, n, m)
    units = check_units(units)
    k = _check_k(micro_batches)
    ops = []
    if spec.layout == "replicated":
        total = sum(shard.numel(s) for u in units for s in u)
        ops = _ops(spec, rec, total, Fraction(total, n), n, m, reshard_after_forward, micro_batches=k)
    for i, unit in enumerate(units):
        if spec.layout == "flat":
            padded = shard.padded_numel(sum(shard.numel(s) for s in unit), n * m)
            ops += _ops(spec, rec, padded, shard.shard_numel(padded, n), n, m,
                        reshard_after_forward, tag=f"unit{i}/", micro_batches=k)
        elif spec.layout == "dim0":
            if spec.hybrid:
                raise NotImplementedError("dim-0 layout on a hybrid mesh is not modelled")
            for j, s in enumerate(unit):
                if len(s) == 0:
                    raise ValueError("a 0-dim parameter cannot be sharded on dim 0")
                padded = shard.dim0_padded_numel(s, n)
                ops += _ops(spec, rec, padded, Fraction(padded, n), n, m,
                            reshard_after_forward, tag=f"unit{i}/param{j}/", micro_batches=k)
        elif spec.layout != "replicated":
            raise ValueError(f"unknown layout {spec.layout!r}")
    return CommBytes(ops + (_norm_ops(spec, n, m) if clip else []), _axes(spec, clip))


__all__ = ["COLLECTIVES", "CommBytes", "CommOp", "sent_bytes", "comm_per_rank", "exact_comm"]
