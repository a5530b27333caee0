"""torch's own FSDP2 (`fully_shard`) on zeroedu's model and data: the independent yardstick.

`fully_shard_job` runs on every rank: the same model (`models.make_model`), one `fully_shard`
per unit (`models.units`) plus the root, `torch.optim.Adam`, this rank's slice of the same
global batches. It returns the losses, the gathered final parameters (`DTensor.full_tensor`),
and — when `track_memory` — the peak bytes per rank from torch's
`torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker` (works on CPU: it counts the
storages that dispatch sees, by category). Nothing from zeroedu's strategies, comm or ledger is
involved, so agreement with `zeroedu.strategies.fsdp2` is evidence, not tautology.

`counting_sent` counts the bytes torch's collectives send under the ring model (for
`references.bench`) by wrapping the two collective functions FSDP2 calls for the duration of
the count only, so a warm rank's next job sees torch's own functions again.

Recipes: ``fp32`` maps to no mixed precision; ``mixed-bf16`` to
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)`` — torch then keeps the sharded
parameter in fp32 (it is the master) and its sharded gradient in fp32, so its 16Ψ/N splits as
4 + 4 + 8 instead of zeroedu's 2 + 2 + 12; the total is the same.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch

from ..models import units
from ..recipes import get_recipe
from ..runtime import matmul16
from ..train.config import config_from_dict
from ..train.runner import local_micro_batches
from .torch_private import fsdp2_mem_tracker


def build_fully_shard(cfg, world_size, reshard_after_forward: bool | None = None):
    """zeroedu's model under torch's `fully_shard` (one call per unit, then the root) + Adam.

    A hybrid config (cfg.m > 1) gets a 2-D mesh (dp_outer, dp_shard) = (M, N), inner ranks
    contiguous as in zeroedu's mesh: `fully_shard` then replicates across dp_outer and shards
    within dp_shard, torch's HSDP. `reshard_after_forward`: default from cfg.options (True)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if cfg.m > 1:
        mesh = init_device_mesh("cpu", (cfg.m, world_size // cfg.m), mesh_dim_names=("dp_outer", "dp_shard"))
    else:
        mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp_shard",))
    model = cfg.model.build()
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
          if cfg.recipe == "mixed-bf16" else MixedPrecisionPolicy())
    if cfg.recipe not in ("fp32", "mixed-bf16"):
        raise ValueError(f"the torch reference supports fp32 and mixed-bf16, got {cfg.recipe}")
    raf = cfg.options.get("reshard_after_forward", True) if reshard_after_forward is None else reshard_after_forward
    for u in units(model):
        fully_shard(u, mesh=mesh, reshard_after_forward=raf, mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=raf, mp_policy=mp)
    a = cfg.adam
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, foreach=False)
    return model, opt


def torch_train_step(model, opt, x, y, dtype: str = "fp32") -> float:
    """One step; `dtype` the recipe's compute dtype (as `torch_ddp.torch_ddp_step`)."""
    opt.zero_grad(set_to_none=True)
    with matmul16.compute(dtype):
        loss = model.loss(model(x), y)
        loss.backward()
    opt.step()
    return loss.item()


def torch_train_steps(ctx, cfg, model, opt, start: int = 0) -> list[float]:
    """Steps [start, cfg.steps) of torch's model on this rank's share of the same batches."""
    losses = []
    for step in range(start, cfg.steps):
        ((x, y),) = local_micro_batches(cfg, step, ctx.rank, ctx.world_size, micro_batches=1)
        losses.append(torch_train_step(model, opt, x, y, get_recipe(cfg.recipe).param))
    return losses


def fully_shard_job(ctx, cfg: dict, track_memory: bool = True) -> dict:
    """Train torch FSDP2 for cfg.steps; losses, final full params (rank 0), FSDPMemTracker peak."""
    FSDPMemTracker = fsdp2_mem_tracker()

    cfg = config_from_dict(cfg)
    model, opt = build_fully_shard(cfg, ctx.world_size)
    tracker = FSDPMemTracker(model, opt) if track_memory else None
    if tracker is not None:
        tracker.__enter__()
    try:
        # tracked: torch's own 16-bit kernels, as `torch_memory.memtracker_job` (runtime.matmul16.native)
        with matmul16.native() if tracker is not None else nullcontext():
            losses = torch_train_steps(ctx, cfg, model, opt)
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


def _counted_names() -> tuple[str, str]:
    """The two collective functions FSDP2 calls: the *_single names from torch 2.13 on, the
    older all_gather_into_tensor / reduce_scatter_tensor before (the declared torch range)."""
    import torch.distributed as dist

    if hasattr(dist, "all_gather_single"):
        return ("all_gather_single", "reduce_scatter_single")
    return ("all_gather_into_tensor", "reduce_scatter_tensor")


COUNTED = _counted_names()


@contextmanager
def counting_sent():
    """Count the bytes fully_shard's collectives send (ring model) by wrapping the two functions
    FSDP2 calls, in this rank only, for the duration of the block; the originals are put back
    on exit, also when the block raises, so nothing stays patched in a warm pool."""
    from fractions import Fraction

    import torch.distributed as dist

    sent: dict = {}
    originals = {name: getattr(dist, name) for name in COUNTED}

    def wrap(name, fn):
        def counted(*args, **kwargs):
            # FSDP2 passes (output, input) by position or by keyword, group= by keyword
            g = dist.get_world_size(kwargs.get("group"))
            out = name.startswith("all_gather")  # all-gather: size of the output; reduce-scatter: input
            names = ("output_tensor", "output") if out else ("input_tensor", "input")
            i = 0 if out else 1
            t = args[i] if len(args) > i else next(kwargs[k] for k in names if k in kwargs)
            sent[name] = sent.get(name, 0) + Fraction(g - 1, g) * t.numel() * t.element_size()
            return fn(*args, **kwargs)

        return counted

    try:
        for name, fn in originals.items():
            setattr(dist, name, wrap(name, fn))
        yield sent
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def patched_collectives(ctx) -> dict:
    """Which of the counted functions are not torch's own on this rank (empty: none patched)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    return {name: f"{getattr(dist, name).__module__}.{getattr(dist, name).__qualname__}"
            for name in COUNTED if getattr(dist, name) is not getattr(c10d, name)}
