"""Mixed precision on a CPU without a fast 16-bit matmul: a gpt-small step in mixed-bf16 against fp32.

Each row is one process (its own `ZEROEDU_MATMUL16` decision and CPU settings), training
gpt-small with DDP on one rank (`DistState.single`, the spine's `train_step`: forward, backward,
Adam), global batch 16, one torch thread. Per arm, the median of the timed steps after a warm-up,
arms alternated in rounds; the ratio is mixed-bf16's median over fp32's from the same process.

Rows: this CPU as it is (the probe decides); the same CPU made to lack a fast bf16 kernel
(``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2``, tests/README.md), with torch's own
16-bit product (native: its fallback loop) and with the emulated one. Done-when of the "any
CPU" issue: the emulated row's ratio <= 1.3.

    .venv/bin/python benchmarks/bench_matmul16.py [--quick] [--rounds 3] [--steps 2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import common

SLOW_CPU = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
ROWS = [  # (label, environment)
    ("this CPU, as the probe decides", {}),
    ("no fast bf16 kernel, torch's own product", {**SLOW_CPU, "ZEROEDU_MATMUL16": "native"}),
    ("no fast bf16 kernel, emulated", {**SLOW_CPU, "ZEROEDU_MATMUL16": "emulated"}),
]


def child(model: str, rounds: int, steps: int, batch: int) -> dict:
    """In the row's process: time fp32 and mixed-bf16 steps in alternating rounds."""
    import torch

    from zeroedu.models import make_model
    from zeroedu.models.gpt import PRESETS
    from zeroedu.recipes import get_recipe
    from zeroedu.runtime import matmul16
    from zeroedu.runtime.ledger import Ledger
    from zeroedu.strategies import build
    from zeroedu.strategies.base import DistState
    from zeroedu.train import RunConfig
    from zeroedu.train.runner import RankRun, train_step

    torch.set_num_threads(1)
    runs = {}
    for recipe in ("fp32", "mixed-bf16"):
        cfg = RunConfig("ddp", 1, steps=1, recipe=recipe, model=model, global_batch=batch).resolved()
        dist = DistState.single(Ledger(0, timeline_mode="minimal"))
        strat = build("ddp", make_model(PRESETS[model]), dist, get_recipe(recipe), cfg.adam)
        runs[recipe] = RankRun(cfg, None, dist.ledger, dist, strat)
    batches = [[PRESETS[model].batch(k, batch)] for k in range(steps + 1)]
    times = {r: [] for r in runs}
    for _ in range(rounds):
        for recipe, run in runs.items():
            train_step(run, 0, batches[0])  # warm-up: the first step allocates Adam's scratch
            for k in range(1, steps + 1):
                t0 = time.perf_counter()
                train_step(run, k, batches[k])
                times[recipe].append(time.perf_counter() - t0)
    med = {r: sorted(t)[len(t) // 2] for r, t in times.items()}
    d = matmul16.decision()
    return {"fp32": med["fp32"], "mixed-bf16": med["mixed-bf16"], "ratio": med["mixed-bf16"] / med["fp32"],
            "matmul16": d.plain()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per arm and round (+1 warm-up)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="1 round")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.quick:
        a.rounds = 1
    if a.child:
        print(json.dumps(child(a.model, a.rounds, a.steps, a.batch)))
        return None
    print(f"{a.model}, DDP on one rank, global batch {a.batch}, {a.rounds} rounds x {a.steps} steps; {common.load()}")
    rows = []
    for label, env in ROWS:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--model", a.model, "--rounds", str(a.rounds),
               "--steps", str(a.steps), "--batch", str(a.batch)]
        # each row's settings alone: none of them inherited from the caller's environment
        base = {k: v for k, v in os.environ.items() if k not in ("ZEROEDU_MATMUL16", *SLOW_CPU)}
        out = subprocess.run(cmd, env={**base, "OMP_NUM_THREADS": "1", **env}, capture_output=True,
                             text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append({"label": label, "env": env, **r})
        m = r["matmul16"]
        print(f"  {label:<42} fp32 {1e3 * r['fp32']:7.0f} ms  mixed-bf16 {1e3 * r['mixed-bf16']:7.0f} ms  "
              f"ratio {r['ratio']:5.2f}  (bf16 matmul: {m['bf16']}; torch's kernels {m['cpu_capability']}, "
              f"oneDNN bf16 {m['onednn_bf16']})", flush=True)
    common.write_results("matmul16", {"model": a.model, "batch": a.batch, "rounds": a.rounds, "steps": a.steps,
                             "load": common.load(), "rows": rows})
    return rows


if __name__ == "__main__":
    main()
