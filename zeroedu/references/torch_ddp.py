"""Rank jobs that hold zeroedu's DDP against torch's own `DistributedDataParallel`.

Independent checks, run on the same ranks, model, data and Adam arithmetic as `zeroedu.train`:

* `torch_ddp_job`: trains with `torch.nn.parallel.DistributedDataParallel` (gloo) and
  `torch.optim.Adam(foreach=False)`: nothing of zeroedu's strategies, comm or optimizer.

Jobs live here, not in tests or benchmarks, because ranks import them by name.
"""
from __future__ import annotations

import torch

from ..recipes import get_recipe
from ..runtime import matmul16
from ..train.config import RunConfig, config_from_dict
from ..train.runner import local_micro_batches
from .torch_private import ddp_grad_buckets


class MasterAdam:
    """torch.optim.Adam on fp32 master copies of a bf16 model's parameters: copy the (bf16,
    already averaged) gradients in, step, cast the masters back. The optimizer side of the
    mixed-bf16 recipe for torch DDP, whose native mixed precision needs CUDA events."""

    def __init__(self, params, adam):
        self.params = list(params)
        self.masters = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.opt = torch.optim.Adam(self.masters, lr=adam.lr, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                                    foreach=False)

    def zero_grad(self, set_to_none: bool = False) -> None:
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.masters):
            m.grad = p.grad.float()
        self.opt.step()
        for p, m in zip(self.params, self.masters):
            p.copy_(m)


def build_torch_ddp(cfg: RunConfig, bucket_bytes: int):
    """zeroedu's model under torch's `DistributedDataParallel` + `torch.optim.Adam`.

    ``mixed-bf16``: the model in bf16 under DDP (its buckets are all-reduced in bf16, the bytes
    zeroedu's recipe sends) and Adam on fp32 master copies (`MasterAdam`). DDP's own
    `_MixedPrecision` would keep fp32 parameters as the master, but it records CUDA events and
    fails on CPU."""
    from torch.nn.parallel import DistributedDataParallel

    if cfg.recipe not in ("fp32", "mixed-bf16"):
        raise ValueError(f"the torch DDP reference supports fp32 and mixed-bf16, got {cfg.recipe}")
    model = cfg.model.build()
    if cfg.recipe == "mixed-bf16":
        model = model.to(torch.bfloat16)
    # gradient_as_bucket_view: p.grad are views into torch's buckets, as in zeroedu's version.
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_bytes / 2 ** 20, gradient_as_bucket_view=True)
    a = cfg.adam
    if cfg.recipe == "mixed-bf16":
        return ddp, MasterAdam(ddp.parameters(), a)
    opt = torch.optim.Adam(ddp.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, foreach=False)
    return ddp, opt


def torch_ddp_step(ddp, opt, x, y, dtype: str = "fp32") -> float:
    """One step; `dtype` the recipe's compute dtype (16-bit products as zeroedu's runs make them
    on this CPU, `runtime.matmul16`, so both sides of a comparison compute alike)."""
    opt.zero_grad(set_to_none=False)
    with matmul16.compute(dtype):
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
            for b in ddp_grad_buckets(ddp)]


def torch_ddp_job(ctx, cfg: dict, bucket_bytes: int = 1024) -> dict:
    """Train `cfg` with torch's DDP; losses, final parameters, the bucket sizes torch chose."""
    cfg = config_from_dict(cfg)
    ddp, opt = build_torch_ddp(cfg, bucket_bytes)
    losses = []
    for step in range(cfg.steps):
        ((x, y),) = local_micro_batches(cfg, step, ctx.rank, ctx.world_size, micro_batches=1)
        losses.append(torch_ddp_step(ddp, opt, x, y, get_recipe(cfg.recipe).param))
    return {"losses": losses, "params": [p.detach().clone() for p in ddp.module.parameters()],
            "bucket_bytes": torch_bucket_bytes(ddp)}
