"""zeroedu's FSDP2 vs torch's `fully_shard`, side by side in one run (N ranks, gloo on CPU).

Same model, same data, same recipe. Reports per implementation: median step time (the slowest
rank of each step, warm-up steps dropped), the ratio zeroedu / torch (goal <= 1.10), peak bytes
per rank (zeroedu: its ledger; torch: FSDPMemTracker on a short separate run, since the
tracker slows every op) and bytes one rank sends per step (zeroedu: its comm records; torch: its
two collective functions wrapped and counted under the same ring model), next to 3Ψ from the
closed forms. Timings are noisy on a shared machine: the two implementations alternate rounds.

    .venv/bin/python benchmarks/bench_fsdp.py [--n 4] [--hidden 512] [--depth 6] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics

from zeroedu import shard, theory
from zeroedu.runtime import cluster
from zeroedu.models import MLPConfig, make_model, unit_shapes
from zeroedu.references.torch_fsdp2 import fully_shard_job, timed_job
from zeroedu.train import RunConfig, config_to_dict


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=6, help="steps per round (2 of them warm-up)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--recipe", default="fp32", choices=["fp32", "mixed-bf16"])
    args = ap.parse_args(argv)

    model = MLPConfig(d_in=args.hidden, hidden=args.hidden, depth=args.depth, d_out=args.hidden - 3)
    cfg = RunConfig("fsdp2", args.n, steps=args.steps, recipe=args.recipe, global_batch=args.batch,
                    model=model).resolved()
    payload = config_to_dict(cfg)
    pool = cluster.get_pool(args.n)
    times = {"zeroedu": [], "torch": []}
    last = {}
    for _ in range(args.rounds):
        for impl in ("zeroedu", "torch"):
            ranks = pool.run(timed_job, {"cfg": payload, "impl": impl}, timeout=600)
            times[impl] += [max(step) for step in zip(*(r["times"] for r in ranks))]
            last[impl] = ranks
    short = config_to_dict(RunConfig(**{**payload, "steps": 2, "model": model, "adam": cfg.adam}))
    tracked = pool.run(fully_shard_job, {"cfg": short, "track_memory": True}, timeout=600)

    shapes = unit_shapes(make_model(model))
    psi = sum(shard.numel(s) for u in shapes for s in u)
    three_psi = float(theory.exact_comm("fsdp2", shapes, args.n, recipe=args.recipe).total())
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"model: {args.depth} Linear layers, hidden {args.hidden}, Ψ = {psi:,}; N = {args.n}, "
          f"recipe {args.recipe}, global batch {args.batch}, {len(times['zeroedu'])} timed steps each")
    print(f"{'':10s} {'median step (ms)':>17s} {'peak bytes/rank (rank 0)':>25s} {'bytes sent/step':>16s}")
    print(f"{'zeroedu':10s} {med['zeroedu'] * 1e3:17.2f} {last['zeroedu'][0]['peak']:25,d} "
          f"{last['zeroedu'][0]['sent']:16,.0f}")
    print(f"{'torch':10s} {med['torch'] * 1e3:17.2f} {tracked[0]['peak']:25,d} {last['torch'][0]['sent']:16,.0f}")
    print(f"closed form (3Ψ ring, padded): {three_psi:,.0f} bytes sent per rank per step")
    ratio = med["zeroedu"] / med["torch"]
    print(f"ratio zeroedu / torch step time: {ratio:.3f} (goal <= 1.10: {'met' if ratio <= 1.10 else 'NOT met'})")
    return ratio


if __name__ == "__main__":
    main()
