"""The GPT seen learning: a 200-step loss curve per strategy family against single-process training.

Every family trains gpt-tiny on N = 4 ranks (the hybrid on a 2 x 2 mesh) in fp32 (so that equal
means equal to round-off; `--recipe mixed-bf16` shows bf16's rounding instead), and the run's
report carries the single-process reference on the same global batch, recipe and seed
(`RunReport.reference_losses`), so each curve sits beside the curve it must equal. Notebook 02 and the README read the cached result,
`benchmarks/results/loss_curves.json`; this script regenerates it (about 5 minutes on 2 cores):

    python benchmarks/bench_loss_curves.py [--steps 200] [--model gpt-tiny] [--families ddp_bucketed,...]

and `docs/figures/make_figures.py` redraws the README's figure from it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from zeroedu.train import RunConfig, run  # noqa: E402

# One strategy per family the course teaches (DDP, ZeRO-1, ZeRO-2, ZeRO-3/FSDP, Megatron's
# distributed optimizer, hybrid sharding): the N of each run, and M for the hybrid.
FAMILIES = {"ddp_bucketed": (4, 1), "zero1": (4, 1), "zero2": (4, 1), "fsdp2": (4, 1), "megatron_distopt": (4, 1),
            "hfsdp": (4, 2)}
RESULT = "loss_curves"


def curve(strategy: str, n: int, m: int, steps: int, model: str, recipe: str) -> dict:
    t0 = time.perf_counter()
    r = run(RunConfig(strategy, n, steps=steps, m=m, model=model, recipe=recipe, timeline="minimal"))
    worst = max(abs(a - b) / abs(b) for a, b in zip(r.losses, r.reference_losses))
    print(f"  {strategy:18s} N = {n}{f', M = {m}' if m > 1 else ''}  {r.recipe:13s} loss {r.losses[0]:.3f} -> "
          f"{r.losses[-1]:.3f}  (single process {r.reference_losses[-1]:.3f}; worst step {worst:.1e} relative)"
          f"  {time.perf_counter() - t0:.0f} s", flush=True)
    return {"strategy": strategy, "n": r.n, "m": r.m, "recipe": r.recipe, "losses": list(r.losses),
            "reference": list(r.reference_losses), "worst_relative": worst}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--model", default="gpt-tiny")
    ap.add_argument("--recipe", default="fp32")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--quick", action="store_true", help="20 steps (make bench BENCH_ARGS=--quick)")
    a = ap.parse_args(argv)
    steps = 20 if a.quick else a.steps
    print(f"{a.model}, {a.recipe}, {steps} steps per family; {common.load()}")
    rows = [curve(s, *FAMILIES[s], steps, a.model, a.recipe) for s in a.families.split(",")]
    name = RESULT + ("_quick" if a.quick else "")  # a quick pass never replaces the curves the course reads
    print("written:", common.write_results(name, {"model": a.model, "recipe": a.recipe, "steps": steps,
                                                    "rows": rows}))
    return rows


if __name__ == "__main__":
    main()
