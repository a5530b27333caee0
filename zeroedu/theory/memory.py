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
from ..catalog import shards
from .inputs import check_counts, check_psi, check_units, resolve

# The four optimizer-state parts a recipe may have (recipes.Recipe.optim_parts keys).
OPTIM_PARTS = ("master", "main_grad", "m", "v")


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


def model_states(strategy, psi, n, m=1, recipe=None) -> ModelStates:
    """Asymptotic bytes per rank (Fractions). Non-hybrid strategies ignore `m`;
    hybrid ones with m = 1 are flat ZeRO-3 over N ranks."""
    spec, rec = resolve(strategy, recipe)
    psi = check_psi(psi)
    n, m = check_counts(spec, n, m)
    out = {}
    for name, (cat, nbytes) in _category_bytes(rec).items():
        on_inner, on_outer = _sharded(spec, cat)
        out[name] = psi * nbytes / ((n if on_inner else 1) * (m if on_outer else 1))
    return ModelStates(**out)


def flat_unit_elements(numel: int, n: int, m: int, on_inner: bool, on_outer: bool) -> int:
    """Elements one rank stores of one flat unit's category (padding included).

    The buffer is padded to a multiple of N·M so the inner chunk c = padded/N splits evenly
    again across the M outer ranks."""
    padded = shard.padded_numel(numel, n * m)
    if on_inner:
        c = shard.shard_numel(padded, n)
        return shard.shard_numel(c, m) if on_outer else c
    return shard.shard_numel(padded, m) if on_outer else padded


def exact_model_states(strategy, units, n, m=1, rank=0, recipe=None) -> ModelStates:
    """Bytes rank `rank` (its index on the inner axis) stores for a concrete model (ints).

    Hybrid strategies also accept a global rank on the M x N mesh, [0, N·M): inner-axis ranks
    are contiguous (`cluster.RankContext.mesh`), so its inner index is rank mod N."""
    spec, rec = resolve(strategy, recipe)
    n, m = check_counts(spec, n, m)
    units = check_units(units)
    if not isinstance(rank, int) or not 0 <= rank < n * m:
        raise ValueError(f"rank must be in [0, {n * m}), got {rank!r}")
    rank %= n
    cats = _category_bytes(rec)
    out = dict.fromkeys(cats, 0)
    for unit in units:
        for name, (cat, nbytes) in cats.items():
            on_inner, on_outer = _sharded(spec, cat)
            if spec.layout == "replicated":
                elems = sum(shard.numel(s) for s in unit)
            elif spec.layout == "flat":
                elems = flat_unit_elements(sum(shard.numel(s) for s in unit), n, m, on_inner, on_outer)
            elif spec.layout == "dim0":
                if on_outer:
                    raise NotImplementedError("dim-0 layout with outer-axis sharding is not modelled")
                elems = sum(shard.dim0_shard_numel(s, n, rank) if on_inner else shard.numel(s)
                            for s in unit)
            else:
                raise ValueError(f"unknown layout {spec.layout!r}")
            out[name] += elems * nbytes
    return ModelStates(**out)


__all__ = ["ModelStates", "model_states", "exact_model_states", "flat_unit_elements",
           "OPTIM_PARTS"]
