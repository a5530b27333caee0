"""Adam written out, for tensors the strategies own (flat shards, per-parameter masters).

Why not `torch.optim.Adam`? It allocates its state lazily at the first step and adds a `step`
tensor per parameter, so the bytes would not be the 12 (or 8) per parameter the closed forms
count. This is the same arithmetic as torch's single-tensor Adam (same operation order, so fp32
results agree with it to the last bit or two), on state allocated up front and registered with
the ledger.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AdamConfig:
    lr: float = 1e-2
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8


def adam_update(param: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                step: int, cfg: AdamConfig) -> None:
    """One Adam step in place on fp32 `param` (the master copy) from fp32 `grad`."""
    m.lerp_(grad, 1 - cfg.beta1)
    v.mul_(cfg.beta2).addcmul_(grad, grad, value=1 - cfg.beta2)
    bias1 = 1 - cfg.beta1 ** step
    bias2 = 1 - cfg.beta2 ** step
    denom = (v.sqrt() / bias2 ** 0.5).add_(cfg.eps)
    param.addcdiv_(m, denom, value=-cfg.lr / bias1)
