"""torch's own FSDP2 (`fully_shard`) on zeroedu's model and data: the independent yardstick.

`fully_shard_job` runs on every rank: the same model (`models.make_model`), one `fully_shard`
per unit (`models.units`) plus the root, `torch.optim.Adam`, this rank's slice of the same
global batches. It returns the losses, the gathered final parameters (`DTensor.full_tensor`),
and — when `track_memory` — the peak bytes per rank from torch's
`torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker` (works on CPU: it counts the
storages that dispatch sees, by category). Nothing from zeroedu's strategies, comm or ledger is
involved, so agreement with `zeroedu.strategies.fsdp2` is evidence, not tautology.

`timed_job` trains either implementation for a few steps and returns per-step wall times, peak
bytes and bytes sent, for `benchmarks/bench_fsdp.py`.

Recipes: ``fp32`` maps to no mixed precision; ``mixed-bf16`` to
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)`` — torch then keeps the sharded
parameter in fp32 (it is the master) and its sharded gradient in fp32, so its 16Ψ/N splits as
4 + 4 + 8 instead of zeroedu's 2 + 2 + 12; the total is the same.
"""
from __future__ import annotations

import time

import torch

from .models import local_slice, make_batch, make_model, units
from .train import config_from_dict


def _build(cfg, world_size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp_shard",))
    model = make_model(cfg.model)
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
          if cfg.recipe == "mixed-bf16" else MixedPrecisionPolicy())
    if cfg.recipe not in ("fp32", "mixed-bf16"):
        raise ValueError(f"the torch reference supports fp32 and mixed-bf16, got {cfg.recipe}")
    raf = cfg.options.get("reshard_after_forward", True)
    for u in units(model):
        fully_shard(u, mesh=mesh, reshard_after_forward=raf, mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=raf, mp_policy=mp)
    a = cfg.adam
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, foreach=False)
    return model, opt


def _train_step(model, opt, x, y) -> float:
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x).float(), y)
    loss.backward()
    opt.step()
    return loss.item()


def fully_shard_job(ctx, cfg: dict, track_memory: bool = True) -> dict:
    """Train torch FSDP2 for cfg.steps; losses, final full params (rank 0), FSDPMemTracker peak."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    cfg = config_from_dict(cfg)
    model, opt = _build(cfg, ctx.world_size)
    sl = local_slice(cfg.global_batch, ctx.world_size, ctx.rank)
    tracker = FSDPMemTracker(model, opt) if track_memory else None
    losses = []
    if tracker is not None:
        tracker.__enter__()
    try:
        for step in range(cfg.steps):
            x, y = make_batch(step, cfg.global_batch, cfg.model)
            losses.append(_train_step(model, opt, x[sl], y[sl]))
    finally:
        if tracker is not None:
            tracker.__exit__(None, None, None)
    out = {"rank": ctx.rank, "losses": losses}
    if tracker is not None:
        snap = tracker.get_tracker_snapshot("peak")
        dev = next(iter(snap))
        out["peak"] = int(snap[dev]["Total"])
        out["peak_by_category"] = {str(k): int(v) for k, v in snap[dev].items()}
    params = [p.full_tensor().detach().float().clone() for p in model.parameters()]
    if ctx.rank == 0:
        out["params"] = params
    return out


def _count_sent() -> dict:
    """Count bytes fully_shard's collectives send (ring model) by wrapping the two functions
    FSDP2 calls (`dist.all_gather_single`, `dist.reduce_scatter_single`) in this rank only."""
    from fractions import Fraction

    import torch.distributed as dist

    sent: dict = {}

    def wrap(name, which):
        fn = getattr(dist, name)

        def counted(*args, **kwargs):
            # FSDP2 passes (output, input) by position or by keyword, group= by keyword
            g = dist.get_world_size(kwargs.get("group"))
            names = ("output_tensor", "output") if which == "out" else ("input_tensor", "input")
            i = 0 if which == "out" else 1
            t = args[i] if len(args) > i else next(kwargs[k] for k in names if k in kwargs)
            sent[name] = sent.get(name, 0) + Fraction(g - 1, g) * t.numel() * t.element_size()
            return fn(*args, **kwargs)

        setattr(dist, name, counted)

    wrap("all_gather_single", "out")
    wrap("reduce_scatter_single", "in")
    return sent


def timed_job(ctx, cfg: dict, impl: str, warmup: int = 2) -> dict:
    """Per-step wall times of `impl` ("zeroedu": strategies.build(cfg.strategy), or "torch":
    fully_shard), plus peak bytes and bytes sent per step by this rank."""
    from .comm import Comm
    from .ledger import Ledger
    from .recipes import get_recipe
    from .strategies import build
    from .strategies.base import DistState

    cfg = config_from_dict(cfg)
    sl = local_slice(cfg.global_batch, ctx.world_size, ctx.rank)
    batches = [make_batch(s, cfg.global_batch, cfg.model) for s in range(cfg.steps)]
    times, out = [], {"rank": ctx.rank}
    torch.distributed.barrier()
    if impl == "torch":
        model, opt = _build(cfg, ctx.world_size)
        sent = _count_sent()
        for s, (x, y) in enumerate(batches):
            torch.distributed.barrier()
            sent.clear()
            t = time.perf_counter()
            _train_step(model, opt, x[sl], y[sl])
            times.append(time.perf_counter() - t)
        out["sent"] = float(sum(sent.values()))  # last step, ring model as zeroedu.comm counts
    elif impl == "zeroedu":
        ledger = Ledger(ctx.rank)
        dist = DistState(ctx.rank, ctx.world_size, ctx.device, ctx.world_axis(), Comm(ledger), ledger)
        strat = build(cfg.strategy, make_model(cfg.model), dist, get_recipe(cfg.recipe), cfg.adam, **cfg.options)
        for s, (x, y) in enumerate(batches):
            torch.distributed.barrier()
            ledger.begin_step(s)
            t = time.perf_counter()
            strat.forward_backward(x[sl], y[sl])
            strat.step()
            times.append(time.perf_counter() - t)
        out["peak"] = ledger.peak
        out["sent"] = float(sum(ledger.comm_by_collective().values()))
    else:
        raise ValueError(f"impl must be 'zeroedu' or 'torch', got {impl!r}")
    out["times"] = times[warmup:]
    return out
