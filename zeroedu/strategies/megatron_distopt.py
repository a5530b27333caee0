"""Megatron-Core's distributed optimizer: a whole fp32 gradient buffer, a sharded optimizer.

Algorithm (Megatron-Core docs, "Distributed Optimizer"; it is ZeRO-1, ZeRO paper §5.1 P_os,
with Megatron's buffers):
  1. Set-up. Each unit's parameters become views into one contiguous parameter buffer (param
     dtype, bf16 by default), padded to a multiple of N. Next to it sits a gradient buffer of the
     same length in the recipe's grad dtype (fp32 for ``megatron-bf16``), kept whole on every
     rank. Rank r owns chunk r of both buffers; the optimizer (fp32 master, m, v) exists for
     that chunk only.
  2. Backward. A post-accumulate hook on every parameter adds ``param.grad`` (bf16) into the
     parameter's view of the gradient buffer (Megatron's ``main_grad``) and drops ``param.grad``,
     so no bf16 gradient survives the backward. When the last parameter of a unit has its
     gradient, ``start_grad_sync`` launches that unit's reduce-scatter (SUM) asynchronously, so
     it overlaps the backward of the layers below.
  3. ``finish_grad_sync`` waits for every reduce-scatter; rank r now holds the summed gradient
     of its chunk, in its local range of the gradient buffer.
  4. Adam on the fp32 master chunk with that gradient times 1/N (SUM then divide in fp32).
  5. The updated master is cast into this rank's range of the bf16 parameter buffer, and the
     parameter buffer is all-gathered, so every rank again holds the full updated weights.

Index spaces (named as in Megatron's ``DistributedOptimizer``, computed by `zeroedu.shard`):
*buffer-wide* range = positions in a unit's padded flat buffer (this rank's chunk is
`FlatUnit.shard_range` there); *local* range = positions in this rank's chunk 0..c;
*per-parameter* range = positions inside one parameter's flattened tensor.
`FlatLayout.param_slices(r)` lists, for each parameter overlapping chunk r, the same slice in
all three spaces; `report_extra` returns them for the notebooks. The buffers are
`flat.FlatUnit`'s, the same unit ZeRO-1/2 and FSDP1 use.

Memory per rank (P, G, K bytes of param, grad, optimizer state; ``megatron-bf16``: 2, 4, 12):
(P + G)Ψ + KΨ/N = 6Ψ + 12Ψ/N; ``fp16``: 4Ψ + 16Ψ/N (fp16 grads, an fp32 main-grad copy of
the chunk inside the optimizer); ``fp32``: 8Ψ + 8Ψ/N (the fp32 param chunk is the master).
Padding is real storage and counted.

Communication per rank per step: reduce-scatter of the padded gradient buffer in G bytes
(Ψ·4 with fp32 grads) plus all-gather of the padded parameter buffer in P bytes (Ψ·2), each
(N-1)/N of that under the ring. Reducing in fp32 costs twice the bytes of bf16, for accuracy.
No loss scaling is applied with ``fp16`` (the model is small and well-conditioned).
Gradient accumulation: the fp32 gradient buffer is the accumulator. Inside `no_sync()` the
hooks only add into it; the step's last micro-batch launches the reduce-scatters as usual, so
gradients cross the wire once per optimizer step (as Megatron-Core's `no_sync`). A backward
after a synchronised one and before `step()` raises: its reduce-scatters are reading the buffer.
"""
from __future__ import annotations

import torch

from ..kinds import EventKind as Ev
from ..runtime.comm import UnitName
from .base import AdamState, Strategy
from .flat import FlatUnit


class MegatronDistOpt(Strategy):
    name = "megatron_distopt"
    OPTIONS = {"overlap_grad_reduce": True}

    def __init__(self, model, dist, recipe, adam=None, **options):
        super().__init__(model, dist, recipe, adam, **options)
        self.overlap_grad_reduce = bool(self.options["overlap_grad_reduce"])
        ax = dist.inner
        self.model.to(dist.device, self.param_dtype)
        self.units = [FlatUnit(UnitName(k), list(m.parameters()), ax.size, ax.rank, self.param_dtype,
                               self.grad_dtype, self.ledger, index=k) for k, m in enumerate(self.unit_modules())]
        for k, unit in enumerate(self.units):
            # The whole gradient buffer, kept for the run: each parameter's `main_grad` is a
            # view of it, and `param.grad` is not bound to it (autograd's bf16 gradient is
            # folded in by the hook below, then dropped).
            unit.alloc_grad(bind=False)
            unit.grad_shard_view()
            for i, p in enumerate(unit.params):
                p.register_post_accumulate_grad_hook(self._make_grad_hook(k, i))
        self.pending = [len(u.params) for u in self.units]  # parameters still waiting this step
        self.handles: list = [None] * len(self.units)
        self.reduced: list = [None] * len(self.units)  # each reduce-scatter's output in flight
        # The optimizer sees only this rank's chunk of each parameter buffer: with a master in
        # the recipe it keeps an fp32 copy of the chunk; with fp32 it updates the chunk in place.
        self.optim = AdamState([u.param_shard for u in self.units], self.recipe, self.adam, self.ledger)
        self.ledger.event(Ev.BUILT, note="buffers")

    def before_micro_batch(self):
        if any(h is not None for h in self.handles):
            # A reduce-scatter launched by the last backward is still reading the fp32 buffer:
            # a second backward would add into it mid-flight.
            raise RuntimeError("megatron_distopt: call step() after a synchronised backward "
                               "(accumulate micro-batches inside no_sync())")
        self.pending = [len(u.params) for u in self.units]

    # ------------------------------------------------------------------ backward hooks
    def _make_grad_hook(self, k, i):
        unit = self.units[k]

        def hook(p):
            with torch.no_grad():
                # Accumulate in the grad dtype (fp32 main_grad), then drop the bf16 grad so that
                # autograd's copy is freed as soon as it is folded in.
                unit.grad_view(i).add_(p.grad)
            p.grad = None
            self.pending[k] -= 1
            if self.pending[k] == 0 and self.overlap_grad_reduce and self.require_sync:
                self.start_grad_sync(k)

        return hook

    def start_grad_sync(self, k):
        """Launch unit k's reduce-scatter: SUM over the axis, this rank keeps its chunk."""
        unit = self.units[k]
        # A separate output keeps the collective's input and output from aliasing (gloo does
        # not promise in-place reduce-scatter); it is copied into the local range afterwards.
        self.reduced[k] = self.ledger.track(torch.empty_like(unit.grad_shard), "comm_buffer")
        self.handles[k] = self.comm.reduce_scatter(self.reduced[k], unit.grad_buffer, self.dist.inner,
                                                   self.tag(unit.name, "grads"), async_op=True)
        self.ledger.event(Ev.REDUCE_SCATTER_STARTED, k)

    def finish_grad_sync(self):
        for k, unit in enumerate(self.units):
            if self.handles[k] is None:  # no overlap, or a parameter got no gradient
                self.start_grad_sync(k)
            self.handles[k].wait()
            unit.grad_shard.copy_(self.reduced[k])
            self.handles[k] = self.reduced[k] = None  # drop the output buffer
            self.pending[k] = len(unit.params)
        self.ledger.event(Ev.GRADS_REDUCE_SCATTERED)

    # ------------------------------------------------------------------ optimizer step
    def grads_for_optimizer(self):
        # Adam on the local range only; SUM then 1/(N·K) in fp32 inside AdamState.
        return [u.grad_shard for u in self.units]

    def after_update(self):
        ax = self.dist.inner
        for unit in self.units:
            # Our chunk of the param buffer now holds the updated (cast) weights; gather the
            # rest. The input is a copy so the collective's input and output do not alias.
            mine = self.ledger.track(unit.param_shard.clone(), "comm_buffer")
            self.comm.all_gather(unit.param_buffer, mine, ax, self.tag(unit.name, "params"))
            del mine
            unit.zero_grad()
        self.ledger.event(Ev.PARAMS_GATHERED)

    def full_parameters(self):
        # Every rank holds the whole parameter buffer after the all-gather: no collective needed.
        return [p.detach().float().cpu().clone() for u in self.units for p in u.params]

    def report_extra(self):
        """The three index spaces of this rank's chunk, per unit (for the notebooks)."""
        r = self.dist.inner.rank
        out = []
        for k, u in enumerate(self.units):
            out.append({
                "unit": k, "numel": u.layout.numel, "padded": u.layout.padded_numel,
                "shard_range": [u.shard_range.start, u.shard_range.end],
                "slices": [{"param": s.index, "buffer": [s.buffer.start, s.buffer.end],
                            "param_range": [s.param.start, s.param.end],
                            "local": [s.local.start, s.local.end]}
                           for s in u.layout.param_slices(r)],
            })
        return out
