"""The suite's planner against its own runs: `zeroedu plan --model gpt-small --gpus 8 --link domain`'s
best plans, each run for real on the same emulated link, the measured step beside the predicted.

For each of the top `--top` plans (`train.plans.plan`): one run of `--steps` steps on the link
(`train.run`, minimal timeline), the median step after the first on the slowest rank
(`reports.TimeReport.median`), beside the planner's compute + comm; and, from the same run,
whether every rank's model states, activations and bytes per axis equal the plan's (they are
asserted in tests/test_plans.py; printed here beside the time). The prediction is a model (the
planner's docstring): compute from a one-thread calibration, communication exposed whole, so a
strategy that overlaps its collectives with backward runs faster than it says.

Written to benchmarks/results/plans.json.

    .venv/bin/python benchmarks/bench_plans.py [--model gpt-small] [--n 8] [--link domain] [--top 3] [--steps 4] [--quick]
"""
from __future__ import annotations

import argparse

import common

from zeroedu.train import plans, run


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--link", default="domain")
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="steps per run; the median is over all but the first")
    ap.add_argument("--quick", action="store_true", help="the best plan only, 2 steps")
    a = ap.parse_args(argv)
    if a.quick:
        a.top, a.steps = 1, 2
    rep = plans.plan(a.model, a.n, links=a.link)
    print(f"{rep.model} on {a.n} ranks, link {rep.links}, global batch {rep.global_batch}, {rep.recipe}; "
          f"calibration {rep.seconds_per_sequence * 1e3:.1f} ms per sequence; {common.load()}")
    print(f"{'plan':58s} {'predicted s':>11s} {'measured s':>10s} {'ratio':>6s}  figures")
    rows = []
    for p in rep.ranked[:a.top]:
        out = run(p.run_config(steps=a.steps, links=a.link), warm=True)
        medians = [r.time.median() for r in out.ranks]
        measured = max(m.seconds for m in medians if m is not None)
        exact = all(r.measured.total == f.model_states and r.measured.activations == f.activations
                    and r.measured.comm_by_axis == f.comm_by_axis for r, f in zip(out.ranks, p.ranks))
        row = {"plan": str(p), "compute_s": p.compute, "comm_s": sum(p.comm.values()), "step_s": p.step,
               "measured_s": measured, "ratio": round(measured / p.step, 2), "figures_exact": exact,
               "trains": bool(out.match.losses)}
        rows.append(row)
        print(f"{row['plan']:58s} {p.step:11.3f} {measured:10.3f} {row['ratio']:6.2f}  "
              f"{'exact' if exact else 'DIFFER'}")
    path = common.write_results("plans", {"model": rep.model, "n": a.n, "link": rep.links,
                                          "global_batch": rep.global_batch, "recipe": rep.recipe,
                                          "seconds_per_sequence": rep.seconds_per_sequence, "load": common.load(),
                                          "rows": rows})
    print(f"written: {path}")
    return rows


if __name__ == "__main__":
    main()
