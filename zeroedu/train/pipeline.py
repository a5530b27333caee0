"""A GPT trained on a pipeline of real ranks (`strategies.pipeline`), measured beside the closed
forms (`theory.pipeline`) and beside the same training in one process.

`pipeline_job` runs on every rank of a world of p ranks, one stage each, on a mesh whose `pp`
axis is the world: m micro-batches per step in the chosen schedule, then each stage's Adam step
(torch's, on the stage's parameters: Adam is elementwise, so a stage's step is the whole model's
step restricted to its parameters). It returns, per stage: the loss (last stage), the stage's
parameters by their names in the full model, and for the last step the bytes the stage sent on
the pp axis (the ring model's records and the kernel's counters), the most activation bytes it
held (the ledger, at each micro-batch's forward end), each beside its closed form.
`reference` is the same training in one process: the whole GPT, the whole batch; `run` launches
the ranks, sets each stage beside its closed forms (`StageReport`) and the losses beside one
process's (`PipelineReport`); ``zeroedu pipeline`` prints it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..kinds import DP_SHARD, PP, EventKind, Mesh
from ..models import GPTConfig, get_model, local_slice, unit_shapes
from ..optim import AdamConfig
from ..runtime.comm import Comm
from ..runtime.ledger import Ledger
from ..runtime.wire import FRAMING_PER_MESSAGE
from ..strategies import strategy_class
from ..strategies.base import DistState
from ..strategies.pipeline import EmulatedCompute, Pipeline
from ..theory import comm as theory_comm
from ..theory import pipeline as theory
from ..theory.pipeline import BACKWARD, FORWARD


def _micro(model: GPTConfig, step: int, global_batch: int, m: int, data_rank: int = 0,
           dp: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This replica's slice of the step's global batch (`data_rank` of `dp`), in m micro-batches."""
    x, y = model.batch(step, global_batch)
    sl = local_slice(global_batch, dp, data_rank)
    return [(a.clone(), b.clone()) for a, b in zip(x[sl].chunk(m), y[sl].chunk(m))]


def check(model: GPTConfig, p: int, m: int, schedule: str, global_batch: int) -> None:
    """Refuse, with one line, a pipeline that cannot exist."""
    if not isinstance(model, GPTConfig):
        raise ValueError(f"a pipeline cuts a GPT's blocks into stages: {model.name} is not a gpt-* model")
    if schedule not in theory.SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(theory.SCHEDULES)}, got {schedule!r}")
    if model.n_layers % p:
        raise ValueError(f"{model.n_layers} layers do not split into {p} equal stages")
    if global_batch % m:
        raise ValueError(f"the global batch {global_batch} does not split into {m} micro-batches")


@dataclass(frozen=True)
class Work:
    """One action of a stage, read from its timeline's marks: forward ("F") or backward ("B") of
    micro-batch `micro`, from `start` to `end` in seconds on the machine's monotonic clock (every
    rank of a local pool reads the same clock, so stages line up)."""
    stage: int
    what: str
    micro: int
    start: float
    end: float


_BEGIN = {EventKind.MICRO_FORWARD_BEGIN: FORWARD, EventKind.MICRO_BACKWARD_BEGIN: BACKWARD}
_END = {EventKind.MICRO_FORWARD_END: FORWARD, EventKind.MICRO_BACKWARD_END: BACKWARD}


def stage_work(ledger: Ledger, stage: int, step: int) -> list[Work]:
    """The stage's actions in `step`, from the begin and end marks its pipeline left."""
    open_, out = {}, []
    for e in ledger.marks:
        if e.step != step:
            continue
        if e.kind in _BEGIN:
            open_[_BEGIN[e.kind], e.micro] = e.t
        elif e.kind in _END:
            what = _END[e.kind]
            out.append(Work(stage, what, e.micro, ledger.t0 + open_.pop((what, e.micro)), ledger.t0 + e.t))
    return out


def measured_bubble(work: list[list[Work]]) -> list[float]:
    """Each stage's idle fraction of the step: 1 - (its actions' time) / (the step's span, from the
    first action's start on any stage to the last one's end)."""
    t0 = min(w.start for ws in work for w in ws)
    t1 = max(w.end for ws in work for w in ws)
    return [1.0 - sum(w.end - w.start for w in ws) / (t1 - t0) for ws in work]


@dataclass
class StageReport:
    """One stage's last step: bytes it sent on the pp axis (the records, the kernel's count) and
    the most activation bytes it held, each beside its closed form."""
    stage: int
    layers: tuple[int, int]  # the blocks it runs, [first, last)
    sent: float
    predicted_sent: int
    wire: int | None  # None where the kernel's counters cannot be read (NCCL)
    messages: int
    peak_activations: int
    predicted_peak_activations: int
    in_flight: int
    rank: int = 0
    dp_sent: dict[str, float] = field(default_factory=dict)  # on dp_shard, by collective (the records)
    predicted_dp_sent: dict[str, float] = field(default_factory=dict)  # `theory.exact_comm` for the stage
    work: list[Work] = field(default_factory=list)  # the last step's actions, from the timeline

    @property
    def match(self) -> bool:
        wire_ok = self.wire is None or self.wire == self.sent + FRAMING_PER_MESSAGE * self.messages
        return (self.sent == self.predicted_sent and wire_ok and self.dp_sent == self.predicted_dp_sent
                and self.peak_activations == self.predicted_peak_activations)


@dataclass
class PipelineReport:
    model: str
    stages: int
    microbatches: int
    schedule: str
    dp: int
    strategy: str | None
    steps: int
    global_batch: int
    per_stage: list[StageReport]
    losses: list[float]
    reference_losses: list[float]
    bubble: float  # (p-1)/(m+p-1), the closed form
    compute: tuple[float, float] | None = None  # the emulated device's (t_f, t_b), or None: real compute
    param_error: float = 0.0  # the largest relative difference of a trained tensor from one process's


    @property
    def measured_bubble(self) -> list[float]:
        """Each pipeline stage's idle fraction of the last step (the first replica of each stage)."""
        first = {}
        for st in self.per_stage:
            first.setdefault(st.stage, st.work)
        return measured_bubble([first[s] for s in sorted(first)])

    @property
    def losses_match(self) -> bool:
        return all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(self.losses, self.reference_losses, strict=True))


def pipeline_job(ctx, model: dict, schedule: str, microbatches: int, steps: int, global_batch: int,
                 lr: float, dp: int = 1, strategy: str | None = None, compute: list[float] | None = None) -> dict:
    """One stage of a pipeline of world / dp stages; with `strategy`, each stage data-parallel over
    the dp ranks that hold it (a (pp, dp_shard) mesh: pp outer, the stage's replicas contiguous).
    `compute`: (t_f, t_b) of an emulated device (`strategies.pipeline.EmulatedCompute`)."""
    cfg = get_model(model)
    if ctx.world_size % dp:
        raise ValueError(f"dp = {dp} must divide the world size {ctx.world_size}")
    p, m = ctx.world_size // dp, microbatches
    check(cfg, p, m, schedule, global_batch // dp)
    if dp > 1 and strategy is None:
        raise ValueError("a stage on more than one rank is data parallel: name its strategy")
    mesh = Mesh(((PP, p), (DP_SHARD, dp)))
    axes = ctx.axes(mesh)
    axis = axes[PP]
    ledger = Ledger(ctx.rank, wire=ctx.wire, mesh=mesh)
    comm = Comm(ledger, "auto", ctx.backend, ctx.wire)
    wrap, shapes = None, []
    if strategy is not None:
        def wrap(stage):
            shapes.append(unit_shapes(stage))  # the stage's own shapes, before the strategy shards them
            dist = DistState(ctx.rank, ctx.world_size, ctx.device, axes[DP_SHARD], comm, ledger, mesh=mesh, axes=axes)
            return strategy_class(strategy)(stage, dist, "fp32", AdamConfig(lr=lr))
    pipe = Pipeline(cfg.build(), axis, comm, ledger, schedule, data_parallel=wrap,
                    compute=EmulatedCompute(*compute) if compute is not None else None)
    opt = torch.optim.Adam(pipe.stage.params, lr=lr) if strategy is None else None
    d = mesh.data_rank(ctx.rank)
    losses = []
    for step in range(steps):
        micro = _micro(cfg, step, global_batch, m, d, dp)
        ledger.begin_step(step)
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        losses.append(pipe.forward_backward(micro))
        if opt is not None:
            opt.step()
        else:
            pipe.strategy.step()
        ledger.end_step()
    last, s = steps - 1, axis.rank
    b, elem = global_batch // dp // m, pipe.dtype.itemsize
    ln_stats = 4 if ctx.device.startswith("cuda") else None
    wire = ledger.wire_report()
    dp_sent: dict[str, float] = {}
    for r in ledger.comm:
        if r.step == last and r.axis == DP_SHARD and r.sent:
            dp_sent[r.op] = dp_sent.get(r.op, 0.0) + float(r.sent)
    predicted_dp = ({} if strategy is None else
                    {k: float(v) for k, v in theory_comm.exact_comm(strategy, shapes[0], dp, recipe="fp32",
                                                                    micro_batches=m).by_collective().items() if v})
    report = StageReport(
        stage=s, layers=(pipe.stage_layers.start, pipe.stage_layers.stop),
        sent=float(sum(r.sent for r in ledger.comm if r.step == last and r.axis == PP)),
        predicted_sent=theory.stage_sent_bytes(b, cfg.seq_len, cfg.d_model, elem, p, m, s),
        wire=None if wire.sent is None else wire.by_axis.get(PP, 0),
        messages=sum(1 for r in ledger.comm if r.step == last and r.axis == PP and r.op == "send"),
        peak_activations=max(e.bytes["activation"] for e in ledger.events
                             if e.step == last and e.kind == EventKind.FORWARD_END),
        predicted_peak_activations=theory.peak_activation_bytes(schedule, cfg, b, elem, p, m, s, ln_stats),
        in_flight=theory.in_flight(schedule, p, m, s), rank=ctx.rank, dp_sent=dp_sent, predicted_dp_sent=predicted_dp,
        work=stage_work(ledger, s, last))
    params = pipe.stage.params if strategy is None else pipe.strategy.full_parameters()
    return {"stage": report, "names": pipe.stage.names, "params": [q.detach().clone() for q in params],
            "losses": losses if pipe.stage.last else None}


def parameter_error(trained: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], d_model: int) -> float:
    """The largest per-tensor relative difference (norm of the difference over the reference's norm)
    between trained parameters and one process's. The key third of each attention bias is left
    out: its true gradient is 0 (softmax ignores a constant added to every key's score), so Adam
    steps on round-off there, up to lr per step of either sign, in one process and on ranks alike."""
    worst = 0.0
    for n, q in trained.items():
        want = ref[n]
        if n.endswith("attn.qkv.bias"):
            q, want = torch.cat([q[:d_model], q[2 * d_model:]]), torch.cat([want[:d_model], want[2 * d_model:]])
        worst = max(worst, ((q - want).norm() / want.norm()).item())
    return worst


def reference(model: GPTConfig, steps: int, global_batch: int, lr: float) -> tuple[list[float], dict]:
    """The same training in one process: losses and the final parameters by name."""
    gpt = model.build()
    opt = torch.optim.Adam(gpt.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = model.batch(step, global_batch)
        opt.zero_grad(set_to_none=True)
        loss = gpt.loss(gpt(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {n: q.detach().clone() for n, q in gpt.named_parameters()}


def run(model: GPTConfig | str, stages: int, microbatches: int, schedule: str = theory.ONE_F_ONE_B,
        steps: int = 3, global_batch: int | None = None, lr: float | None = None, dp: int = 1,
        strategy: str | None = None, timeout: float | None = None,
        compute: tuple[float, float] | None = None) -> PipelineReport:
    """Train `model` on `stages` x `dp` local ranks, one stage each (with `strategy`, each stage
    data-parallel over its `dp` ranks), beside one process. `compute`: (t_f, t_b) seconds per
    micro-batch of an emulated device, for timing the bubble (`EmulatedCompute`)."""
    if compute is not None:
        EmulatedCompute(*compute)  # refused here, before any rank starts
    from ..runtime import cluster

    cfg = get_model(model)
    batch = global_batch if global_batch is not None else cfg.default_global_batch
    if batch % dp:
        raise ValueError(f"the global batch {batch} does not split over dp = {dp} replicas")
    check(cfg, stages, microbatches, schedule, batch // dp)
    if dp > 1 and strategy is None:
        raise ValueError("a stage on more than one rank is data parallel: name its strategy (--strategy)")
    lr = lr if lr is not None else cfg.default_adam().lr
    ranks = cluster.run("zeroedu.train.pipeline:pipeline_job", stages * dp, {
        "model": cfg.as_dict(), "schedule": schedule, "microbatches": microbatches, "steps": steps,
        "global_batch": batch, "lr": lr, "dp": dp, "strategy": strategy,
        "compute": list(compute) if compute is not None else None}, timeout=timeout)
    ref_losses, ref_params = reference(cfg, steps, batch, lr)
    trained = {}
    for r in ranks:  # the first replica of each stage
        for n, q in zip(r["names"], r["params"]):
            trained.setdefault(n, q)
    per = [r["stage"] for r in ranks]
    last = [r["losses"] for r in ranks if r["losses"] is not None]  # one per replica of the last stage
    losses = [sum(v) / len(last) for v in zip(*last)]
    return PipelineReport(cfg.name, stages, microbatches, schedule, dp, strategy, steps, batch, per, losses,
                          ref_losses, float(theory.bubble_fraction(stages, microbatches)),
                          tuple(compute) if compute is not None else None,
                          parameter_error(trained, ref_params, cfg.d_model))
