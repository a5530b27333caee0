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
# step changes the next step's weights, and the difference compounds (the strategies stay
# together: ddp, hsdp and fsdp2 in bf16 peak at the same step). Measured against the fp32
# reference, DDP on 2 ranks: gpt-tiny 0.2 % by step 20, 3.5 % at step 41, 5.5 % at step 116
# (mixed-bf16) and 4.6 % at step 92 (fp16); gpt-small 0.24 % over 60 steps; the MLP 0.05 %.
# So the flat tolerance holds for the first TOLERANCE_STEPS steps and then widens by
# TOLERANCE_PER_STEP a step (`loss_tolerance`): 10.6 % at step 116, 8.2 % at step 92.
TOLERANCE_STEPS = 20
TOLERANCE_PER_STEP = 1e-3


def loss_tolerance(recipe: str, step: int) -> float:
    """Relative tolerance of the loss at 0-based `step` against single-process fp32 training:
    `TOLERANCE[recipe]`, widened after `TOLERANCE_STEPS` steps for low-precision recipes."""
    base = TOLERANCE[recipe]
    if recipe == "fp32" or step < TOLERANCE_STEPS:
        return base
    return base + TOLERANCE_PER_STEP * (step + 1 - TOLERANCE_STEPS)


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
