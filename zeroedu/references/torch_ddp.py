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

from ..train.config import RunConfig, config_from_dict
from ..train.runner import build_run, local_micro_batches


def build_torch_ddp(cfg: RunConfig, bucket_bytes: int):
    """zeroedu's model under torch's `DistributedDataParallel` + `torch.optim.Adam`."""
    from torch.nn.parallel import DistributedDataParallel

    # gradient_as_bucket_view: p.grad are views into torch's buckets, as in zeroedu's version.
    ddp = DistributedDataParallel(cfg.model.build(), bucket_cap_mb=bucket_bytes / 2 ** 20,
                                  gradient_as_bucket_view=True)
    a = cfg.adam
    opt = torch.optim.Adam(ddp.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, foreach=False)
    return ddp, opt


def torch_ddp_step(ddp, opt, x, y) -> float:
    opt.zero_grad(set_to_none=False)
    loss = ddp.module.loss(ddp(x), y)
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


def torch_ddp_job(ctx, cfg: dict, bucket_bytes: int = 1024) -> dict:
    """Train `cfg` with torch's DDP; losses, final parameters, the bucket sizes torch chose."""
    cfg = config_from_dict(cfg).resolved()
    ddp, opt = build_torch_ddp(cfg, bucket_bytes)
    losses = []
    for step in range(cfg.steps):
        ((x, y),) = local_micro_batches(cfg, step, ctx.rank, ctx.world_size, micro_batches=1)
        losses.append(torch_ddp_step(ddp, opt, x, y))
    return {"losses": losses, "params": [p.detach().clone() for p in ddp.module.parameters()],
            "bucket_bytes": torch_bucket_bytes(ddp)}


def bench_job(ctx, cfg: dict, warmup: int = 2, reps: int = 3, bucket_bytes: int = 2 ** 20) -> dict:
    """Time zeroedu's ddp_bucketed and torch DDP in alternating repetitions (same data).

    Each step is timed on every rank from a barrier to the end of the optimizer step; the
    parent takes the slowest rank per step, as a synchronous step is as slow as its slowest rank.
    """
    import torch.distributed as tdist

    cfg = config_from_dict({**cfg, "strategy": "ddp_bucketed", "options": {"bucket_bytes": bucket_bytes}}).resolved()
    run = build_run(ctx, cfg)
    ours, ledger = run.strategy, run.ledger
    ddp, opt = build_torch_ddp(cfg, bucket_bytes)
    batches = [local_micro_batches(cfg, s, ctx.rank, ctx.world_size, micro_batches=1)[0]
               for s in range(cfg.steps + warmup)]
    times = {"zeroedu": [], "torch": []}
    step_no = 0
    for rep in range(reps):
        for who in ("zeroedu", "torch"):
            for s, (x, y) in enumerate(batches):
                tdist.barrier()
                t0 = time.perf_counter()
                if who == "zeroedu":
                    ledger.begin_step(step_no)
                    ours.forward_backward(x, y)
                    ours.step()
                    step_no += 1
                else:
                    torch_ddp_step(ddp, opt, x, y)
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
        "zeroedu_buckets": [b.buffer.numel() * b.buffer.element_size() for b in ours.buckets],
        "torch_buckets": torch_buckets,
        # torch DDP all-reduces each bucket once per step: ring bytes from its bucket sizes.
        "torch_sent": float(ring * sum(torch_buckets)) if torch_buckets else float(ring * psi * 4),
    }
