"""Cold start vs warm re-run of a 1-step training job (why notebooks keep a warm pool).

Cold: start N ranks (forkserver with torch preloaded, rendezvous on a store the parent owns)
and run the first job; warm: the same job again on the same ranks. Medians of `--reps` warm
runs, min and max beside them.

    .venv/bin/python benchmarks/bench_launch.py [--n 4] [--reps 5] [--quick]
"""
from __future__ import annotations

import argparse
import statistics
import time

import common
from zeroedu.runtime import cluster
from zeroedu.train import RunConfig, run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--quick", action="store_true", help="3 warm runs")
    a = ap.parse_args(argv)
    if a.quick:
        a.reps = 3
    cfg = RunConfig("ddp", a.n, steps=1, model=a.model)
    print(common.load())
    t = time.perf_counter()
    pool = cluster.Pool(a.n, backend="gloo")
    start = time.perf_counter() - t
    t = time.perf_counter()
    run(cfg, pool=pool)
    first = time.perf_counter() - t
    warm = []
    for _ in range(a.reps):
        t = time.perf_counter()
        run(cfg, pool=pool)
        warm.append(time.perf_counter() - t)
    pool.close()
    med = statistics.median(warm)
    print(f"N = {a.n}: cold = pool start {start:.2f} s + first 1-step job {first:.2f} s = {start + first:.2f} s")
    print(f"        warm re-run of a 1-step job: median {med:.3f} s over {a.reps} "
          f"(min {min(warm):.3f}, max {max(warm):.3f}); cold / warm = {(start + first) / med:.0f}x")
    common.write_results("launch", {"n": a.n, "model": a.model, "pool_start": start, "first_job": first,
                                    "warm": warm, "warm_median": med})
    return med


if __name__ == "__main__":
    main()
