"""Notebook 12 (interview rehearsal): a ZeRO-2 with one plausible mistake.

`ZeRO2ZeroedNotFreed` reuses each unit's full gradient buffer from step to step: once the
unit's reduce-scatter has finished it zeroes the buffer for the next backward instead of
dropping it. The training is unchanged (the reduced shard is a tensor of its own, and the next
backward starts from zeros), so the losses still equal single-process training and the wire
still carries ZeRO-2's bytes; the symptom is in the ledger, beside the closed form.
"""
from __future__ import annotations

from ...kinds import EventKind as Ev
from ...strategies.zero2 import ZeRO2


class ZeRO2ZeroedNotFreed(ZeRO2):
    """ZeRO-2 whose full gradient buffers are zeroed after their reduce-scatter, not freed."""

    def release_full_grad(self, u) -> None:
        u.grad_buffer.zero_()  # "reuse the buffer next step" (it stays allocated)
        self.ledger.event(Ev.GRAD_ZEROED, u.index)
