"""Notebook 08's find-the-bug: batched FSDP2 with one indexing mistake in its reduce-scatter.

`BrokenFSDP2` is `strategies.fsdp2.FSDP2` (batched collectives) whose copy-out after the
reduce-scatter walks the S-element output by each parameter's *real* shard size instead of
its row-padded size s_j. On a rank whose shards all hold c_j rows the two walks coincide; on
a rank with short shards (the last rank at N = 3 on gpt-small) every parameter after the
first short one reads its gradient from the wrong offset. Bytes and memory are exactly the
predicted ones; the first loss is right (the forward is untouched), the later ones drift,
and only the rows owned by the short rank go wrong.
"""
from __future__ import annotations

import torch

from ...kinds import EventKind as Ev
from ...strategies.fsdp2 import FSDP2, Dim0Unit


class _MisalignedUnit(Dim0Unit):
    def _reduce_scatter(self, full_grads, accumulate):
        if not self.batched:
            return super()._reduce_scatter(full_grads, accumulate)
        n, S = self.axis.size, self.shard_numel
        inp = self.ledger.track(torch.empty(n * S, dtype=self.grad_dtype, device=self.device), "comm_buffer")
        torch._chunk_cat(full_grads, 0, n, out=inp.view(n, S))
        self.ledger.event(Ev.COPY_IN, self.index)
        full_grads.clear()
        out = self.ledger.track(torch.empty(S, dtype=self.grad_dtype, device=self.device), "comm_buffer")
        self.comm.reduce_scatter(out, inp, self.axis, self.tag(self.name, "grads"))
        del inp
        offset = 0
        for gs, real in zip(self.grad_shards, self.real_sizes):
            if real:
                src = out[offset:offset + real]
                (gs.add_ if accumulate else gs.copy_)(src.view(gs.shape))
            offset += real


class BrokenFSDP2(FSDP2):
    """FSDP2 whose batched reduce-scatter copy-out uses the wrong offsets on short shards."""

    def make_unit(self, index, module):
        return _MisalignedUnit(index, module, self.shard_axis(), self.comm, self.ledger,
                               self.param_dtype, self.grad_dtype, tag=self.tag,
                               batched=bool(self.options["batched"]))
