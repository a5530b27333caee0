"""zeroedu's Adam (`zeroedu.optim.adam_update`): the arithmetic of the whole-tensor form to the
bit, with no temporary the size of the shard (the denominator goes through one scratch buffer of
at most `ADAM_CHUNK` elements, and the gradient's fp32 copy through a second), counted by a
dispatch mode that sees every tensor torch makes; and the temporaries of torch's own Adam
(for-loop, foreach, fused) beside zeroedu's, measured by torch's MemTracker against
`theory.memory.adam_step_temporaries`."""
from __future__ import annotations

from math import prod

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from zeroedu.optim import ADAM_CHUNK, AdamConfig, adam_update, scratch_elements
from zeroedu.references.torch_memory import ADAM_IMPLEMENTATIONS, adam_temporaries
from zeroedu.theory.memory import adam_step_temporaries

pytestmark = pytest.mark.fast


def _whole(param, grad, m, v, step, cfg, scale=1.0):
    """The update written on whole tensors, as torch's single-tensor Adam orders it (the
    gradient read as fp32 and scaled first, as `AdamState.step` did before the scratch buffer)."""
    if grad.dtype != torch.float32:
        grad = grad.float()
    if scale != 1.0:
        grad = grad * scale
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


@pytest.mark.parametrize("dtype,scale", [(torch.float32, 1.0), (torch.float32, 0.25), (torch.bfloat16, 1 / 3),
                                         (torch.float16, 1.0)])
@pytest.mark.parametrize("n", [1, 7, ADAM_CHUNK, ADAM_CHUNK + 3, 3 * ADAM_CHUNK - 5])
def test_the_chunked_update_is_the_whole_tensor_update_to_the_bit(n, dtype, scale):
    g = torch.Generator().manual_seed(n)
    start, grad = torch.randn(n, generator=g), torch.randn(n, generator=g).to(dtype)
    a = [start.clone(), torch.zeros(n), torch.zeros(n)]
    b = [start.clone(), torch.zeros(n), torch.zeros(n)]
    cfg = AdamConfig(lr=3e-3)
    for step in (1, 2, 3):
        _whole(a[0], grad, a[1], a[2], step, cfg, scale)
        adam_update(b[0], grad, b[1], b[2], step, cfg, scale=scale)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_the_update_makes_no_temporary_the_size_of_the_shard():
    n = 3 * ADAM_CHUNK + 11
    param, grad, m, v = torch.randn(n), torch.randn(n), torch.zeros(n), torch.zeros(n)
    with _NewBytes() as chunked:
        adam_update(param, grad, m, v, 1, AdamConfig())
    copies = param.clone(), m.clone(), v.clone()
    with _NewBytes() as whole:
        _whole(copies[0], grad, copies[1], copies[2], 1, AdamConfig())
    assert chunked.bytes == 4 * ADAM_CHUNK == 4 * scratch_elements([n], False)  # the scratch buffer, once
    assert whole.bytes == 2 * 4 * n  # written whole: v.sqrt() and its quotient, each the size of the shard
    low = grad.bfloat16()
    with _NewBytes() as chunked:
        adam_update(param, low, m, v, 2, AdamConfig(), scale=0.5)
    with _NewBytes() as whole:
        _whole(copies[0], low, copies[1], copies[2], 2, AdamConfig(), 0.5)
    assert chunked.bytes == 2 * 4 * ADAM_CHUNK == 4 * scratch_elements([n], True)  # the gradient's chunk too
    assert whole.bytes == 4 * 4 * n  # and its fp32 copy, its scaled copy


def test_a_given_scratch_buffer_too_small_is_refused():
    x = torch.zeros(10)
    with pytest.raises(ValueError, match="needs 20"):
        adam_update(x, x.bfloat16(), x.clone(), x.clone(), 1, AdamConfig(), scratch=torch.empty(19))


@pytest.mark.parametrize("shapes", [[(512, 512), (512,), (1536, 1024), (256,)], [(256,), (1536, 1024), (64, 64)],
                                    [(2048, 1024)]])
@pytest.mark.parametrize("implementation", ADAM_IMPLEMENTATIONS)
def test_each_adams_temporaries_measured_by_memtracker_equal_the_closed_form(implementation, shapes):
    """torch.optim.Adam for-loop, foreach and fused, and zeroedu's (gradients read in place and
    scaled through scratch), measured by torch's MemTracker around a steady step."""
    numels = [prod(s) for s in shapes]
    for scale in (1.0, 0.5):
        measured = adam_temporaries(shapes, implementation, scale)
        assert measured == adam_step_temporaries(implementation, numels, scale != 1.0), (implementation, scale)
    if implementation == "foreach":
        assert measured == 4 * sum(numels)  # 4 bytes per parameter, for a moment
    if implementation == "zeroedu":
        assert measured <= 2 * 4 * ADAM_CHUNK
