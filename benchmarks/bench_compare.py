"""zeroedu against torch's own implementations, step time side by side (N = 4, gloo on CPU).

    ddp_bucketed  vs  DistributedDataParallel           (same bucket size, 1 MiB)
    fsdp2         vs  fully_shard per block + root      (zeroedu batched: one collective per unit)
    fsdp1         vs  fully_shard per block + root
    hsdp          vs  fully_shard on a 2-D mesh (dp_outer = 2, dp_shard = 2): torch's HSDP

on gpt-small (fp32 and mixed-bf16; `--model`) and, cheaply, the MLP (fp32). For each pair: median step
time [min, max] over rounds x steps (slowest rank per step), the ratio zeroedu / torch with its
goal (1.05; 1.10 for HSDP), the same ratio round by round (median [min, max]: the two arms run
back to back in each round, so the spread is this machine's noise on one ratio), and the bytes
one rank sent per step, measured on its sockets (both sides), beside zeroedu's ring model. zeroedu runs with timeline="minimal" (the report's
figures only; `bench_instrumentation.py` measures what the full timeline costs) and its default
collectives (ring reduce-scatter / all-gather on gloo: fewer bytes than gloo's reduce-scatter,
which is an all-reduce; `bench_collectives.py` compares the two).

    .venv/bin/python benchmarks/bench_compare.py [--quick] [--rounds 5] [--steps 3]
        [--strategies ddp_bucketed,fsdp2,fsdp1,hsdp] [--recipes fp32,mixed-bf16] [--profile DIR]
"""
from __future__ import annotations

import os
import statistics

import common
from zeroedu.references.bench import round_ratios, run_compare
from zeroedu.runtime import cluster

GOALS = {"ddp_bucketed": 1.05, "fsdp2": 1.05, "fsdp1": 1.05, "hsdp": 1.10}
TORCH_NAME = {"ddp_bucketed": "torch DDP", "fsdp2": "torch fully_shard", "fsdp1": "torch fully_shard",
              "hsdp": "torch fully_shard 2-D (HSDP)"}


def compare(pool, strategy, n, model, recipe, rounds, steps, profile=None) -> dict:
    cfg = common.cfg_dict(strategy, n, model=model, recipe=recipe)
    arms = [common.zeroedu_arm("zeroedu", cfg), common.torch_arm("torch", cfg, strategy)]
    if profile:
        os.makedirs(profile, exist_ok=True)
    prof = os.path.join(profile, f"{strategy}-{recipe}-{model}") if profile else None
    r = run_compare(pool, arms, rounds=rounds, steps=steps, profile=prof)
    ratio = r["zeroedu"]["median"] / r["torch"]["median"]
    rounds_ratio = round_ratios(r["zeroedu"]["per_step"], r["torch"]["per_step"], steps)
    return {"strategy": strategy, "model": model, "recipe": recipe, "n": n, "zeroedu": r["zeroedu"],
            "torch": r["torch"], "ratio": ratio, "round_ratios": rounds_ratio, "goal": GOALS.get(strategy),
            "profile": prof}


def main(argv=None):
    ap = common.timed_parser(__doc__, "fp32 only, 2 timed steps per round")
    ap.add_argument("--strategies", default="ddp_bucketed,fsdp2,fsdp1,hsdp")
    ap.add_argument("--recipes", default="fp32,mixed-bf16")
    ap.add_argument("--no-mlp", action="store_true", help="skip the MLP rows")
    ap.add_argument("--profile", default=None, help="folder for cProfile files (rank 0), printed")
    a = ap.parse_args(argv)
    if a.quick:
        a.recipes, a.steps = "fp32", 2
    pool = cluster.get_pool(a.n, "gloo")  # the CPU benchmark, also where GPUs are visible
    print(f"N = {a.n} ranks (gloo, loopback), {a.rounds} rounds x {a.steps} steps per arm; {common.load()}")
    rows = []
    configs = [(s, a.model, r) for r in a.recipes.split(",") for s in a.strategies.split(",")]
    if not a.no_mlp:
        configs += [(s, "mlp", "fp32") for s in ("ddp_bucketed", "fsdp2") if s in a.strategies.split(",")]
    for strategy, model, recipe in configs:
        res = compare(pool, strategy, a.n, model, recipe, a.rounds, a.steps, a.profile)
        rows.append(res)
        print(f"{strategy} vs {TORCH_NAME[strategy]}, {model}, {recipe}:")
        print(common.row(f"zeroedu {strategy}", res["zeroedu"]))
        print(common.row(TORCH_NAME[strategy], res["torch"]))
        print(f"  ratio zeroedu / torch = {res['ratio']:.3f}{common.verdict(res['ratio'], res['goal'])}")
        rr = sorted(res["round_ratios"])
        # The same ratio round by round (the arms alternate within each round): its spread is
        # this machine's run-to-run noise, against which a goal a few per cent away is judged.
        print(f"  round by round: median {statistics.median(rr):.3f}  [{rr[0]:.3f}, {rr[-1]:.3f}] over {len(rr)} rounds")
        if a.profile:
            for who in ("zeroedu", "torch"):
                common.print_profile(f"{res['profile']}.{who}.prof")
    print(f"after: {common.load()}")
    path = common.write_results("compare", {"n": a.n, "rounds": a.rounds, "steps": a.steps, "rows": rows})
    print(f"written: {os.path.relpath(path)}")
    return rows


if __name__ == "__main__":
    main()
