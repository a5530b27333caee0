"""The smallest model: an MLP trained on a fixed random regression target (MSE).

Layer sizes are deliberately *not* multiples of 2, 3, 4 or 8, so every sharded strategy meets
padding and uneven shards; Ψ = 827 with the defaults. It learns nothing worth plotting (the
targets are fresh noise every step), but a step takes microseconds: it is the model of the
fastest unit tests. Units (what FSDP gathers at once, what ZeRO buckets) are the Linear layers.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from ..kinds import RecomputeMode
from ..optim import AdamConfig


class MLP(nn.Sequential):
    """Linear (Tanh Linear)*; its loss is the mean squared error in fp32."""

    @staticmethod
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(out.float(), y)


@dataclass(frozen=True)
class MLPConfig:
    d_in: int = 12
    hidden: int = 20
    depth: int = 3  # number of Linear layers
    d_out: int = 7
    seed: int = 0

    kind = "mlp"
    default_global_batch = 24

    def __post_init__(self):
        if not isinstance(self.depth, int) or self.depth < 1 or min(self.d_in, self.hidden, self.d_out) < 1:
            raise ValueError(f"model sizes must be >= 1, got {self}")

    def as_dict(self) -> dict:
        return {"kind": self.kind, **asdict(self)}

    @property
    def name(self) -> str:
        return "mlp"

    def dims(self) -> list[int]:
        return [self.d_in] + [self.hidden] * (self.depth - 1) + [self.d_out]

    def build(self) -> MLP:
        """Same weights on every rank and in the reference: built from the seed, in fp32."""
        g = torch.Generator().manual_seed(self.seed)
        dims = self.dims()
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
        return MLP(*layers)

    def param_count(self) -> int:
        dims = self.dims()
        return sum(a * b + b for a, b in zip(dims[:-1], dims[1:]))

    def batch(self, step: int, global_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch of one step: a fixed random regression target, reproducible anywhere."""
        g = torch.Generator().manual_seed(10_000 + 7919 * step + self.seed)
        x = torch.randn(global_batch, self.d_in, generator=g)
        y = torch.randn(global_batch, self.d_out, generator=g)
        return x, y

    def default_adam(self) -> AdamConfig:
        return AdamConfig(lr=1e-2)

    def recompute_modules(self, model: nn.Module, mode: str) -> list[nn.Module]:
        raise ValueError("activation recompute is a transformer technique: use a gpt-* model")

    def activation_bytes(self, batch: int, dtype_bytes: int, recompute: str = "none",
                         ln_stats_bytes: int | None = None) -> int:
        """Exact bytes autograd saves for one micro-batch (`theory.activations.mlp_activation_bytes`)."""
        from ..theory.activations import mlp_activation_bytes

        if recompute != RecomputeMode.NONE:
            raise ValueError("the MLP has no activation recompute")
        return mlp_activation_bytes(self.dims(), batch, dtype_bytes)
