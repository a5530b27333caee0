"""The single-process reference every strategy must equal: the whole global batch, one process,
`torch.optim.Adam`. Nothing from zeroedu's strategies, comm or optimizer is involved, which is
what makes it an independent check.
"""
from __future__ import annotations

import torch

from ..models import make_batch, make_model
from .config import RunConfig


def reference(cfg: RunConfig) -> tuple[list[float], list[torch.Tensor]]:
    """Single-process training on the global batch with torch.optim.Adam, in fp32."""
    torch.manual_seed(0)
    model = make_model(cfg.model)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.adam.lr, betas=(cfg.adam.beta1, cfg.adam.beta2),
                           eps=cfg.adam.eps, foreach=False)
    losses = []
    for step in range(cfg.steps):
        x, y = make_batch(step, cfg.global_batch, cfg.model)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]
