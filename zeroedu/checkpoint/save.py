"""What a rank writes: its parameter holders and optimizer targets with the pieces that place
every element (`Strategy.param_holders` / `target_pieces`), and the run's metadata."""
from __future__ import annotations

import io
import json
import os
import shutil
import time
from typing import Callable

import torch

from ..catalog import get_spec
from ..models import persistent_buffers
from ..train.config import RunConfig
from .format import (FORMAT, LATEST, MANIFEST, atomic_write_bytes, param_shapes, partial_dir_name,
                     publish_step_dir, rank_file_name, sha256, step_dir_name)

def shard_state(strategy, cfg: RunConfig, rank: int, world: int, next_step: int) -> dict:
    """What this rank writes: plain tensors, ints, strings and lists (loadable with
    torch.load(weights_only=True))."""
    opt = strategy.optim
    holders = [{"values": h.detach().cpu().clone(), "pieces": [list(p) for p in pieces]}
               for h, pieces in strategy.param_holders()]
    targets = []
    for k, (t, pieces) in enumerate(zip(opt.targets, strategy.target_pieces())):
        master = opt.masters[k] if opt.masters else t
        targets.append({"master": master.detach().float().cpu().clone(),
                        "m": opt.m[k].detach().cpu().clone(), "v": opt.v[k].detach().cpu().clone(),
                        "pieces": [list(p) for p in pieces]})
    return {
        "format": FORMAT, "rank": rank, "world_size": world, "strategy": cfg.strategy,
        "recipe": cfg.recipe, "n": cfg.n, "m": cfg.m, "layout": get_spec(cfg.strategy).layout,
        "model": cfg.model.as_dict(), "param_shapes": param_shapes(cfg.model),
        "step": next_step, "adam_step": opt.t, "rng": torch.get_rng_state(),
        "units": strategy.describe_units(), "holders": holders, "targets": targets,
        # Frozen parameters (model.parameters() order) have no optimizer target: their values
        # are read back from the holders, their Adam m and v are zero (never updated).
        "frozen": list(strategy.frozen),
        # Every rank holds the same buffers (replicas); rank 0 writes them once.
        "buffers": ({n: b.detach().cpu().clone() for n, b in persistent_buffers(strategy.model).items()}
                    if rank == 0 else {}),
    }


def save_sharded(strategy, cfg: RunConfig, ctx, ckpt_dir: str, next_step: int,
                 after_rank_file: Callable[[], None] | None = None) -> str:
    """Collective: every rank writes its file into a hidden partial directory; rank 0 writes the
    manifest there, moves the complete directory into place, then points `latest` at it.
    `after_rank_file` runs between a rank's own file and the manifest (tests inject faults there).

    A step directory appears only complete, and one that `latest` names is replaced only by a
    complete one: a first save is a rename, a re-save of an existing step an atomic exchange
    (`publish_step_dir`). A run killed mid-save leaves a ``.step-*.partial`` directory, which
    no reader looks at and the next save of that step clears."""
    import torch.distributed as dist

    name_dir = step_dir_name(next_step)
    final = os.path.join(ckpt_dir, name_dir)
    partial = os.path.join(ckpt_dir, partial_dir_name(next_step))
    if ctx.rank == 0:
        shutil.rmtree(partial, ignore_errors=True)  # left by a run killed while saving this step
        os.makedirs(partial)
    # Checkpoint coordination is not training traffic: it goes to torch.distributed directly,
    # outside the ledger, so the measured bytes per step stay the strategy's own.
    dist.barrier()
    buf = io.BytesIO()
    torch.save(shard_state(strategy, cfg, ctx.rank, ctx.world_size, next_step), buf)
    data = buf.getvalue()
    name = rank_file_name(ctx.rank, ctx.world_size)
    atomic_write_bytes(os.path.join(partial, name), data)
    if after_rank_file is not None:
        after_rank_file()  # a rank dying here: no manifest, the partial directory only
    infos = [None] * ctx.world_size
    dist.all_gather_object(infos, {"name": name, "bytes": len(data), "sha256": sha256(data)})
    if ctx.rank == 0:
        manifest = {"format": FORMAT, "step": next_step, "world_size": ctx.world_size,
                    "strategy": cfg.strategy, "recipe": cfg.recipe, "n": cfg.n, "m": cfg.m,
                    "layout": get_spec(cfg.strategy).layout, "model": cfg.model.as_dict(),
                    "param_shapes": param_shapes(cfg.model), "files": infos,
                    "saved_at": time.time()}
        atomic_write_bytes(os.path.join(partial, MANIFEST), json.dumps(manifest, indent=1).encode())
        publish_step_dir(partial, final)
        atomic_write_bytes(os.path.join(ckpt_dir, LATEST), name_dir.encode())
    dist.barrier()
    return final
