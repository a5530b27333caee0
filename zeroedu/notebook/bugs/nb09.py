"""Notebook 09's find-the-bug: a DDP that all-reduces the running sum after every micro-batch.

`DDPBroken` all-reduces every gradient at the end of each backward instead of once at the
optimizer step. The gradient buffer holds the running sum of the micro-batches, so the first
micro-batch's (already summed) gradient is summed over the N ranks again by the second
all-reduce: with K = 2 the optimizer sees N·Σg₁ + Σg₂ instead of Σg₁ + Σg₂. Two symptoms:
the all-reduce bytes per optimizer step are K + 1 times the closed form's (K all-reduces during
backward plus the step's own), and the losses leave single-process training.

The notebook runs it with K = 2 on gpt-tiny (fp32) and asks which mistake it is, among
look-alikes: an all-reduce per micro-batch into a fresh buffer (bytes K times, losses right),
a forgotten 1/K (bytes right; Adam nearly cancels a constant factor), a skipped all-reduce
(no bytes, replicas disagree).
"""
from __future__ import annotations

from ...strategies.ddp import DDP


class DDPBroken(DDP):
    """DDP whose every backward all-reduces the accumulated gradient buffer in place."""

    def after_backward(self) -> None:
        # The mistake: syncing after each micro-batch, in place, on the buffer that still holds
        # the earlier micro-batches' (already reduced) sum.
        for i, p in enumerate(self.params):
            self.comm.all_reduce(p.grad, self.dist.inner, self.tag(f"param{i}", "grads"))
