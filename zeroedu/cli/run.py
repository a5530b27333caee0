"""``zeroedu run``: train a strategy on real ranks, print measured vs predicted.

It starts N local ranks (gloo on CPU, NCCL when CUDA has N devices) or, when started by
torchrun, uses the ranks torchrun made; trains the shipped model for K steps; and prints, per
rank, model-state bytes and bytes sent per step as measured by the ledger against
`zeroedu.theory`'s exact prediction, plus the losses against single-process training.
``zeroedu tour`` (`tour.py`) does that for every strategy at one world size.
"""
from __future__ import annotations

import json
import os
import sys

from .. import catalog, recipes
from ..models import ModelConfig
from ..notebook.report import plain, summary
from ..runtime import cluster
from ..train import RunConfig, assemble, config_to_dict, run, train_job
from .args import positive_int


def _options(args) -> dict:
    opts = {}
    if getattr(args, "bucket_bytes", None) is not None:
        opts["bucket_bytes"] = args.bucket_bytes
    if getattr(args, "no_reshard_after_forward", False):
        opts["reshard_after_forward"] = False
    prefetch = getattr(args, "prefetch", None)
    if prefetch is not None:
        opts["backward_prefetch"] = prefetch in ("backward", "both")
        opts["forward_prefetch"] = prefetch in ("forward", "both")
    return opts


def model_config(args) -> ModelConfig:
    return ModelConfig(hidden=args.hidden, depth=args.depth)


def check_world(world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"--world-size must be >= 1, got {world_size}")
    if world_size > cluster.MAX_LOCAL_RANKS and not cluster.under_torchrun():
        raise ValueError(f"--world-size {world_size} exceeds the local rank limit "
                         f"{cluster.MAX_LOCAL_RANKS} (1..{cluster.MAX_LOCAL_RANKS}); use torchrun for more")


def cmd_run(args) -> int:
    if cluster.under_torchrun():
        return _run_torchrun(args)
    check_world(args.world_size)
    cfg = RunConfig(args.strategy, args.world_size, steps=args.steps, recipe=args.recipe,
                    m=args.outer, global_batch=args.global_batch, model=model_config(args),
                    options=_options(args)).resolved()
    if not args.json:
        print(f"starting {cfg.world_size} ranks for {cfg.strategy} ...", file=sys.stderr, flush=True)
    report = run(cfg, warm=False, timeout=args.timeout)
    _emit(report, args)
    return 0


def _run_torchrun(args) -> int:
    world = int(os.environ["WORLD_SIZE"])
    cfg = RunConfig(args.strategy, world, steps=args.steps, recipe=args.recipe, m=args.outer,
                    global_batch=args.global_batch, model=model_config(args), options=_options(args)).resolved()
    ranks = cluster.run_torchrun(train_job, {"cfg": config_to_dict(cfg)})
    if ranks is not None:  # rank 0 prints for everyone
        _emit(assemble(cfg, ranks), args)
    return 0


def _emit(report, args):
    if args.json:
        print(json.dumps(plain(report, timeline=args.timeline), indent=1))
    else:
        print(summary(report))


def add_common(p) -> None:
    """Options `run` and `tour` share: steps, model size, global batch."""
    p.add_argument("--steps", type=positive_int, default=5, help="training steps (default 5)")
    p.add_argument("--hidden", type=positive_int, default=ModelConfig.hidden, help="model width")
    p.add_argument("--depth", type=positive_int, default=ModelConfig.depth, help="Linear layers")
    p.add_argument("--global-batch", type=positive_int, default=RunConfig.global_batch,
                   help="samples per step over all ranks; must divide by the world size (default 24)")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("run", help="train one strategy on N real ranks; measured vs predicted")
    p.add_argument("--strategy", required=True,
                   help="one of: " + ", ".join(list(catalog.STRATEGIES) + list(catalog.ALIASES)))
    p.add_argument("--world-size", type=int, default=4, help="ranks (local: 1..16; torchrun: its own)")
    p.add_argument("--outer", "--m", dest="outer", type=positive_int, default=1,
                   help="M: replicas/domains on the dp_outer axis (hsdp, hfsdp)")
    p.add_argument("--recipe", choices=list(recipes.RECIPES), default=None,
                   help="precision recipe (default: the strategy's own)")
    p.add_argument("--bucket-bytes", type=positive_int, default=None, help="DDP/ZeRO bucket size")
    p.add_argument("--no-reshard-after-forward", action="store_true",
                   help="FSDP: keep unsharded params from forward to backward")
    p.add_argument("--prefetch", choices=["none", "backward", "forward", "both"], default=None,
                   help="FSDP all-gather prefetch")
    p.add_argument("--timeout", type=float, default=cluster.DEFAULT_TIMEOUT,
                   help="seconds before a silent rank counts as hung (default 60)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--timeline", action="store_true", help="include per-rank timelines in the JSON")
    add_common(p)
    p.set_defaults(func=cmd_run)
