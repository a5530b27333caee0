"""Expert parallelism: a mixture of experts' experts placed over an `ep` axis, the tokens carried
to them and back by all-to-all.

Algorithm (Lepikhin et al. 2021, GShard §2.2, dispatch and combine by all-to-all; the layer, its
top-k router with capacity and its load-balancing loss are the model's, `models.moe`). Each of the
ep ranks holds E/ep of every layer's E experts (rank r: experts [r·E/ep, (r+1)·E/ep)) and the rest
of the model whole, and trains on its own share of the batch (ep splits the batch as data
parallelism does). In each MoE layer a rank routes its own sequences (each a group, `models.moe`),
then (`EPContext.run`):
    dispatch    its kept assignments, sorted by expert, go to the experts' ranks: all-to-all
                (after an all-to-all of the E/ep counts each rank will receive per local expert)
    compute     each local expert runs its MLP on the rows it received, from every rank
    combine     the outputs go back to the tokens' ranks: all-to-all, the dispatch reversed,
                then summed into each token weighted by its gate probability
Backward runs the same two all-to-alls reversed (the combine's gradient first).

Bytes one rank sends per layer and micro-batch, with n[s][d] the kept assignments rank s sends to
rank d's experts (the router's actual assignment), D the model width, a bytes per element:
    dispatch          Σ_{d≠r} n[r][d] · D · a        combine            Σ_{s≠r} n[s][r] · D · a
    combine's grad    = dispatch                     dispatch's grad    = combine
    counts            (ep - 1) · (E/ep) · 8
(`theory.experts.all_to_all_bytes`). A perfectly balanced router with nothing dropped sends
k·T·D·a·(ep-1)/ep per all-to-all (`theory.experts.balanced_bytes`). Parameters per rank: everything
but the experts, plus E/ep experts. Gradients: the experts' already sum every ep rank's tokens (the
all-to-alls carried them), so a data-parallel strategy reduces them over the ranks holding the
same experts only, and everything else over dp x ep (`strategies.splits.ExpertSplit`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.moe import Expert, Experts, LayerStats, MoE, MoESpec, Routing, route
from ..runtime.comm import Axis, Comm, tag
# the closed forms live in theory (the predictions read them without the algorithm)
from ..theory.experts import all_to_all_bytes as theory_bytes
from ..theory.experts import balanced_bytes, owner, param_count


@dataclass(frozen=True)
class EPContext:
    """A MoE layer's experts placed over `axis`: rank r holds experts [r·E/ep, (r+1)·E/ep) and
    the rows routed to them come and go by all-to-all (the module docstring's steps)."""
    comm: Comm
    axis: Axis
    tag: str = "ep"

    def run(self, layer: MoE, sends: list[torch.Tensor], routes: list[Routing]) -> torch.Tensor:
        """Dispatch this rank's kept assignments (every group's, sorted by expert), run the local
        experts on what arrives, combine: the outputs back in the order of `sends`."""
        send = torch.cat(sends)
        expert = torch.cat([r.expert for r in routes])
        order = None
        if len(routes) > 1:  # each group is sorted by expert; the all-to-all wants the whole send so
            order = torch.argsort(expert, stable=True)
            send, expert = send[order], expert[order]
        counts = torch.bincount(expert, minlength=layer.spec.experts)
        rows, local, splits, got = self._dispatch(layer, send, counts)
        layer.stats.sent.append(counts.tolist())
        layer.stats.received.append(got.sum(1).tolist())
        y = layer._experts(rows, local)
        y = _AllToAll.apply(y, splits[0], splits[1], self, "combine", "combine_grad")
        if order is not None:
            y = y[torch.argsort(order)]  # each group's rows back where its routing has them
        return y

    def _dispatch(self, layer: MoE, send: torch.Tensor, counts: torch.Tensor):
        """Counts, then rows, to the experts' ranks; returns the rows received, each one's local
        expert, the (sent, received) splits the combine reverses, and the counts received."""
        ep, per = self.axis.size, layer.spec.experts // self.axis.size
        got = torch.empty_like(counts)  # from each rank, rows per local expert: (ep, per)
        self.comm.all_to_all(got, counts, [per] * ep, [per] * ep, self.axis,
                            tag(self.tag, "experts", "data", "counts"))
        in_splits = counts.view(ep, per).sum(1).tolist()
        got = got.view(ep, per)
        out_splits = got.sum(1).tolist()
        rows = _AllToAll.apply(send, out_splits, in_splits, self, "dispatch", "dispatch_grad")
        base = layer.local_experts().start
        local = torch.repeat_interleave(torch.arange(per).repeat(ep) + base, got.reshape(-1))
        return rows, local, (in_splits, out_splits), got


# ------------------------------------------------------------------ all-to-all with a gradient
class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(fctx, x, out_splits, in_splits, ep: EPContext, what: str, back: str):
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        ep.comm.all_to_all(out, x.contiguous(), out_splits, in_splits, ep.axis, tag(ep.tag, "experts", "data", what))
        fctx.splits, fctx.ep, fctx.back = (out_splits, in_splits), ep, back
        return out

    @staticmethod
    def backward(fctx, grad):
        out_splits, in_splits = fctx.splits
        g = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        # the rows go back where they came from: the splits swapped
        fctx.ep.comm.all_to_all(g, grad.contiguous(), in_splits, out_splits, fctx.ep.axis,
                                tag(fctx.ep.tag, "experts", "data", fctx.back))
        return g, None, None, None, None, None


__all__ = ["EPContext", "Expert", "Experts", "LayerStats", "MoE", "MoESpec", "Routing", "balanced_bytes", "owner", "param_count", "route", "theory_bytes"]
