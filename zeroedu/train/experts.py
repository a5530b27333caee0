"""Training a mixture-of-experts GPT with expert parallelism on real ranks, beside one process.

Every rank builds the same GPT whose MLPs are mixtures of E experts (`strategies.expert_parallel
.moe_gpt`), keeps its E/ep experts, and trains on its share of the batch (rows [r·B/ep, (r+1)·B/ep)).
Its loss is the mean over its tokens plus α times the layers' auxiliary losses. The step's loss is
the ranks' mean, so: the gradients of what every rank holds whole (embeddings, attention, norms,
routers) are all-reduced over ep and divided by ep; an expert's gradient already sums every rank's
tokens (the all-to-alls carried them), so it is only divided by ep. With dp groups of ep ranks
(the mesh `dp_shard` x `ep`) the experts are replicated over dp: every gradient is also summed
over dp, and the step's mean divides by ep·dp. Adam runs on what each rank
holds. One process runs the same model whole, routing the batch in ep groups (the ranks' shares),
and gets the same losses and parameters.

Measured on each rank (`EPRankResult`): the losses; the bytes sent on the ep axis in the first step
by tag (the ledger's records of the all-to-alls and the all-reduce); the router's own counts of the
first forward, per layer (assignments chosen and kept per expert, tokens dropped); the parameter
bytes it holds (the ledger's tracked storages).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import torch

from ..kinds import DP_SHARD, EP, Mesh
from ..models.gpt import GPTConfig
from ..runtime import cluster
from ..runtime.comm import Comm
from ..runtime.ledger import Ledger
from ..strategies.expert_parallel import EPContext, MoE, MoESpec, moe_gpt

TAG = "ep"
# Parameters after a few Adam steps, largest per-tensor relative difference from one process: Adam
# divides by sqrt(v), so on elements whose gradient is near 0 the ranks' round-off (sums in another
# order) becomes steps of up to ~lr; 1e-4 as for the pipeline (tests/test_pipeline.py). (With one
# intra-op thread the tests' configurations stay within 1e-5; with torch's default threads one
# reached 2.0e-5: the bound is the algorithm's, not a thread count's.)
PARAM_TOL = 1e-4


@dataclass(frozen=True)
class EPRankResult:
    rank: int
    ep_rank: int  # which experts it holds
    dp_rank: int  # which replica of the experts
    losses: list[float]
    sent_by_tag: dict[str, Fraction]  # the first step's bytes, by tag
    chosen: list[list[int]]  # per layer: this rank's assignments per expert in the first forward
    kept: list[list[int]]
    dropped: list[int]  # per layer
    kept_by_step: list[list[list[int]]]  # [step][layer]: kept assignments per expert
    param_bytes: int  # what this rank holds, from the ledger
    params: dict[str, torch.Tensor]  # this rank's parameters by name (its experts only)


@dataclass(frozen=True)
class EPReport:
    spec: MoESpec
    ep: int
    dp: int
    ranks: list[EPRankResult] = field(default_factory=list)

    @property
    def losses(self) -> list[float]:
        return [sum(r.losses[s] for r in self.ranks) / len(self.ranks) for s in range(len(self.ranks[0].losses))]

    def routed(self, layer: int, replica: int = 0) -> list[list[int]]:
        """n[s][d]: kept assignments ep rank s of dp replica `replica` sent to ep rank d's experts
        in the first forward of `layer`."""
        per = self.spec.experts // self.ep
        group = sorted((r for r in self.ranks if r.dp_rank == replica), key=lambda r: r.ep_rank)
        return [[sum(r.kept[layer][d * per:(d + 1) * per]) for d in range(self.ep)] for r in group]


def _cfg(d: dict) -> GPTConfig:
    d = dict(d)
    d.pop("kind", None)
    return GPTConfig(**d)


def _moe_layers(model) -> list[MoE]:
    return [b.mlp for b in model.blocks]


def _loss(model, x, y, spec: MoESpec):
    lm = model.loss(model(x), y)
    return lm + spec.aux_weight * sum(m.aux for m in _moe_layers(model))


def mesh(ep: int, dp: int = 1) -> Mesh:
    """dp groups of ep ranks: the experts split over ep, replicated over dp; every rank its own tokens."""
    return Mesh(((DP_SHARD, dp), (EP, ep)))


def ep_job(ctx, model: dict, spec: dict, steps: int, global_batch: int, dp: int = 1) -> dict:
    cfg, spec = _cfg(model), MoESpec(**spec)
    ledger = Ledger(ctx.rank)
    comm = Comm(ledger)
    axes = ctx.axes(mesh(ctx.world_size // dp, dp))
    axis, data = axes[EP], axes[DP_SHARD]
    ep = axis.size
    m = moe_gpt(cfg, spec, EPContext(comm, axis, TAG))
    for p in m.parameters():
        ledger.track(p, "param")
    param_bytes = ledger.bytes_by_category()["param"]
    shared = [p for n, p in m.named_parameters() if ".experts." not in n]
    experts = [p for n, p in m.named_parameters() if ".experts." in n]
    a = cfg.default_adam()
    opt = torch.optim.Adam(m.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, foreach=False)
    b = global_batch // (ep * dp)  # rank d*ep + e trains on the (d*ep + e)-th share
    losses, sent0 = [], None
    for step in range(steps):
        ledger.step = step
        x, y = cfg.batch(step, global_batch)
        x, y = x[ctx.rank * b:(ctx.rank + 1) * b], y[ctx.rank * b:(ctx.rank + 1) * b]
        loss = _loss(m, x, y, spec)
        loss.backward()
        for p in shared:  # every rank's gradient of its own loss: their mean
            comm.all_reduce(p.grad, axis, f"{TAG}/grads")
            if dp > 1:
                comm.all_reduce(p.grad, data, "dp/grads")
            p.grad /= ep * dp
        for p in experts:  # already the sum over the ep group's tokens; the dp replicas' summed
            if dp > 1:
                comm.all_reduce(p.grad, data, "dp/expert_grads")
            p.grad /= ep * dp
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if sent0 is None:
            sent0 = {}
            for r in ledger.comm:
                sent0[str(r.tag)] = sent0.get(str(r.tag), Fraction(0)) + r.sent
    layers = _moe_layers(m)
    return {"rank": ctx.rank, "ep_rank": axis.rank, "dp_rank": data.rank, "losses": losses, "sent_by_tag": sent0,
            "chosen": [lay.stats.chosen[0] for lay in layers], "kept": [lay.stats.kept[0] for lay in layers],
            "dropped": [lay.stats.dropped[0] for lay in layers],
            "kept_by_step": [[lay.stats.kept[s] for lay in layers] for s in range(steps)], "param_bytes": param_bytes,
            "params": {n: p.detach().clone() for n, p in m.named_parameters()}}


def check(model: GPTConfig, spec: MoESpec, ep: int, global_batch: int, dp: int = 1) -> None:
    """Refuse, in one line, a shape that cannot exist."""
    if spec.experts % ep:
        raise ValueError(f"expert parallelism places E/ep experts on each rank: {spec.experts} experts "
                         f"do not split over ep = {ep}")
    if global_batch % (ep * dp):
        raise ValueError(f"each of the ep x dp = {ep * dp} ranks trains on its share of the batch: "
                         f"global batch {global_batch} does not split")


def run_ep(model: GPTConfig, spec: MoESpec, ep: int, *, steps: int = 3, global_batch: int = 4,
           dp: int = 1) -> EPReport:
    """Train the MoE GPT for `steps` steps over `ep` local ranks (gloo), the experts replicated
    over `dp` such groups (ep x dp ranks)."""
    check(model, spec, ep, global_batch, dp)
    out = cluster.get_pool(ep * dp).run(ep_job, {"model": model.as_dict(), "spec": spec.__dict__, "steps": steps,
                                                 "global_batch": global_batch, "dp": dp})
    return EPReport(spec, ep, dp, [EPRankResult(**r) for r in out])


def reference(model: GPTConfig, spec: MoESpec, groups: int, steps: int, global_batch: int, replicas: int = 1
              ) -> tuple[list[float], dict[str, torch.Tensor], list[MoE]]:
    """One process, every expert, the batch routed in `groups` groups (each expert run once per
    replica's run of groups): losses, parameters, layers."""
    m = moe_gpt(model, spec, None, groups, replicas=replicas)
    a = model.default_adam()
    opt = torch.optim.Adam(m.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, foreach=False)
    losses = []
    for step in range(steps):
        x, y = model.batch(step, global_batch)
        loss = _loss(m, x, y, spec)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in m.named_parameters()}, _moe_layers(m)




# ------------------------------------------------------------------ measured beside predicted
@dataclass(frozen=True)
class EPRow:
    """One rank's first step beside the closed forms (bytes summed over the layers)."""
    rank: int
    ep_rank: int
    dp_rank: int
    experts: str  # the experts it holds, e.g. "2-3"
    tokens_dropped: int  # over the layers, this rank's tokens, first forward
    dispatch_sent: Fraction  # the dispatch all-to-all (the combine's gradient sends the same)
    predicted_dispatch: int  # from the router's actual assignment
    combine_sent: Fraction
    predicted_combine: int
    balanced: Fraction  # one all-to-all at a perfectly balanced router, times the layers
    all_to_all_sent: Fraction  # all four all-to-alls and the counts
    predicted_all_to_all: int
    reduce_sent: Fraction  # gradients' all-reduces (ep, and dp's)
    predicted_reduce: Fraction
    param_bytes: int
    predicted_param_bytes: int

    @property
    def match(self) -> bool:
        return (self.dispatch_sent, self.combine_sent, self.all_to_all_sent, self.reduce_sent, self.param_bytes) == \
            (self.predicted_dispatch, self.predicted_combine, self.predicted_all_to_all, self.predicted_reduce,
             self.predicted_param_bytes)


@dataclass(frozen=True)
class EPComparison:
    model: str
    spec: MoESpec
    ep: int
    dp: int
    steps: int
    global_batch: int
    capacity: int  # per expert, of one rank's tokens
    rows: list[EPRow]
    losses: list[float]
    reference_losses: list[float]
    param_error: float
    same_routing_steps: int  # leading steps whose routing (kept per expert, every rank and layer) equals one process's

    @property
    def losses_match(self) -> bool:
        return all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(self.losses, self.reference_losses))

    @property
    def routing_match(self) -> bool:
        return self.same_routing_steps == self.steps

    @property
    def match(self) -> bool:
        # Routing is discrete: once round-off (~1e-7 after a step) tips a near-tied choice, the two runs
        # train on different assignments and their parameters part by more than round-off. Parameters
        # are compared while the routing is the same; a diverged routing is reported, not hidden.
        return self.losses_match and all(r.match for r in self.rows) and \
            (self.param_error <= PARAM_TOL or not self.routing_match)


def compare(model: GPTConfig, spec: MoESpec, ep: int, *, dp: int = 1, steps: int = 3,
            global_batch: int = 4) -> EPComparison:
    """Run expert parallelism and the same MoE in one process; every figure beside its closed form."""
    from ..strategies.expert_parallel import balanced_bytes, param_count, theory_bytes
    from .pipeline import parameter_error

    check(model, spec, ep, global_batch, dp)
    ref_losses, ref_params, ref_layers = reference(model, spec, ep * dp, steps, global_batch, replicas=dp)
    rep = run_ep(model, spec, ep, steps=steps, global_batch=global_batch, dp=dp)
    counts = param_count(model, spec.experts, ep)
    L, per = model.n_layers, spec.experts // ep
    tokens = global_batch // (ep * dp) * model.seq_len
    reduce = 4 * counts["shared"] * Fraction(2 * (ep - 1), ep) \
        + 4 * (counts["shared"] + counts["experts"]) * Fraction(2 * (dp - 1), dp)
    rows, err = [], 0.0
    for r in rep.ranks:
        want = [theory_bytes(rep.routed(i, r.dp_rank), r.ep_rank, model.d_model, spec.experts) for i in range(L)]
        s = r.sent_by_tag
        a2a = sum(v for k, v in s.items() if k.startswith(f"{TAG}/") and k != f"{TAG}/grads")
        rows.append(EPRow(
            r.rank, r.ep_rank, r.dp_rank, f"{r.ep_rank * per}-{(r.ep_rank + 1) * per - 1}", sum(r.dropped),
            s.get(f"{TAG}/dispatch", Fraction(0)), sum(w["dispatch"] for w in want),
            s.get(f"{TAG}/combine", Fraction(0)), sum(w["combine"] for w in want),
            L * balanced_bytes(tokens, spec.top_k, model.d_model, ep),
            a2a, sum(sum(w.values()) for w in want),
            s.get(f"{TAG}/grads", Fraction(0)) + s.get("dp/grads", Fraction(0)) + s.get("dp/expert_grads", Fraction(0)),
            reduce, r.param_bytes, 4 * (counts["shared"] + counts["experts"])))
        err = max(err, parameter_error(r.params, {n: ref_params[n] for n in r.params}, model.d_model))
    groups = ep * dp
    same = 0
    while same < steps and all(r.kept_by_step[same][i] == lay.stats.kept[same * groups + r.rank]
                               for r in rep.ranks for i, lay in enumerate(ref_layers)):
        same += 1
    return EPComparison(model.name, spec, ep, dp, steps, global_batch, spec.capacity(tokens), rows, rep.losses,
                        ref_losses, err, same)


__all__ = ["EPComparison", "EPRankResult", "EPReport", "EPRow", "check", "compare", "ep_job", "mesh", "reference",
           "run_ep"]
