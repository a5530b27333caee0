"""ZeRO-3 / FSDP1: each unit's parameters flattened into one FlatParameter, sharded evenly.

Algorithm (ZeRO paper, Rajbhandari et al. 2019, §5.3 P_os+g+p; FSDP paper, Zhao et al. 2023,
§3.2 "FlatParameter"). Set-up: per unit, flatten and concatenate its parameters into one flat
buffer, pad it with zeros to a multiple of N (N·M for a hybrid mesh) and keep only this rank's
chunk c = padded/N (`zeroedu.shard.FlatLayout` names the index spaces). Per step, per unit
(lifecycle in `fsdp_units`):
  1. pre_forward: all-gather the N chunks into the padded flat buffer (param dtype); the
     module's weight and bias become views into it;
  2. post_forward: free the flat buffer (reshard_after_forward=True);
  3. pre_backward: all-gather it again;
  4. post_backward: the views' gradients land in one full flat gradient; reduce-scatter it
     (SUM, grad dtype) into this rank's c-element grad shard; free it and the flat buffer;
  5. step: Adam on the shard (fp32 master/m/v of c elements), scale 1/N; the updated param
     shard is what the next forward gathers — no extra all-gather after the step.

Memory per rank (model states): (P + G + K) · Σ_units padded/N = 16Ψ/N with mixed-bf16, padding
included (`theory.exact_model_states("fsdp1", ...)`). On top of it, transiently: the unsharded
unit being computed (plus one prefetched) and its full gradient; the ledger tracks them as
"gathered" / "comm_buffer" and the timeline shows one unshard/reshard saw-tooth per unit.

Communication per rank per step: all-gather ΨP twice + reduce-scatter ΨG, each (N-1)/N of the
padded buffer: 3Ψ in the paper's units, 1.5x DDP's 2Ψ (ZeRO §7.2.3). With
reshard_after_forward=False the backward all-gather is skipped: 2Ψ.

The flat buffer itself is `flat.FlatUnit` with ``shard_params=True`` (the same unit ZeRO-1/2
and Megatron's distributed optimizer use with whole parameters); `FlatParamUnit` adds the FSDP
lifecycle around it. Hybrid strategies reuse it with another shard axis and padding multiple,
and override `post_backward` to reduce the returned grad shard over dp_outer.
"""
from __future__ import annotations

import torch

from .flat import FlatUnit
from .fsdp_units import FSDPStrategy, Unit


class FlatParamUnit(Unit):
    """FSDP's lifecycle around one `FlatUnit`: `leaves[0]` is the padded flat buffer (the
    FlatParameter), `shards[0]` this rank's chunk, `grad_shards[0]` its reduced gradient."""

    def __init__(self, index, module, axis, pad_multiple, comm, ledger, param_dtype, grad_dtype, tag):
        super().__init__(index, module, axis, comm, ledger, param_dtype, grad_dtype, tag)
        self.flat = FlatUnit(self.name, [p for _, p in self.params], axis.size, axis.rank, param_dtype,
                             grad_dtype, ledger, pad_multiple=pad_multiple, shard_params=True)
        self.layout = self.flat.layout
        self.shards = [self.flat.param_shard]
        self.grad_shards = [self.flat.alloc_grad_shard()]
        self.leaves = [self.flat.param_buffer]
        self._detach_module_params()

    def _all_gather(self):
        self._alloc_leaves()
        # `.data`: write the gathered values without bumping the leaf's version counter, which
        # autograd's saved views share; they are meant to see exactly these values.
        return [self.comm.all_gather(self.leaves[0].data, self.shards[0], self.axis,
                                     self.tag(self.name, "params"), async_op=True)]

    def _reduce_scatter(self, full_grads, accumulate):
        (shard,) = self.grad_shards
        out = self.ledger.track(torch.empty_like(shard), "comm_buffer") if accumulate else shard
        self.comm.reduce_scatter(out, full_grads[0], self.axis, self.tag(self.name, "grads"))
        if accumulate:
            shard.add_(out)

    def _views(self):
        # One `split` of the flat buffer (the padding is its last piece), not one slice per
        # parameter: backward of a slice builds a zero tensor the size of the whole buffer and
        # adds it into the flat gradient, once per parameter; backward of a split concatenates
        # the pieces' gradients once (torch's FSDP1 unflattens with split views too).
        L = self.layout
        pieces = self.leaves[0].split(L.numels + [L.padded_numel - L.numel])
        return [t.view(shape) for t, shape in zip(pieces, L.shapes)]

    def param_pieces(self):
        return self.flat.param_pieces()

    def describe(self):
        return self.flat.describe()


class FSDP1(FSDPStrategy):
    name = "fsdp1"

    def make_unit(self, index, module):
        return FlatParamUnit(index, module, self.shard_axis(), self.pad_multiple(), self.comm, self.ledger,
                             self.param_dtype, self.grad_dtype, tag=self.tag)
