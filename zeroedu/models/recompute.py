"""Activation recompute (checkpointing): keep a module's inputs, re-run it in backward.

`apply_recompute(modules)` replaces each module's `forward` with a non-reentrant
`torch.utils.checkpoint` of the original: in forward nothing inside the module is saved for
backward except what the checkpoint keeps to re-run it, its inputs; in backward, when autograd
first needs one of the module's saved tensors, the original forward runs again (under no hooks of
the module itself: `module.__call__`, where FSDP's unshard/reshard hooks live, is not re-entered,
so the re-run uses the parameters the unit's pre-backward unshard already gathered).

torch keeps the checkpoint's inputs alive through the checkpoint's own closure, where
`saved_tensors_hooks` do not see them. `_Kept` passes every tensor input through an identity
that saves it, so whoever counts saved tensors (the ledger) sees exactly what the checkpoint
keeps; it allocates nothing (the saved tensor is the input itself, each storage counted once).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..kinds import RECOMPUTE_MODES  # noqa: F401  (re-exported: `zeroedu.kinds.RecomputeMode`)


class _Kept(torch.autograd.Function):
    """Identity that saves its input: makes a checkpoint's kept input visible as saved."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def _keep(a):
    return _Kept.apply(a) if isinstance(a, torch.Tensor) and a.requires_grad else a


def apply_recompute(modules: list[nn.Module], on_rerun: Callable[[int], None] | None = None) -> None:
    """Make each module re-run its forward in backward instead of keeping its activations.
    `on_rerun(index)` is called as each re-run starts (the ledger marks the timeline with it,
    so the extra forward shows where it happens). There is no matching end: torch stops a
    re-run early, as soon as every tensor backward needs has been recomputed."""
    for k, m in enumerate(modules):
        if getattr(m, "_zeroedu_recompute", False):
            continue
        original = m.forward

        def run(*args, _original=original, _k=k, **kwargs):
            # The same function runs in forward and, inside backward, as the re-run.
            if on_rerun is not None and torch._C._current_graph_task_id() != -1:
                on_rerun(_k)
            return _original(*args, **kwargs)

        def forward(*args, _run=run, _original=original, **kwargs):
            if not torch.is_grad_enabled():
                return _original(*args, **kwargs)
            args = tuple(_keep(a) for a in args)
            return checkpoint(_run, *args, use_reentrant=False, **kwargs)

        m.forward = forward
        m._zeroedu_recompute = True
