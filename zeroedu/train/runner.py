"""The rank side of every training job: build one run on this rank, then train it step by step.

Every job that trains with a zeroedu strategy goes through these two functions (the `zeroedu
run` job below, checkpoint save/resume, the torch comparisons, the notebook jobs), so each of
them runs every strategy, hybrids included:

* `build_run(ctx, cfg)`: the distributed state for the configuration (the flat world axis, or
  the M x N mesh's two axes for hybrid strategies), a fresh ledger and comm, the model built
  from its seed, and the strategy;
* `train_steps(run, start, stop)`: steps [start, stop) on this rank's slice of each global
  batch, each step marked in the ledger; returns the local losses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..catalog import get_spec
from ..models import local_slice, make_batch, make_model
from ..recipes import get_recipe
from ..runtime.comm import Comm
from ..runtime.ledger import Ledger
from ..strategies import build
from ..strategies.base import DistState, Strategy
from .config import RunConfig


@dataclass
class RankRun:
    """One rank's share of a run: what `train_steps` needs, and what a job reports from."""

    cfg: RunConfig
    ctx: object  # zeroedu.runtime.rank.RankContext
    ledger: Ledger
    dist: DistState
    strategy: Strategy

    @property
    def batch_slice(self) -> slice:
        return local_slice(self.cfg.global_batch, self.ctx.world_size, self.ctx.rank)


def dist_state(ctx, cfg: RunConfig, ledger: Ledger) -> DistState:
    """The axes this rank communicates on: the world, or (dp_outer, dp_shard) of the mesh."""
    comm = Comm(ledger)
    if get_spec(cfg.strategy).hybrid:
        outer, inner = ctx.mesh(cfg.m)
        return DistState(ctx.rank, ctx.world_size, ctx.device, inner, comm, ledger, outer)
    return DistState(ctx.rank, ctx.world_size, ctx.device, ctx.world_axis(), comm, ledger)


def build_run(ctx, cfg: RunConfig, sink: Callable[[dict], None] | None = None) -> RankRun:
    """Ledger, distributed state, model (same seed on every rank) and strategy for `cfg`."""
    ledger = Ledger(ctx.rank, sink=sink)
    dist = dist_state(ctx, cfg, ledger)
    strategy = build(cfg.strategy, make_model(cfg.model), dist, get_recipe(cfg.recipe), cfg.adam, **cfg.options)
    return RankRun(cfg, ctx, ledger, dist, strategy)


def train_steps(run: RankRun, start: int = 0, stop: int | None = None,
                before_step: Callable[[int], None] | None = None,
                after_step: Callable[[int], None] | None = None) -> list[float]:
    """Train steps [start, stop) (default: to cfg.steps); return this rank's local losses.
    `before_step(step)` / `after_step(step)` let a job act around a step (a checkpoint save,
    an injected fault) without writing its own loop."""
    cfg, sl = run.cfg, run.batch_slice
    losses = []
    for step in range(start, cfg.steps if stop is None else stop):
        if before_step is not None:
            before_step(step)
        run.ledger.begin_step(step)
        x, y = make_batch(step, cfg.global_batch, cfg.model)
        losses.append(run.strategy.forward_backward(x[sl], y[sl]))
        run.strategy.step()
        if after_step is not None:
            after_step(step)
    return losses
