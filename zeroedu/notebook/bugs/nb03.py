"""Notebook 03's find-the-bug: a ZeRO-1 with one plausible mistake.

`BuggyZeRO1` looks like ZeRO-1 from the outside: the same buffers (so the memory it reports
equals the closed form), the same collectives on the same buffers (so the ring model and the
wire equal ZeRO-1's), the same all-gather after the update (so every rank ends the step with
the same parameters). What is wrong is *which* chunk of the summed gradient each owner gets:
the gradient buffer is rotated by one chunk before the reduce-scatter, an off-by-one in the
owner's index, so rank r receives the summed gradient of chunk r+1 and Adam applies it to its
own chunk r. Only the training result shows it: the losses leave single-process training's.

The notebook runs it on 4 ranks and asks which mistake it is, among look-alikes whose
symptoms differ: forgetting the 1/N (Adam divides m by √v, so a constant factor on every
gradient nearly cancels and the losses would still match), skipping the all-gather (no
all-gather bytes on the wire, ranks disagree), all-reducing (3Ψ on the wire).
"""
from __future__ import annotations

import torch

from ...strategies.flat import FlatUnit
from ...strategies.zero1 import ZeRO1


class BuggyZeRO1(ZeRO1):
    """ZeRO-1 whose owners update their chunk with their right neighbour's summed gradient."""

    def reduce_grads(self, u: FlatUnit):
        n = self.dist.inner.size
        # The mistake: chunk r+1 is moved to position r before the reduce-scatter, so what
        # lands in this rank's slice is the sum of the neighbour's chunk. Same sizes, same
        # collective, same bytes: nothing but the values is off.
        rotated = torch.roll(u.grad_buffer.view(n, -1), shifts=-1, dims=0).reshape(-1)
        return self.comm.reduce_scatter(u.grad_shard, rotated, self.dist.inner,
                                        self.tag(u.name, "grads"), async_op=True)
