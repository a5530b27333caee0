"""Jobs that fail on purpose, to show (and test) what the harness does when a rank goes wrong.

Each takes the rank that misbehaves; the others go on into a collective and would wait for it
forever, which is exactly the situation the parent's failure handling must resolve.
"""
from __future__ import annotations

import os
import time

import torch

from .comm import Comm
from .ledger import Ledger


def _collective(ctx):
    comm = Comm(Ledger(ctx.rank))
    t = torch.ones(4)
    comm.all_reduce(t, ctx.world_axis(), tag="faults/probe")
    return t.sum().item()


def raise_on(ctx, bad_rank: int = 1):
    if ctx.rank == bad_rank:
        raise RuntimeError(f"deliberate failure on rank {ctx.rank}")
    return _collective(ctx)


def exit_on(ctx, bad_rank: int = 1, code: int = 7):
    if ctx.rank == bad_rank:
        os._exit(code)  # no traceback, no result: like a segfault or an OOM kill
    return _collective(ctx)


def hang_on(ctx, bad_rank: int = 1, seconds: float = 3600):
    if ctx.rank == bad_rank:
        time.sleep(seconds)
    return _collective(ctx)


def ok(ctx):
    return {"rank": ctx.rank, "sum": _collective(ctx), "pid": os.getpid()}


def pid(ctx):
    return os.getpid()
