"""Jobs that exercise the collectives on real ranks: the lesson of notebook 01 and the harness tests.

`collectives_job` runs, on every rank, the four facts the rest of the suite stands on:
all-reduce, reduce-scatter followed by all-gather (which equals all-reduce), and a hand-written
ring all-reduce from send/recv; it returns the results and this rank's ledger records so a
notebook or test can check values and bytes against the ring formulas.
"""
from __future__ import annotations

import torch

from .comm import Comm, ring_all_reduce
from .ledger import Ledger


def rank_tensor(rank: int, numel: int) -> torch.Tensor:
    """A deterministic, rank-dependent tensor (so sums are checkable by hand)."""
    return torch.arange(numel, dtype=torch.float32) * (rank + 1) + rank


def collectives_job(ctx, numel: int = 24) -> dict:
    ledger = Ledger(ctx.rank, sink=ctx.emit)
    comm = Comm(ledger)
    axis = ctx.world_axis()
    n = ctx.world_size
    x = rank_tensor(ctx.rank, numel).to(ctx.device)
    out = {}

    ledger.begin_step(0)
    t = x.clone()
    comm.all_reduce(t, axis, tag="lesson/all_reduce")
    out["all_reduce"] = t.cpu()

    ledger.begin_step(1)
    pad = (-numel) % n  # reduce-scatter needs equal chunks: pad, as every flat-buffer strategy does
    xp = torch.cat([x, x.new_zeros(pad)])
    shard = xp.new_empty(xp.numel() // n)
    comm.reduce_scatter(shard, xp, axis, tag="lesson/reduce_scatter")
    full = torch.empty_like(xp)
    comm.all_gather(full, shard, axis, tag="lesson/all_gather")
    out["shard"] = shard.cpu()
    out["rs_ag"] = full[:numel].cpu()

    ledger.begin_step(2)
    t = xp.clone()
    ring_all_reduce(comm, t, axis, tag="lesson/ring")
    out["ring"] = t[:numel].cpu()

    out["comm"] = {s: {k: float(v) for k, v in ledger.comm_by_collective(s).items()} for s in (0, 1, 2)}
    out["records"] = [r.plain() for r in ledger.comm]
    return out
