"""Training a GPT with context parallelism on real ranks, beside one process.

The cp ranks hold one replica each (parameters replicated, as data parallelism does) but split
every sequence (and dp such groups split the batch: the mesh `dp_shard` x `cp`): rank r keeps the positions `strategies.context_parallel.chunks` gives it (plain
or zig-zag), embeds them with their own rows of the position table, runs every block with its
attention core swapped for ring attention (`RingAttentionCore`), and takes the mean loss over its
own tokens. Each rank holds the same number of tokens, so the mean over the whole batch is the mean
of the ranks' means: the gradients are all-reduced (SUM) over cp and divided by cp, and Adam runs
on every rank alike. The result equals one process training on the whole sequences.

What the job measures on each rank (`CPRankResult`): the loss of each step, the bytes it sent on
the cp axis by tag (the ledger's records: ring K/V forward, K/V with their gradients backward,
the gradients' way home, the parameter gradients' all-reduce), the activation bytes autograd
saved in the first forward (the ledger's `saving_activations`), the score elements its ring
attention computed (counted from the tensors multiplied), and the wall time of its attention
compute (forward, all steps; the causal imbalance shows in it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import torch

from ..kinds import CP, DP_SHARD, EventKind, Mesh
from ..models.gpt import GPTConfig
from ..runtime import cluster
from ..runtime.comm import Comm
from ..runtime.ledger import Ledger
from ..runtime.rank import resolve_ref
from ..strategies.context_parallel import RingAttentionCore, RingContext, RingStats, chunks

TAG = "cp"
PARAM_TOL = 1e-4  # as for the pipeline: Adam turns round-off on near-zero gradients into ~lr steps


@dataclass(frozen=True)
class CPRankResult:
    rank: int
    cp_rank: int  # place on the cp axis (which positions it holds)
    dp_rank: int  # place on the dp axis (which sequences)
    losses: list[float]
    sent_by_tag: dict[str, Fraction]  # bytes per step (the first step), by tag
    activation_bytes: int  # saved for backward in the first forward
    forward_elements: int  # score elements ring attention computed in the first forward, all layers
    attention_seconds: float  # wall time of ring attention's forward compute, all steps and layers (sends excluded)
    overlap: list[tuple[float, float, float, float]]  # first forward, each hop: (K/V sends issued, waited for,
    #                                                   the block computed meanwhile: start, end), ledger clock
    params: list[torch.Tensor] | None  # rank 0 only
    grads: list[torch.Tensor] | None  # rank 0 only: the first step's gradients, reduced over cp


@dataclass(frozen=True)
class CPReport:
    cp: int
    zigzag: bool
    dp: int
    ranks: list[CPRankResult] = field(default_factory=list)

    @property
    def losses(self) -> list[float]:
        """The global mean loss of each step: the mean of the ranks' means (equal token counts)."""
        return [sum(r.losses[s] for r in self.ranks) / len(self.ranks) for s in range(len(self.ranks[0].losses))]


def _cfg(d: dict) -> GPTConfig:
    d = dict(d)
    d.pop("kind", None)
    return GPTConfig(**d)


def mesh(cp: int, dp: int = 1) -> Mesh:
    """dp replicas (each its share of the batch) of cp ranks that split every sequence."""
    return Mesh(((DP_SHARD, dp), (CP, cp)))


def cp_job(ctx, model: dict, zigzag: bool, steps: int, global_batch: int, dp: int = 1, ring_class: str = "") -> dict:
    """One rank of a context-parallel run: world = dp x cp, cp innermost; `ring_class` (a
    "module:Class" subclass of `RingContext`, e.g. a find-the-bug variant) replaces the ring."""
    cfg = _cfg(model)
    ledger = Ledger(ctx.rank)
    comm = Comm(ledger)
    axes = ctx.axes(mesh(ctx.world_size // dp, dp))
    axis, data = axes[CP], axes[DP_SHARD]
    cp = axis.size
    b = global_batch // dp
    stats = RingStats()
    ring = (resolve_ref(ring_class) if ring_class else RingContext)(comm, axis, cfg.seq_len, zigzag, tag=TAG, stats=stats)
    m = cfg.build()
    for p in m.parameters():  # model states: what autograd saves of them is not an activation
        ledger.track(p, "param")
    for block in m.blocks:
        block.attn.core = RingAttentionCore(ring)
    mine = ring.my_chunks()
    idx = torch.tensor([p for c in mine for p in c], dtype=torch.long)

    def embed(tokens, e=m.embed):
        # this rank's rows of the position table: slices, concatenated (saves nothing)
        return e.tok(tokens) + torch.cat([e.pos.weight[c.start:c.stop] for c in mine])

    m.embed.forward = embed
    a = cfg.default_adam()
    opt = torch.optim.Adam(m.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, foreach=False)
    losses, activation, elements, sent0, grads0, overlap = [], None, None, None, None, []
    for step in range(steps):
        ledger.step = step
        x, y = cfg.batch(step, global_batch)
        rows = slice(data.rank * b, (data.rank + 1) * b)  # this replica's sequences, its positions
        x, y = x[rows][:, idx].contiguous(), y[rows][:, idx].contiguous()
        with ledger.saving_activations():
            loss = m.loss(m(x), y)
            ev = ledger.event(EventKind.FORWARD_END)
        if activation is None:
            activation = ledger.timeline().events[-1].bytes["activation"] if ev is None else ev.bytes["activation"]
            elements = stats.forward_elements
            sends = [r for r in ledger.comm if r.tag == f"{TAG}/kv" and r.op == "send"]
            overlap = [(min(a.t_start, b.t_start), min(a.waited, b.waited), c0, c1)
                       for (a, b), (c0, c1) in zip(zip(sends[::2], sends[1::2]), stats.compute_spans)]
        loss.backward()
        for p in m.parameters():  # the mean over cp and dp of the ranks' gradients of their own means
            comm.all_reduce(p.grad, axis, f"{TAG}/grads")
            if dp > 1:
                comm.all_reduce(p.grad, data, "dp/grads")
            p.grad /= cp * dp
        if step == 0 and ctx.rank == 0:
            grads0 = [p.grad.detach().clone() for p in m.parameters()]
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if sent0 is None:
            sent0 = {}
            for r in ledger.comm:
                if r.step == 0:
                    sent0[str(r.tag)] = sent0.get(str(r.tag), Fraction(0)) + r.sent
    params = [p.detach().clone() for p in m.parameters()] if ctx.rank == 0 else None
    return {"overlap": overlap, "rank": ctx.rank, "cp_rank": axis.rank, "dp_rank": data.rank, "losses": losses, "sent_by_tag": sent0, "activation_bytes": activation,
            "forward_elements": elements, "attention_seconds": stats.forward_seconds, "params": params, "grads": grads0}


def run_cp(model: GPTConfig, cp: int, *, zigzag: bool = False, steps: int = 3, global_batch: int = 4,
           dp: int = 1, ring_class: str = "") -> CPReport:
    """Train `model` for `steps` steps with context parallelism over `cp` local ranks (gloo), and
    data parallelism over `dp` such groups (dp x cp ranks); `ring_class`: see `cp_job`."""
    if model.attention != "eager":
        raise ValueError("context parallelism replaces the attention core: build the GPT with attention='eager'")
    chunks(model.seq_len, cp, 0, zigzag)  # refuses a sequence that does not split, in the parent
    if global_batch % dp:
        raise ValueError(f"each of the dp = {dp} replicas trains on its share of the batch: "
                         f"global batch {global_batch} does not split")
    if ring_class and not (isinstance(cls := resolve_ref(ring_class), type) and issubclass(cls, RingContext)):
        raise ValueError(f"{ring_class} is not a subclass of RingContext")
    out = cluster.get_pool(cp * dp).run(cp_job, {"model": model.as_dict(), "zigzag": zigzag, "steps": steps,
                                                 "global_batch": global_batch, "dp": dp,
                                                 "ring_class": ring_class})
    return CPReport(cp, zigzag, dp, [CPRankResult(**r) for r in out])


def reference(model: GPTConfig, steps: int, global_batch: int
              ) -> tuple[list[float], list[torch.Tensor], list[torch.Tensor]]:
    """One process, whole sequences, the same Adam: losses, final parameters, the first step's gradients."""
    m = model.build()
    a = model.default_adam()
    opt = torch.optim.Adam(m.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, foreach=False)
    losses, grads0 = [], None
    for step in range(steps):
        x, y = model.batch(step, global_batch)
        loss = m.loss(m(x), y)
        loss.backward()
        if grads0 is None:
            grads0 = [p.grad.detach().clone() for p in m.parameters()]
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in m.parameters()], grads0





# ------------------------------------------------------------------ measured beside predicted
@dataclass(frozen=True)
class CPRow:
    """One rank's measurements beside their closed forms (first step; bytes summed over the layers)."""
    rank: int
    cp_rank: int
    dp_rank: int
    positions: str  # the runs of positions it holds, e.g. "0-7,24-31"
    forward_sent: Fraction  # K, V around the ring
    predicted_forward: int
    backward_sent: Fraction  # K, V with dK, dV, and dK, dV home
    predicted_backward: int
    grads_sent: Fraction  # the parameter gradients' all-reduces (cp and dp)
    predicted_grads: Fraction
    activation_bytes: int
    predicted_activations: int
    score_elements: int
    predicted_score_elements: int
    attention_seconds: float

    @property
    def match(self) -> bool:
        return (self.forward_sent, self.backward_sent, self.grads_sent, self.activation_bytes, self.score_elements) == \
            (self.predicted_forward, self.predicted_backward, self.predicted_grads, self.predicted_activations,
             self.predicted_score_elements)


@dataclass(frozen=True)
class CPComparison:
    model: str
    cp: int
    zigzag: bool
    dp: int
    steps: int
    global_batch: int
    rows: list[CPRow]
    losses: list[float]
    reference_losses: list[float]
    param_error: float  # largest per-tensor relative difference from one process (`pipeline.parameter_error`)

    @property
    def losses_match(self) -> bool:
        return all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(self.losses, self.reference_losses))

    @property
    def match(self) -> bool:
        return self.losses_match and self.param_error <= PARAM_TOL and all(r.match for r in self.rows)


def compare(model: GPTConfig, cp: int, *, zigzag: bool = False, dp: int = 1, steps: int = 3,
            global_batch: int = 4, ring_class: str = "") -> CPComparison:
    """Run context parallelism and one process; every figure beside its closed form (the closed
    forms are the algorithm's, whatever `ring_class` runs)."""
    from ..strategies.context_parallel import theory_bytes, work_elements
    from ..theory.activations import gpt_activation_bytes
    from .pipeline import parameter_error

    rep = run_cp(model, cp, zigzag=zigzag, steps=steps, global_batch=global_batch, dp=dp, ring_class=ring_class)
    ref_losses, ref_params, _ = reference(model, steps, global_batch)
    names = [n for n, _ in model.build().named_parameters()]
    L, H = model.n_layers, model.n_heads
    b = global_batch // dp
    per_layer = theory_bytes(b, H, model.seq_len, model.d_model // H, cp)
    psi = 4 * model.param_count()
    grads = psi * Fraction(2 * (cp - 1), cp) + psi * Fraction(2 * (dp - 1), dp)
    rows = []
    for r in rep.ranks:
        s = r.sent_by_tag
        runs = chunks(model.seq_len, cp, r.cp_rank, zigzag)
        rows.append(CPRow(
            r.rank, r.cp_rank, r.dp_rank, ",".join(f"{c.start}-{c.stop - 1}" for c in runs),
            s.get(f"{TAG}/kv", Fraction(0)), L * per_layer["forward"],
            s.get(f"{TAG}/kv_grads", Fraction(0)) + s.get(f"{TAG}/dkv_home", Fraction(0)), L * per_layer["backward"],
            s.get(f"{TAG}/grads", Fraction(0)) + s.get("dp/grads", Fraction(0)), grads,
            r.activation_bytes, gpt_activation_bytes(model, b, model.seq_len // cp, 4, attention="fused"),
            r.forward_elements, L * work_elements(b, H, model.seq_len, cp, r.cp_rank, zigzag), r.attention_seconds))
    err = parameter_error(dict(zip(names, rep.ranks[0].params)), dict(zip(names, ref_params)), model.d_model)
    return CPComparison(model.name, cp, zigzag, dp, steps, global_batch,
                        rows, rep.losses, ref_losses, err)
__all__ = ["CPComparison", "CPRankResult", "CPReport", "CPRow", "compare", "cp_job", "mesh", "reference", "run_cp"]
