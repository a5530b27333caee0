"""Notebook 13 (fact-check): ZeRO-2 written from a wrong description.

Course notes sometimes say that ZeRO-2 "all-gathers the gradients before the next forward".
`MysteryZeRO2` does exactly that: after the optimizer step it all-gathers every unit's reduced
gradient shard into a temporary full gradient buffer, and never all-gathers the updated
parameters. Gradients and parameters have the same dtype in `mixed-bf16` and `fp32`, so the
wire carries ZeRO-2's bytes to the byte and the model states equal the closed form; but each
rank only ever updates its own chunk of the parameters, the other N-1 chunks stay as they were
at the start, and the replicas drift apart: the losses leave single-process training.
"""
from __future__ import annotations

import torch

from ...kinds import EventKind as Ev
from ...strategies.zero2 import ZeRO2


class MysteryZeRO2(ZeRO2):
    """ZeRO-2 that all-gathers the reduced gradients after the step, not the parameters."""

    def unshard(self) -> None:
        for u in self.units:
            full = self.ledger.track(torch.empty(u.layout.padded_numel, dtype=u.grad_shard.dtype,
                                                 device=u.grad_shard.device), "comm_buffer")
            self.comm.all_gather(full, u.grad_shard, self.dist.inner, self.tag(u.name, "grads"))
            del full  # "the next forward has the full gradient"; nothing reads it
        self.ledger.event(Ev.GRADS_ALL_GATHERED)
