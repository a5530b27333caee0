"""Step time measured on emulated links against the prediction of `zeroedu.theory.schedule`.

For every strategy at N = 2 and 4 (hybrids at 2 x 2 only), on two links (flat strategies: the
`domain` preset and the link between domains on every axis; hybrids: `domain` and
`two-domains`), `zeroedu.train.run(..., predict=True)`: a calibration run with no emulated link,
whose schedule (where each collective was issued and waited for, what was computed between) is
replayed on the links, each collective its ring steps' alpha + bytes/beta; then the run on the
links, measured on the ranks' timelines. Per row: the slowest rank's median step after the
first, measured and predicted, and their ratio; the overlap bound (`theory.schedule.bound`: the
best step any overlap of the same work reaches on the links) and the overlap efficiency, bound
over measured; then the median and largest error over the rows.
Written to benchmarks/results/predict.json.

    .venv/bin/python benchmarks/bench_predict.py [--quick] [--steps 4] [--strategies ddp_bucketed,fsdp2]
"""
from __future__ import annotations

import argparse
import statistics

import common
import zeroedu
from zeroedu.catalog import STRATEGIES
from zeroedu.notebook.report import table
from zeroedu.runtime.links import BETWEEN_DOMAINS
from zeroedu.train import RunConfig, run

FLAT_LINKS = ("domain", str(BETWEEN_DOMAINS))
HYBRID_LINKS = ("domain", "two-domains")


def rows_for(strategies, sizes, flat=FLAT_LINKS, hybrid_links=HYBRID_LINKS):
    for n in sizes:
        for s in strategies:
            hybrid = STRATEGIES[s].hybrid
            if hybrid and n != 4:
                continue
            for link in (hybrid_links if hybrid else flat):
                yield n, s, link


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="steps per run (the first is left out)")
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--quick", action="store_true", help="N = 2, the domain link only")
    ap.add_argument("--link", action="append", default=None, help="the links (presets or links) to run on, "
                    "instead of the two per strategy")
    ap.add_argument("--n", type=int, action="append", default=None, help="numbers of ranks (default 2 and 4)")
    args = ap.parse_args(argv)
    strategies = [s for s in args.strategies.split(",") if s]
    sizes = tuple(args.n) if args.n else (2,) if args.quick else (2, 4)
    links = tuple(args.link) if args.link else None
    plan = [r for r in rows_for(strategies, sizes, links or FLAT_LINKS, links or HYBRID_LINKS)
            if not args.quick or r[2] == "domain"]
    rows = []
    for n in sizes:
        todo = [r for r in plan if r[0] == n]
        if not todo:
            continue
        with zeroedu.ranks(n) as pool:
            for _, s, link in todo:
                m = 2 if STRATEGIES[s].hybrid else 1
                rep = run(RunConfig(s, n, m=m, steps=args.steps, model=args.model, links=link, timeline="minimal"),
                          pool=pool, predict=True)
                meas = max(r.time.median().seconds for r in rep.ranks)
                pred = max(r.time.predicted_median().seconds for r in rep.ranks)
                slow = max(rep.ranks, key=lambda r: r.time.median().seconds)
                me, pe = slow.time.median(), slow.time.predicted_median()
                rows.append({"strategy": s, "n": n, "m": m, "link": link, "step_measured": meas, "step_predicted": pred,
                             "ratio": pred / meas, "compute": me.compute, "predicted_compute": pe.compute,
                             "comm": me.comm_total, "predicted_comm": pe.comm_total,
                             "exposed": me.exposed, "predicted_exposed": pe.exposed,
                             # the best any overlap reaches (theory.schedule.bound), over the measured step
                             "bound": pe.bound, "efficiency": pe.bound / me.seconds})
                r = rows[-1]
                print(f"  {s} N={n} {link}: measured {1e3 * meas:.0f} ms, predicted {1e3 * pred:.0f} ms "
                      f"({r['ratio']:.2f})", flush=True)
    errors = [abs(r["ratio"] - 1) for r in rows]
    print(f"{args.model}, {args.steps} steps per run, median step after the first, slowest rank ({common.load()})")
    print(table([[r["strategy"], f"{r['n']}" + (f" = {r['m']}x{r['n'] // r['m']}" if r["m"] > 1 else ""), r["link"],
                  f"{1e3 * r['step_measured']:.0f}", f"{1e3 * r['step_predicted']:.0f}", f"{r['ratio']:.2f}",
                  f"{1e3 * r['comm']:.0f} / {1e3 * r['predicted_comm']:.0f}",
                  f"{1e3 * r['exposed']:.0f} / {1e3 * r['predicted_exposed']:.0f}",
                  f"{1e3 * r['bound']:.0f}", f"{r['efficiency']:.2f}"] for r in rows],
                ["strategy", "N", "link", "measured ms", "predicted ms", "pred/meas",
                 "comm meas / pred", "exposed meas / pred", "bound ms", "bound/meas"]))
    summary = {"median_error": statistics.median(errors), "max_error": max(errors)}
    print(f"error |predicted/measured - 1|: median {summary['median_error']:.1%}, largest {summary['max_error']:.1%} "
          f"over {len(rows)} rows")
    common.write_results("predict", {"model": args.model, "steps": args.steps, "rows": rows, **summary})
    return rows


if __name__ == "__main__":
    main()
