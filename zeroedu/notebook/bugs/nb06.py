"""Notebook 06's find-the-bug: an FSDP linear layer with one mistake.

`BrokenFSDPLinear` is `strategies.fsdp_linear.FSDPLinear` whose backward reduce-scatters the
weight and bias gradients with SUM and keeps the sum: it forgets the division by N. Every
collective is the right one, on the right bytes; only the arithmetic is off, so the wire
matches the closed forms while the losses leave single-process training, and the first SGD
step moves every weight exactly N times as far as `nn.Linear` on the global batch would.

`strategies.fsdp_linear.linear_job(layer="zeroedu.notebook.bugs.nb06:BrokenFSDPLinear")` trains
it on real ranks and measures each call (ring model, wire, messages, saved tensors).
"""
from __future__ import annotations

from ...strategies.fsdp_linear import FSDPLinear


class BrokenFSDPLinear(FSDPLinear):
    """FSDPLinear whose backward keeps the SUM of the gradients over ranks (no 1/N)."""

    def mean_grad(self, summed):
        return summed  # "the reduce-scatter already combined the ranks"
