"""Precision recipes: which dtype each piece of model state has.

A recipe names the dtype of the parameter the model computes with, of its gradient, and of the
optimizer's own copies. Bytes per parameter follow directly (ZeRO paper §3.1, Megatron-Core's
distributed-optimizer table):

=============== ====== ===== ====================================== ===== ==========
recipe          param  grad  optimizer state (K)                    total sharded K
=============== ====== ===== ====================================== ===== ==========
mixed-bf16      bf16 2 bf16 2 fp32 master 4 + m 4 + v 4 = 12        16    ZeRO: 4 + 12/N
megatron-bf16   bf16 2 fp32 4 fp32 master 4 + m 4 + v 4 = 12        18    6 + 12/N
fp16            fp16 2 fp16 2 master 4 + fp32 main grad 4 + m + v=16 20    4 + 16/N
fp32            fp32 4 fp32 4 m 4 + v 4 = 8 (the param is the master) 16    8 + 8/N
=============== ====== ===== ====================================== ===== ==========

This module is pure (no torch import) so `zeroedu.theory` can use it anywhere; `torch_dtype`
converts a name when a strategy needs the real dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

# How far a strategy's losses and parameters may lie from single-process training, relative, per
# recipe (the report's match["losses"] and match["params"]): fp32 agrees up to summation order;
# low-precision recipes round parameters/gradients to 8 (bf16) or 11 (fp16) significant bits, so
# over a few steps the losses drift by ~1e-3 (measured ~5e-4 for bf16 DDP,
# tests/test_ddp_bucketed.py): 1e-2 leaves room.
TOLERANCE = {"fp32": 1e-6, "megatron-bf16": 1e-2, "mixed-bf16": 1e-2, "fp16": 1e-2}
# Over longer runs a low-precision trajectory separates from the fp32 one: the rounding of each
# step changes the next step's weights, and the difference compounds, by an amount that depends
# on the CPU's kernels (hsdp in mixed-bf16 on gpt-tiny, 60 steps: 3.09 % with AVX-512's, 3.23 %
# with AVX2's, 4.32 % with the scalar ones, seen on two machines). So no constant bound is right
# for every CPU. The bound is measured in the same run instead: one process trains in the same
# recipe with torch alone (`train.reference.recipe_losses`), and its own distance from fp32 is
# what the recipe's rounding does by itself on this CPU. A distributed run may lie from the fp32
# reference at step k by the flat tolerance plus LOWP_FACTOR times the largest distance the one
# process reached up to step k (`loss_bound`). Measured here (gpt-tiny, hsdp 2 x 2, 60 steps,
# native, emulated, AVX2 and scalar kernels): the one process drifts to 3.7-3.8 %, hsdp to
# 3.1-3.4 %, and hsdp's excess over the flat tolerance is at most 0.64 of the one process's
# running drift, so a factor of 2 leaves room; a strategy that is wrong by 2 % in its first steps,
# where the one process has not drifted yet, is still refused.
LOWP_FACTOR = 2.0


def loss_bound(recipe: str, step: int, one_process: list[float] | None = None,
               reference: list[float] | None = None) -> float:
    """Relative bound on a run's loss at 0-based `step` against single-process fp32 training:
    `TOLERANCE[recipe]`, plus, for a 16-bit recipe, LOWP_FACTOR times the largest relative
    distance of `one_process` (the recipe trained by one process) from `reference` (fp32) over
    steps 0..step. fp32, or no one-process run given: the flat tolerance."""
    base = TOLERANCE[recipe]
    if recipe == "fp32" or one_process is None:
        return base
    drift = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(one_process[:step + 1], reference[:step + 1]))
    return base + LOWP_FACTOR * drift


@dataclass(frozen=True)
class Recipe:
    name: str
    param: str
    grad: str
    master: str | None  # None: the parameter itself is the fp32 copy the optimizer updates
    main_grad: str | None  # fp32 copy of the gradient inside the optimizer (Megatron fp16)
    m: str = "fp32"
    v: str = "fp32"

    @property
    def param_bytes(self) -> int:
        return DTYPE_BYTES[self.param]

    @property
    def grad_bytes(self) -> int:
        return DTYPE_BYTES[self.grad]

    def optim_parts(self) -> dict[str, int]:
        """Bytes per parameter of each optimizer-state tensor, in a fixed order."""
        parts = {}
        if self.master:
            parts["master"] = DTYPE_BYTES[self.master]
        if self.main_grad:
            parts["main_grad"] = DTYPE_BYTES[self.main_grad]
        parts["m"] = DTYPE_BYTES[self.m]
        parts["v"] = DTYPE_BYTES[self.v]
        return parts

    @property
    def optim_bytes(self) -> int:
        """K in the ZeRO paper: optimizer-state bytes per parameter."""
        return sum(self.optim_parts().values())

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optim_bytes


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in [
        Recipe("mixed-bf16", param="bf16", grad="bf16", master="fp32", main_grad=None),
        Recipe("megatron-bf16", param="bf16", grad="fp32", master="fp32", main_grad=None),
        Recipe("fp16", param="fp16", grad="fp16", master="fp32", main_grad="fp32"),
        Recipe("fp32", param="fp32", grad="fp32", master=None, main_grad=None),
    ]
}


def get_recipe(name: str | Recipe) -> Recipe:
    if isinstance(name, Recipe):
        return name
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; choose one of {', '.join(RECIPES)}") from None


def torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
