"""The single-process reference every strategy must equal: the whole global batch, one process,
`torch.optim.Adam` (and `torch.nn.utils.clip_grad_norm_` when the run clips). Nothing from
zeroedu's strategies, comm or optimizer is involved, which is what makes it an independent check.
Micro-batches and activation recompute change neither the mathematics nor, so, the reference.
"""
from __future__ import annotations

import torch

from .config import RunConfig


def reference(cfg: RunConfig) -> tuple[list[float], list[torch.Tensor]]:
    """Single-process training on the global batch with torch.optim.Adam, in fp32."""
    cfg = cfg.resolved()
    torch.manual_seed(0)
    model = cfg.model.build()
    a = cfg.adam
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, foreach=False)
    losses = []
    for step in range(cfg.steps):
        x, y = cfg.model.batch(step, cfg.global_batch)
        opt.zero_grad()
        loss = model.loss(model(x), y)
        loss.backward()
        if cfg.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad_norm)
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]
