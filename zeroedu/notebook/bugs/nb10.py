"""Notebook 10 (hybrid sharding): two hybrids, each with one plausible mistake.

`BuggyHSDP` sends each unit's *full* gradient across domains: it all-reduces the unsharded
gradient over ``dp_outer`` before the inner reduce-scatter, instead of all-reducing the 1/N
shard that the reduce-scatter leaves. Sums commute, so every rank still ends with the right
summed shard: the losses equal single-process training and the model states equal the closed
form. The symptom is on the wire, axis by axis: ``dp_outer`` carries N times HSDP's bytes, and
on a real cluster those are the bytes that cross the slow links between nodes.

`BuggyHFSDP` forgets HFSDP's outer all-gather after the optimizer step. Each domain-rank updates
its 1/M sub-chunk of the shard and never receives the other domains' updated sub-chunks, so the
replicas of a shard drift apart from the first step on: the losses leave single-process
training, and ``dp_outer`` carries only the reduce-scatter's half of HFSDP's outer bytes.
"""
from __future__ import annotations

from ...strategies.fsdp_units import FSDPStrategy
from ...strategies.hybrid import HFSDP, HSDP


class BuggyHSDP(HSDP):
    """HSDP whose outer all-reduce runs on each unit's unsharded gradient, before the inner
    reduce-scatter (N times the cross-domain bytes; the arithmetic is still right)."""

    def post_backward(self, u):
        if self.require_sync:
            for leaf in u.leaves:  # the full flat gradient of the unit, grad dtype as reduced
                self.comm.all_reduce(leaf.grad, self.outer, self.tag(u.name, "grads", "outer"))
        # the inner reduce-scatter and reshard, without HSDP's all-reduce of the shard
        return FSDPStrategy.post_backward(self, u)


class BuggyHFSDP(HFSDP):
    """HFSDP whose step leaves out the outer all-gather of the updated parameter sub-chunk."""

    def after_update(self):
        self.outer_grads = [None] * len(self.units)
        FSDPStrategy.after_update(self)  # the shards' bookkeeping, without HFSDP's outer all-gather
