"""The small deterministic model and data every run trains: shipped in the package, no download.

An MLP whose layer sizes are deliberately *not* multiples of 2, 3, 4 or 8, so every sharded
strategy meets padding and uneven shards. Units (what FSDP gathers at once, what ZeRO buckets)
are the top-level layers that own parameters.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    d_in: int = 12
    hidden: int = 20
    depth: int = 3  # number of Linear layers
    d_out: int = 7
    seed: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def make_model(cfg: ModelConfig = ModelConfig()) -> nn.Sequential:
    """Same weights on every rank and in the reference: built from a fixed seed, in fp32."""
    if cfg.depth < 1 or min(cfg.d_in, cfg.hidden, cfg.d_out) < 1:
        raise ValueError(f"model sizes must be >= 1, got {cfg}")
    g = torch.Generator().manual_seed(cfg.seed)
    dims = [cfg.d_in] + [cfg.hidden] * (cfg.depth - 1) + [cfg.d_out]
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        lin = nn.Linear(a, b)
        with torch.no_grad():
            bound = 1.0 / a ** 0.5
            lin.weight.copy_(torch.rand(b, a, generator=g) * 2 * bound - bound)
            lin.bias.copy_(torch.rand(b, generator=g) * 2 * bound - bound)
        layers.append(lin)
        if i < len(dims) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def param_count(cfg: ModelConfig) -> int:
    dims = [cfg.d_in] + [cfg.hidden] * (cfg.depth - 1) + [cfg.d_out]
    return sum(a * b + b for a, b in zip(dims[:-1], dims[1:]))


def units(model: nn.Module) -> list[nn.Module]:
    """Top-level children that own parameters: one FSDP unit / ZeRO bucket each."""
    return [c for c in model.children() if any(True for _ in c.parameters(recurse=True))]


def unit_shapes(model: nn.Module) -> list[list[tuple[int, ...]]]:
    return [[tuple(p.shape) for p in u.parameters()] for u in units(model)]


def make_batch(step: int, global_batch: int, cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of one step: a fixed random regression target, reproducible anywhere."""
    g = torch.Generator().manual_seed(10_000 + 7919 * step + cfg.seed)
    x = torch.randn(global_batch, cfg.d_in, generator=g)
    y = torch.randn(global_batch, cfg.d_out, generator=g)
    return x, y


def local_slice(global_batch: int, n: int, rank: int) -> slice:
    """Rank r's contiguous share of the global batch (equal shares, so mean of means = mean)."""
    if global_batch % n:
        raise ValueError(f"global batch {global_batch} must be divisible by the number of "
                         f"data-parallel ranks {n}")
    b = global_batch // n
    return slice(rank * b, (rank + 1) * b)
