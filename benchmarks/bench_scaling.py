"""Scaling table: step time and bytes per rank for N = 1, 2, 4, 8, zeroedu and torch side by side,
with the closed-form communication time beside them; also written as JSON for the notebooks.

    DDP     zeroedu ddp_bucketed   vs torch DistributedDataParallel (same 1 MiB buckets)
    ZeRO-2  zeroedu zero2          vs torch fully_shard(reshard_after_forward=False), i.e.
                                      SHARD_GRAD_OP, torch's ZeRO-2 analogue: the same 2Ψ bytes
    FSDP    zeroedu fsdp2          vs torch fully_shard per block (3Ψ)

gpt-small, fp32, the model's global batch (8 sequences) split over N ranks. This machine has
few cores (printed), so N ranks share them: the total compute per step stays about the same
as N grows (strong scaling of one global batch), and N = 8 on 2 cores runs 4 ranks per core:
what grows is communication and scheduling, not speed. The closed-form time is the bandwidth
term of `zeroedu.theory.timing.comm_time`: bytes one rank sends per step (`theory.exact_comm`,
ring model) over the loopback bandwidth measured between two ranks (point-to-point, gloo).
Written to benchmarks/results/scaling.json; schema: `zeroedu.references.bench.SCALING_SCHEMA`,
loader: `zeroedu.references.bench.load_results`.

    .venv/bin/python benchmarks/bench_scaling.py [--quick] [--ns 1,2,4,8] [--rounds 5] [--steps 2]
"""
from __future__ import annotations

import argparse
import os

import common
from zeroedu import theory
from zeroedu.models import get_model, unit_shapes
from zeroedu.references.bench import loopback_job, run_compare
from zeroedu.runtime import cluster
from zeroedu.theory.comm import on_the_wire

STRATEGIES = {"ddp": "ddp_bucketed", "zero2": "zero2", "fsdp": "fsdp2"}
TORCH_IMPL = {"ddp": "torch DDP", "zero2": "torch fully_shard(reshard_after_forward=False)",
              "fsdp": "torch fully_shard"}


def closed_form(strategy: str, model: str, recipe: str, n: int, bandwidth: float) -> dict:
    shapes = unit_shapes(get_model(model).build())
    comm = theory.exact_comm(strategy, shapes, n, recipe=recipe)
    sent = float(comm.total())
    return {"sent": sent, "wire": float(on_the_wire(comm, "ring")),
            "wire_gloo_backend": float(on_the_wire(comm, "backend")),
            "t_comm": theory.comm_time(comm, bandwidth={"dp_shard": bandwidth}) if sent else 0.0}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--recipe", default="fp32")
    ap.add_argument("--quick", action="store_true", help="N = 1, 2, 4 only, 1 timed step per round")
    a = ap.parse_args(argv)
    if a.quick:
        a.ns, a.steps = "1,2,4", 1
    ns = [int(x) for x in a.ns.split(",")]
    print(f"{a.model}, {a.recipe}, {a.rounds} rounds x {a.steps} steps per arm; {common.load()}")
    with cluster.Pool(2, backend="gloo") as pool:
        lb = pool.run(loopback_job)[0]
    bw, alpha = lb["bandwidth"], lb["alpha"]
    print(f"loopback between two ranks (gloo send/recv, best of 5): {bw / 1e9:.2f} GB/s, "
          f"{alpha * 1e6:.0f} µs per small message")
    rows = []
    head = (f"{'N':>2s} {'strategy':7s} {'zeroedu ms':>10s} {'torch ms':>9s} {'ratio':>6s} "
            f"{'wire zeroedu MB':>15s} {'wire torch MB':>13s} {'closed form MB':>14s} {'t_comm ms':>9s}")
    print(head)
    for n in ns:
        if n > 1 and n % 2:
            raise SystemExit("N must be 1 or even")
        with cluster.Pool(n, backend="gloo") as pool:
            for name, strategy in STRATEGIES.items():
                cfg = common.cfg_dict(strategy, n, a.model, a.recipe)
                arms = [common.zeroedu_arm("zeroedu", cfg), common.torch_arm("torch", cfg, strategy)]
                r = run_compare(pool, arms, rounds=a.rounds, steps=a.steps)
                cf = closed_form(strategy, a.model, a.recipe, n, bw)
                ratio = r["zeroedu"]["median"] / r["torch"]["median"]
                rows.append({"n": n, "strategy": name,
                             "zeroedu": {"impl": f"zeroedu {strategy}", **r["zeroedu"]},
                             "torch": {"impl": TORCH_IMPL[name], **r["torch"]},
                             "ratio": ratio, "closed_form": cf})
                z, t = r["zeroedu"], r["torch"]
                print(f"{n:2d} {name:7s} {z['median'] * 1e3:10.1f} {t['median'] * 1e3:9.1f} {ratio:6.3f} "
                      f"{(z['wire'] or 0) / 1e6:15.3f} {(t['wire'] or 0) / 1e6:13.3f} {cf['wire'] / 1e6:14.3f} "
                      f"{cf['t_comm'] * 1e3:9.2f}")
    print(f"N = 8 on {common.cores()} cores: {8 / common.cores():.0f} ranks per core; wire = bytes one "
          "rank sent per step (kernel counters); closed form = ring-model payload of zeroedu's "
          "collectives (torch's gloo reduce-scatter sends an all-reduce's bytes).")
    print(f"after: {common.load()}")
    import time
    one, five, fifteen = os.getloadavg()
    path = common.write_results("scaling", {
        "model": a.model, "recipe": a.recipe, "rounds": a.rounds, "steps": a.steps,
        "machine": {"cores": common.cores(), "loadavg": [one, five, fifteen]},
        "loopback": {"bandwidth": bw, "alpha": alpha}, "rows": rows, "time": time.time()})
    print(f"written: {os.path.relpath(path)}")
    return rows


if __name__ == "__main__":
    main()
