"""Overlap on emulated links: does the schedule that should hide communication hide it?

On a link where communication takes about as long as compute (`--link`, default the `domain`
preset, `zeroedu.runtime.links`), four arms, each a real training run on the same warm ranks,
in alternating rounds so that the machine's load falls on all of them alike:

    ddp_bucketed, one bucket      every gradient in one bucket: its all-reduce starts after the
                                  last gradient, so nothing overlaps backward
    ddp_bucketed, 1 MiB buckets   each bucket's all-reduce starts when its last gradient exists,
                                  and runs while backward computes the rest
    fsdp2, no prefetch            each unit's all-gather starts when the unit is needed
    fsdp2, prefetch               the next unit's all-gather starts while this one computes
                                  (forward and backward prefetch)

A step's time is the slowest rank's, read from the ranks' timelines (`RankReport.time`); each
run's first step is left out (buffers, threads). Printed per arm: the median step, its spread
(min-max), and the medians of compute and exposed communication; then each pair's ratio.
Written to benchmarks/results/links.json.

    .venv/bin/python benchmarks/bench_links.py [--quick] [--n 2] [--rounds 5] [--steps 3] [--link domain]
"""
from __future__ import annotations

import argparse
import statistics

import common
import zeroedu
from zeroedu.notebook.report import table
from zeroedu.train import RunConfig, run

ARMS = [
    ("ddp, one bucket", "ddp_bucketed", {"bucket_bytes": 1 << 40}),
    ("ddp, 1 MiB buckets", "ddp_bucketed", {"bucket_bytes": 1 << 20}),
    ("fsdp2, no prefetch", "fsdp2", {"forward_prefetch": False, "backward_prefetch": False}),
    ("fsdp2, prefetch", "fsdp2", {"forward_prefetch": True, "backward_prefetch": True}),
]
PAIRS = [("ddp, 1 MiB buckets", "ddp, one bucket"), ("fsdp2, prefetch", "fsdp2, no prefetch")]


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per arm and round (+1 warm-up)")
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--link", default="domain", help="a preset or a link for every axis (200MB/s,50us)")
    ap.add_argument("--quick", action="store_true", help="2 rounds")
    args = ap.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    steps = {label: [] for label, _, _ in ARMS}
    with zeroedu.ranks(args.n) as pool:
        for k in range(rounds):
            order = ARMS if k % 2 == 0 else ARMS[::-1]  # neither arm always runs first
            for label, strategy, options in order:
                rep = run(RunConfig(strategy, args.n, steps=args.steps + 1, model=args.model, options=options,
                                    links=args.link, timeline="minimal"), pool=pool)
                for i in range(1, args.steps + 1):  # the first step is a warm-up
                    per_rank = [r.time.steps[i] for r in rep.ranks]
                    slowest = max(per_rank, key=lambda s: s.seconds)
                    steps[label].append({"seconds": slowest.seconds, "compute": slowest.compute,
                                         "exposed": slowest.exposed, "comm": slowest.comm_total})
    rows = []
    for label, strategy, options in ARMS:
        xs = steps[label]
        sec = [x["seconds"] for x in xs]
        rows.append({"arm": label, "strategy": strategy, "options": options, "steps": len(xs),
                     "median": statistics.median(sec), "min": min(sec), "max": max(sec),
                     "compute": statistics.median(x["compute"] for x in xs),
                     "exposed": statistics.median(x["exposed"] for x in xs),
                     "comm": statistics.median(x["comm"] for x in xs)})
    by = {r["arm"]: r for r in rows}
    ratios = [{"arm": a, "against": b, "ratio": by[a]["median"] / by[b]["median"]} for a, b in PAIRS]
    print(f"{args.model}, N = {args.n}, link {args.link}, {rounds} rounds x {args.steps} timed steps per arm "
          f"({common.load()})")
    print(table([[r["arm"], f"{1e3 * r['median']:.0f}", f"{1e3 * r['min']:.0f}-{1e3 * r['max']:.0f}",
                         f"{1e3 * r['compute']:.0f}", f"{1e3 * r['exposed']:.0f}", f"{1e3 * r['comm']:.0f}"]
                        for r in rows],
                       ["arm", "step ms (median)", "spread", "compute", "exposed comm", "comm in flight"]))
    for q in ratios:
        print(f"{q['arm']} / {q['against']}: {q['ratio']:.2f} of the step time")
    common.write_results("links", {"model": args.model, "n": args.n, "link": args.link, "rounds": rounds,
                                   "steps": args.steps, "rows": rows, "ratios": ratios})
    return rows + ratios


if __name__ == "__main__":
    main()
