"""ZeRO-2: ZeRO-1, plus each rank keeps only its 1/N of the gradients.

Algorithm (ZeRO paper, Rajbhandari et al. 2019, §5.2 "P_os+g", communication in §7.2.1):
  set-up: flat padded buffers per unit as in ZeRO-1 (`flat.FlatUnit`), but the persistent
          gradient storage is only this rank's chunk of each unit (`FlatUnit.alloc_grad_shard`).
  1. backward, when the first gradient of a unit arrives (a tensor hook, which runs before
     autograd accumulates): allocate the unit's full gradient buffer and point `p.grad` into it;
  2. `post_backward` of a unit (its last post-accumulate-grad hook): launch an async
     reduce-scatter (SUM) of the unit's buffer into its gradient shard, while backward goes on
     with earlier layers;
  3. as soon as a unit's reduce-scatter has finished (checked at each later unit and in
     `finish_grad_sync`), free its full buffer: only the shard is needed from now on;
  4. Adam on the own chunk (summed gradient times 1/N, in fp32); `unshard`: all-gather the
     updated parameter chunks, as in ZeRO-1.

Memory per rank at the optimizer step: PΨ + (G + K)Ψ/N = 2Ψ + 14Ψ/N with `mixed-bf16` (padded).
During backward a unit's full gradient lives only from its first gradient until its
reduce-scatter is done, so at most a few units' worth is alive at once.

Communication per rank: the same as ZeRO-1, reduce-scatter of Ψ·G + all-gather of Ψ·P bytes,
2(N-1)/N·Ψ·2 bytes with bf16; only the reduce-scatter moved into backward, where it overlaps
the gradient computation of earlier layers.

Gradient accumulation (K micro-batches): the full gradient does not outlive one backward, so
every micro-batch reduce-scatters (K·ΨG on the wire per optimizer step, the all-gather still
once) and the reduced chunks are summed into the persistent shard: the first micro-batch's
reduce-scatter writes the shard directly, later ones write a temporary chunk that is added to
it once their collective has finished. `no_sync()` changes nothing here.
"""
from __future__ import annotations

import torch

from ..kinds import EventKind as Ev
from .zero1 import ZeRO1


class ZeRO2(ZeRO1):
    name = "zero2"

    def init_grads(self) -> None:
        self._pending: list[int] = []
        self._inflight: dict[int, tuple] = {}  # unit -> (handle, chunk to add into the shard or None)
        self._shards_hold_sum = False  # True once a micro-batch of this step has been reduced
        for k, u in enumerate(self.units):
            u.alloc_grad_shard()  # persistent: only this rank's chunk outlives backward
            for p in u.params:
                p.register_hook(self._pre_accumulate_hook(k))
                p.register_post_accumulate_grad_hook(self._post_accumulate_hook(k))
        self._reset_counts()

    def _reset_counts(self) -> None:
        self._pending = [len(u.params) for u in self.units]

    # ------------------------------------------------------------------ backward hooks
    def _pre_accumulate_hook(self, k: int):
        def hook(grad):
            u = self.units[k]
            if u.grad_buffer is None:
                # Autograd adds into an existing .grad in place, so the gradient goes straight
                # into the flat buffer that the reduce-scatter reads.
                u.alloc_grad()
                self.ledger.event(Ev.GRAD_ALLOC, k)
            return None  # the gradient itself is unchanged
        return hook

    def _post_accumulate_hook(self, k: int):
        def hook(p):
            self._pending[k] -= 1
            if self._pending[k] == 0:
                self.free_finished()
                self.post_backward(k)
        return hook

    def post_backward(self, k: int) -> None:
        """Launch unit k's reduce-scatter: into the shard itself on the step's first
        micro-batch, else into a temporary chunk that `free_finished` adds to the shard."""
        u = self.units[k]
        self.ledger.mark(Ev.GRADS_READY, unit=k)
        extra = None
        if self._shards_hold_sum:  # a later micro-batch: the shard holds a sum already
            extra = self.ledger.track(torch.empty_like(u.grad_shard), "comm_buffer")
        self._inflight[k] = (self.reduce_grads(u, extra), extra)

    def reduce_grads(self, u, out=None):
        return self.comm.reduce_scatter(u.grad_shard if out is None else out, u.grad_buffer, u.axis,
                                        self.tag(u.name, "grads"), async_op=True)

    def free_finished(self, wait: bool = False) -> None:
        """Free the full buffers of units whose reduce-scatter is done (or wait for all)."""
        for k in list(self._inflight):
            h, extra = self._inflight[k]
            if not wait and not h.done():
                continue
            h.wait()
            if extra is not None:
                self.units[k].grad_shard.add_(extra)
            # The work object references the buffer too: drop it with the views, or the
            # memory would stay allocated although the ledger no longer sees the buffer.
            del self._inflight[k], h, extra
            self.release_full_grad(self.units[k])

    def release_full_grad(self, u) -> None:
        """The unit's full gradient buffer has been reduce-scattered: free it (ZeRO-2's saving)."""
        u.free_grad()
        self.ledger.event(Ev.GRAD_FREED, u.index)

    # ------------------------------------------------------------------ micro-batches
    def before_micro_batch(self):
        self.free_finished(wait=True)  # the previous micro-batch's chunks are in the shards
        self._reset_counts()

    def after_backward(self) -> None:
        # A unit none of whose parameters got a gradient still takes part in the collective,
        # with zeros, so every rank issues the same reduce-scatters in the same order.
        for k in reversed(range(len(self.units))):
            if k not in self._inflight and self._pending[k] > 0:
                if self.units[k].grad_buffer is None:
                    self.units[k].alloc_grad()
                self._pending[k] = 0
                self.post_backward(k)
        self._shards_hold_sum = True

    def finish_grad_sync(self) -> None:
        self.free_finished(wait=True)
        self.ledger.mark(Ev.GRADS_SYNCED)

    def zero_grad(self) -> None:
        # The step's first reduce-scatter overwrites the shards, and the full buffers are gone.
        self._shards_hold_sum = False
