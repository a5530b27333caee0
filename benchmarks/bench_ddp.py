"""zeroedu's bucketed DDP vs torch's DistributedDataParallel, side by side in one run.

Same ranks (N=4, gloo on loopback), same MLP, same data, same bucket size, fp32, alternating
repetitions so both see the same machine load. Prints the median step time of each (the
slowest rank per step, since a synchronous step is as slow as its slowest rank), their ratio
(goal: zeroedu / torch <= 1.10) and the bytes each rank sends per step under the ring model.
Times are measurements, noisy on a shared machine; the bytes are exact.

    python benchmarks/bench_ddp.py [--n 4] [--hidden 512] [--depth 6] [--steps 10] [--reps 3]
"""
import argparse
import statistics

from zeroedu.runtime import cluster
from zeroedu.models import MLPConfig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--batch", type=int, default=128, help="global batch")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per repetition")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--bucket-mib", type=float, default=1.0)
    a = ap.parse_args(argv)
    model = MLPConfig(d_in=a.hidden, hidden=a.hidden, depth=a.depth, d_out=a.hidden)
    bucket = int(a.bucket_mib * 2 ** 20)
    res = cluster.run("zeroedu.references.torch_ddp:bench_job", a.n,
                      {"model": model.as_dict(), "steps": a.steps, "reps": a.reps,
                       "global_batch": a.batch, "bucket_bytes": bucket}, timeout=600)
    r0 = res[0]
    med = {}
    for who in ("zeroedu", "torch"):
        per_step = [max(r["times"][who][i] for r in res) for i in range(len(r0["times"][who]))]
        med[who] = statistics.median(per_step)
    print(f"model: MLP hidden={a.hidden} depth={a.depth}, Ψ={r0['psi']:,} (fp32), global batch "
          f"{a.batch}, N={a.n} gloo, bucket {bucket} B, {a.reps} reps x {a.steps} steps")
    print(f"{'':10s} {'median step [ms]':>17s} {'sent/rank/step [B]':>20s}  buckets [B]")
    print(f"{'zeroedu':10s} {med['zeroedu'] * 1e3:17.2f} {r0['zeroedu_sent']:20,.0f}  {r0['zeroedu_buckets']}")
    print(f"{'torch DDP':10s} {med['torch'] * 1e3:17.2f} {r0['torch_sent']:20,.0f}  {r0['torch_buckets']}")
    ratio = med["zeroedu"] / med["torch"]
    print(f"ratio zeroedu / torch = {ratio:.3f}  (goal <= 1.10: {'met' if ratio <= 1.10 else 'NOT met'})")
    return ratio


if __name__ == "__main__":
    main()
