"""What the benchmark scripts share: arms, the machine's load, tables, results files, profiles.

Every timed benchmark goes through `zeroedu.references.bench.run_compare`: all arms (zeroedu
and torch, or two zeroedu variants) are built on the same warm ranks and run in alternating
rounds; a step is forward + backward + optimizer, timed on every rank from a barrier, and the
slowest rank of each step counts. Times are noisy on a shared machine: read the ratios, which
come from the same rounds, and the load average printed beside them.
"""
from __future__ import annotations

import argparse
import json
import os
import pstats
import time

from zeroedu.train import RunConfig, config_to_dict

# Where results files go (ZEROEDU_BENCH_RESULTS overrides: the smoke tests write elsewhere).
RESULTS = os.environ.get("ZEROEDU_BENCH_RESULTS") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
TORCH_FOR = {"ddp_bucketed": "ddp", "fsdp2": "fully_shard", "fsdp1": "fully_shard", "hsdp": "fully_shard",
             "zero2": "fully_shard"}
BUCKET_BYTES = 1 << 20  # DDP on both sides: the same bucket size


def timed_parser(doc: str, quick_help: str = "2 timed steps per round") -> argparse.ArgumentParser:
    """The options every alternating-rounds benchmark takes: ranks, rounds, timed steps, model,
    and --quick (which the script interprets; `make bench BENCH_ARGS=--quick`)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per arm and round (+1 warm-up)")
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--quick", action="store_true", help=quick_help)
    return ap


def cfg_dict(strategy: str, n: int, model="gpt-small", recipe="fp32", collectives="auto",
             options: dict | None = None, m: int | None = None) -> dict:
    """A resolved RunConfig as plain data (what the ranks get)."""
    opts = dict(options or {})
    if strategy == "ddp_bucketed":
        opts.setdefault("bucket_bytes", BUCKET_BYTES)
    if m is None:
        m = 2 if strategy in ("hsdp", "hfsdp") and n % 2 == 0 and n > 1 else 1
    return config_to_dict(RunConfig(strategy, n, steps=1, m=m, model=model, recipe=recipe,
                                    collectives=collectives, options=opts).resolved())


def zeroedu_arm(label: str, cfg: dict, timeline: str = "minimal") -> dict:
    return {"label": label, "impl": "zeroedu", "cfg": cfg, "timeline": timeline}


def torch_arm(label: str, cfg: dict, strategy: str, reshard_after_forward: bool | None = None) -> dict:
    """torch's counterpart of a zeroedu strategy on the same config: DDP for ddp_bucketed,
    `fully_shard` per unit for FSDP (on a 2-D mesh for hsdp: torch's HSDP; with
    reshard_after_forward=False for zero2: SHARD_GRAD_OP, ZeRO-2's torch analogue)."""
    if strategy == "zero2" and reshard_after_forward is None:
        reshard_after_forward = False
    if reshard_after_forward is not None:
        cfg = {**cfg, "options": {**cfg["options"], "reshard_after_forward": reshard_after_forward}}
        cfg["strategy"] = "fsdp2"  # zero2 takes no such option; the torch side only reads it
    return {"label": label, "impl": "torch", "cfg": cfg, "torch": TORCH_FOR[strategy],
            "bucket_bytes": BUCKET_BYTES}


def cores() -> int:
    """Cores this process may run on (its affinity), which its ranks inherit."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}, {cores()} cores"


def ms(x: float) -> str:
    return f"{x * 1e3:8.1f}"


def mb(x) -> str:
    return "       -" if x is None else f"{x / 1e6:8.3f}"


def row(label: str, r: dict) -> str:
    """One arm: median [min, max] per step, and bytes per rank per step."""
    return (f"  {label:26s} {ms(r['median'])} ms  [{ms(r['min']).strip()}, {ms(r['max']).strip()}]"
            f"  wire {mb(r['wire'])} MB  ring model {mb(r['ring_model'])} MB")


def verdict(ratio: float, goal: float | None) -> str:
    if goal is None:
        return ""
    return f"  (goal <= {goal:.2f}: {'met' if ratio <= goal else 'NOT met'})"


def write_results(name: str, data: dict) -> str:
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.json")
    data = {"written": time.strftime("%Y-%m-%d %H:%M:%S"), **data}
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    return path


def top_functions(path: str, n: int = 12) -> list[tuple[str, int, float, float]]:
    """(function, calls, self seconds, cumulative seconds) of a cProfile file, by self time."""
    st = pstats.Stats(path)
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _) in st.stats.items():
        where = fn if file == "~" else f"{os.path.basename(file)}:{line}({fn})"
        rows.append((where, nc, tt, ct))
    rows.sort(key=lambda r: -r[2])
    return rows[:n]


def print_profile(path: str, n: int = 12) -> None:
    total = pstats.Stats(path).total_tt
    print(f"    profile {os.path.basename(path)} (rank 0, last round; {total:.2f} s in all)")
    for where, calls, tt, ct in top_functions(path, n):
        print(f"      {tt:7.3f} s self {ct:7.3f} s cum {calls:6d}x  {where[:90]}")
