"""Notebook 07's find-the-bug: an FSDP that keeps every unit gathered after its forward.

`FSDPBroken` is FSDP1 with `post_forward` skipping the reshard, whatever the options say.
`pre_backward` then finds each unit still gathered and has nothing to all-gather, so one of
the three passes over the parameters disappears from the wire (2Ψ instead of the 3Ψ the
closed form predicts for reshard_after_forward=True), while every unit's full parameters stay
alive from its forward to its backward: at the forward/backward boundary all of them are held
at once. Training is unaffected: the losses equal single-process training.

The notebook runs it on 4 ranks beside the correct FSDP1 and asks which mistake it is, among
look-alikes with other symptoms: no all-gather before backward (backward would read freed
parameters), a skipped reduce-scatter (fewer reduce_scatter bytes, wrong losses), parameters
gathered in fp32 (all_gather bytes doubled).
"""
from __future__ import annotations

from ...strategies.fsdp1 import FSDP1


class FSDPBroken(FSDP1):
    """FSDP1 that never reshards after forward."""

    def post_forward(self, u, out, args=()):
        keep, self.reshard_after_forward = self.reshard_after_forward, False
        try:
            # The mistake: the hook for backward is still registered, the reshard is skipped.
            return super().post_forward(u, out, args)
        finally:
            self.reshard_after_forward = keep
