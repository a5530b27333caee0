"""Any nn.Module under any zeroedu strategy: a small transformer classifier built from torch's own
layers (nn.MultiheadAttention, which reads its packed `in_proj_weight` directly, LayerNorm,
nested blocks, parameters of several shapes), sharded with FSDP2 on 4 ranks.

    python examples/custom_model.py [strategy] [world_size]

Ranks are separate processes, so the model, batches and loss are named by import path (here
this file, which the ranks import as the module `custom_model`); the unit policy names the
submodules gathered together: the embedding, every block, the head.
"""
from __future__ import annotations

import sys

import torch
from torch import nn

D, HEADS, CLASSES, FEATURES, TOKENS = 48, 4, 5, 10, 12


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, HEADS, batch_first=True)
        self.norm2 = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Embed(nn.Module):
    """Features to width D plus a learned position table (a bare (TOKENS, D) parameter)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(FEATURES, D)
        self.pos = nn.Parameter(0.02 * torch.randn(TOKENS, D))

    def forward(self, x):
        return self.proj(x) + self.pos


class Classifier(nn.Module):
    def __init__(self, depth: int = 3):
        super().__init__()
        self.embed = Embed()
        self.blocks = nn.ModuleList(Block() for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(D), nn.Linear(D, CLASSES))

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x.mean(dim=1))


def build() -> nn.Module:
    torch.manual_seed(0)  # the same weights on every rank
    return Classifier()


def batch(step: int, global_batch: int):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(global_batch, TOKENS, FEATURES, generator=g)
    y = (x[:, :, 0].sum(dim=1) > 0).long() + 2 * (x[:, 0, 1] > 0).long()  # a learnable label
    return x, y


def loss(out, y):
    return nn.functional.cross_entropy(out.float(), y)


if __name__ == "__main__":
    from zeroedu.models import CustomModel
    from zeroedu.notebook.report import summary
    from zeroedu.train import RunConfig, run

    strategy = sys.argv[1] if len(sys.argv) > 1 else "fsdp2"
    world = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    model = CustomModel(build, batch, loss, units=("embed", "blocks.*", "head"), lr=3e-3, global_batch=16,
                        label="mha-classifier")
    print(summary(run(RunConfig(strategy, world, steps=5, recipe="fp32", model=model))))
