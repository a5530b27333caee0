"""Notebook 05's find-the-bug: a ZeRO-2 that loses micro-batches.

`ZeRO2Broken` holds the same buffers as ZeRO-2 (its memory equals the closed form), launches
the same reduce-scatters on the same buffers (its ring model and its wire equal ZeRO-2's) and
all-gathers the updated parameters as ZeRO-2 does (every rank ends a step with the same
weights). What it gets wrong is gradient accumulation: after a backward it forgets that the
shards already hold this step's sum, so the next micro-batch's reduce-scatter writes into the
shard directly and overwrites it. With K micro-batches only the last one's gradient reaches
Adam. With K = 1 it is exactly ZeRO-2; with K = 2 only the losses show it.

The notebook runs it with K = 2 in fp32 (where the correct strategy equals single-process
training to 1e-6) and asks which mistake it is, among look-alikes whose symptoms differ: full
buffers never freed (grad bytes at the step), an all-reduce (twice the bytes), a skipped
all-gather (no all_gather bytes).
"""
from __future__ import annotations

from ...strategies.zero2 import ZeRO2


class ZeRO2Broken(ZeRO2):
    """ZeRO-2 whose every micro-batch overwrites the gradient shards."""

    def after_backward(self) -> None:
        super().after_backward()
        # The mistake: the flag that makes later micro-batches reduce into a temporary chunk and
        # add it to the shard is cleared, so each reduce-scatter lands on the shard itself.
        self._shards_hold_sum = False
