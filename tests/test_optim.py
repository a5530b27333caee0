"""zeroedu's Adam (`zeroedu.optim.adam_update`): the arithmetic of the whole-tensor form to the
bit, with no temporary the size of the shard (the denominator goes through one scratch buffer of
at most `ADAM_CHUNK` elements), counted by a dispatch mode that sees every tensor torch makes."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from zeroedu.optim import ADAM_CHUNK, AdamConfig, adam_update

pytestmark = pytest.mark.fast


def _whole(param, grad, m, v, step, cfg):
    """The update written on whole tensors, as torch's single-tensor Adam orders it."""
    m.lerp_(grad, 1 - cfg.beta1)
    v.mul_(cfg.beta2).addcmul_(grad, grad, value=1 - cfg.beta2)
    denom = (v.sqrt() / (1 - cfg.beta2 ** step) ** 0.5).add_(cfg.eps)
    param.addcdiv_(m, denom, value=-cfg.lr / (1 - cfg.beta1 ** step))


class _NewBytes(TorchDispatchMode):
    """Bytes of every tensor an op makes (not in place, not a view of another)."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        schema = func._schema
        if not schema.is_mutable and all(r.alias_info is None for r in schema.returns):
            self.bytes += sum(t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


@pytest.mark.parametrize("n", [1, 7, ADAM_CHUNK, ADAM_CHUNK + 3, 3 * ADAM_CHUNK - 5])
def test_the_chunked_update_is_the_whole_tensor_update_to_the_bit(n):
    g = torch.Generator().manual_seed(n)
    start, grad = torch.randn(n, generator=g), torch.randn(n, generator=g)
    a = [start.clone(), torch.zeros(n), torch.zeros(n)]
    b = [start.clone(), torch.zeros(n), torch.zeros(n)]
    cfg = AdamConfig(lr=3e-3)
    for step in (1, 2, 3):
        _whole(a[0], grad, a[1], a[2], step, cfg)
        adam_update(b[0], grad, b[1], b[2], step, cfg)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_the_update_makes_no_temporary_the_size_of_the_shard():
    n = 3 * ADAM_CHUNK + 11
    param, grad, m, v = torch.randn(n), torch.randn(n), torch.zeros(n), torch.zeros(n)
    with _NewBytes() as chunked:
        adam_update(param, grad, m, v, 1, AdamConfig())
    copies = param.clone(), m.clone(), v.clone()
    with _NewBytes() as whole:
        _whole(copies[0], grad, copies[1], copies[2], 1, AdamConfig())
    assert chunked.bytes == 4 * ADAM_CHUNK  # the scratch buffer, once
    assert whole.bytes == 2 * 4 * n  # written whole: v.sqrt() and its quotient, each the size of the shard
