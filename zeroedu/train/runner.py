"""The rank side of every training job: build one run on this rank, then train it step by step.

Every job that trains with a zeroedu strategy goes through these two functions (the `zeroedu
run` job, checkpoint save/resume, the torch comparisons, the notebook jobs), so each of them
runs every strategy, hybrids included, with every run option:

* `build_run(ctx, cfg)`: the distributed state for the configuration's mesh (`kinds.Mesh`: the
  flat dp_shard axis, a hybrid's dp_outer x dp_shard, or dp_shard x tp), a fresh ledger and comm,
  the model built from its seed (with activation recompute applied if asked, then split over the
  mesh's model axis if it has one, `strategies.splits`), and the strategy over the data axes;
* `train_steps(run, start, stop)`: optimizer steps [start, stop); each takes this rank's slice
  of the step's global batch, cut into K micro-batches (K-1 of them inside `no_sync()`), and
  returns the mean of the micro-batch losses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from ..models import apply_recompute, local_slice
from ..recipes import get_recipe
from ..kinds import DP_OUTER, DP_SHARD, EP, PP, SHARD_GROUP, EventKind, RecomputeMode
from ..runtime.comm import Comm
from ..runtime.ledger import Ledger
from ..runtime import matmul16
from ..runtime.rank import JobStopped
from ..runtime.rank import resolve_ref
from ..strategies import strategy_class
from ..strategies.base import DistState, Strategy
from ..strategies.splits import split_of
from .config import ResolvedConfig


@dataclass
class RankRun:
    """One rank's share of a run: what `train_steps` needs, and what a job reports from."""

    cfg: ResolvedConfig
    ctx: object  # zeroedu.runtime.rank.RankContext
    ledger: Ledger
    dist: DistState
    strategy: Strategy

    @property
    def data_rank(self) -> tuple[int, int]:
        """(which slice of the global batch, of how many): this rank's place over the mesh's data
        axes (the ranks of one replica, along a model axis, train on the same slice)."""
        mesh = self.cfg.mesh
        return mesh.data_rank(self.ctx.rank), mesh.data_parallel

    @property
    def batch_slice(self) -> slice:
        return local_slice(self.cfg.global_batch, self.data_rank[1], self.data_rank[0])

    def micro_batches(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's K micro-batches of the step: its slice of the batch, and of each sequence
        what its model axis gives it (`Split.inputs`: a cp rank's positions)."""
        split = split_of(self.cfg.mesh)
        return [split.inputs(self.cfg, self.dist, x, y) for x, y in local_micro_batches(self.cfg, step, *self.data_rank)]


def local_micro_batches(cfg: ResolvedConfig, step: int, rank: int, world_size: int,
                        micro_batches: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank `rank`'s K micro-batches of the step's global batch, each a tensor of its own: a
    slice would keep the whole global batch's storage alive, and autograd saves inputs and
    targets (the activation ledger would count the global batch)."""
    x, y = cfg.model.batch(step, cfg.global_batch)
    sl = local_slice(cfg.global_batch, world_size, rank)
    k = cfg.micro_batches if micro_batches is None else micro_batches
    return [(a.clone(), b.clone()) for a, b in zip(x[sl].chunk(k), y[sl].chunk(k))]


def dist_state(ctx, cfg: ResolvedConfig, ledger: Ledger) -> DistState:
    """The axes this rank communicates on, from the configuration's mesh (`kinds.Mesh`): the
    strategy's dp_shard (and dp_outer for a hybrid), and any model axis beside them; the comm that
    records (and measures) every collective on them. The ledger gets the mesh too, so the wire's
    bytes count on the axis whose sockets carried them."""
    comm = Comm(ledger, cfg.collectives, ctx.backend, ctx.wire, links=cfg.links,
                pacer=ctx.pacer() if cfg.links is not None else None)
    mesh = cfg.mesh
    axes = ctx.axes(mesh)
    ledger.mesh = mesh
    # the strategy's group: dp_shard, flattened with ep and cp where the mesh has them
    # (`kinds.SHARD_AXES`); the experts' group under ep: dp_shard alone
    inner = axes.get(SHARD_GROUP, axes[DP_SHARD])
    return DistState(ctx.rank, ctx.world_size, ctx.device, inner, comm, ledger, axes.get(DP_OUTER),
                     mesh=mesh, axes=axes, expert=axes[DP_SHARD] if EP in mesh else None,
                     disjoint=[axes[PP]] if PP in mesh else [])  # each stage its own layers


def strategy_cls(cfg: ResolvedConfig) -> type[Strategy]:
    """The class a run builds: the catalog's, or the `strategy_class` override."""
    return resolve_ref(cfg.strategy_class) if cfg.strategy_class else strategy_class(cfg.strategy)


def build_run(ctx, cfg: ResolvedConfig, sink: Callable[[dict], None] | None = None, *,
              check_ledger: bool = False) -> RankRun:
    """Ledger, distributed state, model (same seed on every rank) and strategy for `cfg`.

    What the ledger records is the configuration's `timeline`, and only that (one place says
    it, so a training or checkpoint job records what its config asks): "full" records every
    lifecycle event and reads the wire around every collective; "minimal" keeps only what the
    report's figures are read from (model states at the optimizer step, activations at forward
    end, the peak, the wire per step: `Ledger`).
    `check_ledger`: the ledger verifies its running byte count at every event (tests).
    `cfg` is the parent's `ResolvedConfig` (`config_from_dict` on a rank): taken as it is."""
    if not isinstance(cfg, ResolvedConfig):
        raise TypeError(f"build_run takes the parent's ResolvedConfig (resolve it there), got {type(cfg).__name__}")
    ledger = Ledger(ctx.rank, sink=sink, wire=ctx.wire, timeline_mode=cfg.timeline, check=check_ledger)
    dist = dist_state(ctx, cfg, ledger)
    model = cfg.model.build()
    if cfg.recompute != RecomputeMode.NONE:
        apply_recompute(cfg.model.recompute_modules(model, cfg.recompute),
                        on_rerun=lambda k: ledger.mark(EventKind.RECOMPUTE, block=k))
    model = split_of(dist.mesh).apply(model, dist, cfg)  # this rank's part, before the strategy shards it
    cls = strategy_cls(cfg)
    strategy = cls(model, dist, get_recipe(cfg.recipe), cfg.adam, clip_grad_norm=cfg.clip_grad_norm, **cfg.options)
    return RankRun(cfg, ctx, ledger, dist, strategy)


def train_step(run: RankRun, step: int, micro: list | None = None) -> float | None:
    """One optimizer step: K micro-batches (the first K-1 inside `no_sync()`; a pipeline's in its
    schedule, `Split.forward_backward`), then `step()`; the step's mean loss (None on a pipeline
    stage that computes none). `micro`: this step's micro-batches, if already made (default:
    `run.micro_batches(step)`)."""
    strategy = run.strategy
    run.ledger.begin_step(step)
    micro = run.micro_batches(step) if micro is None else micro
    # 16-bit products computed in fp32 where the CPU has no fast 16-bit kernel (`runtime.matmul16`):
    # the same tensors saved and sent, so nothing the ledger or the wire counts changes.
    with matmul16.compute(get_recipe(run.cfg.recipe).param):
        # the model axes' way through the micro-batches (a pipeline's schedule), else one by one
        loss = split_of(run.cfg.mesh).forward_backward(run, micro)
    strategy.step()
    run.ledger.end_step()
    return loss


class NonFiniteLoss(JobStopped):
    """The loss became inf or NaN: the run has diverged and every later step would be noise."""

    def __init__(self, step: int, rank: int, loss: float, cfg: ResolvedConfig):
        lr = getattr(cfg.adam, "lr", None)
        super().__init__(f"the loss is {loss} at step {step + 1} of {cfg.steps} on rank {rank}: training diverged"
                         + (f" (learning rate {lr:g}); lower it (--lr) or clip gradients "
                            "(--clip-grad-norm)" if lr is not None else ""))


def train_steps(run: RankRun, start: int = 0, stop: int | None = None,
                before_step: Callable[[int], None] | None = None,
                after_step: Callable[[int], None] | None = None,
                batches: Callable[[int], list] | None = None, progress: bool = True) -> list[float]:
    """Train steps [start, stop) (default: to cfg.steps); return this rank's local losses.
    `before_step(step)` / `after_step(step)` let a job act around a step (a checkpoint save,
    an injected fault, a timer) without writing its own loop. `batches(step)`: the step's
    micro-batches, made beforehand (a timed step is then forward + backward + optimizer only);
    `progress=False`: no progress message to the parent after each step (timed loops)."""
    losses = []
    for step in range(start, run.cfg.steps if stop is None else stop):
        micro = batches(step) if batches is not None else None
        if before_step is not None:
            before_step(step)
        losses.append(train_step(run, step, micro))
        # (a pipeline's earlier stages compute no loss: None)
        if losses[-1] is not None and not math.isfinite(losses[-1]):
            raise NonFiniteLoss(step, run.ctx.rank, losses[-1], run.cfg)
        if progress:  # a small message per step: the parent shows progress, knows ranks live
            run.ctx.emit({"type": "progress", "rank": run.ctx.rank, "step": step, "loss": losses[-1],
                          "matmul16": matmul16.mode_for(get_recipe(run.cfg.recipe).param)})
        if after_step is not None:
            after_step(step)
    return losses
