"""The planner (`zeroedu.theory.planner`) against published training runs
(`zeroedu.theory.published`): for each run, the planner's predicted model TFLOP/s per GPU for the
published configuration beside the published figure, that configuration's rank among every plan
the planner ranks on the same GPUs, batch and precision, and the planner's #1 beside it.

The share of peak the matrix multiplications reach is the planner's stated assumption (0.5 unless
--efficiency), not fitted to these rows; one FLOP convention, the planner's `step_flops` without
recompute, which reproduces each row's published TFLOP/s from its published tokens/s exactly.
The runs are FP8 (the linear layers at the FP8 peak), ZeRO-1 (the distributed optimizer),
selective recompute. Written to benchmarks/results/planner.json. No ranks start: seconds.

    .venv/bin/python benchmarks/bench_planner.py [--efficiency 0.5]
"""
from __future__ import annotations

import argparse

import common

from zeroedu.kinds import RecomputeMode
from zeroedu.theory import planner as P
from zeroedu.theory import published


def check(run: published.PublishedRun, efficiency: float) -> dict:
    cluster = P.Cluster.of(run.gpu, run.gpus, efficiency=efficiency)
    mine = P.Plan(run.dp, run.tp, run.pp, run.cp, 1, fp8=run.fp8, micro_batch=run.micro_batch,
                  recompute=RecomputeMode.SELECTIVE, v=run.vp)
    why = P.refusal(run.model, cluster, mine, run.global_batch)
    if why:
        return {"name": run.name, "gpus": run.gpus, "plan": str(mine), "refused": why}
    est = P.estimate(run.model, cluster, mine, run.global_batch)
    rep = P.plan(run.model, cluster, run.global_batch, fp8=(run.fp8,), recompute=(RecomputeMode.SELECTIVE,),
                 interleave=tuple(sorted({1, 2, 4, run.vp})))
    faster = [e for e in rep.ranked if e.step < est.step and e.plan != mine]
    best = rep.ranked[0]
    return {"name": run.name, "gpus": run.gpus, "plan": str(mine), "tflops_published": run.model_tflops,
            "tflops_predicted": est.throughput(run.gpus) / 1e12, "ratio": est.throughput(run.gpus) / 1e12 / run.model_tflops,
            "fits": est.fits, "memory_gb": est.memory / 1e9, "rank": len(faster) + 1, "of": len(rep.ranked),
            "best": str(best.plan), "best_predicted": best.throughput(run.gpus) / 1e12,
            "terms": {k: round(v, 4) for k, v in est.terms().items()}, "source": run.source}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--efficiency", type=float, default=P.Cluster(1).efficiency,
                    help="share of peak the matrix multiplications reach (the planner's assumption)")
    ap.add_argument("--quick", action="store_true", help="the same (it takes seconds): `make bench BENCH_ARGS=--quick`")
    args = ap.parse_args(argv)
    rows = [check(r, args.efficiency) for r in published.RUNS]
    print(f"planner vs published runs ({published.NEMO_24_12}); efficiency {args.efficiency:.0%} (assumed, not fitted)")
    print(f"{'run':11s} {'GPUs':>5}  {'published configuration':52s} {'published':>9} {'predicted':>9} {'ratio':>6} "
          f"{'rank':>11}  planner's #1")
    for r in rows:
        if "refused" in r:
            print(f"{r['name']:11s} {r['gpus']:>5}  {r['plan']:52s} REFUSED: {r['refused']}")
            continue
        print(f"{r['name']:11s} {r['gpus']:>5}  {r['plan']:52s} {r['tflops_published']:>9.0f} {r['tflops_predicted']:>9.0f} "
              f"{r['ratio']:>6.2f} {str(r['rank']) + ' of ' + str(r['of']):>11}  {r['best']} ({r['best_predicted']:.0f})")
    ok = [r for r in rows if "refused" not in r]
    worst = max(abs(r["ratio"] - 1) for r in ok)
    print(f"every published configuration exists and fits: {all(r['fits'] for r in ok) and len(ok) == len(rows)}; "
          f"predicted within {worst:.1%} of published")
    path = common.write_results("planner", {"efficiency": args.efficiency, "source": published.NEMO_24_12,
                                            "rows": rows})
    print(f"written: {path}")
    return rows


if __name__ == "__main__":
    main()
