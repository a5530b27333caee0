"""zeroedu's ring collectives against gloo's own, in a training step (N = 4, gpt-small, fp32).

`collectives="ring"` runs zeroedu's ring reduce-scatter and all-gather from point-to-point
messages, which send the ring bound; `"backend"` runs torch's, where gloo's reduce-scatter is
an all-reduce with one chunk kept: twice the bytes. All-reduce is gloo's in both, so DDP is the
control (its ratio should be ~1). Per strategy: step time of each (median [min, max], slowest
rank per step, alternating rounds in the same warm pool), the ratio ring / backend, and the
bytes one rank sent per step, measured on its sockets.

    .venv/bin/python benchmarks/bench_collectives.py [--quick] [--rounds 5] [--steps 3]
"""
from __future__ import annotations

import os

import common
from zeroedu.references.bench import run_compare
from zeroedu.runtime import cluster

STRATEGIES = {"DDP": "ddp_bucketed", "ZeRO-2": "zero2", "FSDP": "fsdp2"}


def main(argv=None):
    ap = common.timed_parser(__doc__)
    ap.add_argument("--recipe", default="fp32")
    a = ap.parse_args(argv)
    if a.quick:
        a.steps = 2
    pool = cluster.get_pool(a.n, "gloo")  # the CPU benchmark, also where GPUs are visible
    print(f"N = {a.n}, {a.model}, {a.recipe}, {a.rounds} rounds x {a.steps} steps; {common.load()}")
    rows = []
    for name, strategy in STRATEGIES.items():
        arms = [common.zeroedu_arm(c, common.cfg_dict(strategy, a.n, a.model, a.recipe, collectives=c))
                for c in ("ring", "backend")]
        r = run_compare(pool, arms, rounds=a.rounds, steps=a.steps)
        ratio = r["ring"]["median"] / r["backend"]["median"]
        rows.append({"name": name, "strategy": strategy, "ring": r["ring"], "backend": r["backend"],
                     "ratio": ratio})
        print(f"{name} ({strategy}):")
        print(common.row("ring (zeroedu)", r["ring"]))
        print(common.row("backend (gloo)", r["backend"]))
        wires = r["ring"]["wire"], r["backend"]["wire"]
        print(f"  ratio ring / backend = {ratio:.3f};  bytes ring / backend = "
              + (f"{wires[0] / wires[1]:.3f}" if all(wires) else "not measured (no wire meter)"))
    print(f"after: {common.load()}")
    path = common.write_results("collectives", {"n": a.n, "model": a.model, "recipe": a.recipe, "rows": rows})
    print(f"written: {os.path.relpath(path)}")
    return rows


if __name__ == "__main__":
    main()
