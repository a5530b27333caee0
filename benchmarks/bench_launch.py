"""Cold start vs warm re-run of a 1-step training job at N = 4 (why notebooks keep a warm pool).

    .venv/bin/python benchmarks/bench_launch.py
"""
import statistics
import time

from zeroedu.runtime import cluster
from zeroedu.train import RunConfig, run


def main(n: int = 4, reps: int = 5) -> None:
    t = time.perf_counter()
    pool = cluster.Pool(n)
    start = time.perf_counter() - t
    t = time.perf_counter()
    run(RunConfig("ddp", n, steps=1, model="mlp"), pool=pool)
    first = time.perf_counter() - t
    warm = []
    for _ in range(reps):
        t = time.perf_counter()
        run(RunConfig("ddp", n, steps=1, model="mlp"), pool=pool)
        warm.append(time.perf_counter() - t)
    pool.close()
    med = statistics.median(warm)
    print(f"N = {n}: cold = pool start {start:.2f} s + first 1-step job {first:.2f} s = {start + first:.2f} s")
    print(f"        warm re-run of a 1-step job: median {med:.3f} s over {reps} "
          f"(min {min(warm):.3f}, max {max(warm):.3f}); cold/warm = {(start + first) / med:.0f}x")


if __name__ == "__main__":
    main()
