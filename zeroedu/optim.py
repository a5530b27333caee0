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


# Elements of the one scratch buffer the update's denominator goes through (4 MiB in fp32): the
# step holds at most this much beyond the model states, whatever the size of the shard. Written
# whole, `v.sqrt() / bias2 ** 0.5` makes two temporaries the size of the shard, which no ledger
# category holds (on a GPU the step then sets the allocator's peak).
ADAM_CHUNK = 1 << 20


def adam_update(param: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                step: int, cfg: AdamConfig) -> None:
    """One Adam step in place on fp32 `param` (the master copy) from fp32 `grad`. The moments
    are updated in place; the denominator sqrt(v / (1 - beta2^t)) + eps is made chunk by chunk in
    one scratch buffer of at most `ADAM_CHUNK` elements, with the same operations in the same
    order as the whole-tensor form, so the result is the same to the bit."""
    m.lerp_(grad, 1 - cfg.beta1)
    v.mul_(cfg.beta2).addcmul_(grad, grad, value=1 - cfg.beta2)
    bias1 = 1 - cfg.beta1 ** step
    root2 = (1 - cfg.beta2 ** step) ** 0.5
    if not (param.is_contiguous() and m.is_contiguous() and v.is_contiguous()):
        param.addcdiv_(m, (v.sqrt() / root2).add_(cfg.eps), value=-cfg.lr / bias1)  # no flat view to chunk
        return
    p, mm, vv = param.view(-1), m.view(-1), v.view(-1)
    n = p.numel()
    scratch = torch.empty(min(n, ADAM_CHUNK), dtype=v.dtype, device=v.device)
    for s in range(0, n, ADAM_CHUNK):
        e = min(s + ADAM_CHUNK, n)
        d = scratch[:e - s]
        torch.sqrt(vv[s:e], out=d)
        d.div_(root2).add_(cfg.eps)
        p[s:e].addcdiv_(mm[s:e], d, value=-cfg.lr / bias1)
