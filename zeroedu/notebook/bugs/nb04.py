"""Notebook 04's find-the-bug: a distributed optimizer that reduces its gradients in bf16.

`BrokenDistOpt` is `strategies.megatron_distopt.MegatronDistOpt` whose `start_grad_sync`
casts the fp32 gradient buffer to the parameters' dtype (bf16 with ``megatron-bf16``) and
reduce-scatters that copy; the reduced chunk is cast back into the fp32 buffer. The memory is
the predicted one (the cast is a communication buffer) and the losses stay close to
single-process training over a few steps, but the reduce-scatter moves half the predicted
bytes, and every sum over ranks is rounded to 8 significant bits: the accumulation the fp32
buffer exists for is thrown away on the wire.
"""
from __future__ import annotations

import torch

from ...kinds import EventKind as Ev
from ...strategies.megatron_distopt import MegatronDistOpt


class BrokenDistOpt(MegatronDistOpt):
    """MegatronDistOpt whose gradient reduce-scatter runs on a bf16 copy of the fp32 buffer."""

    def start_grad_sync(self, k):
        unit = self.units[k]
        low = self.ledger.track(unit.grad_buffer.to(self.param_dtype), "comm_buffer")
        self.reduced[k] = self.ledger.track(torch.empty(unit.grad_shard.shape, dtype=self.param_dtype,
                                                        device=low.device), "comm_buffer")
        self._inputs = getattr(self, "_inputs", {})
        self._inputs[k] = low  # keep the input alive while the collective is in flight
        self.handles[k] = self.comm.reduce_scatter(self.reduced[k], low, self.dist.inner,
                                                   self.tag(unit.name, "grads"), async_op=True)
        self.ledger.event(Ev.REDUCE_SCATTER_STARTED, k)

    def finish_grad_sync(self):
        super().finish_grad_sync()
        self._inputs = {}  # the bf16 copies go once every reduce-scatter has finished
