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
