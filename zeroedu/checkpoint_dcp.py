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
  (`resume(..., resume_from=dcp_dir)` detects the format). DCP reshards on read: whatever
  wrote it (FSDP2 DTensor shards on 4 ranks, or one process) we ask for full plain tensors.
* `fsdp2_save_job` / `fsdp2_resume_job`: torch's own `fully_shard` (on CPU gloo, as in
  `zeroedu.reference_fsdp2`) saving to / resuming from DCP: the independent other side.

Adam's step counter in torch is a float tensor per parameter; zeroedu keeps one int. The data
position is the optimizer step, since every step consumes one global batch.
"""
from __future__ import annotations

import os
import warnings

import torch

from .checkpoint import FullState, param_shapes
from .models import ModelConfig, local_slice, make_batch, make_model
from .train import config_from_dict


def is_dcp(path: str) -> bool:
    return os.path.exists(os.path.join(path, ".metadata"))


def _names(cfg: ModelConfig) -> list[str]:
    return [n for n, _ in make_model(cfg).named_parameters()]


def export_dcp(state: FullState, dcp_dir: str, adam=None) -> str:
    """Write a (resharded) zeroedu checkpoint as a DCP checkpoint of full tensors."""
    import torch.distributed.checkpoint as dcp

    names = _names(ModelConfig(**state.manifest["model"]))
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


def load_dcp(dcp_dir: str, model: ModelConfig) -> FullState:
    """Read a DCP checkpoint of `model` (saved by torch or by `export_dcp`) as full fp32 tensors."""
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
    man = {"format": "dcp", "step": step, "model": model.as_dict(), "param_shapes": [list(s) for s in shapes],
           "world_size": None, "strategy": "dcp"}
    st = sd["optim"]["state"]
    return FullState(step, step, [sd["model"][n] for n in names], [st[n]["exp_avg"] for n in names],
                     [st[n]["exp_avg_sq"] for n in names], [], man, dcp_dir)


# ------------------------------------------------------------------------ torch's side
def _torch_train(ctx, cfg, model, opt, start: int) -> list[float]:
    from .reference_fsdp2 import _train_step

    sl = local_slice(cfg.global_batch, ctx.world_size, ctx.rank)
    losses = []
    for step in range(start, cfg.steps):
        x, y = make_batch(step, cfg.global_batch, cfg.model)
        losses.append(_train_step(model, opt, x[sl], y[sl]))
    return losses


def fsdp2_save_job(ctx, cfg: dict, dcp_dir: str) -> dict:
    """torch `fully_shard` + torch.optim.Adam for cfg.steps, then a sharded DCP save."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from .reference_fsdp2 import _build

    cfg = config_from_dict(cfg)
    model, opt = _build(cfg, ctx.world_size)
    losses = _torch_train(ctx, cfg, model, opt, 0)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=dcp_dir)
    return {"rank": ctx.rank, "losses": losses}


def fsdp2_resume_job(ctx, cfg: dict, dcp_dir: str) -> dict:
    """torch `fully_shard` loads a DCP checkpoint (e.g. exported from zeroedu) and trains on."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from .reference_fsdp2 import _build

    cfg = config_from_dict(cfg)
    model, opt = _build(cfg, ctx.world_size)
    msd, osd = get_state_dict(model, opt)  # initialises Adam's state, sharded like the params
    dcp.load({"model": msd, "optim": {"state": osd["state"]}}, checkpoint_id=dcp_dir)
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    start = int(next(iter(opt.state.values()))["step"].item())
    losses = _torch_train(ctx, cfg, model, opt, start)
    params = [p.full_tensor().detach().float().clone() for p in model.parameters()]
    return {"rank": ctx.rank, "start": start, "losses": losses, **({"params": params} if ctx.rank == 0 else {})}
