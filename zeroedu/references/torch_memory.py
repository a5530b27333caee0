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

`peak_job` trains cfg.steps without a tracker and returns the ledger's peak with its bytes by
category, to set beside `FSDPMemTracker`'s peak of torch's `fully_shard`
(`torch_fsdp2.fully_shard_job`).
"""
from __future__ import annotations

import collections
from dataclasses import replace

from ..train.config import config_from_dict
from ..train.runner import build_run, train_step, train_steps
from .torch_private import itemizing_mem_tracker


def memtracker_job(ctx, cfg: dict, timeline: str = "full") -> dict:
    """One training step of `cfg` (build included) inside torch's MemTracker, on every rank."""
    cfg = replace(config_from_dict(cfg), timeline=timeline)  # the ledger checks the mode
    mt = itemizing_mem_tracker()()
    with mt:
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
    return {"rank": ctx.rank, "peak": led.peak, "peak_label": led.peak_label, "peak_bytes": dict(led.peak_bytes),
            "model_states": dict(led.model_state_bytes)}
