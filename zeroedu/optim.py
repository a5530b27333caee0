"""Adam written out, for tensors the strategies own (flat shards, per-parameter masters).

Why not `torch.optim.Adam`? It allocates its state lazily at the first step and adds a `step`
tensor per parameter, so the bytes would not be the 12 (or 8) per parameter the closed forms
count. This is the same arithmetic as torch's single-tensor Adam (same operation order, so fp32
results agree with it to the last bit or two), on state allocated up front and registered with
the ledger.

What the step itself allocates is bounded too. torch 2.13's Adam (`torch/optim/adam.py`) holds,
beyond its state, two tensors the size of the parameter it is on (for-loop), one per parameter
of the whole group, 4 bytes per parameter (foreach, the default on GPUs), or nothing (fused);
`theory.memory.adam_step_temporaries` gives each and `tests/test_optim.py` measures them. Here
the update goes chunk by chunk through one scratch buffer, as a fused kernel goes through
registers: at most two chunks of `ADAM_CHUNK` fp32 elements (8 MiB), which the strategies charge
to the ledger's "optimizer_temp" while it lives (`strategies.base.AdamState.step`).
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


# Elements of one scratch chunk (4 MiB in fp32): the update holds at most one or two of these
# beyond the model states, whatever the size of the shard. Written whole, `v.sqrt() / bias2 ** 0.5`
# makes two temporaries the size of the shard and `grad.float() * scale` one more, which no
# ledger category held (on a GPU the step then set the allocator's peak).
ADAM_CHUNK = 1 << 20


def grad_goes_through_scratch(grad: torch.Tensor, scale: float) -> bool:
    """The gradient is read through the scratch buffer, chunk by chunk, when it is not fp32 (the
    fp32 copy the update needs) or must be scaled and may not be scaled in place."""
    return grad.dtype != torch.float32 or scale != 1.0


def scratch_elements(target_numels, grads_copied: bool) -> int:
    """Elements of the one scratch buffer `AdamState.step` allocates for targets of these sizes:
    one chunk for the denominator, a second for the gradient when it goes through scratch (fp32
    elements; 0 when there is no target). The closed form of the step's temporaries:
    ``4 · min(max numel, ADAM_CHUNK) · (1 + grads_copied)`` bytes."""
    largest = max(target_numels, default=0)
    return min(largest, ADAM_CHUNK) * (2 if grads_copied else 1)


def adam_update(param: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                step: int, cfg: AdamConfig, *, scale: float = 1.0, scratch: torch.Tensor | None = None) -> None:
    """One Adam step in place on fp32 `param` (the master copy) from `grad` times `scale` (any
    dtype; read as fp32). The moments are updated in place; the gradient's fp32 copy (when
    `grad_goes_through_scratch`) and the denominator sqrt(v / (1 - beta2^t)) + eps are made chunk
    by chunk in `scratch` (fp32, at least `scratch_elements([n], copied)` elements; allocated
    here when not given), with the same operations in the same order as the whole-tensor form,
    so the result is the same to the bit."""
    bias1 = 1 - cfg.beta1 ** step
    root2 = (1 - cfg.beta2 ** step) ** 0.5
    copied = grad_goes_through_scratch(grad, scale)
    if not (param.is_contiguous() and grad.is_contiguous() and m.is_contiguous() and v.is_contiguous()):
        raise ValueError("adam_update works on contiguous tensors (it updates them chunk by chunk through flat views)")
    p, g, mm, vv = param.view(-1), grad.reshape(-1), m.view(-1), v.view(-1)
    n = p.numel()
    k = min(n, ADAM_CHUNK)
    if scratch is None:
        scratch = torch.empty(k * (2 if copied else 1), dtype=torch.float32, device=p.device)
    if scratch.numel() < k * (2 if copied else 1):
        raise ValueError(f"scratch holds {scratch.numel()} elements; this update needs {k * (2 if copied else 1)}")
    for s in range(0, n, ADAM_CHUNK):
        e = min(s + ADAM_CHUNK, n)
        gc = g[s:e]
        if copied:
            gc = scratch[k:k + e - s].copy_(gc)
            if scale != 1.0:
                gc.mul_(scale)
        mm[s:e].lerp_(gc, 1 - cfg.beta1)
        vv[s:e].mul_(cfg.beta2).addcmul_(gc, gc, value=1 - cfg.beta2)
        d = scratch[:e - s]
        torch.sqrt(vv[s:e], out=d)
        d.div_(root2).add_(cfg.eps)
        p[s:e].addcdiv_(mm[s:e], d, value=-cfg.lr / bias1)
