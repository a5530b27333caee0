"""ZeRO-1: every rank keeps full parameters and gradients, but only 1/N of the optimizer state.

Algorithm (ZeRO paper, Rajbhandari et al. 2019, §5.1 "P_os", communication in §7.2.1):
  set-up: one flat buffer per unit (top-level layer), padded to a multiple of N
          (`flat.FlatUnit`); parameters and gradients are views into the unit's buffers.
          Rank r owns chunk r of every unit and allocates fp32 master / m / v for that chunk only.
  1. forward and backward on this rank's micro-batch; gradients land in the full grad buffers;
  2. `finish_grad_sync`: reduce-scatter (SUM) each unit's gradient buffer, so rank r ends up
     with the summed gradient of *its* chunk, written in place into its slice of the buffer;
  3. Adam on the own chunk only (summed gradient times 1/N, in fp32), the updated fp32 master
     cast back into the own slice of the parameter buffer;
  4. `unshard`: all-gather every unit's parameter chunks, so all ranks hold the new parameters.

Memory per rank: (P + G)Ψ + KΨ/N = 4Ψ + 12Ψ/N with `mixed-bf16`, Ψ counted with padding.
The full gradient buffer stays allocated; freeing it is ZeRO-2 (`zero2.py`).

Communication per rank: reduce-scatter of the Ψ·G gradient bytes plus all-gather of the Ψ·P
parameter bytes, each sending (N-1)/N of its buffer under the ring: 2(N-1)/N·Ψ·2 bytes with
bf16, the same as DDP's all-reduce (an all-reduce *is* a reduce-scatter followed by an
all-gather; ZeRO-1 just runs the optimizer in between).

`ZeRO1AllReduce` is ZeRO-1 as it is often coded: all-reduce the whole gradient, then update
the own chunk and all-gather. That moves 3Ψ: the all-reduce's gather half is wasted, because
every rank reads only its own chunk of the reduced gradient.
"""
from __future__ import annotations

import torch

from ..models import units as model_units
from .base import AdamState, Strategy
from .flat import flat_units


class ZeRO1(Strategy):
    name = "zero1"
    grad_sync = "reduce_scatter"

    def __init__(self, model, dist, recipe, adam=None, **opts):
        super().__init__(model, dist, recipe, *(() if adam is None else (adam,)))
        if opts:
            raise ValueError(f"{self.name} takes no options, got {sorted(opts)}")
        if self.grad_dtype != self.param_dtype:
            raise ValueError(f"{self.name} reduces gradients in the parameter's dtype; recipe "
                             f"{recipe.name} wants {recipe.grad} grads for {recipe.param} params "
                             "(that is megatron_distopt's recipe)")
        self.model.to(dist.device, self.param_dtype)
        axis = dist.inner
        self.units = flat_units(model_units(self.model), axis.size, axis.rank, self.param_dtype,
                                self.grad_dtype, self.ledger)
        self.init_grads()
        # Optimizer state for the own chunk of each unit only: this is the 1/N of ZeRO-1.
        self.optim = AdamState([u.param_shard for u in self.units], recipe, self.adam, self.ledger)
        self.ledger.event("flat units built")

    def init_grads(self) -> None:
        for u in self.units:
            u.alloc_grad()

    def grad_shards(self) -> list[torch.Tensor]:
        return [u.grad_shard for u in self.units]

    # ------------------------------------------------------------------ step
    def finish_grad_sync(self) -> None:
        axis, handles = self.dist.inner, []
        # Phase 1: launch every unit's reduction (last unit first, as backward produced them),
        # then wait; SUM now, 1/N later in fp32 (gloo has no AVG/PREMUL_SUM).
        for u in reversed(self.units):
            tag = f"{self.name}/grads/{u.name}"
            if self.grad_sync == "reduce_scatter":
                # In place: the output is this rank's chunk of the input buffer, exactly NCCL's
                # in-place convention (recvbuff == sendbuff + rank * count), which gloo also
                # honours (checked by the equivalence tests); the reduced chunk lands where
                # `grad_shard` looks, with no extra buffer.
                handles.append(self.comm.reduce_scatter(u.grad_shard, u.grad_buffer, axis, tag,
                                                        async_op=True))
            else:
                handles.append(self.comm.all_reduce(u.grad_buffer, axis, tag, async_op=True))
        for h in handles:
            h.wait()
        self.ledger.mark("grads synced")

    def unshard(self) -> None:
        """All-gather each unit's updated chunks into its full parameter buffer (in place: the
        input is this rank's chunk of the output, NCCL's in-place convention for all-gather)."""
        handles = [self.comm.all_gather(u.param_buffer, u.param_shard, self.dist.inner,
                                        f"{self.name}/params/{u.name}", async_op=True)
                   for u in self.units]
        for h in handles:
            h.wait()
        self.ledger.event("params all-gathered")

    def step(self):
        self.finish_grad_sync()
        self.ledger.record_model_states()
        with torch.no_grad():
            # Phase 2: Adam on the own chunk; masters are cast back into the parameter buffer.
            self.optim.step(self.grad_shards(), scale=1.0 / self.dist.inner.size)
        # Phase 3: everyone gets everyone's updated chunk.
        self.unshard()
        self.zero_grad()
        self.ledger.event("step end")

    def zero_grad(self) -> None:
        for u in self.units:
            u.zero_grad()

    def full_parameters(self):
        # Parameters are replicated after the all-gather: no collective needed.
        return [p.detach().float().cpu().clone() for p in self.model.parameters()]

    def report_extra(self):
        return {"units": [{"numel": u.layout.numel, "padded_numel": u.layout.padded_numel,
                           "shard_numel": u.layout.shard_numel} for u in self.units]}


class ZeRO1AllReduce(ZeRO1):
    name = "zero1_allreduce"
    grad_sync = "all_reduce"
