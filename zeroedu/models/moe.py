"""A mixture-of-experts GPT: every block's MLP is E experts behind a top-k router.

The model (Shazeer et al. 2017 §2, the top-k gate; Lepikhin et al. 2021, GShard §2.2, capacity per
group; Fedus et al. 2022, Switch Transformer §2.2, the load-balancing loss). In each MoE layer the
tokens are routed group by group (`MoE.group_rows` sequences a group: one sequence in
`MoEGPTConfig`, so the routing of a sequence never depends on how a batch is split over ranks or
micro-batches):
    route       p = softmax(x W_router) over E; each token picks its k largest; the expert's output
                is scaled by that probability. An expert takes at most
                C = ceil(capacity_factor · k · T / E) of the group's T tokens' assignments, first
                choices before second choices, in token order; the rest are dropped (the token's
                residual carries it on, as if that expert had returned 0)
    compute     each expert runs the dense block's MLP on the rows routed to it
    combine     each output, weighted by its gate probability, summed into its token
The auxiliary loss E · Σ_e f_e · P_e (f_e the share of the group's k·T assignments that chose e
before dropping, P_e the mean gate probability of e) is smallest when the load is even; the model's
loss adds α times its mean over groups, summed over layers.

Where the experts live is not the model's business: with `MoE.ep` unset every expert is here; expert
parallelism (`strategies.expert_parallel`) sets it to a placement that keeps E/ep experts on each rank
and carries the rows to them and back. Parameters: the dense GPT's less its L MLPs, plus per layer a
router (E·D, no bias) and E experts of the MLP's shape (`theory.experts.param_count`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F
from torch import nn

from ..theory.experts import capacity as _capacity
from .gpt import GPT, GPTConfig, init_weights


@dataclass(frozen=True)
class MoESpec:
    experts: int
    top_k: int = 1
    capacity_factor: float = 1.25
    aux_weight: float = 0.01

    def __post_init__(self):
        if isinstance(self.experts, bool) or not isinstance(self.experts, int) or self.experts < 1:
            raise ValueError(f"experts must be an integer >= 1, not {self.experts!r}")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top-k must be 1..experts ({self.experts}), not {self.top_k}")
        if self.capacity_factor <= 0:
            raise ValueError(f"capacity factor must be positive, not {self.capacity_factor}")

    def capacity(self, tokens: int) -> int:
        """C = ceil(capacity_factor · k · T / E): at most this many of T tokens' assignments per expert."""
        return _capacity(self.capacity_factor, self.top_k, tokens, self.experts)


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


# ------------------------------------------------------------------ the layer
class Expert(nn.Module):
    """One expert: the dense block's MLP (fc, GELU, fc2)."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.fc = nn.Linear(d_model, hidden)
        self.fc2 = nn.Linear(hidden, d_model)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc(x), approximate="tanh"))


class Experts(nn.ModuleDict):
    """A layer's experts by id. `expert_parallel`: its parameters are the experts', which a
    data-parallel strategy reduces and shards over the ranks that hold the same experts only."""

    expert_parallel = True


@dataclass
class LayerStats:
    """What one MoE layer's router did, group by group (the system's own counts), and with a
    placement over ranks what each forward sent and received (per forward, one micro-batch)."""
    chosen: list[list[int]] = field(default_factory=list)  # per group: assignments per expert
    kept: list[list[int]] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    sent: list[list[int]] = field(default_factory=list)      # per forward: rows sent to each expert
    received: list[list[int]] = field(default_factory=list)  # per forward: rows received from each ep rank


class MoE(nn.Module):
    """Drop-in for `models.gpt.MLP`: E experts behind a top-k router, every `group_rows`
    sequences of the input routed as one group. `ep` (None: every expert here): a placement over
    ranks (`strategies.expert_parallel.EPContext`)."""

    def __init__(self, d_model: int, hidden: int, spec: MoESpec, group_rows: int = 1, ep=None):
        super().__init__()
        self.spec, self.ep, self.group_rows = spec, ep, group_rows
        self.router = nn.Linear(d_model, spec.experts, bias=False)
        self.experts = Experts({str(e): Expert(d_model, hidden) for e in range(spec.experts)})
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
        self.keep(self.local_experts())

    def keep(self, mine: range) -> None:
        self.experts = Experts({k: v for k, v in self.experts.items() if int(k) in mine})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, D = x.shape
        flat = x.reshape(B * S, D)
        if B % self.group_rows:
            raise ValueError(f"{B} sequences do not make groups of {self.group_rows}")
        G = B // self.group_rows
        T = B * S // G
        routes = [route(self.router(flat[g * T:(g + 1) * T]), self.spec) for g in range(G)]
        for r in routes:
            self.stats.chosen.append(r.chosen)
            self.stats.kept.append(r.kept)
            self.stats.dropped.append(r.dropped)
        self.aux = torch.stack([r.aux for r in routes]).mean()
        sends = [flat[g * T:(g + 1) * T][r.token] for g, r in enumerate(routes)]  # sorted by expert
        if self.ep is None:  # every expert here: each runs on its rows of every group
            y = self._experts(torch.cat(sends), torch.cat([r.expert for r in routes]))
        else:
            y = self.ep.run(self, sends, routes)
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


# ------------------------------------------------------------------ the model
@dataclass(frozen=True)
class MoEGPTConfig(GPTConfig):
    """A GPT preset whose blocks' MLPs are mixtures of `experts` experts (top-`top_k`), each
    sequence routed as one group (module docstring)."""

    experts: int = 4
    top_k: int = 1
    capacity_factor: float = 1.25
    aux_weight: float = 0.01

    kind = "moe-gpt"

    def __post_init__(self):
        super().__post_init__()
        self.spec  # validated

    @classmethod
    def of(cls, base: GPTConfig, experts: int, top_k: int = 1, **kw) -> "MoEGPTConfig":
        if isinstance(base, MoEGPTConfig):
            raise ValueError(f"{base.name} is a mixture of experts already")
        return cls(**{f.name: getattr(base, f.name) for f in fields(GPTConfig)}, experts=experts, top_k=top_k, **kw)

    @property
    def spec(self) -> MoESpec:
        return MoESpec(self.experts, self.top_k, self.capacity_factor, self.aux_weight)

    @property
    def name(self) -> str:
        return f"{super().name} MoE(E = {self.experts}, top-{self.top_k})"

    def build(self) -> "MoEGPT":
        """Same weights on every rank: every expert built from the seed (a rank keeps its own
        later), the fc2 of every expert initialised as the dense model's residual projection."""
        model = MoEGPT(self)
        init_weights(model, self.seed)
        return model

    def param_count(self) -> int:
        from ..theory.experts import param_count

        # the closed form counts from the dense GPT's Ψ (`GPTConfig.param_count`)
        dense = GPTConfig(**{f.name: getattr(self, f.name) for f in fields(GPTConfig)})
        return sum(param_count(dense, self.experts, 1).values())

    def activation_bytes(self, *args, **kw) -> None:
        return None  # the router decides what the experts save: no closed form here

    def recompute_modules(self, model, mode):
        raise ValueError("activation recompute is not applied to mixture-of-experts blocks")


class MoEGPT(GPT):
    """zeroedu's GPT with every block's MLP a `MoE`; its loss adds the layers' auxiliary losses."""

    def __init__(self, cfg: MoEGPTConfig):
        super().__init__(cfg)
        for block in self.blocks:
            block.mlp = MoE(cfg.d_model, cfg.mlp_ratio * cfg.d_model, cfg.spec)

    def moe_layers(self) -> list[MoE]:
        return [b.mlp for b in self.blocks]

    def expert_units(self) -> list[nn.Module]:
        """The unit policy under expert parallelism: [embed, then per block what every rank holds
        (its LayerNorms, attention and router) and its experts, head]; the experts' units are
        reduced and sharded over their own group (`Experts.expert_parallel`). In model order, so
        a unit's parameters stay contiguous in `parameters()`."""
        out = [self.embed]
        for b in self.blocks:
            out += [_Shared(b.ln1, b.attn, b.ln2, b.mlp.router), b.mlp.experts]
        return out + [self.head]


class _Shared(nn.Module):
    """A block's parameters outside its experts, as one unit (a view of the block's modules: it
    is never called, so only strategies that hook no unit's forward take it)."""

    def __init__(self, *mods: nn.Module):
        super().__init__()
        self.parts = nn.ModuleList(mods)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # the mean cross-entropy, plus α · the layers' auxiliary losses of the last forward
        return GPT.loss(logits, targets) + self.cfg.aux_weight * sum(m.aux for m in self.moe_layers())


__all__ = ["Expert", "Experts", "LayerStats", "MoE", "MoEGPT", "MoEGPTConfig", "MoESpec", "Routing", "route"]
