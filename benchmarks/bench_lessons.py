"""The notebooks' time lessons, committed: step time on emulated links, measured and predicted.

Each lesson of `zeroedu.notebook.time_lessons.LESSONS` (02: DDP's bucket size; 07: FSDP's
prefetch and reshard_after_forward; 10: flat ZeRO-3 against HSDP and HFSDP with a slow link
between domains; 11: FSDP2 on 1, 2 and 4 ranks) runs its configurations with `train.run(..., predict=True)`, `--rounds` times
in alternating rounds on the same warm ranks; per configuration, the medians over the rounds of
the slowest rank's median step after the first, measured and predicted, the overlap bound and
the exposed communication. The notebooks read benchmarks/results/lessons.json and assert on it
(the live runs beside it vary with the machine). With --lessons, the other lessons in the file
are kept when they were run with the same model, steps and rounds.

    .venv/bin/python benchmarks/bench_lessons.py [--quick] [--rounds 3] [--steps 5] [--lessons ddp_buckets,hybrid]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os

import common
import zeroedu
from zeroedu.notebook import time_lessons


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="steps per run (the first is left out)")
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--lessons", default=",".join(time_lessons.LESSONS))
    ap.add_argument("--quick", action="store_true", help="one round")
    args = ap.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    names = [n for n in args.lessons.split(",") if n]
    out = {}
    for name in names:
        sizes = {kw["world_size"] for _, _, kw in time_lessons.LESSONS[name]}
        with contextlib.ExitStack() as stack:
            # one pool for a lesson on one number of ranks; otherwise each run on the warm pool of its size
            pool = stack.enter_context(zeroedu.ranks(sizes.pop())) if len(sizes) == 1 else None
            runs = [time_lessons.run_lesson(name, steps=args.steps, model=args.model, pool=pool,
                                            progress=lambda line, k=k: print(f"  round {k + 1}/{rounds} {line}", flush=True))
                    for k in range(rounds)]
        out[name] = time_lessons.median_of(runs)
        print(f"== {name} ({args.model}, {args.steps} steps per run, medians over {rounds} rounds; {common.load()})")
        print(time_lessons.table(out[name]))
    # --lessons runs some of them: the others keep what the file holds
    kept = {}
    if os.path.exists(os.path.join(common.RESULTS, "lessons.json")):
        with open(os.path.join(common.RESULTS, "lessons.json")) as f:
            old = json.load(f)
        if (old.get("model"), old.get("steps"), old.get("rounds")) == (args.model, args.steps, rounds):
            kept = old["lessons"]
    path = common.write_results("lessons", {"model": args.model, "steps": args.steps, "rounds": rounds,
                                            "lessons": {**kept, **{k: [r.plain() for r in v] for k, v in out.items()}}})
    print(f"written: {path}")
    return out


if __name__ == "__main__":
    main()
