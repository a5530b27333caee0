"""Models zeroedu does not ship, for the tests of the any-nn.Module API (ranks import them)."""
from __future__ import annotations

import torch
from torch import nn


class Tied(nn.Module):
    """Token embedding and LM head share one weight (tied embeddings)."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(11, 8)
        self.head = nn.Linear(8, 11, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, x):
        return self.head(self.tok(x))

    @staticmethod
    def loss(out, y):
        return nn.functional.cross_entropy(out.float().flatten(0, 1), y.flatten())


def tied_model() -> nn.Module:
    torch.manual_seed(0)
    return Tied()


def token_batch(step: int, global_batch: int):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, 11, (global_batch, 5), generator=g)
    return x, x.roll(-1, dims=1)


class Scale(nn.Module):
    def __init__(self, d: int, value: float):
        super().__init__()
        self.weight = nn.Parameter(torch.full((d,), value))

    def forward(self, x):
        return x * self.weight


class FrozenParts(nn.Module):
    """Fine-tuning shape: a frozen token embedding and a frozen scale around a trained body."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(11, 8)
        self.body = nn.Linear(8, 8)
        self.scale = Scale(8, 0.5)
        self.head = nn.Linear(8, 11)
        self.tok.weight.requires_grad_(False)
        self.scale.weight.requires_grad_(False)

    def forward(self, x):
        return self.head(self.scale(torch.tanh(self.body(self.tok(x)))))

    @staticmethod
    def loss(out, y):
        return nn.functional.cross_entropy(out.float().flatten(0, 1), y.flatten())


def frozen_model() -> nn.Module:
    torch.manual_seed(0)
    return FrozenParts()


class BatchNormNet(nn.Module):
    """A network with BatchNorm: running statistics updated by forward in training mode."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.norm = nn.BatchNorm1d(8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.relu(self.norm(self.inp(x))))

    @staticmethod
    def loss(out, y):
        return nn.functional.cross_entropy(out.float(), y)


def batchnorm_model() -> nn.Module:
    torch.manual_seed(0)
    return BatchNormNet()


class Counter(nn.Module):
    """Keeps its own state in a buffer (a step counter) that forward changes: no norm type to see."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 3)
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x):
        self.seen += x.shape[0]
        return self.inp(x)

    @staticmethod
    def loss(out, y):
        return nn.functional.cross_entropy(out.float(), y)


def counter_model() -> nn.Module:
    torch.manual_seed(0)
    return Counter()


def vector_batch(step: int, global_batch: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(global_batch, 6, generator=g), torch.randint(0, 3, (global_batch,), generator=g)


class Shift(nn.Module):
    """Adds a fixed offset kept as a persistent buffer; a non-persistent scratch buffer beside it."""

    def __init__(self, d: int):
        super().__init__()
        self.register_buffer("offset", torch.linspace(-1.0, 1.0, d))
        self.register_buffer("scratch", torch.ones(d), persistent=False)

    def forward(self, x):
        return x + self.offset * self.scratch


class Buffered(nn.Module):
    """A trained network with fixed buffers, for checkpoints that carry buffers."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.shift = Shift(8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.shift(self.inp(x))))

    @staticmethod
    def loss(out, y):
        return nn.functional.cross_entropy(out.float(), y)


def buffered_model() -> nn.Module:
    torch.manual_seed(0)
    return Buffered()


CALLED: list[str] = []


def must_not_run() -> nn.Module:
    """Named by a crafted checkpoint's manifest: the test fails if anything calls it."""
    CALLED.append("must_not_run")
    raise RuntimeError("a checkpoint's manifest made this process run code")
