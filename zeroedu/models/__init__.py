"""The models runs train, shipped in the package (no download), and any `nn.Module` of yours.

A *model configuration* knows everything a run needs about its model: `build()` (same weights
on every rank, from a seed), `batch(step, global_batch)` (the same global batch on every rank),
the model's `loss` and unit policy (`GPT.units()`: one unit per block plus embeddings and head),
`default_adam()`, `recompute_modules(model, mode)`, and `activation_bytes(...)`, the closed form
of what autograd saves for one micro-batch (None when there is none):

* `MLPConfig` (``mlp``): a tiny MLP on random regression targets, the fastest unit-test model;
* `GPTConfig` (``gpt-tiny``, ``gpt-small``): a decoder-only transformer on a learnable token
  stream (`models.data`), the model of the notebooks, the CLI and the dashboards;
* `MoEGPTConfig`: such a GPT whose MLPs are mixtures of experts (`models.moe`; `--experts E`);
* `CustomModel`: your model, batches, loss and unit policy, by import path.
"""
from __future__ import annotations

from torch import nn

from .custom import (CustomModel, buffers_changed, check_trainable, check_units, persistent_buffers,
                     resolve_units)
from .gpt import GPT, PRESETS as GPT_PRESETS, GPTConfig
from .mlp import MLP, MLPConfig
from .moe import MoEGPTConfig
from .recompute import RECOMPUTE_MODES, apply_recompute

PRESETS = {"mlp": MLPConfig(), **GPT_PRESETS}
DEFAULT_MODEL = "gpt-small"  # what the notebooks, the CLI and the dashboards train
ModelSpec = MLPConfig | GPTConfig | CustomModel


def get_model(spec: str | ModelSpec | dict) -> ModelSpec:
    """A model configuration from a preset name, a configuration, or its `as_dict()`."""
    if isinstance(spec, (MLPConfig, GPTConfig, CustomModel)):
        return spec
    if isinstance(spec, dict):
        d = dict(spec)
        kind = d.pop("kind", "mlp")
        cls = {"mlp": MLPConfig, "gpt": GPTConfig, "moe-gpt": MoEGPTConfig, "custom": CustomModel}.get(kind)
        if cls is None:
            raise ValueError(f"unknown model kind {kind!r}")
        return cls(**d)
    if spec in PRESETS:
        return PRESETS[spec]
    raise ValueError(f"unknown model {spec!r}; choose one of {', '.join(PRESETS)}")


def make_model(spec) -> nn.Module:
    return get_model(spec).build()


def make_batch(step: int, global_batch: int, spec):
    return get_model(spec).batch(step, global_batch)


def units(model: nn.Module) -> list[nn.Module]:
    """The model's unit policy: its `units()` method, else its top-level children that own
    parameters (one FSDP unit / ZeRO bucket each)."""
    policy = getattr(model, "units", None)
    if callable(policy):
        return list(policy())
    return [c for c in model.children() if any(True for _ in c.parameters(recurse=True))]


def unit_shapes(model: nn.Module) -> list[list[tuple[int, ...]]]:
    return [[tuple(p.shape) for p in u.parameters()] for u in units(model)]


def param_count(spec) -> int:
    return get_model(spec).param_count()


def local_slice(global_batch: int, n: int, rank: int) -> slice:
    """Rank r's contiguous share of the global batch (equal shares, so mean of means = mean)."""
    if global_batch % n:
        raise ValueError(f"global batch {global_batch} must be divisible by the number of "
                         f"data-parallel ranks {n}")
    b = global_batch // n
    return slice(rank * b, (rank + 1) * b)


__all__ = ["CustomModel", "GPT", "GPTConfig", "MLP", "MLPConfig", "PRESETS", "DEFAULT_MODEL", "ModelSpec",
           "RECOMPUTE_MODES", "apply_recompute", "buffers_changed", "check_trainable", "check_units", "persistent_buffers", "get_model", "local_slice", "make_batch",
           "make_model", "param_count", "resolve_units", "unit_shapes", "units"]
