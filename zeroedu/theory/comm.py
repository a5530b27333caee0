"""Bytes each rank sends per training step, collective by collective, under the ring model.

**Ring model** (Patarasuk & Yuan 2009; ZeRO paper §7). Over a group of g ranks, a
reduce-scatter whose input is S bytes and an all-gather whose output is S bytes each send
(g-1)/g · S bytes per rank; an all-reduce is the two back to back, 2(g-1)/g · S. One rank
alone sends nothing. Gradients travel in the recipe's grad dtype G, parameters in its param
dtype P.

**Per step, Ψ elements** (ZeRO §7.1-7.2.2; FSDP paper §3.2, §3.3; Megatron-FSDP per-axis levels)::

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

**Reduce dtype, and when "ZeRO-3 = 1.5x DDP" holds.** Gradients go on the wire in the recipe's
grad dtype G unless ``reduce_dtype`` names another: ``"fp32"`` is FSDP2's
``MixedPrecisionPolicy(reduce_dtype=torch.float32)`` (torchtitan's default) and Megatron-LM's
default under ``--bf16`` (gradients reduced in fp32 unless ``--grad-reduce-in-bf16``; the
``megatron-bf16`` recipe already has G = 4). ZeRO §7.2.2's 3Ψ vs 2Ψ counts elements; in bytes
the ratio is 1.5 only when the parameter all-gathers and every gradient reduction use the same
dtype. With bf16 parameters and fp32 reduction ZeRO-3 sends 2 + 2 + 4 = 8 bytes per parameter
against DDP's fp32 all-reduce 2·4 = 8: ratio 1.0; against a DDP reducing in bf16, 2·2 = 4: 2.0.

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

from dataclasses import dataclass, replace
from fractions import Fraction

from ..kinds import Implementation, Layout
from .. import shard
from ..recipes import DTYPE_BYTES
from ..catalog import shards
from ..kinds import DP_OUTER as OUTER, DP_SHARD as INNER, WORLD
from .inputs import check_counts, check_psi, check_units, resolve

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


def sent_bytes(collective: str, nbytes, group: int) -> Fraction:
    """Bytes one rank sends in a ring collective; `nbytes` is the full (unsharded) size."""
    if collective == "send":  # point to point (a ring attention hop, a pipeline boundary): the buffer once
        return Fraction(nbytes)
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; choose one of {', '.join(COLLECTIVES)}")
    factor = Fraction(group - 1, group)
    # all-reduce = reduce-scatter then all-gather, so a ring sends the buffer twice
    return (2 if collective == "all_reduce" else 1) * factor * Fraction(nbytes)


# nccl-tests' two bandwidths (NVIDIA/nccl-tests, doc/PERFORMANCE.md): algbw = S/t, the buffer over
# the time, and busbw = algbw times the share of S that each rank's link must carry at least, for
# any algorithm built from point-to-point sends (ring or tree). busbw is then independent of n and
# compares with the link's peak. For the ring collectives that share is `sent_bytes(op, S, n)/S`;
# broadcast and reduce push all of S through the root's one link.
BUS_OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce")


def bus_factor(collective: str, n: int) -> Fraction:
    """busbw / algbw for `collective` over n ranks: 2(n-1)/n, (n-1)/n (reduce-scatter, all-gather,
    all-to-all), 1 (broadcast, reduce)."""
    if collective not in BUS_OPS:
        raise ValueError(f"unknown collective {collective!r}; choose one of {', '.join(BUS_OPS)}")
    if collective in ("broadcast", "reduce"):
        return Fraction(1)
    if collective == "all_to_all":
        return Fraction(n - 1, n)  # every rank keeps its own 1/n and sends the rest
    return sent_bytes(collective, 1, n)


def bus_bandwidth(collective: str, nbytes, seconds, n: int) -> Fraction:
    """busbw of one measured collective: (nbytes / seconds) · `bus_factor`."""
    return Fraction(nbytes) / Fraction(seconds) * bus_factor(collective, n)


@dataclass(frozen=True)
class CommOp:
    """One collective call: which axis, what it moves, how big, over how many ranks."""

    axis: str
    collective: str
    tag: str
    nbytes: object  # full-buffer size in bytes (S)
    group: int
    unit: int | None = None  # the unit whose buffer moves (the tag's "unitK", as a field)
    # Bytes this rank sends, where they are not the ring's share of `nbytes`: an all-to-all
    # whose splits the router chose sends its own rows to each other rank (`theory.experts`).
    exact: object = None

    @property
    def sent(self) -> Fraction:
        if self.exact is not None:
            return Fraction(self.exact)
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


def _ops(spec, rec, full, chunk, n, m, reshard_after_forward, tag="", micro_batches=1, unit=None) -> list[CommOp]:
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
            ops.append(CommOp(INNER, "all_gather", tag + "params/forward", full * P, n, unit))
            if reshard_after_forward:
                ops.append(CommOp(INNER, "all_gather", tag + "params/backward", full * P, n, unit))
            ops.append(CommOp(INNER, "reduce_scatter", tag + "grads", full * G, n, unit))
    elif spec.inner == "no_shard":
        ops.append(CommOp(INNER, "all_reduce", tag + "grads", full * G, n, unit))
    else:
        # ZeRO-1/2: each rank updates its shard only, so the updated params are all-gathered.
        # ZeRO-2 frees the full gradient after each backward, so it reduces every micro-batch.
        for _ in range(K if inner["grad"] else 1):
            ops.append(CommOp(INNER, spec.grad_sync, tag + "grads", full * G, n, unit))
        ops.append(CommOp(INNER, "all_gather", tag + "params/after_step", full * P, n, unit))
    if spec.hybrid:
        if spec.outer == "no_shard":
            # HSDP: the outer axis is plain DDP on this rank's grad shard
            ops.append(CommOp(OUTER, "all_reduce", tag + "outer/grads", chunk * G, m, unit))
        else:
            # HFSDP: ZeRO-1 across domains; the updated param shard goes back out
            ops.append(CommOp(OUTER, "reduce_scatter", tag + "outer/grads", chunk * G, m, unit))
            ops.append(CommOp(OUTER, "all_gather", tag + "outer/params", chunk * P, m, unit))
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


def _reduce_in(rec, reduce_dtype):
    """The recipe with gradients reduced in `reduce_dtype` (a dtype name); None keeps its own."""
    if reduce_dtype is None:
        return rec
    if reduce_dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown reduce_dtype {reduce_dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
    return replace(rec, grad=reduce_dtype)


def comm_per_rank(strategy, psi, n, m=1, recipe=None, reshard_after_forward=True, micro_batches=1,
                  clip=False, reduce_dtype=None) -> CommBytes:
    """Asymptotic bytes sent by one rank per optimizer step (Fractions). `reduce_dtype` ("fp32",
    "bf16", "fp16") puts gradients on the wire in that dtype instead of the recipe's grad dtype."""
    spec, rec = resolve(strategy, recipe)
    rec = _reduce_in(rec, reduce_dtype)
    psi = check_psi(psi)
    n, m = check_counts(spec, n, m)
    k = _check_k(micro_batches)
    ops = _ops(spec, rec, psi, psi / n, n, m, reshard_after_forward, micro_batches=k)
    return CommBytes(ops + (_norm_ops(spec, n, m) if clip else []), _axes(spec, clip))


def exact_comm(strategy, units, n, m=1, recipe=None, reshard_after_forward=True, micro_batches=1,
               clip=False, reduce_dtype=None, trainable=None) -> CommBytes:
    """Bytes sent by one rank per optimizer step for a concrete model, with padding on the wire.
    `trainable` (per unit, one flag per parameter; None: all): frozen parameters have no
    gradient to reduce (replicated and dim-0 layouts, see `theory.memory`). Under dim-0 a
    frozen parameter is still all-gathered for forward, and again for backward when backward
    reaches its unit: with the units run in order on inputs that need no gradient, when this
    unit or an earlier one has a trainable parameter (`fully_shard` gathers for backward from
    a hook on outputs that require grad; a frozen embedding's output requires none)."""
    from .memory import _check_trainable

    spec, rec = resolve(strategy, recipe)
    rec = _reduce_in(rec, reduce_dtype)
    n, m = check_counts(spec, n, m)
    units = check_units(units)
    mask = _check_trainable(units, trainable, spec.layout)
    k = _check_k(micro_batches)
    ops = []
    if spec.layout == Layout.REPLICATED and spec.per_parameter_calls:
        # one call per trainable parameter, as naive DDP issues them (the same bytes in all)
        sizes = [shard.numel(s) for u, f in zip(units, mask) for s, t in zip(u, f) if t]
        for j, size in enumerate(sizes):
            ops += _ops(spec, rec, size, Fraction(size, n), n, m, reshard_after_forward, tag=f"param{j}/",
                        micro_batches=k)
    elif spec.layout == Layout.REPLICATED:
        total = sum(shard.numel(s) for u, f in zip(units, mask) for s, t in zip(u, f) if t)
        ops = _ops(spec, rec, total, Fraction(total, n), n, m, reshard_after_forward, micro_batches=k)
    for i, unit in enumerate(units):
        if spec.layout == Layout.FLAT:
            padded = shard.padded_numel(sum(shard.numel(s) for s in unit), n * m)
            ops += _ops(spec, rec, padded, shard.shard_numel(padded, n), n, m,
                        reshard_after_forward, tag=f"unit{i}/", micro_batches=k, unit=i)
        elif spec.layout == Layout.DIM0:
            if spec.hybrid:
                raise NotImplementedError("dim-0 layout on a hybrid mesh is not modelled")
            reached = any(t for f in mask[:i + 1] for t in f)  # backward runs through unit i
            for j, (s, t) in enumerate(zip(unit, mask[i])):
                if len(s) == 0:
                    raise ValueError("a 0-dim parameter cannot be sharded on dim 0")
                padded = shard.dim0_padded_numel(s, n)
                ops += [op for op in _ops(spec, rec, padded, Fraction(padded, n), n, m,
                                          reshard_after_forward and reached, tag=f"unit{i}/param{j}/",
                                          micro_batches=k, unit=i)
                        if t or op.collective != "reduce_scatter"]
        elif spec.layout != Layout.REPLICATED:
            raise ValueError(f"unknown layout {spec.layout!r}")
    return CommBytes(ops + (_norm_ops(spec, n, m) if clip else []), _axes(spec, clip))


TRANSPORTS = ("gloo", "nccl")


def on_the_wire(comm: CommBytes, implementation: str = "ring", transport: str = "gloo") -> Fraction:
    """Bytes one rank puts on the wire per step for these collectives: the ring model, except
    that gloo's own reduce-scatter (``implementation="backend"`` on ``transport="gloo"``) is an
    all-reduce with one chunk kept (ProcessGroupGloo's reduce_scatter_tensor_coalesced), so it
    sends 2(g-1)/g·S, twice the ring bound (measured: `tests/test_wire.py`). gloo's framing, 144 B
    per message, is on top (`zeroedu.runtime.wire`). On ``transport="nccl"`` every collective is
    counted under the ring model (NCCL's ring algorithm, ``NCCL_ALGO=Ring``): its reduce-scatter
    is not an all-reduce. NCCL's other algorithms (tree, NVLS) are not modelled, and nothing
    here measures NCCL's wire: on GPUs this figure is a prediction only."""
    if implementation not in (Implementation.RING, Implementation.BACKEND):
        raise ValueError(f"implementation must be 'ring' or 'backend', got {implementation!r}")
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    doubled = implementation == Implementation.BACKEND and transport == "gloo"
    return sum((op.sent * (2 if doubled and op.collective == "reduce_scatter" else 1)
                for op in comm.ops), Fraction(0))


__all__ = ["BUS_OPS", "bus_bandwidth", "bus_factor", "TRANSPORTS", "on_the_wire", "COLLECTIVES", "CommBytes", "CommOp", "sent_bytes", "comm_per_rank", "exact_comm"]
