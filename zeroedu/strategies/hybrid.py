"""HSDP and HFSDP: FSDP1 inside a domain (``dp_shard``, N ranks), something lighter across
domains (``dp_outer``, M replicas). World = M × N ranks; inner-axis ranks are contiguous, so
under torchrun the all-gathers of every layer stay on a node's NVLink.

Both are a composition, visibly (FSDP paper, Zhao et al. 2023, §3.2.2 "hybrid sharding";
Megatron-FSDP's per-axis ZeRO levels, inner ``optim_grads_params``):

    inner (dp_shard)  FSDP1 unchanged: per unit, all-gather the flat parameter before forward
                      and before backward, reduce-scatter its gradient (SUM) into this rank's
                      chunk of c = padded/N elements. Flat buffers are padded to a multiple of
                      N·M (not N), so the chunk c splits evenly once more across the M domains.

    Time (`theory.schedule.fsdp(..., outer=M)`): the inner collectives share dp_shard's link,
    each unit's outer reduction starts on dp_outer's link when its reduce-scatter ends.

    outer (dp_outer)  HSDP, level ``no_shard``: the M ranks holding the same chunk in different
                      domains are plain DDP replicas of it: after a unit's post_backward,
                      all-reduce (SUM) its c-element grad shard over dp_outer, async, waited in
                      finish_grad_sync. Adam on the whole chunk with scale 1/(N·M).

                      HFSDP, level ``optim`` (ZeRO-1 across domains): after post_backward,
                      reduce-scatter the grad shard over dp_outer, so domain-rank o gets the
                      summed c/M sub-chunk o; Adam (fp32 master, m, v) exists for that sub-chunk
                      only, scale 1/(N·M); the updated sub-chunk is cast into the param shard and
                      all-gathered over dp_outer, so all M replicas again hold the same c-chunk.

Memory per rank (model states, P, G, K bytes of param, grad, optimizer state; mixed-bf16 2, 2,
12): HSDP (P+G+K)Ψ/N = 16Ψ/N; HFSDP (P+G)Ψ/N + KΨ/(N·M) = 4Ψ/N + 12Ψ/(N·M). 7B on 2 domains of
8: 14 GB and 8.75 GB (flat ZeRO-3 over all 16 ranks would be 7 GB, with every all-gather
crossing domains; `zeroedu.theory.hybrid` compares the three).

Communication per rank per step: inner as FSDP1 (all-gather ΨP twice, reduce-scatter ΨG, over
N); outer HSDP: all-reduce of the (Ψ/N)G grad shard, 2(M-1)/M of it; HFSDP: reduce-scatter of
the (Ψ/N)G shard + all-gather of the (Ψ/N)P shard, (M-1)/M of each: the same bytes when P = G,
but the optimizer state is M times smaller. Outer traffic happens once per optimizer step: each
unit's outer reduction starts in its post_backward of the step's last micro-batch (inside
`no_sync()` the outer axis waits, while the inner axis reduces every micro-batch, as FSDP must).
Gradient clipping: HSDP's shards repeat across domains, so the squared norm is all-reduced over
dp_shard only; HFSDP's optimizer sub-chunks are disjoint across both axes, so over the world.
"""
from __future__ import annotations

import torch

from ..kinds import EventKind as Ev
from .base import AdamState
from .fsdp1 import FSDP1


class HSDP(FSDP1):
    """FSDP1 on dp_shard + DDP's all-reduce of each reduced grad shard on dp_outer."""

    name = "hsdp"

    def __init__(self, model, dist, recipe, adam=None, **options):
        if dist.outer is None:
            raise ValueError(f"{self.name} needs a 2-D mesh: DistState.outer (dp_outer) is missing")
        self.outer = dist.outer
        self.outer_handles: list = []
        super().__init__(model, dist, recipe, adam, **options)

    def pad_multiple(self) -> int:
        # N·M, so the inner chunk c = padded/N is itself a multiple of M (HFSDP cuts it again).
        return self.shard_axis().size * self.outer.size

    def data_parallel_size(self) -> int:
        # SUM over dp_shard, then SUM over dp_outer: the mean needs 1/(N·M), taken in fp32.
        return self.axis.size * self.outer.size

    def post_backward(self, u):
        shards = super().post_backward(u)  # inner reduce-scatter, reshard
        if self.require_sync:  # accumulation: the outer axis waits for the step's last micro-batch
            self.start_outer_sync(u, shards)
        return shards

    def start_outer_sync(self, u, shards):
        # Async: the slow cross-domain all-reduce of this unit runs while lower layers compute.
        for g in shards:
            self.outer_handles.append(self.comm.all_reduce(
                g, self.outer, self.tag(u.name, "grads", "outer"), async_op=True))

    def finish_grad_sync(self):
        super().finish_grad_sync()
        for h in self.outer_handles:
            h.wait()
        self.outer_handles = []
        self.ledger.event(Ev.OUTER_GRADS_SYNCED)


class HFSDP(HSDP):
    """FSDP1 on dp_shard + ZeRO-1 on dp_outer (optimizer state sharded N·M ways)."""

    name = "hfsdp"

    def _sub(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's dp_outer sub-chunk of an inner chunk (a view: local range of the chunk)."""
        k = t.numel() // self.outer.size
        return t[self.outer.rank * k:(self.outer.rank + 1) * k]

    def build_optimizer(self):
        self.outer_grads = [None] * len(self.units)
        # Adam sees only our 1/M of each param shard; with a master in the recipe it keeps an
        # fp32 copy of it (K·Ψ/(N·M) bytes), with fp32 it updates the view in place.
        return AdamState([self._sub(s) for u in self.units for s in u.shards],
                         self.recipe, self.adam, self.ledger)

    def start_outer_sync(self, u, shards):
        (g,) = shards  # FSDP1: one flat grad shard per unit
        # A separate output (not a view of the input): gloo does not promise in-place collectives.
        out = self.ledger.track(torch.empty_like(self._sub(g)), "comm_buffer")
        self.outer_grads[u.index] = out
        self.outer_handles.append(self.comm.reduce_scatter(
            out, g, self.outer, self.tag(u.name, "grads", "outer"), async_op=True))

    def norm_axes(self):
        # Each rank's optimizer sub-chunk is disjoint from every other rank's: one all-reduce
        # over the whole world (both mesh axes) adds each element's square exactly once.
        return [self.dist.world]

    def grads_for_optimizer(self):
        return self.outer_grads  # the outer reduce-scatter's sub-chunks

    def after_update(self):
        self.outer_grads = [None] * len(self.units)  # drop the reduced sub-chunks
        for u in self.units:
            (s,) = u.shards
            # Our sub-chunk of the param shard was just updated; fetch the other M-1.
            mine = self.ledger.track(self._sub(s).clone(), "comm_buffer")
            self.comm.all_gather(s, mine, self.outer, self.tag(u.name, "params", "outer"))
        super().after_update()
