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

One process runs the same layer with ep = 1 and the batch in ep groups of T tokens, each routed
and capped on its own: the same routing, the same arithmetic, no all-to-all.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..runtime.comm import Axis, Comm
# the closed forms live in theory (the predictions read them without the algorithm)
from ..theory.experts import all_to_all_bytes as theory_bytes
from ..theory.experts import balanced_bytes, owner, param_count
from ..theory.experts import capacity as _capacity


@dataclass(frozen=True)
class MoESpec:
    experts: int
    top_k: int = 1
    capacity_factor: float = 1.25
    aux_weight: float = 0.01

    def __post_init__(self):
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top-k must be 1..experts ({self.experts}), not {self.top_k}")
        if self.capacity_factor <= 0:
            raise ValueError(f"capacity factor must be positive, not {self.capacity_factor}")

    def capacity(self, tokens: int) -> int:
        """C = ceil(capacity_factor · k · T / E): at most this many of T tokens' assignments per expert."""
        return _capacity(self.capacity_factor, self.top_k, tokens, self.experts)


@dataclass(frozen=True)
class EPContext:
    comm: Comm
    axis: Axis
    tag: str = "ep"


# ------------------------------------------------------------------ routing
@dataclass(frozen=True)
class Routing:
    """One group's routing: the kept assignments, sorted by expert."""
    token: torch.Tensor   # (n,) token index in the group
    expert: torch.Tensor  # (n,) expert id, non-decreasing
    weight: torch.Tensor  # (n,) gate probability (with its gradient)
    chosen: list[int]     # assignments per expert before dropping
    kept: list[int]       # after
    aux: torch.Tensor     # E · Σ f_e P_e

    @property
    def dropped(self) -> int:
        return sum(self.chosen) - sum(self.kept)


def route(logits: torch.Tensor, spec: MoESpec) -> Routing:
    """Top-k gate with capacity over the T rows of `logits` (T, E) (module docstring)."""
    T, E = logits.shape
    probs = torch.softmax(logits, dim=-1)
    top_p, top_e = probs.topk(spec.top_k, dim=-1)  # (T, k)
    # slot-major order: every token's first choice before any second choice, tokens in order
    e_flat = top_e.t().reshape(-1)
    p_flat = top_p.t().reshape(-1)
    t_flat = torch.arange(T).repeat(spec.top_k)
    onehot = F.one_hot(e_flat, E)
    place = (onehot.cumsum(0) * onehot).sum(1) - 1  # this assignment's place in its expert's queue
    keep = place < spec.capacity(T)
    chosen = torch.bincount(e_flat, minlength=E)
    f = chosen.to(probs.dtype) / (spec.top_k * T)
    aux = E * (f * probs.mean(0)).sum()
    e_kept, order = torch.sort(e_flat[keep], stable=True)
    return Routing(t_flat[keep][order], e_kept, p_flat[keep][order], chosen.tolist(),
                   torch.bincount(e_kept, minlength=E).tolist(), aux)


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


# ------------------------------------------------------------------ the layer
class Expert(nn.Module):
    """One expert: the dense block's MLP (fc, GELU, fc2)."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.fc = nn.Linear(d_model, hidden)
        self.fc2 = nn.Linear(hidden, d_model)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc(x), approximate="tanh"))


@dataclass
class LayerStats:
    """What one MoE layer's router did in each forward, group by group (the system's own counts)."""
    chosen: list[list[int]] = field(default_factory=list)  # per group: assignments per expert
    kept: list[list[int]] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)


class MoE(nn.Module):
    """Drop-in for `models.gpt.MLP`: E experts behind a top-k router.

    ep=None: one process holds every expert and routes the tokens in `groups` groups (the ranks'
    shares), computing each expert once per `replicas` consecutive run of groups (dp's replicas). With an `EPContext` this rank holds experts [r·E/ep, (r+1)·E/ep) only (`keep_local`)
    and routes its own tokens as one group."""

    def __init__(self, d_model: int, hidden: int, spec: MoESpec, ep: EPContext | None = None, groups: int = 1,
                 replicas: int = 1):
        super().__init__()
        if groups % replicas:
            raise ValueError(f"{groups} groups do not split into {replicas} replicas of the experts")
        self.spec, self.ep, self.groups, self.replicas = spec, ep, groups, replicas
        self.router = nn.Linear(d_model, spec.experts, bias=False)
        self.experts = nn.ModuleDict({str(e): Expert(d_model, hidden) for e in range(spec.experts)})
        self.aux: torch.Tensor | None = None
        self.stats = LayerStats()

    @property
    def size(self) -> int:
        return 1 if self.ep is None else self.ep.axis.size

    def local_experts(self) -> range:
        per = self.spec.experts // self.size
        r = 0 if self.ep is None else self.ep.axis.rank
        return range(r * per, (r + 1) * per)

    def keep_local(self) -> None:
        """Drop the experts another rank holds (after every rank built the same E experts)."""
        mine = self.local_experts()
        self.experts = nn.ModuleDict({k: v for k, v in self.experts.items() if int(k) in mine})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, D = x.shape
        flat = x.reshape(B * S, D)
        T = B * S // self.groups
        # route: each group (this rank's tokens, or one rank's share in one process) on its own
        routes = [route(self.router(flat[g * T:(g + 1) * T]), self.spec) for g in range(self.groups)]
        for r in routes:
            self.stats.chosen.append(r.chosen)
            self.stats.kept.append(r.kept)
            self.stats.dropped.append(r.dropped)
        self.aux = torch.stack([r.aux for r in routes]).mean()
        sends = [flat[g * T:(g + 1) * T][r.token] for g, r in enumerate(routes)]  # sorted by expert
        if self.ep is None:
            # the rows every expert would receive on the ranks, in the same order (group by group,
            # expert by expert) and per replica of the experts: the same matrices as on the ranks,
            # so the same round-off
            per = self.groups // self.replicas
            y = torch.cat([self._experts(torch.cat(sends[j * per:(j + 1) * per]),
                                         torch.cat([r.expert for r in routes[j * per:(j + 1) * per]]))
                           for j in range(self.replicas)])
        else:
            rows, local, splits = self._dispatch(sends[0], routes[0])
            y = self._experts(rows, local)
        if self.ep is not None:
            y = _AllToAll.apply(y, splits[0], splits[1], self.ep, "combine", "combine_grad")
        outs, at = [], 0
        for g, r in enumerate(routes):
            n = r.token.numel()
            outs.append(flat.new_zeros(T, D).index_add(0, r.token, y[at:at + n] * r.weight[:, None]))
            at += n
        return torch.cat(outs).view(B, S, D)

    def _experts(self, rows: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """Each local expert's MLP on its rows (`local`: each row's expert), in place of the rows."""
        y = torch.zeros_like(rows)
        for e in self.local_experts():
            idx = (local == e).nonzero().squeeze(1)
            # run even on no rows: every rank's combine must be in its graph, or one rank would
            # skip the combine's backward all-to-all that the others wait in
            y = y.index_copy(0, idx, self.experts[str(e)](rows[idx]))
        return y

    def _dispatch(self, send: torch.Tensor, r: Routing):
        """Counts, then rows, to the experts' ranks; returns the rows received, each one's local
        expert, and the (sent, received) splits the combine reverses."""
        ep, per = self.size, self.spec.experts // self.size
        counts = torch.tensor(r.kept, dtype=torch.long)
        got = torch.empty_like(counts)  # from each rank, rows per local expert: (ep, per)
        self.ep.comm.all_to_all(got, counts, [per] * ep, [per] * ep, self.ep.axis, f"{self.ep.tag}/counts")
        in_splits = counts.view(ep, per).sum(1).tolist()
        got = got.view(ep, per)
        out_splits = got.sum(1).tolist()
        rows = _AllToAll.apply(send, out_splits, in_splits, self.ep, "dispatch", "dispatch_grad")
        base = self.local_experts().start
        local = torch.repeat_interleave(torch.arange(per).repeat(ep) + base, got.reshape(-1))
        return rows, local, (in_splits, out_splits)


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


__all__ = ["EPContext", "Expert", "LayerStats", "MoE", "MoESpec", "Routing", "balanced_bytes", "moe_gpt",
           "owner", "param_count", "route", "theory_bytes"]
