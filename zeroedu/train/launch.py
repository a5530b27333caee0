"""Train a strategy for K steps on real ranks and assemble the report the CLI prints and the
notebooks plot.

`train_job` runs on every rank (through `runner`) and returns plain data: the local losses,
the ledger's measurement (model states at the optimizer step, comm of the last step), the
closed-form prediction for this rank, the peak and the timeline. `run` launches it and
`assemble` sets the ranks' results beside the single-process reference (`reference`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from .. import theory
from ..models import check_trainable
from ..recipes import get_recipe, loss_bound
from ..reports import Match, Predicted, RankReport, RunReport, vouch
from ..runtime import analysis, cluster, matmul16
from ..runtime.comm import resolve_implementation
from ..runtime.cuda import cuda_memory
from ..runtime.links import Links
from ..runtime.wire import FRAMING_PER_MESSAGE
from ..strategies.splits import split_of
from ..theory import comm as theory_comm
from ..theory import schedule
from .config import ResolvedConfig, RunConfig, config_from_dict, config_to_dict, resolve
from .reference import recipe_losses, reference
from .runner import build_run, strategy_cls, train_steps


def predicted(cfg: RunConfig | ResolvedConfig, rank: int, backend: str = "gloo", device: str = "cpu") -> Predicted:
    """The closed forms, exact mode, for this model and this rank, on `backend` (the transport
    the ranks' collectives run on: it decides "auto" collectives and the wire's algorithm) and
    `device` (LayerNorm statistics are fp32 on CUDA). (A run with expert parallelism is
    predicted on its ranks: the all-to-alls' bytes follow the router's counts.)"""
    return _predicted(resolve(cfg), rank, backend, device)


def _predicted(cfg: ResolvedConfig, rank: int, backend: str, device: str, observed=None) -> Predicted:
    # A rank's configuration is the parent's, resolved already: `train_job` comes here directly.
    # `observed`: what the split read of the run on this rank (`Split.observe`).
    ln_stats = 4 if device.startswith("cuda") else None  # LayerNorm statistics are fp32 on CUDA
    ms, comm = _states_and_comm(cfg, rank, observed)
    activations = split_of(cfg.mesh).activation_bytes(cfg, get_recipe(cfg.recipe).param_bytes, ln_stats, rank,
                                                      observed)
    # On the wire: the ring model's bytes, with gloo's own reduce-scatter at all-reduce cost
    # when the backend's collectives run (`theory.comm.on_the_wire`).
    implementation = resolve_implementation(cfg.collectives, backend)
    return Predicted(
        **ms.as_dict(),  # param, grad, optim, total, optim_detail
        wire=float(theory_comm.on_the_wire(comm, implementation, backend)),
        activations=activations,
        comm={k: float(v) for k, v in sorted(comm.by_collective().items()) if v},
        comm_by_axis={a: {k: float(v) for k, v in sorted(c.items()) if v}
                      for a, c in sorted(comm.items()) if any(c.values())})


def predicted_comm(cfg: RunConfig | ResolvedConfig, rank: int) -> theory_comm.CommBytes:
    """This rank's collectives per step as the closed forms list them (`CommBytes.ops`: each call's
    axis, collective, size and group), whose bytes `predicted` sums."""
    return _states_and_comm(resolve(cfg), rank, None)[1]


def _states_and_comm(cfg: ResolvedConfig, rank: int, observed):
    elem = get_recipe(cfg.recipe).param_bytes
    split = split_of(cfg.mesh)  # how a replica is split over the model axes (none: WHOLE)
    # Each group of units with the group it is reduced over (one, but for ep's experts); the
    # closed forms index a rank by its place in that group.
    ms, ops, axes = theory.ModelStates(), [], ()
    for g in split.unit_groups(cfg, rank):
        ms = ms + theory.exact_model_states(cfg.strategy, g.shapes, g.n, cfg.m, rank=g.rank, recipe=cfg.recipe,
                                            trainable=g.trainable)
        c = theory.exact_comm(cfg.strategy, g.shapes, g.n, cfg.m, recipe=cfg.recipe, trainable=g.trainable,
                              **theory_comm_options(cfg))
        ops += c.ops
        axes += tuple(a for a in c if a not in axes)
    # a model axis's collectives beside the data-parallel ones, on the axis they run on
    return ms, theory_comm.CommBytes(ops + split.ops(cfg, elem, rank, observed), axes)


def theory_comm_options(cfg: ResolvedConfig) -> dict:
    opts = {"micro_batches": cfg.micro_batches, "clip": cfg.clip_grad_norm is not None}
    if "reshard_after_forward" in cfg.options:
        opts["reshard_after_forward"] = cfg.options["reshard_after_forward"]
    return opts


def train_job(ctx, cfg: dict) -> dict:
    """Runs on every rank. `cfg` is the parent's ResolvedConfig as a dict (plain data crosses the
    process boundary); the rank reads it as it is, never resolving it again."""
    cfg = config_from_dict(cfg)
    run_ = build_run(ctx, cfg, sink=ctx.emit if cfg.stream else None)
    ledger, strategy = run_.ledger, run_.strategy
    losses = train_steps(run_)
    ledger.step = cfg.steps - 1
    out = {
        "rank": ctx.rank,
        "backend": ctx.backend,
        "matmul16": matmul16.mode_for(get_recipe(cfg.recipe).param),
        "measured": ledger.measured(),
        "predicted": _predicted(cfg, ctx.rank, ctx.backend, ctx.device, observed := split_of(cfg.mesh).observe(run_)),
        "peak": ledger.peak,
        "peak_label": ledger.peak_label,
        "losses": losses,
        "timeline": ledger.timeline(),
        "wire": ledger.wire_report(),
        "time": ledger.time_report().plain(),
    }
    if ctx.device.startswith("cuda"):
        # The allocator's and the device's own counts, beside the ledger's peak (`CudaMemory`).
        out["cuda"] = cuda_memory(ctx.device)
    if observed is not None:  # the axis's own record of the run (the router's counts, the ring's work)
        out[observed.REPORT_FIELD] = observed.plain()
    extra = strategy.report_extra()
    if extra is not None:
        out["extra"] = extra
    params = strategy.full_parameters()  # a collective for sharded strategies: every rank calls it
    if cfg.return_params:
        out["params"] = params
    return out


def run(cfg: RunConfig | ResolvedConfig, *, pool: cluster.Pool | None = None, on_event: Callable | None = None,
        warm: bool = True, timeout: float | None = None, predict: bool = False) -> RunReport:
    """Train on `cfg.world_size` real ranks; return the report (see README, "JSON report").
    The configuration is resolved here, once (a `ResolvedConfig` is taken as it is).

    `predict` (a run on emulated links): first a calibration run, the same configuration on
    links that cost nothing (`Links.instant`), then the run; each rank's `time.predicted` is the
    calibration's schedule replayed on the links (`predict_time`), beside `time.steps` measured."""
    cfg = resolve(cfg)
    check_trainable(cfg.model.build(), strategy_cls(cfg).TRAINS_FROZEN)  # before any rank starts
    if predict and cfg.links is None:
        raise ValueError("a step-time prediction replays the run's schedule on its emulated links: "
                         "give the run links (RunConfig(links=...), --link)")
    calibration = None
    if predict:
        calibration = _ranks(replace(cfg, links=cfg.links.instant(), stream=False, return_params=False),
                             pool, None, warm, timeout)
    if on_event is not None:
        cfg = replace(cfg, stream=True)
    report = assemble(cfg, _ranks(cfg, pool, on_event, warm, timeout))
    if calibration is not None:
        run_level = ("backend", "matmul16")  # what `assemble` takes off a rank's result for the run
        predict_time(report, [RankReport.from_plain({k: v for k, v in r.items() if k not in run_level})
                              for r in calibration])
    return report


def _ranks(cfg: ResolvedConfig, pool, on_event, warm, timeout) -> list[dict]:
    payload = {"cfg": config_to_dict(cfg)}
    if pool is not None:
        return pool.run(train_job, payload, on_event=on_event, timeout=timeout)
    return cluster.run(train_job, cfg.world_size, payload, warm=warm, on_event=on_event, timeout=timeout)


def predict_time(report: RunReport, calibration: list[RankReport]) -> None:
    """Fill each rank's `time.predicted`: its calibration run's steps (the same configuration on
    links that cost nothing: where each collective was issued and waited for, what was computed
    between, what each collective took this machine) replayed on `report.links` by
    `theory.schedule.predict`, each collective the link's ring time or what it took in the
    calibration, whichever is longer. The calibration is another run, so the prediction can
    miss: what the links' pacing changes in compute (threads woken later, messages held) is not in it."""
    links = Links.from_plain(report.links)
    if links is None:
        raise ValueError("the run had no emulated links to predict its step time on")
    for r, cal in zip(report.ranks, calibration):
        axes = {c.axis for c in cal.timeline.comm}
        on = {a: schedule.Link(x.alpha, x.beta) for a in axes if (x := links.for_axis(a)) is not None}
        r.time.predicted = schedule.predict(cal.timeline.comm, cal.time.steps, on, transport=True)


def assemble(cfg: ResolvedConfig, ranks: list[dict]) -> RunReport:
    """The ranks' plain results (`train_job`) typed once, beside single-process training."""
    if not isinstance(cfg, ResolvedConfig):
        raise TypeError(f"assemble reads the configuration the ranks ran: a ResolvedConfig, got {type(cfg).__name__}")
    ref_losses, ref_params = reference(cfg)
    backends = {r.pop("backend") for r in ranks}
    if len(backends) != 1:
        raise RuntimeError(f"the ranks ran on different backends: {sorted(backends)}")
    backend = backends.pop()
    matmuls = {r.pop("matmul16", None) for r in ranks}
    # Ranks decide alone (a probe each); on one machine they agree, across unlike nodes they
    # may not, and the report says so rather than pick one.
    matmul = matmuls.pop() if len(matmuls) == 1 else "mixed"
    reports = [RankReport.from_plain(r) for r in ranks]
    for r in reports:  # share of gradient communication hidden behind backward (a measurement)
        r.overlap = analysis.overlap_fraction(r.timeline)
    # the mean of the ranks' means (equal token counts); a pipeline's earlier stages have none
    scored = [r for r in reports if r.losses and r.losses[0] is not None]
    losses = [sum(r.losses[k] for r in scored) / len(scored) for k in range(cfg.steps)]
    # A 16-bit run's bound is measured here, on this CPU: one process in the same recipe. Only
    # asked for where a step lies beyond the flat tolerance, which no bound can be below (a
    # short run rarely does): it is a second single-process training of the global batch.
    one_process = None
    if get_recipe(cfg.recipe).param != "fp32" and not losses_match(losses, ref_losses, cfg.recipe):
        one_process = recipe_losses(cfg)
    report = RunReport(
        strategy=cfg.strategy, world_size=cfg.world_size, n=cfg.n, m=cfg.m, recipe=cfg.recipe,
        steps=cfg.steps, model=cfg.model.name, global_batch=cfg.global_batch,
        micro_batches=cfg.micro_batches, recompute=cfg.recompute, clip_grad_norm=cfg.clip_grad_norm,
        collectives=resolve_implementation(cfg.collectives, backend), backend=backend, matmul16=matmul,
        options=dict(cfg.options), timeline_mode=cfg.timeline,
        links=None if cfg.links is None else cfg.links.plain(), tp=cfg.tp, sequence_parallel=cfg.sequence_parallel, cp=cfg.cp, zigzag=cfg.zigzag, pp=cfg.pp,
        schedule=cfg.schedule, ep=cfg.ep, emulate=None if cfg.emulate is None else list(cfg.emulate),
        psi=sum(p.numel() for p in ref_params), ranks=reports, losses=losses, reference_losses=ref_losses,
        recipe_losses=one_process,
        match=Match(
            model_states=all(r.measured.model_states() == r.predicted.model_states() for r in reports),
            comm=all(r.measured.comm == r.predicted.comm and r.measured.comm_by_axis == r.predicted.comm_by_axis
                     for r in reports),
            # The bytes measured on the wire against the ring model (gloo's framing allowed for,
            # see `wire_match`); None where nothing could be measured (NCCL).
            wire=wire_match(reports),
            # None where the model has no closed form (a custom model): measured only.
            activations=(None if any(r.predicted.activations is None for r in reports) else
                         all(r.measured.activations == r.predicted.activations for r in reports)),
            # Training itself: every step's loss against single-process training, within the
            # recipe's relative tolerance. (Parameters are compared by the tests, per tensor and
            # per model: a GPT's attention key bias has an exactly zero gradient, so Adam turns
            # round-off there into lr-sized steps of either sign, and no single tolerance fits.)
            losses=losses_match(losses, ref_losses, cfg.recipe, one_process)))
    if reports and reports[0].params is not None:
        # Every replica ends with the same full parameters (replicas stay identical; sharded
        # strategies gather the same shards); on a model axis a replica is its ranks' parts, put
        # back together (`Split.unsplit`). The largest difference from the first replica's.
        split = split_of(cfg.mesh)
        names = [k for k, _ in cfg.model.build().named_parameters()]
        replicas = [split.unsplit(names, [reports[r].params for r in group]) for group in cfg.mesh.replica_groups()]
        report.params, report.reference_params = replicas[0], ref_params
        report.replica_max_diff = max(
            (float((a - b).abs().max()) for rep in replicas[1:] for a, b in zip(rep, report.params)), default=0.0)
        for r in reports[1:]:
            r.params = None  # the first replica's are the report's
        reports[0].params = report.params
    return vouch(report)  # a run's own report: the checks that grade measurements trust it


def losses_match(losses: list[float], ref: list[float], recipe: str, one_process: list[float] | None = None) -> bool:
    """Every step's loss within `recipes.loss_bound` of single-process fp32 training at that step:
    the recipe's flat tolerance, widened for a 16-bit recipe by how far `one_process` (one process
    training in the same recipe, `reference.recipe_losses`) has drifted from fp32 by then."""
    return all(abs(x - y) <= loss_bound(recipe, k, one_process, ref) * max(abs(y), 1e-30)
               for k, (x, y) in enumerate(zip(losses, ref, strict=True)))


WIRE_MARGIN = 0.01  # relative, around the payload the ring model (of this implementation) predicts


def wire_match(ranks: list[RankReport]) -> bool | None:
    """Every rank's measured wire bytes within 1 % of the predicted payload, plus at most gloo's
    framing: 144 B per point-to-point message (`zeroedu.runtime.wire`), for the messages this
    rank's collectives send at most (`wire.messages`; gloo skips the empty segments of buffers
    smaller than 2 elements per rank, so tiny collectives send fewer). For megabyte payloads the
    framing is a few hundredths of a percent; for a few hundred bytes it dominates."""
    oks = [rank_wire_ok(r) for r in ranks]
    return None if None in oks else all(oks)


def rank_wire_ok(r: RankReport) -> bool | None:
    """One rank's wire bytes within the margin of `wire_match` (None: not measured)."""
    if r.wire.sent is None:
        return None
    payload, sent = r.predicted.wire, r.wire.sent
    framing = FRAMING_PER_MESSAGE * r.wire.messages
    return bool((1 - WIRE_MARGIN) * payload - 64 <= sent <= (1 + WIRE_MARGIN) * payload + framing + 64)
