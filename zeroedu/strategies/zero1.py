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
The full gradient buffer stays allocated; freeing it is ZeRO-2 (`zero2.py`). It is also the
accumulator: with K micro-batches the gradients sum into it and phase 1 runs once, at the step.

Communication per rank: reduce-scatter of the Ψ·G gradient bytes plus all-gather of the Ψ·P
parameter bytes, each sending (N-1)/N of its buffer under the ring: 2(N-1)/N·Ψ·2 bytes with
bf16, the same as DDP's all-reduce (an all-reduce *is* a reduce-scatter followed by an
all-gather; ZeRO-1 just runs the optimizer in between).

`ZeRO1AllReduce` is ZeRO-1 as it is often coded: all-reduce the whole gradient, then update
the own chunk and all-gather. That moves 3Ψ: the all-reduce's gather half is wasted, because
every rank reads only its own chunk of the reduced gradient. It differs from `ZeRO1` in one
method, `reduce_grads`.
"""
from __future__ import annotations

from ..kinds import EventKind as Ev
from ..runtime.comm import UnitName
from .base import AdamState, Strategy
from .flat import FlatUnit


class ZeRO1(Strategy):
    name = "zero1"
    GRADS_IN_PARAM_DTYPE = True

    def __init__(self, model, dist, recipe, adam=None, **options):
        super().__init__(model, dist, recipe, adam, **options)
        self.model.to(dist.device, self.param_dtype)
        self.units = []
        for k, m in enumerate(self.unit_modules()):
            axis = self.axis_of(m)  # dp_shard (x ep x cp); a layer's experts: their own group
            u = FlatUnit(UnitName(k), list(m.parameters()), axis.size, axis.rank, self.param_dtype,
                         self.grad_dtype, self.ledger, index=k)
            u.axis = axis
            self.units.append(u)
        self.init_grads()
        # Optimizer state for the own chunk of each unit only: this is the 1/N of ZeRO-1.
        self.optim = AdamState([u.param_shard for u in self.units], self.recipe, self.adam, self.ledger)
        self.ledger.event(Ev.BUILT, note="flat units")

    def init_grads(self) -> None:
        """Full gradient buffers for the whole run; the reduced chunk lands in its own slice."""
        for u in self.units:
            u.alloc_grad()
            u.grad_shard_view()

    # ------------------------------------------------------------------ step
    def reduce_grads(self, u: FlatUnit):
        """Reduce-scatter (SUM) the unit's gradient buffer into `grad_shard`; async.

        Here in place: `grad_shard` is this rank's chunk of the input buffer, exactly NCCL's
        in-place convention (recvbuff == sendbuff + rank * count), which gloo also honours
        (checked by the equivalence tests), so no extra buffer is needed. (ZeRO-2's
        `grad_shard` is a tensor of its own.)"""
        return self.comm.reduce_scatter(u.grad_shard, u.grad_buffer, u.axis,
                                        self.tag(u.name, "grads"), async_op=True)

    def finish_grad_sync(self) -> None:
        # Phase 1: launch every unit's reduction (last unit first, as backward produced them),
        # then wait; SUM now, 1/N later in fp32 (gloo has no AVG/PREMUL_SUM).
        handles = [self.reduce_grads(u) for u in reversed(self.units)]
        for h in handles:
            h.wait()
        self.ledger.mark(Ev.GRADS_SYNCED)

    def unshard(self) -> None:
        """All-gather each unit's updated chunks into its full parameter buffer (in place: the
        input is this rank's chunk of the output, NCCL's in-place convention for all-gather)."""
        handles = [self.comm.all_gather(u.param_buffer, u.param_shard, u.axis,
                                        self.tag(u.name, "params"), async_op=True)
                   for u in self.units]
        for h in handles:
            h.wait()
        self.ledger.event(Ev.PARAMS_GATHERED)

    def grads_for_optimizer(self):
        # Phase 2: Adam on the own chunk; masters are cast back into the parameter buffer.
        return [u.grad_shard for u in self.units]

    def after_update(self):
        # Phase 3: everyone gets everyone's updated chunk.
        self.unshard()
        self.zero_grad()

    def zero_grad(self) -> None:
        for u in self.units:
            u.zero_grad()

    def full_parameters(self):
        # Parameters are replicated after the all-gather: no collective needed.
        return [p.detach().float().cpu().clone() for p in self.model.parameters()]

    def report_extra(self):
        return {"units": [{"numel": u.layout.numel, "padded_numel": u.layout.padded_numel,
                           "shard_numel": u.shard_range.size} for u in self.units]}


class ZeRO1AllReduce(ZeRO1):
    """ZeRO-1 with DDP's all-reduce: every rank receives the whole summed gradient and reads
    only its own chunk of it (the all-reduce's gather half is traffic nobody uses)."""

    name = "zero1_allreduce"

    def reduce_grads(self, u: FlatUnit):
        return self.comm.all_reduce(u.grad_buffer, u.axis, self.tag(u.name, "grads"), async_op=True)
