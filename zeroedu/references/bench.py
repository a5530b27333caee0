"""Timed rank jobs for `benchmarks/`: zeroedu and torch side by side, in the same warm pool.

`compare_job` builds every *arm* of a comparison on every rank at once (a zeroedu run through
`train.runner.build_run`, or torch's own DDP / `fully_shard` on the same model, data and Adam),
then runs them in alternating rounds, so each arm sees the same machine load:

    round k:  arm (k mod A), arm (k+1 mod A), ...      each for `steps` optimizer steps

A step is forward + backward + optimizer on every rank, timed on each rank from a barrier to
the end of the optimizer step; the parent takes the slowest rank per step (`slowest_rank`),
since a synchronous step is as slow as its slowest rank. The first `warmup` steps of each
round are not timed. zeroedu's steps go through `train_steps` (its own loop, its hooks for the
timer, micro-batches made before the timer starts); torch's through `torch_ddp_step` /
`torch_train_step` on the same micro-batches.

After the timed rounds every arm runs one more, untimed step between two readings of the
rank's wire meter (the kernel's TCP counters, `zeroedu.runtime.wire`): bytes this rank
really sent in one step, for zeroedu and torch alike, beside zeroedu's ring model (its ledger).

An arm is plain data:

    {"label": str, "impl": "zeroedu" | "torch", "cfg": RunConfig as a dict,
     "timeline": "full" | "minimal"          (zeroedu; default "minimal"),
     "watch": "first" | "every"              (zeroedu, full timeline: which steps' backward
                                              the ledger watches op by op; default "first"),
     "wire_meter": bool                      (zeroedu: False runs without the rank's wire
                                              meter, so no kernel counters are read at each
                                              step's start: what that reading costs; default True),
     "torch": "ddp" | "fully_shard"          (torch; fully_shard on a 2-D mesh when the
                                              config is hybrid: torch's HSDP),
     "bucket_bytes": int}                    (DDP arms: the same bucket size on both sides)

`load_results(path)` reads what `benchmarks/` writes (`benchmarks/results/*.json`), for the
notebooks; its schema is in `SCALING_SCHEMA`.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import replace

import torch

from ..recipes import get_recipe
from ..train.config import config_from_dict
from ..train.runner import build_run, local_micro_batches, train_steps
from .torch_ddp import build_torch_ddp, torch_ddp_step
from .torch_fsdp2 import build_fully_shard, counting_sent, torch_train_step


class _Arm:
    """One side of a comparison, built on this rank: `steps(a, b, batches, timer)` runs
    optimizer steps [a, b) on the given micro-batches."""

    def __init__(self, ctx, spec: dict):
        self.label, self.impl = spec["label"], spec["impl"]
        self.cfg = config_from_dict(spec["cfg"])
        self.spec = spec
        if self.impl == "zeroedu":
            self.run = build_run(ctx, replace(self.cfg, timeline=spec.get("timeline", "minimal")))
            self.run.ledger.watch = spec.get("watch", self.run.ledger.watch)
            if not spec.get("wire_meter", True):
                # The ledger reads the meter at each step's start, comm around collectives
                # (full timeline): without it, neither reads the kernel's counters.
                self.run.ledger.wire = None
                self.run.dist.comm.meter = None
        elif self.impl == "torch":
            kind = spec.get("torch", "fully_shard")
            if kind == "ddp":
                self.model, self.opt = build_torch_ddp(self.cfg, spec.get("bucket_bytes", 2 ** 20))
                dtype = get_recipe(self.cfg.recipe).param
                self._step = lambda x, y: torch_ddp_step(self.model, self.opt, x, y, dtype)
            elif kind == "fully_shard":
                self.model, self.opt = build_fully_shard(self.cfg, ctx.world_size)
                dtype = get_recipe(self.cfg.recipe).param
                self._step = lambda x, y: torch_train_step(self.model, self.opt, x, y, dtype)
            else:
                raise ValueError(f"torch arm must be 'ddp' or 'fully_shard', got {kind!r}")
        else:
            raise ValueError(f"impl must be 'zeroedu' or 'torch', got {self.impl!r}")
        self.step_no = 0  # zeroedu's ledger counts steps across rounds

    def steps(self, count: int, batches, before, after) -> None:
        if self.impl == "zeroedu":
            a = self.step_no
            train_steps(self.run, a, a + count, before_step=lambda s: before(),
                        after_step=lambda s: after(), batches=lambda s: batches[(s - a) % len(batches)],
                        progress=False)
        else:
            for s in range(count):
                before()
                ((x, y),) = batches[s % len(batches)]
                self._step(x, y)
                after()
        self.step_no += count


def compare_job(ctx, arms: list[dict], rounds: int = 5, steps: int = 3, warmup: int = 1,
                profile: str | None = None) -> dict:
    """Time every arm in alternating rounds on this rank (module docstring). `profile`: a path
    prefix; rank 0 writes a cProfile of each arm's last round to `<profile>.<label>.prof`."""
    import torch.distributed as dist

    built = [_Arm(ctx, a) for a in arms]
    cfg = built[0].cfg
    # Micro-batches made once, before any timing: a step's time is the training step alone.
    batches = [local_micro_batches(cfg, s, ctx.rank, ctx.world_size) for s in range(steps + warmup)]
    times = {a.label: [] for a in built}
    first = {}  # each arm's very first step (a zeroedu full timeline watches its backward)
    clock = {}

    def before():
        dist.barrier()
        clock["t"] = time.perf_counter()

    def after():
        clock["dt"] = time.perf_counter() - clock["t"]

    for k in range(rounds):
        for i in range(len(built)):
            arm = built[(k + i) % len(built)]
            prof = None
            if profile and ctx.rank == 0 and k == rounds - 1:
                import cProfile

                prof = cProfile.Profile()
            for s in range(steps + warmup):
                if prof is not None and s == warmup:
                    prof.enable()
                arm.steps(1, [batches[s]], before, after)
                if s >= warmup:
                    times[arm.label].append(clock["dt"])
                first.setdefault(arm.label, clock["dt"])
            if prof is not None:
                prof.disable()
                prof.dump_stats(f"{profile}.{arm.label}.prof")
            # a heartbeat: a job that streams is alive (`cluster.Pool.run`), so a comparison that
            # takes longer than the pool's limit on a busy machine is not taken for a hung one
            ctx.emit({"type": "heartbeat", "rank": ctx.rank, "round": k, "arm": arm.label})
    out = {"rank": ctx.rank, "times": times, "first": first, "wire": {}, "ring_model": {}, "messages": {},
           "peak": {}}
    meter = ctx.wire if getattr(ctx.wire, "available", False) else None
    for arm in built:
        # One more step, untimed, between two readings of the kernel's counters.
        dist.barrier()
        if arm.impl == "zeroedu":
            arm.steps(1, [batches[0]], lambda: None, lambda: None)
            ledger = arm.run.ledger
            w = ledger.wire_report()
            out["wire"][arm.label] = w.sent
            out["messages"][arm.label] = w.messages
            out["ring_model"][arm.label] = float(sum(ledger.comm_by_collective().values()))
            out["peak"][arm.label] = ledger.peak
        else:
            snap = meter.snapshot() if meter is not None else None
            with counting_sent() as sent:
                arm.steps(1, [batches[0]], lambda: None, lambda: None)
            out["wire"][arm.label] = meter.sent_since(snap).sent if meter is not None else None
            # fully_shard's all-gathers and reduce-scatters under the ring model (DDP's
            # all-reduces and HSDP's outer all-reduce are not counted here: None)
            out["ring_model"][arm.label] = (float(sum(sent.values()))
                                            if arm.spec.get("torch") == "fully_shard" and cfg.m == 1 else None)
    return out


# ---------------------------------------------------------------------------- parent side
def slowest_rank(ranks: list[dict], label: str) -> list[float]:
    """Per step, the slowest rank's time (a synchronous step lasts as long as its slowest rank)."""
    return [max(step) for step in zip(*(r["times"][label] for r in ranks))]


def round_ratios(a: list[float], b: list[float], steps: int) -> list[float]:
    """Per round, the median step of arm `a` over that of arm `b` (`per_step` lists from
    `run_compare`, `steps` timed steps per round): the two arms ran back to back in each round,
    under the same load, so the spread of these ratios is what the machine's noise does to one."""
    if len(a) != len(b) or steps < 1:
        raise ValueError("two arms timed over the same rounds, and steps >= 1")
    return [statistics.median(a[k:k + steps]) / statistics.median(b[k:k + steps])
            for k in range(0, len(a), steps)]


def summary(times: list[float]) -> dict:
    """Median, min and max of per-step times (seconds), and how many steps."""
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "steps": len(times)}


def run_compare(pool, arms: list[dict], rounds: int = 5, steps: int = 3, warmup: int = 1,
                profile: str | None = None, timeout: float = 900) -> dict:
    """Run `compare_job` on `pool`; per arm: the step-time summary (slowest rank per step) and
    rank 0's bytes per step (wire measured, ring model), plus the raw per-rank results."""
    ranks = pool.run(compare_job, {"arms": arms, "rounds": rounds, "steps": steps, "warmup": warmup,
                                   "profile": profile}, timeout=timeout)
    out = {}
    for a in arms:
        lab = a["label"]
        per_step = slowest_rank(ranks, lab)
        out[lab] = {**summary(per_step), "per_step": per_step, "wire": ranks[0]["wire"][lab],
                    "ring_model": ranks[0]["ring_model"][lab], "messages": ranks[0]["messages"].get(lab),
                    "peak": ranks[0]["peak"].get(lab), "first": max(r["first"][lab] for r in ranks)}
    return out


def loopback_job(ctx, nbytes: int = 32 << 20, reps: int = 5) -> dict:
    """Point-to-point bandwidth and latency between ranks 0 and 1 over gloo on loopback:
    ping-pong of `nbytes` (bandwidth = bytes / one-way time) and of 4 bytes (α = half the
    round trip), best of `reps`. Other ranks wait."""
    import torch.distributed as dist

    out = {"rank": ctx.rank}
    if ctx.rank > 1:
        dist.barrier()
        return out
    peer = 1 - ctx.rank
    for name, size in (("big", nbytes), ("small", 4)):
        buf = torch.zeros(size // 4, dtype=torch.float32)
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            if ctx.rank == 0:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)
            best = min(best, (time.perf_counter() - t) / 2)
        out[name] = best
    dist.barrier()
    out["bandwidth"] = nbytes / out["big"]
    out["alpha"] = out["small"]
    return out


# ---------------------------------------------------------------------------- results files
SCALING_SCHEMA = """benchmarks/results/scaling.json (written by benchmarks/bench_scaling.py):
{"model": str, "recipe": str, "machine": {"cores": int, "loadavg": [1, 5, 15 min]},
 "loopback": {"bandwidth": bytes/s, "alpha": s},          # measured between two ranks
 "rows": [{"n": int, "strategy": "ddp" | "zero2" | "fsdp",
           "zeroedu": {"impl": str, "median": s, "min": s, "max": s, "steps": int,
                       "per_step": [s, ...] (slowest rank, rounds in order),
                       "wire": bytes/rank/step measured, "ring_model": bytes},
           "torch":   {"impl": str, "median": s, "min": s, "max": s, "steps": int,
                       "wire": bytes/rank/step measured, "ring_model": bytes | null},
           "ratio": zeroedu median / torch median,
           "closed_form": {"sent": ring-model bytes/rank/step (theory.exact_comm),
                           "wire": payload on the wire for zeroedu's collectives,
                           "t_comm": s = theory.comm_time(sent, loopback bandwidth)}}]}
Times are per optimizer step, the slowest rank per step; N ranks share the machine's cores."""


# The repository's benchmarks/results/, found from this file (an editable install or a checkout).
RESULTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "benchmarks", "results")


def load_results(path: str = "scaling") -> dict:
    """A results file written by `benchmarks/` as plain data: a path, or the name of one in the
    repository's benchmarks/results/ ("scaling", "compare", "collectives", "instrumentation",
    "launch"). Schema of scaling.json: `SCALING_SCHEMA`; the others keep the scripts' rows."""
    if os.path.sep not in path and not path.endswith(".json"):
        path = os.path.join(RESULTS_DIR, f"{path}.json")
    with open(path) as f:
        return json.load(f)
