"""zeroedu's pipeline beside torch's own, on every rank of a pp axis: one step's gradients.

`torch_pipeline_job` takes one optimizer step's forwards and backwards of a GPT cut into p stages
two ways, from the same weights and the same batch:

* **zeroedu**: `strategies.pipeline.Pipeline` (its schedule, its sends through `comm`);
* **torch**: `torch.distributed.pipelining`, the same stage module (`strategies.pipeline.Stage`)
  wrapped in `PipelineStage` and run by `ScheduleGPipe` or `Schedule1F1B` over gloo; torch
  divides the gradients by m (`scale_grads=True`), as zeroedu's loss scaling does;

and returns each stage's gradients by parameter name, for the caller to set beside one process's
(the whole GPT on the whole batch, as `train.reference` trains it) and beside each other.
"""
from __future__ import annotations

import torch

from ..kinds import PP, Mesh
from ..models import get_model
from ..runtime.comm import Comm
from ..runtime.ledger import Ledger
from ..strategies.pipeline import Pipeline, Stage


def torch_pipeline_job(ctx, model: dict, schedule: str, microbatches: int, global_batch: int) -> dict:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    cfg = get_model(model)
    p, m = ctx.world_size, microbatches
    mesh = Mesh.build(p, pp=p)  # (pp p, dp_shard 1)
    axis = ctx.axes(mesh)[PP]
    x, y = cfg.batch(0, global_batch)
    micro = [(a.clone(), b.clone()) for a, b in zip(x.chunk(m), y.chunk(m))]

    ledger = Ledger(ctx.rank, mesh=mesh)
    ours = Pipeline(cfg.build(), axis, Comm(ledger), ledger, schedule)
    loss = ours.forward_backward(micro)
    zeroedu_grads = {n: q.grad.clone() for n, q in zip(ours.stage.names, ours.stage.params)}

    gpt = cfg.build()
    stage = Stage(gpt, p, axis.rank)
    pipe_stage = PipelineStage(stage, axis.rank, p, torch.device("cpu"), group=axis.group)
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    sched = cls(pipe_stage, m, loss_fn=gpt.loss)
    losses: list = []
    if stage.first:
        sched.step(x)
    elif stage.last:
        sched.step(target=y, losses=losses)
    else:
        sched.step()
    torch_grads = {n: q.grad.clone() for n, q in zip(stage.names, stage.params)}
    return {"stage": axis.rank, "zeroedu": zeroedu_grads, "torch": torch_grads,
            "loss": loss, "torch_loss": float(sum(v.item() for v in losses) / m) if stage.last else None}
