"""The planner (`zeroedu.theory.planner`) against published training runs
(`zeroedu.theory.published`): for each run, the planner's predicted model TFLOP/s per GPU for the
published configuration beside the published figure, that configuration's rank among every plan
the planner ranks on the same GPUs, batch and precision, and the planner's #1 beside it. Three
tables: NeMo 24.12's H100 runs, Narayanan et al. 2021's Table 1 and Korthikanti et al. 2022's
configurations (A100; their micro-batch size and interleaving are not printed, so each row is
evaluated at the ones the planner finds fastest for its tp, pp and dp).

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


def check_paper(run: published.PaperRun, efficiency: float) -> dict:
    """A row of Narayanan et al. 2021's Table 1 or Korthikanti et al. 2022's configurations: the
    published tp, pp and dp with the micro-batch size and interleaving the table does not give (the
    fastest the planner finds for them), its rank among every plan of the same recipe (the
    paper's recompute mode and ZeRO level, no cp, no FP8: what the run could have chosen)."""
    cluster = P.Cluster.of(run.gpu, run.gpus, efficiency=efficiency)
    b_sizes, vs = (1, 2, 4, 8), (1, 2, 4, 5, 7, 8)
    tried = [P.Plan(run.dp, run.tp, run.pp, 1, run.zero, micro_batch=b, recompute=run.recompute, v=v)
             for b in b_sizes for v in vs]
    tried = [pl for pl in tried if P.refusal(run.model, cluster, pl, run.global_batch) is None]
    if not tried:
        return {"name": run.name, "gpus": run.gpus, "plan": f"dp {run.dp} x tp {run.tp} x pp {run.pp}",
                "refused": P.refusal(run.model, cluster, P.Plan(run.dp, run.tp, run.pp, 1, run.zero,
                                                                recompute=run.recompute), run.global_batch)}
    ests = sorted((P.estimate(run.model, cluster, pl, run.global_batch) for pl in tried),
                  key=lambda e: (not e.fits, e.step))
    est = ests[0]
    rep = P.plan(run.model, cluster, run.global_batch, zero_levels=(run.zero,), cp_sizes=(1,),
                 micro_batches=b_sizes, recompute=(run.recompute,), interleave=vs)
    same = lambda pl: (pl.dp, pl.tp, pl.pp) == (run.dp, run.tp, run.pp)  # noqa: E731
    faster = [e for e in rep.ranked if e.step < est.step and not same(e.plan)]
    best = rep.ranked[0]
    predicted = est.throughput(run.gpus) / 1e12
    return {"name": run.name, "gpus": run.gpus, "plan": str(est.plan), "tflops_paper": run.published_tflops,
            "tflops_published": run.model_tflops, "tflops_predicted": predicted, "ratio": predicted / run.model_tflops,
            "fits": est.fits, "memory_gb": est.memory / 1e9, "rank": len(faster) + 1, "of": len(rep.ranked),
            "best": str(best.plan), "best_predicted": best.throughput(run.gpus) / 1e12,
            "why_best": P.why_better(best, est) if not same(best.plan) else "",
            "terms": {k: round(v, 4) for k, v in est.terms().items()}, "source": run.source}


def _print_paper_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'run':13s} {'GPUs':>5}  {'published tp, pp, dp (b and v as the planner picks)':58s} {'paper':>6} {'model':>6} "
          f"{'predicted':>9} {'ratio':>6} {'rank':>11}  planner's #1")
    for r in rows:
        if "refused" in r:
            print(f"{r['name']:13s} {r['gpus']:>5}  {r['plan']:58s} REFUSED: {r['refused']}")
            continue
        print(f"{r['name']:13s} {r['gpus']:>5}  {r['plan']:58s} {r['tflops_paper']:>6.1f} {r['tflops_published']:>6.1f} "
              f"{r['tflops_predicted']:>9.1f} {r['ratio']:>6.2f} {str(r['rank']) + ' of ' + str(r['of']):>11}  "
              f"{r['best']} ({r['best_predicted']:.0f})" + ("" if r["fits"] else "  DOES NOT FIT"))


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
    papers = {key: [check_paper(r, args.efficiency) for r in runs]
              for key, runs in (("narayanan_2021", published.NARAYANAN_RUNS),
                                ("korthikanti_2022", published.KORTHIKANTI_RUNS))}
    # one convention for every column: model FLOPs without recompute ("model"); Narayanan's Table 1
    # counts the recomputed forward (Eq. (3), "paper"), so its figure is scaled by the two FLOP counts
    _print_paper_rows(published.NARAYANAN_2021, papers["narayanan_2021"])
    _print_paper_rows(published.KORTHIKANTI_2022, papers["korthikanti_2022"])
    both = [r for rs in papers.values() for r in rs if "refused" not in r]
    print(f"papers' configurations: {len(both)} of {sum(map(len, papers.values()))} exist; "
          f"{sum(r['fits'] for r in both)} fit; predicted within "
          f"{max(abs(r['ratio'] - 1) for r in both):.1%} of published (model FLOPs); "
          f"in the planner's top 5: {sum(r['rank'] <= 5 for r in both)}")
    path = common.write_results("planner", {"efficiency": args.efficiency, "source": published.NEMO_24_12,
                                            "rows": rows, **papers})
    print(f"written: {path}")
    return rows


if __name__ == "__main__":
    main()
