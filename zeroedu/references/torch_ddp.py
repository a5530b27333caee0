"""Rank jobs that hold zeroedu's DDP against torch's own `DistributedDataParallel`.

Independent checks, run on the same ranks, model, data and Adam arithmetic as `zeroedu.train`:

* `torch_ddp_job`: trains with `torch.nn.parallel.DistributedDataParallel` (gloo) and
  `torch.optim.Adam(foreach=False)`: nothing of zeroedu's strategies, comm or optimizer.
* `bench_job`: both DDPs side by side, timed, for `benchmarks/bench_ddp.py`.

Jobs live here, not in tests or benchmarks, because ranks import them by name.
"""
from __future__ import annotations

import time
from fractions import Fraction

import torch

from ..models import ModelConfig, local_slice, make_batch, make_model
from ..optim import AdamConfig
from ..train.config import RunConfig
from ..train.runner import build_run


def _torch_ddp(model_cfg: ModelConfig, bucket_bytes: int, adam: AdamConfig):
    from torch.nn.parallel import DistributedDataParallel

    model = make_model(model_cfg)
    # gradient_as_bucket_view: p.grad are views into torch's buckets, as in zeroedu's version.
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_bytes / 2 ** 20,
                                  gradient_as_bucket_view=True)
    opt = torch.optim.Adam(ddp.parameters(), lr=adam.lr, betas=(adam.beta1, adam.beta2),
                           eps=adam.eps, foreach=False)
    return ddp, opt


def _torch_step(ddp, opt, x, y) -> float:
    opt.zero_grad(set_to_none=False)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()  # DDP averages: each bucket is divided by N and all-reduced during backward
    opt.step()
    return loss.item()


def torch_bucket_bytes(ddp) -> list[int]:
    """Sizes of torch DDP's gradient buckets in bytes, as they are now.

    torch starts with a single bucket and re-buckets by `bucket_cap_mb` after the first
    iteration, in the order gradients actually arrived; the reducer's bucket-shaped tensors
    show the current assignment."""
    return [b.buffer().numel() * b.buffer().element_size()
            for b in ddp.reducer._get_zeros_like_grad_buckets()]


def torch_ddp_job(ctx, model: dict, steps: int = 5, global_batch: int = 24,
                  bucket_bytes: int = 1024, adam: dict | None = None) -> dict:
    mcfg, acfg = ModelConfig(**model), AdamConfig(**(adam or {}))
    ddp, opt = _torch_ddp(mcfg, bucket_bytes, acfg)
    sl = local_slice(global_batch, ctx.world_size, ctx.rank)
    losses = []
    for step in range(steps):
        x, y = make_batch(step, global_batch, mcfg)
        losses.append(_torch_step(ddp, opt, x[sl], y[sl]))
    return {"losses": losses, "params": [p.detach().clone() for p in ddp.module.parameters()],
            "bucket_bytes": torch_bucket_bytes(ddp)}


def bench_job(ctx, model: dict, steps: int = 10, warmup: int = 2, reps: int = 3,
              global_batch: int = 64, bucket_bytes: int = 2 ** 20) -> dict:
    """Time zeroedu's ddp_bucketed and torch DDP in alternating repetitions (fp32, same data).

    Each step is timed on every rank from a barrier to the end of the optimizer step; the
    parent takes the slowest rank per step, as a synchronous step is as slow as its slowest rank.
    """
    import torch.distributed as tdist

    mcfg = ModelConfig(**model)
    run = build_run(ctx, RunConfig("ddp_bucketed", ctx.world_size, recipe="fp32", global_batch=global_batch,
                                   model=mcfg, options={"bucket_bytes": bucket_bytes}))
    ours, ledger = run.strategy, run.ledger
    ddp, opt = _torch_ddp(mcfg, bucket_bytes, AdamConfig())
    sl = local_slice(global_batch, ctx.world_size, ctx.rank)
    batches = [make_batch(s, global_batch, mcfg) for s in range(steps + warmup)]
    times = {"zeroedu": [], "torch": []}
    step_no = 0
    for rep in range(reps):
        for who in ("zeroedu", "torch"):
            for s, (x, y) in enumerate(batches):
                tdist.barrier()
                t0 = time.perf_counter()
                if who == "zeroedu":
                    ledger.begin_step(step_no)
                    ours.forward_backward(x[sl], y[sl])
                    ours.step()
                    step_no += 1
                else:
                    _torch_step(ddp, opt, x[sl], y[sl])
                if s >= warmup:
                    times[who].append(time.perf_counter() - t0)
    n = ctx.world_size
    psi = sum(p.numel() for p in ddp.module.parameters())
    ring = Fraction(2 * (n - 1), n)
    torch_buckets = torch_bucket_bytes(ddp)
    return {
        "times": times,
        "psi": psi,
        "zeroedu_sent": float(sum(ledger.comm_by_collective(step_no - 1).values())),
        "zeroedu_buckets": [b.buffer.numel() * 4 for b in ours.buckets],
        "torch_buckets": torch_buckets,
        # torch DDP all-reduces each bucket once per step: ring bytes from its bucket sizes.
        "torch_sent": float(ring * sum(torch_buckets)) if torch_buckets else float(ring * psi * 4),
    }
