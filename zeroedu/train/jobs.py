"""Rank jobs the notebooks and tests use beyond `zeroedu run`, each built on `runner`.

* `ring_step_job`: the seconds one ring step of an all-reduce takes on this machine's ranks,
  through the comm and links the strategies use (`train.plans`' per-message cost).
* `fsdp2_state_dict_job`: train FSDP2 for a few steps, then take its *local* state dict
  (`FSDP2.local_state_dict`), recording how many bytes that sends (none), next to the gathered
  full parameters for comparison. `stitch_local_state_dicts` puts the N shards back together
  by their row offsets, the way a checkpoint loader would.

Jobs live in the package, not in tests or notebooks, because ranks import them by name.
"""
from __future__ import annotations

import time
from fractions import Fraction

import torch

from ..recipes import get_recipe, torch_dtype
from ..runtime.comm import tag
from ..runtime.ledger import Ledger
from ..theory.timing import ring_steps
from .config import config_from_dict
from .runner import build_run, dist_state, train_steps


def ring_step_job(ctx, cfg: dict, numel: int = 1, reps: int = 10) -> float:
    """Seconds per ring step of an all-reduce of `numel` elements in `cfg`'s parameter dtype over
    its data-parallel ranks, on its links, the median of `reps` after a warm-up: what a message
    costs this machine (every rank's CPU to post and reduce it, waking the next rank), at this
    many ranks on these cores. Give `numel` at least a few per rank: a chunk of none is no message."""
    cfg = config_from_dict(cfg)
    dist = dist_state(ctx, cfg, Ledger(ctx.rank, timeline_mode="minimal"))
    t = torch.zeros(numel, dtype=torch_dtype(get_recipe(cfg.recipe).param))
    times = []
    for i in range(reps + 1):
        start = time.perf_counter()
        dist.comm.all_reduce(t, dist.inner, tag("plan", f"latency{i}", "data"))
        times.append(time.perf_counter() - start)
    dist.comm.close()
    times = sorted(times[1:])
    return times[len(times) // 2] / ring_steps("all_reduce", cfg.n)


def fsdp2_state_dict_job(ctx, cfg: dict) -> dict:
    """Train FSDP2 for cfg.steps on this rank, then take the local state dict and count the bytes
    that sent; `full_parameters()` (an all-gather) afterwards, for comparison."""
    cfg = config_from_dict(cfg)
    if cfg.strategy != "fsdp2":
        raise ValueError(f"fsdp2_state_dict_job takes an fsdp2 configuration, got {cfg.strategy}")
    run = build_run(ctx, cfg)
    train_steps(run)
    ledger, strat = run.ledger, run.strategy

    def sent() -> Fraction:
        return sum((Fraction(c.sent) for c in ledger.comm), Fraction(0))

    before = sent()
    local = strat.local_state_dict()
    sd_sent = sent() - before
    full = strat.full_parameters()
    return {"rank": ctx.rank,
            "state_dict": {k: (row, t.float()) for k, (row, t) in local.items()},
            "state_dict_sent": float(sd_sent),
            "full_parameters_sent": float(sent() - before - sd_sent),
            "full": full if ctx.rank == 0 else None}


def stitch_local_state_dicts(per_rank: list[dict]) -> dict[str, torch.Tensor]:
    """Full tensors from N local FSDP2 state dicts: concatenate each parameter's shards in
    row-offset order (empty shards of trailing ranks contribute nothing)."""
    out = {}
    for name in per_rank[0]:
        parts = sorted((sd[name] for sd in per_rank), key=lambda rt: rt[0])
        out[name] = torch.cat([t for _, t in parts], dim=0)
    return out
