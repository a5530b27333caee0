"""Any `nn.Module`: the model, its batches, its loss and its unit policy named by import path.

Ranks are separate processes, so what they build must be importable there: every function is
given as ``"package.module:function"`` (or as the function itself, when it is defined in an
importable module; `zeroedu.runtime.cluster` resolves a script's ``__main__`` to its module name).

    CustomModel(build="mymodels:make_vit",          # () -> nn.Module, same weights on every call
                batch="mymodels:make_batch",        # (step, global_batch) -> (x, y)
                loss="mymodels:loss",               # (out, y) -> scalar; None: the model's .loss
                units=("patch", "blocks.*", "head"))  # the unit policy, see `resolve_units`

The unit policy says which submodules are gathered (FSDP) or bucketed (ZeRO) together, as
`fully_shard` is applied per block: a list of submodule names, where ``name.*`` stands for
every child of ``name`` (a ModuleList of blocks); or ``"package.module:function"`` taking the
model and returning the modules; or None for the model's own ``units()`` method, else its
top-level children that own parameters. Every parameter must belong to exactly one unit.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import torch
from torch import nn

from ..kinds import RecomputeMode
from ..optim import AdamConfig
from ..runtime.rank import resolve_ref


def ref_of(fn: str | Callable | None) -> str | None:
    """A function as "module:qualname" (the form that crosses to the ranks)."""
    if fn is None or isinstance(fn, str):
        return fn
    from ..runtime.cluster import fn_ref

    return fn_ref(fn)


@dataclass(frozen=True)
class CustomModel:
    build_fn: str
    batch_fn: str
    loss_fn: str | None = None
    units: tuple[str, ...] | str | None = None
    recompute: tuple[str, ...] = ()  # submodule names (same patterns as units) re-run in backward
    lr: float = 1e-3
    global_batch: int = 8
    label: str = "custom"

    kind = "custom"

    def __init__(self, build, batch, loss=None, units=None, recompute=(), lr=1e-3, global_batch=8,
                 label="custom"):
        object.__setattr__(self, "build_fn", ref_of(build))
        object.__setattr__(self, "batch_fn", ref_of(batch))
        object.__setattr__(self, "loss_fn", ref_of(loss))
        units = ref_of(units) if callable(units) else units
        object.__setattr__(self, "units", tuple(units) if isinstance(units, (list, tuple)) else units)
        object.__setattr__(self, "recompute", tuple(recompute))
        object.__setattr__(self, "lr", lr)
        object.__setattr__(self, "global_batch", global_batch)
        object.__setattr__(self, "label", label)

    @property
    def name(self) -> str:
        return self.label

    @property
    def default_global_batch(self) -> int:
        return self.global_batch

    def as_dict(self) -> dict:
        d = asdict(self)
        return {"kind": self.kind, "build": d.pop("build_fn"), "batch": d.pop("batch_fn"),
                "loss": d.pop("loss_fn"), **d}

    def build(self) -> nn.Module:
        model = resolve_ref(self.build_fn)()
        if not isinstance(model, nn.Module):
            raise ValueError(f"{self.build_fn} returned {type(model).__name__}, not an nn.Module")
        if self.loss_fn is not None:
            model.loss = resolve_ref(self.loss_fn)
        if self.units is not None:
            policy = self.units
            model.units = lambda: resolve_units(model, policy)
        return model

    def param_count(self) -> int:
        return sum(p.numel() for p in self.build().parameters())

    def batch(self, step: int, global_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        return resolve_ref(self.batch_fn)(step, global_batch)

    def default_adam(self) -> AdamConfig:
        return AdamConfig(lr=self.lr)

    def recompute_modules(self, model: nn.Module, mode: str) -> list[nn.Module]:
        if mode != RecomputeMode.FULL or not self.recompute:
            raise ValueError("this model re-runs only the submodules named in CustomModel(recompute=...) "
                             "and only with recompute='full'")
        return _match(model, self.recompute)

    def activation_bytes(self, *args, **kwargs) -> None:
        return None  # no closed form for a model zeroedu does not know: measured only


def _match(model: nn.Module, patterns) -> list[nn.Module]:
    named = dict(model.named_modules())
    out = []
    for pat in patterns:
        if pat.endswith(".*"):
            parent = named.get(pat[:-2])
            if parent is None:
                raise ValueError(f"unit policy: no submodule named {pat[:-2]!r}")
            out += list(parent.children())
        elif pat in named:
            out.append(named[pat])
        else:
            raise ValueError(f"unit policy: no submodule named {pat!r}; the model has "
                             f"{sorted(n for n in named if n)[:12]}...")
    return out


def resolve_units(model: nn.Module, policy) -> list[nn.Module]:
    """The unit modules a policy names (see the module docstring)."""
    return resolve_ref(policy)(model) if isinstance(policy, str) else _match(model, policy)


def check_units(model: nn.Module, units: list[nn.Module]) -> list[nn.Module]:
    """Every parameter in exactly one unit, or a ValueError that says which is not."""
    owner: dict[int, int] = {}
    for k, u in enumerate(units):
        for p in u.parameters():
            if id(p) in owner:
                raise ValueError(f"unit policy: a parameter belongs to units {owner[id(p)]} and {k} "
                                 "(units must not overlap; shared parameters are not supported)")
            owner[id(p)] = k
    missing = [n for n, p in model.named_parameters() if id(p) not in owner]
    if missing:
        raise ValueError(f"unit policy: parameters in no unit: {missing[:6]}")
    return units


def _few(names: list[str]) -> str:
    return repr(names[:6])[:-1] + (f", ... ({len(names)} in all)]" if len(names) > 6 else "]")


def check_trainable(model: nn.Module, allow_frozen: bool = False) -> None:
    """Refuse, with names, what no strategy here trains the way single-process training does.

    * A frozen parameter (``requires_grad=False``): torch's DDP and `fully_shard` give it no
      gradient, no update and no reduction. `ddp` and `fsdp2` do the same (``allow_frozen``);
      the strategies that keep flat buffers of every parameter refuse it rather than train it
      or crash in a hook (torch's FSDP1 refuses mixed flags in a FlatParameter unless
      ``use_orig_params=True``: `_flat_param.py`, "Must flatten tensors with uniform
      `requires_grad`").
    * A norm layer that keeps running statistics in training mode (BatchNorm, InstanceNorm with
      ``track_running_stats``): forward updates its buffers from this rank's batch only, so the
      replicas' buffers drift apart and no strategy can equal single-process training without
      a synchronised norm. (torch's `SyncBatchNorm` runs on GPUs only, outside the ledger.)
    """
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    if frozen and not allow_frozen:
        raise ValueError(f"frozen parameters (requires_grad=False) are not supported here: {_few(frozen)}; "
                         "this strategy keeps flat gradient and optimizer buffers of every parameter "
                         "(torch's FSDP1 likewise refuses a FlatParameter of mixed requires_grad): use ddp "
                         "or fsdp2, which skip them as torch's DDP and fully_shard do, unfreeze them, or "
                         "build the model without them")
    stats = [f"{n} ({type(m).__name__})" for n, m in model.named_modules()
             if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats and m.training]
    if stats:
        raise ValueError(f"norm layers with running statistics are not supported: {_few(stats)}; in training "
                         "mode they update their buffers from each rank's own batch, so ranks would "
                         "disagree and no run could equal single-process training: use nn.LayerNorm or "
                         "nn.GroupNorm, or track_running_stats=False")


def buffers_changed(before: dict[str, torch.Tensor], model: nn.Module) -> list[str]:
    """Names of buffers whose values differ from the snapshot `before` (name -> clone)."""
    now = dict(model.named_buffers())
    return [n for n, b in before.items() if n in now and not torch.equal(b, now[n])]


def persistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """The buffers a state dict keeps (not those registered with ``persistent=False``), by name."""
    out = {}
    for mod_name, mod in model.named_modules():
        for name, b in mod.named_buffers(recurse=False):
            if b is not None and name not in mod._non_persistent_buffers_set:
                out[f"{mod_name}.{name}" if mod_name else name] = b
    return out
