"""Checkpointing jobs on real ranks: train and save, resume into any strategy and world size.

The rank side trains through `zeroedu.train.runner` (so every strategy, hybrids included, can
save and resume); `maybe_fault` injects a failure at a chosen step or mid-save, for the tests
that check a killed run leaves `latest` on the previous complete checkpoint.
"""
from __future__ import annotations

import os
import time
from typing import Any

import torch

from ..kinds import CP
from ..models import check_trainable
from ..runtime import cluster
from ..train.config import ResolvedConfig, RunConfig, config_from_dict, config_to_dict, resolve
from ..train.runner import build_run, strategy_cls, train_steps
from .format import check_writable
from .reshard import check_compatible, load_any
from .save import save_sharded


def maybe_fault(fault: dict | None, rank: int, where: str, step: int) -> None:
    """Misbehave on purpose (tests): fault = {rank, kind: raise|exit|hang, where: step|save, at}."""
    if not fault or fault.get("rank") != rank or fault.get("where", "step") != where or fault.get("at") != step:
        return
    kind = fault["kind"]
    if kind == "raise":
        raise RuntimeError(f"deliberate failure on rank {rank} at {where} {step}")
    if kind == "exit":
        os._exit(fault.get("code", 9))
    if kind == "hang":
        time.sleep(fault.get("seconds", 3600))


def _train(ctx, cfg: dict, ckpt_dir: str | None, save_at, resume_from: str | None,
           fault: dict | None, format: str = "zeroedu") -> dict:
    cfg = config_from_dict(cfg)
    run = build_run(ctx, cfg)
    start = 0
    if resume_from is not None:
        state = load_any(resume_from, cfg.model, format)
        check_compatible(state, cfg)
        run.strategy.load_full_state(state.params, state.m, state.v, state.adam_step, state.buffers)
        start = state.step
        # Same rank count: each rank gets its own generator state back; otherwise rank 0's.
        if state.rng:
            torch.set_rng_state(state.rng[ctx.rank] if len(state.rng) == ctx.world_size else state.rng[0])

    def save(step: int) -> None:
        if ckpt_dir is not None and step + 1 in save_at:
            save_sharded(run.strategy, cfg, ctx, ckpt_dir, step + 1,
                         after_rank_file=lambda: maybe_fault(fault, ctx.rank, "save", step + 1))

    losses = train_steps(run, start, before_step=lambda s: maybe_fault(fault, ctx.rank, "step", s),
                         after_step=save)
    params = run.strategy.full_parameters()  # a collective for sharded strategies
    return {"rank": ctx.rank, "start": start, "losses": losses, "pid": os.getpid(),
            **({"params": params} if ctx.rank == 0 else {})}


def train_and_save_job(ctx, cfg: dict, ckpt_dir: str, save_at: list[int], fault: dict | None = None) -> dict:
    """Train from step 0, saving a sharded checkpoint after each step number in `save_at`."""
    return _train(ctx, cfg, ckpt_dir, set(save_at), None, fault)


def resume_job(ctx, cfg: dict, resume_from: str, ckpt_dir: str | None = None,
               save_at: list[int] = (), fault: dict | None = None, format: str = "zeroedu") -> dict:
    """Load `resume_from` (any strategy, any world size) and train on to cfg.steps."""
    return _train(ctx, cfg, ckpt_dir, set(save_at), resume_from, fault, format)


# ------------------------------------------------------------------------ parent side
def _launch(job, cfg: ResolvedConfig, kwargs: dict, pool, timeout) -> dict[str, Any]:
    # A checkpoint's pieces index a whole replica's parameters; a rank on a model axis that splits
    # them (pp's stages, tp's slices, ep's experts) holds part of one (cp's ranks hold it whole).
    split = [a for a in cfg.mesh.model_axes if a != CP]
    if split:
        raise ValueError(f"checkpoints hold one replica's parameters whole; on {' x '.join(split)} a rank holds "
                         "part of one: not written or resumed here yet")
    model = cfg.model.build()
    check_trainable(model, strategy_cls(cfg).TRAINS_FROZEN)  # before any rank starts
    payload = {"cfg": config_to_dict(cfg), **kwargs}
    if pool is not None:
        ranks = pool.run(job, payload, timeout=timeout)
    else:
        ranks = cluster.run(job, cfg.world_size, payload, timeout=timeout)
    n = len(ranks)
    k = len(ranks[0]["losses"])
    return {"strategy": cfg.strategy, "world_size": cfg.world_size, "m": cfg.m, "recipe": cfg.recipe,
            "start": ranks[0]["start"], "losses": [sum(r["losses"][s] for r in ranks) / n for s in range(k)],
            "params": ranks[0]["params"], "pids": [r["pid"] for r in ranks]}


def train_and_save(cfg: RunConfig | ResolvedConfig, ckpt_dir: str, save_at, *, pool=None, timeout=None,
                   fault: dict | None = None) -> dict[str, Any]:
    """Train `cfg` from scratch on real ranks, checkpointing after the steps in `save_at`.
    Returns the global losses (mean over ranks) of every step and the final parameters."""
    check_writable(ckpt_dir)
    return _launch(train_and_save_job, resolve(cfg), {"ckpt_dir": os.path.abspath(ckpt_dir),
                                             "save_at": sorted(save_at), "fault": fault}, pool, timeout)


def resume(cfg: RunConfig | ResolvedConfig, resume_from: str, *, format: str = "zeroedu", ckpt_dir: str | None = None,
           save_at=(), pool=None, timeout=None, fault: dict | None = None) -> dict[str, Any]:
    """Load a checkpoint into `cfg`'s strategy and world size (validated here, in the parent, so a
    bad checkpoint is a ValueError rather than a rank failure) and train to cfg.steps.
    `format="dcp"` reads a torch.distributed.checkpoint directory, which must come from a
    trusted source (its metadata is a pickle); the default reads zeroedu's own format only."""
    cfg = resolve(cfg)
    if ckpt_dir is not None:
        check_writable(ckpt_dir)
    check_compatible(load_any(resume_from, cfg.model, format), cfg)
    return _launch(resume_job, cfg, {"resume_from": os.path.abspath(resume_from), "format": format,
                                     "ckpt_dir": ckpt_dir and os.path.abspath(ckpt_dir),
                                     "save_at": sorted(save_at), "fault": fault}, pool, timeout)
