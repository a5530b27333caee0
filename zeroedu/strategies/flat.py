"""Flat per-unit buffers: one padded parameter buffer and one gradient buffer per unit.

A *unit* is a group of parameters communicated together (a top-level layer for ZeRO-1/2 and
FSDP1). `FlatUnit` lays the group out with `shard.FlatLayout` (flattened, concatenated, padded
with zeros to a multiple of the shard count N) and makes every original parameter a *view* into
the buffer, so the model's forward and autograd keep working on ordinary `nn.Parameter`s while
the strategy communicates one contiguous tensor:

    param buffer  [ w0 ........ | b0 .. | w1 ..... | pad ]   padded_numel elements, param dtype
    grad buffer   [ same layout, grad dtype; p.grad is the matching view             ]
    rank r's shard = buffer[r*c : (r+1)*c], c = padded_numel / N   (buffer-wide range)

The shard of either buffer is a view too, so an in-place reduce-scatter into the own chunk, an
optimizer step on it and an all-gather back into the full buffer need no copies. Padding stays
zero: its gradient is always zero, so Adam leaves it at zero.

Only index math from `zeroedu.shard` is used here; nothing in this module communicates.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import shard
from ..ledger import Ledger


class FlatUnit:
    """One unit's parameters flattened into a padded buffer of `n` equal chunks."""

    def __init__(self, params: list[nn.Parameter], n: int, rank: int, param_dtype, grad_dtype,
                 ledger: Ledger, name: str = "unit"):
        self.params, self.n, self.rank, self.name = list(params), n, rank, name
        self.grad_dtype, self.ledger = grad_dtype, ledger
        self.layout = shard.FlatLayout([tuple(p.shape) for p in self.params], n)
        self.shard_range = self.layout.shard_range(rank)  # buffer-wide range of this rank's chunk
        device = self.params[0].device
        self.param_buffer = torch.zeros(self.layout.padded_numel, dtype=param_dtype, device=device)
        with torch.no_grad():
            for i, p in enumerate(self.params):
                self.param_view(i).copy_(p.detach().reshape(-1))
                # Re-point the parameter at its slice of the buffer: from now on the model reads
                # and autograd differentiates the buffer itself (FSDP1's FlatParameter trick).
                p.data = self.param_view(i).view(p.shape)
        ledger.track(self.param_buffer, "param")
        self.grad_buffer: torch.Tensor | None = None

    # ------------------------------------------------------------------ views
    def _slice(self, buf: torch.Tensor, r: shard.Range) -> torch.Tensor:
        return buf[r.start:r.end]

    def param_view(self, i: int) -> torch.Tensor:
        return self._slice(self.param_buffer, self.layout.param_range(i))

    @property
    def param_shard(self) -> torch.Tensor:
        return self._slice(self.param_buffer, self.shard_range)

    @property
    def grad_shard(self) -> torch.Tensor:
        """This rank's chunk of the full gradient buffer (a view; the buffer must be alive)."""
        return self._slice(self.grad_buffer, self.shard_range)

    # ------------------------------------------------------------------ gradient buffer
    def alloc_grad(self, category: str = "grad") -> torch.Tensor:
        """Allocate a zeroed full gradient buffer and make every `p.grad` a view into it.

        Autograd accumulates into an existing `.grad` in place (when grad mode is off during
        the accumulation, which it is inside backward), so backward writes straight into the
        buffer and the buffer is what gets communicated."""
        self.grad_buffer = torch.zeros(self.layout.padded_numel, dtype=self.grad_dtype,
                                       device=self.param_buffer.device)
        self.ledger.track(self.grad_buffer, category)
        for i, p in enumerate(self.params):
            p.grad = self._slice(self.grad_buffer, self.layout.param_range(i)).view(p.shape)
        return self.grad_buffer

    def free_grad(self) -> None:
        """Drop every reference to the full gradient buffer so its memory really goes.

        The views in `p.grad` share its storage, so they must go too; the ledger holds only a
        weak reference and stops counting the buffer once it is gone."""
        for p in self.params:
            p.grad = None
        self.grad_buffer = None

    def zero_grad(self) -> None:
        if self.grad_buffer is not None:
            self.grad_buffer.zero_()


def flat_units(modules: list[nn.Module], n: int, rank: int, param_dtype, grad_dtype,
               ledger: Ledger) -> list[FlatUnit]:
    """One `FlatUnit` per module (e.g. `models.units(model)`), in module order."""
    return [FlatUnit(list(m.parameters()), n, rank, param_dtype, grad_dtype, ledger, name=f"unit{i}")
            for i, m in enumerate(modules)]
