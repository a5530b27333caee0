"""The planner (`zeroedu.theory.planner`) against published training runs
(`zeroedu.theory.published`): for each run, the planner's predicted model TFLOP/s per GPU for the
published configuration beside the published figure, that configuration's rank among every plan
the planner ranks on the same GPUs, batch and precision, and the planner's #1 beside it. Three
tables: NeMo 24.12's H100 runs, Narayanan et al. 2021's Table 1 and Korthikanti et al. 2022's
configurations (A100; their micro-batch size and interleaving are not printed, so each row is
evaluated at the ones the planner finds fastest for its tp, pp and dp).

The share of peak the matrix multiplications reach is one number per GPU (`planner.A100_EFFICIENCY`,
`H100_EFFICIENCY`), calibrated on that GPU's rows: the share that makes the largest miss smallest,
to the nearest 2.5 %, which `published.calibrate` recomputes and prints (--efficiency overrides it). The
papers' runs wrote the attention scores to HBM between kernels (`Plan.flash` off: the planner's
`scores` term); NeMo's runs use a fused attention kernel. One FLOP convention, the planner's
`step_flops` without recompute, which reproduces each NeMo row's published TFLOP/s from its
published tokens/s exactly. NeMo's runs are FP8 (the linear layers at the FP8 peak), ZeRO-1 (the
distributed optimizer), selective recompute. Written to benchmarks/results/planner.json. No ranks
start: seconds.

    .venv/bin/python benchmarks/bench_planner.py [--efficiency 0.5]
"""
from __future__ import annotations

import argparse

import common

from zeroedu.kinds import RecomputeMode
from zeroedu.theory import planner as P
from zeroedu.theory import published


def check(run: published.PublishedRun, efficiency: float | None) -> dict:
    cluster, mine = published.cluster_of(run, efficiency), published.plan_of(run)
    est = published.predicted(run, efficiency)
    if est is None:
        return {"name": run.name, "gpus": run.gpus, "plan": str(mine),
                "refused": P.refusal(run.model, cluster, mine, run.global_batch)}
    rep = P.plan(run.model, cluster, run.global_batch, fp8=(run.fp8,), recompute=(RecomputeMode.SELECTIVE,),
                 interleave=tuple(sorted({1, 2, 4, run.vp})))
    faster = [e for e in rep.ranked if e.step < est.step and e.plan != mine]
    best = rep.ranked[0]
    return {"name": run.name, "gpus": run.gpus, "plan": str(mine), "tflops_published": run.model_tflops,
            "tflops_predicted": est.throughput(run.gpus) / 1e12, "ratio": est.throughput(run.gpus) / 1e12 / run.model_tflops,
            "fits": est.fits, "memory_gb": est.memory / 1e9, "rank": len(faster) + 1, "of": len(rep.ranked),
            "best": str(best.plan), "best_predicted": best.throughput(run.gpus) / 1e12,
            "terms": {k: round(v, 4) for k, v in est.terms().items()}, "source": run.source}


def check_paper(run: published.PaperRun, efficiency: float | None) -> dict:
    """A row of Narayanan et al. 2021's Table 1 or Korthikanti et al. 2022's configurations: the
    published tp, pp and dp with the micro-batch size and interleaving the table does not give (the
    fastest the planner finds for them, `published.predicted`), its rank among every plan of the
    same recipe (the paper's recompute mode and ZeRO level, no cp, no FP8: what the run could have
    chosen)."""
    cluster = published.cluster_of(run, efficiency)
    est = published.predicted(run, efficiency)
    if est is None:
        return {"name": run.name, "gpus": run.gpus, "plan": f"dp {run.dp} x tp {run.tp} x pp {run.pp}",
                "refused": P.refusal(run.model, cluster, P.Plan(run.dp, run.tp, run.pp, 1, run.zero,
                                                                recompute=run.recompute, flash=False),
                                     run.global_batch)}
    rep = P.plan(run.model, cluster, run.global_batch, zero_levels=(run.zero,), cp_sizes=(1,),
                 micro_batches=published.PAPER_MICRO_BATCHES, recompute=(run.recompute,),
                 interleave=published.PAPER_INTERLEAVES, flash=False)
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
    ap.add_argument("--efficiency", type=float, default=None,
                    help="share of peak the matrix multiplications reach (default: each GPU preset's, "
                         "calibrated on that GPU's published runs)")
    ap.add_argument("--quick", action="store_true", help="the same (it takes seconds): `make bench BENCH_ARGS=--quick`")
    args = ap.parse_args(argv)
    rows = [check(r, args.efficiency) for r in published.RUNS]
    shares = {g: P.GPUS[g].fields["efficiency"] if args.efficiency is None else args.efficiency
              for g in ("h100-sxm", "a100-80gb")}
    print(f"planner vs published runs ({published.NEMO_24_12}); the matmuls at {shares['h100-sxm']:.0%} of peak "
          f"(H100), {shares['a100-80gb']:.0%} (A100): " + ("each GPU's calibration" if args.efficiency is None else "as given"))
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
    fitted = {"h100-sxm": published.calibrate(published.RUNS), "a100-80gb": published.calibrate(published.PAPER_RUNS)}
    print("calibration, the share of peak whose largest miss is smallest (to 2.5 %): "
          + "; ".join(f"{g}: {share:.1%}, largest miss {miss:.1%}, the preset's {P.GPUS[g].fields['efficiency']:.1%}"
                      for g, (share, miss) in fitted.items()))
    path = common.write_results("planner", {"efficiency": shares, "calibrated": {g: {"share": sh, "largest_miss": mi}
                                                                               for g, (sh, mi) in fitted.items()},
                                            "source": published.NEMO_24_12,
                                            "rows": rows, **papers})
    print(f"written: {path}")
    return rows


if __name__ == "__main__":
    main()
