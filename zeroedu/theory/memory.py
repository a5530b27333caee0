"""Model-state bytes each rank holds: the ZeRO paper's closed forms, and an exact count.

**Asymptotic form** (ZeRO paper §5.1, Fig. 1; Megatron-Core distributed-optimizer table).
With P, G, K the recipe's bytes per parameter of weights, gradients and optimizer state
(`zeroedu.recipes`), a category is divided by N when the inner (``dp_shard``) ZeRO level shards
it, and again by M when a hybrid strategy's outer (``dp_outer``) level shards it::

    ddp               (P + G + K) Ψ              mixed-bf16: 16Ψ
    zero1             (P + G) Ψ + K Ψ / N                    4Ψ + 12Ψ/N        (§5.1 P_os)
    zero2             P Ψ + (G + K) Ψ / N                    2Ψ + 14Ψ/N        (§5.1 P_os+g)
    zero3/fsdp1/fsdp2 (P + G + K) Ψ / N                      16Ψ/N             (§5.1 P_os+g+p)
    megatron_distopt  (P + G) Ψ + K Ψ / N        megatron-bf16 (fp32 grads): 6Ψ + 12Ψ/N
    hsdp              (P + G + K) Ψ / N          the outer axis only replicates
    hfsdp             (P + G) Ψ / N + K Ψ / (N M)   ZeRO-1 again across domains

7B on N = 8: 112, 38.5, 26.25, 14 and 52.5 GB; with M = 2, hsdp 14 and hfsdp 8.75 GB.
Activations, temporary unsharded units and communication buffers are not model states and are
not counted here; `extensions.device_bytes` adds activations (`activations`) and the largest
gathered unit to give what one GPU holds, and `extensions.offload` moves states to the host.

**Frozen parameters.** With Ψ_t of the Ψ parameters trainable, the parameter term keeps the
total Ψ (every rank stores every weight it computes with, frozen or not), while the gradient and
optimizer terms use Ψ_t (a frozen parameter has neither, as under torch's DDP and
`fully_shard`); `model_states(..., psi_trainable=Ψ_t)`: ddp (P Ψ + (G + K) Ψ_t), and the ZeRO
stages shard those same terms. `ddp` and `fsdp2` train frozen parameters here, as torch's DDP
and `fully_shard` do; the strategies with flat buffers refuse them (`models.check_trainable`,
as torch's FSDP1 refuses a FlatParameter of mixed ``requires_grad`` without
``use_orig_params``). Their exact forms take the model's mask (`trainable`): replicated, every
tensor of a trainable parameter; dim-0, this rank's rows of each, the parameter term over all.

**Exact form** for a concrete model, byte for byte what a strategy allocates, following the
layout named in `zeroedu.catalog`:

* ``replicated``: every tensor whole; Σ numel × bytes.
* ``flat``: each unit is one buffer padded to a multiple of S = N (or N·M when hybrid). A
  category sharded on the inner axis keeps c = padded/N elements (c/M if also sharded on the
  outer axis); an unsharded one keeps the whole padded buffer. Padding is real storage.
* ``dim0``: each parameter cut on tensor dim 0; rank r keeps its own (possibly short, possibly
  empty) rows, so ranks can differ.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from fractions import Fraction
from numbers import Number

from .. import shard
from ..optim import scratch_elements
from ..kinds import Category, Layout, OPTIM_PARTS as LEDGER_OPTIM_PARTS
from ..catalog import shards
from .inputs import check_count, check_counts, check_psi, check_units, resolve

# The four optimizer-state parts a recipe may have (recipes.Recipe.optim_parts keys).
OPTIM_PARTS = LEDGER_OPTIM_PARTS  # the ledger's optimizer categories (`zeroedu.kinds`)


def _plain(x):
    """Fraction -> int when whole, else float, so reports are plain JSON-able numbers."""
    if isinstance(x, Fraction):
        return int(x) if x.denominator == 1 else float(x)
    return x


@dataclass(frozen=True)
class ModelStates:
    """Bytes of each model-state category on one rank (on one device, or one host)."""

    param: Number = 0
    grad: Number = 0
    master: Number = 0
    main_grad: Number = 0
    m: Number = 0
    v: Number = 0

    @property
    def optim(self):
        return self.master + self.main_grad + self.m + self.v

    @property
    def total(self):
        return self.param + self.grad + self.optim

    def __add__(self, other: "ModelStates") -> "ModelStates":
        return ModelStates(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def as_dict(self) -> dict:
        return {
            "param": _plain(self.param),
            "grad": _plain(self.grad),
            "optim": _plain(self.optim),
            "total": _plain(self.total),
            "optim_detail": {k: _plain(getattr(self, k)) for k in OPTIM_PARTS},
        }


def _category_bytes(recipe) -> dict[str, tuple[str, int]]:
    """Field -> (ZeRO category that decides its sharding, bytes per element)."""
    out = {"param": ("param", recipe.param_bytes), "grad": ("grad", recipe.grad_bytes)}
    out.update({k: ("optim", b) for k, b in recipe.optim_parts().items()})
    return out


def _sharded(spec, category: str) -> tuple[bool, bool]:
    """Is `category` sharded on the inner axis, and on the outer axis?"""
    return shards(spec.inner)[category], spec.hybrid and shards(spec.outer)[category]


def model_states(strategy, psi, n, m=1, recipe=None, psi_trainable=None) -> ModelStates:
    """Asymptotic bytes per rank (Fractions). Non-hybrid strategies ignore `m`;
    hybrid ones with m = 1 are flat ZeRO-3 over N ranks. `psi_trainable` (default: all Ψ):
    the gradient and optimizer terms count only the trainable parameters."""
    spec, rec = resolve(strategy, recipe)
    psi = check_psi(psi)
    psi_t = psi if psi_trainable is None else check_psi(psi_trainable)
    if psi_t > psi:
        raise ValueError(f"psi_trainable {psi_trainable} is more than psi {psi}")
    n, m = check_counts(spec, n, m)
    out = {}
    for name, (cat, nbytes) in _category_bytes(rec).items():
        on_inner, on_outer = _sharded(spec, cat)
        count = psi if cat == Category.PARAM else psi_t
        out[name] = count * nbytes / ((n if on_inner else 1) * (m if on_outer else 1))
    return ModelStates(**out)


def _check_trainable(units, trainable, layout: str):
    """The trainable mask, shaped like `units` (None: every parameter trains)."""
    if trainable is None:
        return [[True] * len(u) for u in units]
    mask = [list(t) for t in trainable]
    if [len(t) for t in mask] != [len(u) for u in units]:
        raise ValueError("trainable must give one flag per parameter shape, unit by unit")
    if layout == Layout.FLAT and not all(all(t) for t in mask):
        raise NotImplementedError("frozen parameters are modelled for the replicated (ddp) and dim-0 "
                                  "(fsdp2) layouts only: a flat buffer keeps gradients of all its parameters")
    return mask


def flat_unit_elements(numel: int, n: int, m: int, on_inner: bool, on_outer: bool) -> int:
    """Elements one rank stores of one flat unit's category (padding included).

    The buffer is padded to a multiple of N·M so the inner chunk c = padded/N splits evenly
    again across the M outer ranks."""
    padded = shard.padded_numel(numel, n * m)
    if on_inner:
        c = shard.shard_numel(padded, n)
        return shard.shard_numel(c, m) if on_outer else c
    return shard.shard_numel(padded, m) if on_outer else padded


def exact_model_states(strategy, units, n, m=1, rank=0, recipe=None, trainable=None) -> ModelStates:
    """Bytes rank `rank` (its index on the inner axis) stores for a concrete model (ints).

    Hybrid strategies also accept a global rank on the M x N mesh, [0, N·M): inner-axis ranks
    are contiguous (`cluster.RankContext.mesh`), so its inner index is rank mod N.
    `trainable`: per unit, one flag per parameter (None: all); a frozen parameter counts in
    the parameter term only."""
    spec, rec = resolve(strategy, recipe)
    n, m = check_counts(spec, n, m)
    units = check_units(units)
    mask = _check_trainable(units, trainable, spec.layout)
    if not isinstance(rank, int) or not 0 <= rank < n * m:
        raise ValueError(f"rank must be in [0, {n * m}), got {rank!r}")
    rank %= n
    cats = _category_bytes(rec)
    out = dict.fromkeys(cats, 0)
    for unit, flags in zip(units, mask):
        for name, (cat, nbytes) in cats.items():
            on_inner, on_outer = _sharded(spec, cat)
            if spec.layout == Layout.REPLICATED:
                elems = sum(shard.numel(s) for s, t in zip(unit, flags) if t or cat == Category.PARAM)
            elif spec.layout == Layout.FLAT:
                elems = flat_unit_elements(sum(shard.numel(s) for s in unit), n, m, on_inner, on_outer)
            elif spec.layout == Layout.DIM0:
                if on_outer:
                    raise NotImplementedError("dim-0 layout with outer-axis sharding is not modelled")
                elems = sum(shard.dim0_shard_numel(s, n, rank) if on_inner else shard.numel(s)
                            for s, t in zip(unit, flags) if t or cat == Category.PARAM)
            else:
                raise ValueError(f"unknown layout {spec.layout!r}")
            out[name] += elems * nbytes
    return ModelStates(**out)


def optimizer_target_elements(strategy, units, n, m=1, rank=0, trainable=None) -> list[int]:
    """Elements of each tensor Adam updates on rank `rank`: every trainable parameter
    (``replicated``), each unit's optimizer shard (``flat``: padded/N, /(N·M) when the outer
    axis shards the optimizer too), each trainable parameter's dim-0 rows (``dim0``)."""
    spec, _ = resolve(strategy, None)
    n, m = check_counts(spec, n, m)
    units = check_units(units)
    mask = _check_trainable(units, trainable, spec.layout)
    on_inner, on_outer = _sharded(spec, "optim")
    out = []
    for unit, flags in zip(units, mask):
        if spec.layout == Layout.FLAT:
            out.append(flat_unit_elements(sum(shard.numel(s) for s in unit), n, m, on_inner, on_outer))
        else:
            out += [shard.dim0_shard_numel(s, n, rank % n) if spec.layout == Layout.DIM0 and on_inner else shard.numel(s)
                    for s, t in zip(unit, flags) if t]
    return out


def update_bytes(strategy, units, n, m=1, rank=0, recipe=None, trainable=None, micro_batches=1) -> dict:
    """What rank `rank` holds while Adam's update runs (the ledger's "update" event): the model
    states and the update's one scratch buffer, exact for a concrete model::

        optimizer_temp = 4 · min(max target elements, ADAM_CHUNK) · (1 + copied)

    one fp32 chunk for the denominator sqrt(v̂) + ε, and a second when the gradient is read as
    fp32 through it (copied: the gradient is not fp32, or it must be scaled by 1/(N·M·K) ≠ 1 and
    the strategy does not scale it in place; a recipe with an fp32 main grad scales that copy).
    Written whole, as torch's single-tensor Adam writes it, the update would hold 2 to 4 more
    tensors the size of the largest target instead (`optim`). Nothing else lives then, except
    where the optimizer is sharded on an outer axis that the gradients are not (hfsdp): Adam reads
    the outer reduce-scatter's output, G·Ψ/(N·M) ("comm_buffer"). Every other communication
    buffer is freed before the update and allocated after it.

    Returns {"model_states", "optimizer_temp", "comm_buffer", "total"} in bytes."""
    spec, rec = resolve(strategy, recipe)
    n, m = check_counts(spec, n, m)
    targets = optimizer_target_elements(spec.name, units, n, m, rank, trainable)
    scaled = n * (m if spec.hybrid else 1) * micro_batches != 1
    copied = rec.main_grad is None and (rec.grad != "fp32" or (scaled and not spec.scales_grads_in_place))
    temp = 4 * scratch_elements(targets, copied)
    states = exact_model_states(spec.name, units, n, m, rank, rec.name, trainable).total
    inner, outer = _sharded(spec, "grad")
    reduced = 0
    if _sharded(spec, "optim")[1] and not outer:  # hfsdp: the gradient's outer reduce-scatter output
        reduced = sum(flat_unit_elements(sum(shard.numel(s) for s in u), n, m, inner, True) for u in units)
        reduced *= rec.grad_bytes
    return {"model_states": states, "optimizer_temp": temp, "comm_buffer": reduced,
            "total": states + temp + reduced}


ADAM_IMPLEMENTATIONS = ("zeroedu", "for-loop", "foreach", "fused")


def adam_step_temporaries(implementation: str, numels, copied: bool = False) -> int:
    """Bytes one Adam step over fp32 tensors of these sizes (in the optimizer's order) allocates
    beyond its state, at its peak, with torch 2.13's `torch/optim/adam.py` (default options: no weight decay, amsgrad,
    maximize or capturable):

        for-loop  (`_single_tensor_adam`)  max over i of 8 n_i + 4 n_{i-1}
                  ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)``, one parameter
                  at a time: its root and the quotient, while the previous parameter's `denom`
                  is still bound to the loop's variable until the assignment replaces it
        foreach   (`_multi_tensor_adam`)   4 · Σ n      ``torch._foreach_sqrt(device_exp_avg_sqs)``: one
                                                        root per parameter of the group, all alive at once
        fused     (`_fused_adam`)          0            one kernel, elementwise in registers
        zeroedu   (`optim.adam_update`)    4 · min(max n, ADAM_CHUNK) · (1 + copied)

    So foreach, torch's default on GPUs, holds 4 bytes per parameter for a moment: a quarter of
    what a ZeRO-1 rank's fp32 optimizer state is worth. `references.torch_memory.adam_temporaries`
    measures all four with torch's MemTracker."""
    numels = [int(x) for x in numels]
    if implementation == "for-loop":
        return max((8 * n + 4 * prev for n, prev in zip(numels, [0] + numels)), default=0)
    if implementation == "foreach":
        return 4 * sum(numels)
    if implementation == "fused":
        return 0
    if implementation == "zeroedu":
        return 4 * scratch_elements(numels, copied)
    raise ValueError(f"implementation must be one of {ADAM_IMPLEMENTATIONS}, got {implementation!r}")


def _unit_elements(spec, unit, n: int) -> int:
    """Elements of one unit unsharded (the gathered buffer, padding included)."""
    if spec.layout == Layout.DIM0:
        return sum(shard.dim0_padded_numel(s, n) for s in unit)
    return shard.padded_numel(sum(shard.numel(s) for s in unit), n)


def fsdp_peak(strategy, units, n, unit_activations, loss_activations=0, rank=0, recipe=None,
              batched=True, backward_prefetch=True, async_reduce=False) -> dict:
    """The most bytes one rank of FSDP1 / FSDP2 holds at a lifecycle event of a training step
    (reshard_after_forward=True, no forward prefetch, no limit on all-gathers), exact for a
    concrete model: what the ledger's peak is with a minimal timeline.

        peak = model states + max over the moments below of what lives beside them

    With g_k the bytes of unit k unsharded (param dtype, padding included: `_unit_elements`),
    G_k the same elements in the grad dtype, A_j the activations unit j saves
    (`unit_activations`, in unit order; the loss's own saved tensors, `loss_activations`, come
    after the last unit and are gone before its backward) and a(k) = A_0 + ... + A_{k-1}:

        forward, unit k        all-gather issued       a(k) + g_k        (batched: its buffer)
                               copy-out (batched)      a(k) + 2 g_k      (buffer + parameters)
        backward, unit k       post_backward           a(k) + g_k + g_{k-1} + G_k
                               copy-in (batched)       a(k) + g_k + g_{k-1} + 2 G_k
                               (g_{k-1}: the previous unit, prefetched: backward_prefetch;
                               batched, its all-gather buffer; else its parameters)
        unshard / prefetch     a(k+1) + g_k + g_k or g_{k-1}, always below the copy-in

    so for the batched FSDP2 the peak is a unit's copy-in, a(k) + g_k + g_{k-1} + 2G_k: the
    full gradients and the reduce-scatter input coexist (torch's `foreach_reduce` has the same
    moment), one G_k more than the per-parameter FSDP2 or FSDP1, which reduce-scatter straight
    from the gradients. FSDP2's per-parameter all-gather also pads a short shard on the wire
    (c·rest elements, ranks whose rows are fewer than c), alive while the all-gather runs.
    With `async_reduce` (FSDP2 batched, ``async_reduce_scatter``: unit k+1's reduce-scatter in
    flight until unit k's post_backward waits for it) every moment of unit k's backward before
    its post_backward also holds unit k+1's reduce-scatter input and output, G_{k+1}(1 + 1/N).
    Not included: what autograd holds while a unit's backward computes (gradients of
    activations, "backward_temp" in the ledger's full timeline), at most a few activation-sized
    tensors; `tests/test_peak.py` bounds it.

    Returns {"peak", "model_states", "moment" (where the peak is), "moments": [(label, bytes
    beside the model states)]}."""
    spec, rec = resolve(strategy, recipe)
    if spec.name not in ("fsdp1", "fsdp2"):
        raise ValueError(f"fsdp_peak models fsdp1 and fsdp2, not {spec.name}")
    n = check_count(n, "n")
    units = check_units(units)
    if len(unit_activations) != len(units):
        raise ValueError(f"need one activation figure per unit ({len(units)}), got {len(unit_activations)}")
    batched = batched and spec.layout == Layout.DIM0
    if async_reduce and not (spec.name == "fsdp2" and batched):
        raise ValueError("async_reduce models FSDP2's batched reduce-scatter")
    P, G = rec.param_bytes, rec.grad_bytes
    g = [_unit_elements(spec, u, n) * P for u in units]
    grads = [_unit_elements(spec, u, n) * G for u in units]
    pad = [0] * len(units)  # per-parameter FSDP2: short shards padded to c rows for the wire
    if spec.layout == Layout.DIM0 and not batched:
        for k, u in enumerate(units):
            for s in u:
                c, rows = shard.dim0_chunk_rows(s[0], n), shard.dim0_rows(s[0], n, rank % n).size
                if rows != c:
                    pad[k] += c * shard.numel(s[1:]) * P
    before = [sum(unit_activations[:k]) for k in range(len(units) + 1)]
    K = len(units)
    moments = []
    for k in range(K):  # forward
        moments.append((f"unit {k} unshard (forward)", before[k] + (g[k] if batched else g[k] + pad[k])))
        if batched:
            moments.append((f"unit {k} copy-out (forward)", before[k] + 2 * g[k]))
    total = before[K] + loss_activations
    moments.append(("forward end", total))
    for k in reversed(range(K)):  # backward
        held = total - loss_activations if k == K - 1 else before[k + 1]  # unit k's still alive
        if async_reduce and k < K - 1:  # unit k+1's reduce-scatter, in flight
            held += grads[k + 1] + grads[k + 1] // n
        prefetched = g[k - 1] if backward_prefetch and k > 0 else 0
        if k == K - 1 or not backward_prefetch:
            moments.append((f"unit {k} unshard (backward)", held + (g[k] if batched else g[k] + pad[k])))
        if batched:
            moments.append((f"unit {k} copy-out (backward)", held + 2 * g[k]))
        if prefetched:
            moments.append((f"unit {k - 1} unshard (prefetch)", held + g[k] + prefetched
                            + (0 if batched else pad[k - 1])))
        moments.append((f"unit {k} post_backward", before[k] + g[k] + prefetched + grads[k]))
        if batched:
            moments.append((f"unit {k} copy-in", before[k] + g[k] + prefetched + 2 * grads[k]))
    states = exact_model_states(spec.name, units, n, rank=rank, recipe=rec.name).total
    label, extra = max(moments, key=lambda m: m[1])
    return {"peak": states + extra, "model_states": states, "moment": label, "moments": moments}


__all__ = ["ModelStates", "model_states", "exact_model_states", "flat_unit_elements", "fsdp_peak",
           "OPTIM_PARTS"]
