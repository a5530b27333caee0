"""``zeroedu tour``: every strategy at one world size, measured vs predicted, one table."""
from __future__ import annotations

import sys
import time

from .. import catalog
from ..notebook.report import TOUR_HEADER, all_match, table, tour_row
from ..optim import AdamConfig
from ..runtime import cluster
from ..train import RunConfig, run
from .run import add_common, check_world, model_config


def cmd_tour(args) -> int:
    check_world(args.world_size)
    rows, ok = [], True
    names = list(catalog.STRATEGIES)
    print(f"tour: {len(names)} strategies on {args.world_size} ranks, {args.steps} steps each "
          f"(bytes per rank on rank 0; sent = bytes per step, ring model)", flush=True)
    for name in names:
        spec = catalog.get_spec(name)
        m = 2 if spec.hybrid and args.world_size % 2 == 0 else 1
        t0 = time.perf_counter()
        report = run(RunConfig(name, args.world_size, steps=args.steps, m=m, model=model_config(args),
                               global_batch=args.global_batch, micro_batches=args.micro_batches,
                               recompute=args.recompute, attention=args.attention,
                               clip_grad_norm=args.clip_grad_norm,
                               collectives=args.collectives, timeline=args.record,
                               adam=None if args.lr is None else AdamConfig(lr=args.lr)))
        rows.append(tour_row(report) + [f"{time.perf_counter() - t0:.1f}s"])
        ok &= all_match(report)
        print(f"  {name:<18} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    print(table(rows, TOUR_HEADER + ["time"]))
    print(f"every strategy: predicted vs measured — match: {ok}")
    cluster.shutdown_pools()
    return 0 if ok else 1


def add_parser(subparsers) -> None:
    t = subparsers.add_parser("tour", help="every strategy at one world size, one table")
    t.add_argument("--world-size", type=int, default=4)
    add_common(t)
    t.set_defaults(func=cmd_tour)
