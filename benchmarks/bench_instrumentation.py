"""What zeroedu's instrumentation costs: the full timeline against the minimal one.

`timeline="minimal"` keeps what the report's figures are read from: model states at the
optimizer step and activations at the forward/backward boundary (both from a full walk of the
tracked storages), the peak at lifecycle events, every collective's record (ring model) and
the wire per step. `"full"` adds an event (bytes by category) at every lifecycle point, reads
the wire around every collective (kernel counters, per kind of collective), and watches the
first step's backward op by op (a dispatch mode) so the peak includes autograd's temporaries.
Rows: full vs minimal (steps after the first), "watch every step" vs minimal, which is what
the op-by-op watch costs per backward (paid once per run by the full timeline), and minimal vs
minimal without the wire meter, which is what reading the kernel's counters at each step's
start costs (that arm measures no bytes on the wire). Same ranks, alternating rounds; ratios of
medians. What no arm can switch off (the ledger's count of what autograd saves, each
collective's record) is in every zeroedu arm, and in `bench_compare.py`'s.

    .venv/bin/python benchmarks/bench_instrumentation.py [--quick] [--rounds 5] [--steps 3]
"""
from __future__ import annotations

import os

import common
from zeroedu.references.bench import run_compare
from zeroedu.runtime import cluster


def main(argv=None):
    ap = common.timed_parser(__doc__)
    ap.add_argument("--strategies", default="ddp_bucketed,zero2,fsdp2")
    a = ap.parse_args(argv)
    if a.quick:
        a.steps = 2
    pool = cluster.get_pool(a.n, "gloo")  # the CPU benchmark, also where GPUs are visible
    print(f"N = {a.n}, {a.model}, fp32, {a.rounds} rounds x {a.steps} steps; {common.load()}")
    rows = []
    for strategy in a.strategies.split(","):
        cfg = common.cfg_dict(strategy, a.n, a.model)
        arms = [common.zeroedu_arm("minimal", cfg, "minimal"), common.zeroedu_arm("full", cfg, "full"),
                {**common.zeroedu_arm("full, watch every step", cfg, "full"), "watch": "every"},
                {**common.zeroedu_arm("minimal, no wire meter", cfg, "minimal"), "wire_meter": False}]
        r = run_compare(pool, arms, rounds=a.rounds, steps=a.steps)
        full = r["full"]["median"] / r["minimal"]["median"]
        watch = r["full, watch every step"]["median"] / r["minimal"]["median"]
        meter = r["minimal"]["median"] / r["minimal, no wire meter"]["median"]
        rows.append({"strategy": strategy, **r, "full_over_minimal": full, "watch_over_minimal": watch,
                     "minimal_over_no_meter": meter})
        print(f"{strategy}:")
        for lab in ("minimal", "full", "full, watch every step", "minimal, no wire meter"):
            print(common.row(lab, r[lab]))
        print(f"  full / minimal = {full:.3f};  watching every backward / minimal = {watch:.3f};"
              f"  minimal / no wire meter = {meter:.3f}")
    print(f"after: {common.load()}")
    path = common.write_results("instrumentation", {"n": a.n, "model": a.model, "rows": rows})
    print(f"written: {os.path.relpath(path)}")
    return rows


if __name__ == "__main__":
    main()
