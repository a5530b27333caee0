"""Expert parallelism: a mixture-of-experts MLP with its experts placed over an `ep` axis and the
tokens carried to them and back by all-to-all.

Algorithm (Shazeer et al. 2017 §2, the top-k gate; Lepikhin et al. 2021, GShard §2.2, capacity and
dispatch/combine by all-to-all; Fedus et al. 2022, Switch Transformer §2.2, the load-balancing loss).
Each of the ep ranks holds E/ep of the E experts (rank r: experts [r·E/ep, (r+1)·E/ep)) and the
rest of the model whole, and trains on its own T tokens (the batch is split over ep, as data
parallelism splits it). In each MoE layer a rank:
    route       p = softmax(x W_router) over E; each token picks its k largest; the expert's output
                is scaled by that probability. An expert takes at most
                C = ceil(capacity_factor · k · T / E) of this rank's assignments, first choices
                before second choices, in token order; the rest are dropped (the token's
                residual carries it on, as if that expert had returned 0)
    dispatch    the kept assignments, sorted by expert, go to the experts' ranks: all-to-all
                (after an all-to-all of the E/ep counts each rank will receive per local expert)
    compute     each local expert runs its MLP on the rows it received, from every rank
    combine     the outputs go back to the tokens' ranks: all-to-all, the dispatch reversed,
                then summed into each token weighted by its gate probability
Backward runs the same two all-to-alls reversed (the combine's gradient first). The auxiliary loss
E · Σ_e f_e · P_e (f_e the share of this rank's k·T assignments that chose e before dropping, P_e
the mean gate probability of e) is smallest when the load is even; it is added with weight α.

Bytes one rank sends per layer and micro-batch, with n[s][d] the kept assignments rank s sends to
rank d's experts (from the router's actual assignment) and D the model width, 4-byte rows:
    dispatch          Σ_{d≠r} n[r][d] · D · 4        combine            Σ_{s≠r} n[s][r] · D · 4
    combine's grad    = dispatch                     dispatch's grad    = combine
    counts            (ep - 1) · (E/ep) · 8
(`theory.experts.all_to_all_bytes`). A perfectly balanced router with nothing dropped sends k·T·D·4·(ep-1)/ep per
all-to-all (`theory.experts.balanced_bytes`). Parameters per rank: everything but the experts, plus E/ep experts.

The layer, its router and the mixture-of-experts GPT are the model's (`models.moe`); this module is
the placement (`EPContext`: which experts a rank keeps, the all-to-alls). One process runs the same layer with ep = 1 and the batch in ep groups of T tokens, each routed
and capped on its own: the same routing, the same arithmetic, no all-to-all.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.moe import Expert, Experts, LayerStats, MoE, MoESpec, Routing, route
from ..runtime.comm import Axis, Comm
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
        self.comm.all_to_all(got, counts, [per] * ep, [per] * ep, self.axis, f"{self.tag}/counts")
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
        ep.comm.all_to_all(out, x.contiguous(), out_splits, in_splits, ep.axis, f"{ep.tag}/{what}")
        fctx.splits, fctx.ep, fctx.back = (out_splits, in_splits), ep, back
        return out

    @staticmethod
    def backward(fctx, grad):
        out_splits, in_splits = fctx.splits
        g = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        # the rows go back where they came from: the splits swapped
        fctx.ep.comm.all_to_all(g, grad.contiguous(), in_splits, out_splits, fctx.ep.axis,
                                f"{fctx.ep.tag}/{fctx.back}")
        return g, None, None, None, None, None


def moe_gpt(cfg, spec: MoESpec, ep: EPContext | None = None, groups: int = 1, seed: int = 1234, replicas: int = 1):
    """zeroedu's GPT with every block's MLP a mixture of experts (every expert the dense MLP's
    shape, each initialised from `seed` the same way on every rank and in one process)."""
    model = cfg.build()
    torch.manual_seed(seed)
    for block in model.blocks:
        block.mlp = MoE(cfg.d_model, cfg.mlp_ratio * cfg.d_model, spec, ep, groups, replicas)
        if ep is not None:
            block.mlp.keep_local()
    return model


__all__ = ["EPContext", "Expert", "Experts", "LayerStats", "MoE", "MoESpec", "Routing", "balanced_bytes", "moe_gpt",
           "owner", "param_count", "route", "theory_bytes"]
