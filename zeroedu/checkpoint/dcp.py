"""Interoperate with `torch.distributed.checkpoint` (DCP), both directions.

A DCP checkpoint of this suite's model is the nested state dict torch's own helpers
(`torch.distributed.checkpoint.state_dict.get_state_dict`) produce, keyed by fully qualified
parameter names exactly as `model.state_dict()`::

    {"model": {"0.weight": W, "0.bias": b, "2.weight": ...},
     "optim": {"state": {"0.weight": {"step": t, "exp_avg": m, "exp_avg_sq": v}, ...},
               "param_groups": [{"lr": ..., "params": ["0.weight", ...]}]}}

* `export_dcp`: a zeroedu checkpoint (any strategy, any world size) -> DCP, full tensors,
  written from one process (DCP's no-process-group mode).
* `load_dcp`: a DCP checkpoint -> `checkpoint.FullState`, so any zeroedu strategy can take it
  (`resume(..., resume_from=dcp_dir, format="dcp")`). DCP reshards on read: whatever wrote it
  (FSDP2 DTensor shards on 4 ranks, or one process) we ask for full plain tensors.

**Trust.** DCP's ``.metadata`` is a pickle (`FileSystemReader.read_metadata` calls
``pickle.load`` in torch/distributed/checkpoint/filesystem.py), and unpickling can run code. So
DCP is read only when the caller names the format, never detected from a file name: load a DCP
directory only if it comes from a source you trust. zeroedu's own format needs no such trust.
The independent other side, torch's own `fully_shard` saving to / resuming from DCP, is in
`zeroedu.references.torch_dcp`.

Adam's step counter in torch is a float tensor per parameter; zeroedu keeps one int. The data
position is the optimizer step, since every step consumes one global batch.
"""
from __future__ import annotations

import os
import warnings

import torch

from ..models import ModelSpec, get_model
from .format import FullState, param_shapes


def is_dcp(path: str) -> bool:
    return os.path.exists(os.path.join(path, ".metadata"))


def _names(model: ModelSpec) -> list[str]:
    return [n for n, _ in get_model(model).build().named_parameters()]


def export_dcp(state: FullState, dcp_dir: str, adam=None, model: ModelSpec | None = None) -> str:
    """Write a (resharded) zeroedu checkpoint as a DCP checkpoint of full tensors. The parameter
    names come from `model`, else from the model the checkpoint's manifest describes; a manifest
    that names code to import (a custom model's "module:function") is data from disk, and
    exporting it runs nothing: pass that model as `model` instead."""
    import torch.distributed.checkpoint as dcp

    if model is None:
        described = state.manifest.get("model")
        if not isinstance(described, (dict, str)) or (isinstance(described, dict)
                                                      and described.get("kind", "mlp") not in ("mlp", "gpt")):
            kind = described.get("kind") if isinstance(described, dict) else type(described).__name__
            raise ValueError(f"{state.path}: its manifest describes a model of kind {kind!r}, which would "
                             "import and run code named in the file; pass the model (model=...) to export it")
        model = described
    names = _names(model)
    step = torch.tensor(float(state.adam_step))
    group = {"params": names}
    if adam is not None:
        group.update(lr=adam.lr, betas=(adam.beta1, adam.beta2), eps=adam.eps)
    sd = {"model": dict(zip(names, state.params)),
          "optim": {"state": {n: {"step": step.clone(), "exp_avg": m, "exp_avg_sq": v}
                              for n, m, v in zip(names, state.m, state.v)},
                    "param_groups": [group]}}
    with warnings.catch_warnings():  # "no process group: single process" is the intent here
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(sd, checkpoint_id=dcp_dir, no_dist=True)
    return dcp_dir


def load_dcp(dcp_dir: str, model: ModelSpec) -> FullState:
    """Read a DCP checkpoint of `model` (saved by torch or by `export_dcp`) as full fp32 tensors.
    The directory must come from a trusted source: its metadata is unpickled."""
    import torch.distributed.checkpoint as dcp

    if not is_dcp(dcp_dir):
        raise ValueError(f"{dcp_dir}: not a DCP checkpoint (no .metadata file)")
    meta = dcp.FileSystemReader(dcp_dir).read_metadata()
    names, shapes = _names(model), [tuple(s) for s in param_shapes(model)]
    for n, s in zip(names, shapes):
        got = meta.state_dict_metadata.get(f"model.{n}")
        if got is None or tuple(got.size) != s:
            raise ValueError(f"{dcp_dir}: parameter {n!r} is {None if got is None else tuple(got.size)} "
                             f"in the checkpoint, the model has {s}")
    sd = {"model": {n: torch.zeros(s) for n, s in zip(names, shapes)},
          "optim": {"state": {n: {"step": torch.tensor(0.0), "exp_avg": torch.zeros(s),
                                  "exp_avg_sq": torch.zeros(s)} for n, s in zip(names, shapes)}}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(sd, checkpoint_id=dcp_dir, no_dist=True)
    steps = {int(sd["optim"]["state"][n]["step"].item()) for n in names}
    if len(steps) != 1:
        raise ValueError(f"{dcp_dir}: parameters disagree on the Adam step: {sorted(steps)}")
    step = steps.pop()
    man = {"format": "dcp", "step": step, "model": get_model(model).as_dict(), "param_shapes": [list(s) for s in shapes],
           "world_size": None, "strategy": "dcp"}
    st = sd["optim"]["state"]
    return FullState(step, step, [sd["model"][n] for n in names], [st[n]["exp_avg"] for n in names],
                     [st[n]["exp_avg_sq"] for n in names], [], man, dcp_dir)
