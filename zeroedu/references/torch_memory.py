"""torch's own memory tracker around a zeroedu run: the independent check of the ledger's peak.

`memtracker_job` enters `torch.distributed._tools.mem_tracker.MemTracker` before `build_run`
(so every allocation of the run is seen: the model, the strategy's shards and buffers, Adam's
state, the step) and trains one step inside it (the tracker refuses a second iteration without
`reset_mod_stats`). The tracker counts every storage an operation returns, by dispatch, and its
resizes; its peak is the largest total at any operation. Beside it, the job returns the
ledger's peak and, at the tracker's own peak, an itemization: which live storages the ledger
tracks, and the ones it does not, grouped by the operation that made them (the tracker's
"ACT" in forward, "TEMP" in backward). What the tracker cannot see either: allocations on other
threads (a dispatch mode is thread-local; zeroedu's ring collectives run on a comm thread, their
two k-element scratch chunks) and gloo's own buffers (not torch tensors).

`adam_temporaries` measures what one optimizer step allocates beyond the state it keeps, for
torch's three Adam implementations (`torch.optim.Adam` for-loop, foreach, fused) and zeroedu's,
on fp32 CPU parameters, with the same tracker: the figures `theory.memory.adam_step_temporaries`
predicts.

`peak_job` trains cfg.steps without a tracker and returns the ledger's peak with its bytes by
category (and, full timeline, the bytes while the last step's Adam update ran), to set beside `FSDPMemTracker`'s peak of torch's `fully_shard`
(`torch_fsdp2.fully_shard_job`).
"""
from __future__ import annotations

import collections
from dataclasses import replace

from ..kinds import EventKind
from ..runtime import matmul16
from ..runtime.cuda import cuda_memory
from ..train.config import config_from_dict
from ..train.runner import build_run, train_step, train_steps
from .torch_private import cublas_workspace_bytes, itemizing_mem_tracker, mem_tracker

ADAM_IMPLEMENTATIONS = ("zeroedu", "for-loop", "foreach", "fused")  # `theory.memory.ADAM_IMPLEMENTATIONS`


def adam_temporaries(shapes, implementation: str, scale: float = 1.0) -> int:
    """Bytes the second Adam step of fp32 CPU parameters of `shapes` holds at its peak beyond
    what was alive when it started, measured by torch's MemTracker (the first step allocates
    torch's lazy state, so the second is the steady one). "zeroedu": `AdamState.step` with the
    gradients scaled by `scale` (1: read in place; else through the scratch buffer)."""
    import torch

    from ..optim import AdamConfig
    from ..recipes import get_recipe
    from ..runtime.ledger import Ledger
    from ..strategies.base import AdamState

    if implementation not in ADAM_IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {ADAM_IMPLEMENTATIONS}, got {implementation!r}")
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    grads = [torch.randn(s, generator=g) for s in shapes]
    if implementation == "zeroedu":
        state = AdamState([p.data for p in params], get_recipe("fp32"), AdamConfig(), Ledger(0))
        step, external = (lambda: state.step(grads, scale=scale)), [*state.m, *state.v]
    else:
        for p, gr in zip(params, grads):
            p.grad = gr
        flag = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[implementation]
        opt = torch.optim.Adam(params, lr=1e-3, **flag)
        step, external = opt.step, [opt]
    step()
    tracker = mem_tracker()()
    tracker.track_external(*params, *grads, *external)
    with tracker:
        before = tracker.get_tracker_snapshot("current")
        step()
        peak = tracker.get_tracker_snapshot("peak")
    cpu = torch.device("cpu")
    return peak[cpu]["Total"] - before[cpu]["Total"]


def memtracker_job(ctx, cfg: dict, timeline: str = "full") -> dict:
    """One training step of `cfg` (build included) inside torch's MemTracker, on every rank."""
    cfg = replace(config_from_dict(cfg), timeline=timeline)  # the ledger checks the mode
    mt = itemizing_mem_tracker()()
    # torch's own 16-bit kernels: the tracker sees every allocation, and an emulated product's fp32
    # copies are this CPU's, not the lesson's (`runtime.matmul16.native`)
    with mt, matmul16.native():
        run = build_run(ctx, cfg)
        mt.ledger = run.ledger
        train_step(run, 0)
    live, ledger_at_peak, tracked, op = mt.at_peak
    untracked = collections.Counter()
    for key, nbytes, origin in live:
        if key not in tracked:
            untracked[origin] += nbytes
    led = run.ledger
    return {"rank": ctx.rank, "tracker_peak": mt.peak_total, "ledger_peak": led.peak,
            "ledger_peak_label": led.peak_label, "ledger_peak_bytes": dict(led.peak_bytes),
            "at_tracker_peak": {"op": op, "ledger": ledger_at_peak,
                                "tracked": sum(b for k, b, _ in live if k in tracked),
                                "untracked": dict(untracked.most_common())}}


def peak_job(ctx, cfg: dict, timeline: str = "full") -> dict:
    """cfg.steps of training, no tracker: the ledger's peak, its label and bytes by category."""
    run = build_run(ctx, replace(config_from_dict(cfg), timeline=timeline))
    train_steps(run, progress=False)
    led = run.ledger
    updates = [e.bytes for e in led.events if e.kind is EventKind.UPDATE]  # full timeline: every step's
    return {"rank": ctx.rank, "peak": led.peak, "peak_label": led.peak_label, "peak_bytes": dict(led.peak_bytes),
            "model_states": dict(led.model_state_bytes), "at_update": dict(updates[-1]) if updates else None}


def cuda_memory_job(ctx, cfg: dict) -> dict:
    """On a GPU rank: cfg.steps of training, then the ledger's peak (its label, its bytes by
    category) beside what the CUDA allocator and the device say (`reports.CudaMemory`), the
    cuBLAS workspaces read by freeing them (after the allocator's peak is read)."""
    run = build_run(ctx, config_from_dict(cfg))
    train_steps(run, progress=False)
    led = run.ledger
    seen = cuda_memory(ctx.device)
    seen.cublas_workspace = cublas_workspace_bytes(ctx.device)
    return {"rank": ctx.rank, "peak": led.peak, "peak_label": led.peak_label, "peak_bytes": dict(led.peak_bytes),
            "model_states": dict(led.model_state_bytes), "cuda": seen.plain()}
