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
No gradient accumulation over micro-batches here: the full gradient does not outlive one
backward (accumulating would mean accumulating the shards after each reduce-scatter).
"""
from __future__ import annotations

from ..runtime import ledger as L
from .zero1 import ZeRO1


class ZeRO2(ZeRO1):
    name = "zero2"

    def init_grads(self) -> None:
        self._pending: list[int] = []
        self._handles: dict[int, object] = {}
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
                self.ledger.event(f"{u.name} grad buffer allocated")
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
        u = self.units[k]
        self.ledger.mark(f"{u.name} grads ready")
        self._handles[k] = self.reduce_grads(u)

    def free_finished(self, wait: bool = False) -> None:
        """Free the full buffers of units whose reduce-scatter is done (or wait for all)."""
        for k in list(self._handles):
            h = self._handles[k]
            if not wait and not h.done():
                continue
            h.wait()
            # The work object references the buffer too: drop it with the views, or the
            # memory would stay allocated although the ledger no longer sees the buffer.
            del self._handles[k]
            self.units[k].free_grad()
            self.ledger.event(f"{self.units[k].name} full grad freed")

    # ------------------------------------------------------------------ step
    def forward_backward(self, x, y):
        if self._handles or any(u.grad_buffer is not None for u in self.units):
            raise RuntimeError("zero2 does not accumulate gradients: call step() after each backward")
        self._reset_counts()
        return super().forward_backward(x, y)

    def finish_grad_sync(self) -> None:
        # A unit none of whose parameters got a gradient still takes part in the collective,
        # with zeros, so every rank issues the same reduce-scatters in the same order.
        for k in reversed(range(len(self.units))):
            if k not in self._handles and self._pending[k] > 0:
                if self.units[k].grad_buffer is None:
                    self.units[k].alloc_grad()
                self._pending[k] = 0
                self.post_backward(k)
        self.free_finished(wait=True)
        self.ledger.mark(L.GRADS_SYNCED)

    def zero_grad(self) -> None:
        # The reduce-scatter overwrites the shards each step, and the full buffers are gone.
        pass
