"""torch's own `fully_shard` saving to and resuming from `torch.distributed.checkpoint` (DCP):
the independent other side of `zeroedu.checkpoint.dcp`.

* `fsdp2_save_job`: torch `fully_shard` + `torch.optim.Adam` for cfg.steps, then a sharded DCP save;
* `fsdp2_resume_job`: `fully_shard` loads a DCP checkpoint (e.g. exported from zeroedu) and
  trains on.
"""
from __future__ import annotations

from ..train.config import config_from_dict
from .torch_fsdp2 import build_fully_shard, torch_train_steps


def fsdp2_save_job(ctx, cfg: dict, dcp_dir: str) -> dict:
    """torch `fully_shard` + torch.optim.Adam for cfg.steps, then a sharded DCP save."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    cfg = config_from_dict(cfg)
    model, opt = build_fully_shard(cfg, ctx.world_size)
    losses = torch_train_steps(ctx, cfg, model, opt, 0)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=dcp_dir)
    return {"rank": ctx.rank, "losses": losses}


def fsdp2_resume_job(ctx, cfg: dict, dcp_dir: str) -> dict:
    """torch `fully_shard` loads a DCP checkpoint (e.g. exported from zeroedu) and trains on."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    cfg = config_from_dict(cfg)
    model, opt = build_fully_shard(cfg, ctx.world_size)
    msd, osd = get_state_dict(model, opt)  # initialises Adam's state, sharded like the params
    dcp.load({"model": msd, "optim": {"state": osd["state"]}}, checkpoint_id=dcp_dir)
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    start = int(next(iter(opt.state.values()))["step"].item())
    losses = torch_train_steps(ctx, cfg, model, opt, start)
    params = [p.full_tensor().detach().float().clone() for p in model.parameters()]
    return {"rank": ctx.rank, "start": start, "losses": losses, **({"params": params} if ctx.rank == 0 else {})}
