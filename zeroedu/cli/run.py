"""``zeroedu run``: train a strategy on real ranks, print measured vs predicted.

It starts N local ranks (gloo on CPU, NCCL when CUDA has N devices) or, when started by
torchrun, uses the ranks torchrun made; trains a shipped model (``--model``, default the
notebooks' gpt-small) for K steps, with a progress line on stderr; and prints, per rank,
model-state bytes, activations and bytes sent per step as measured against `zeroedu.theory`'s
exact prediction, plus the losses against single-process training.
``zeroedu tour`` (`tour.py`) does that for every strategy at one world size.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .. import catalog, recipes
from ..models import DEFAULT_MODEL, PRESETS, RECOMPUTE_MODES, MLPConfig, get_model
from ..models.gpt import ATTENTION
from ..notebook.report import plain, summary
from ..optim import AdamConfig
from ..runtime import cluster
from ..runtime.links import PRESETS as LINK_PRESETS
from ..runtime.comm import IMPLEMENTATIONS
from ..kinds import TIMELINE_MODES
from ..train import ResolvedConfig, RunConfig, assemble, config_to_dict, run, train_job
from .args import positive_float, positive_int


def _options(args) -> dict:
    opts = {}
    if getattr(args, "bucket_bytes", None) is not None:
        opts["bucket_bytes"] = args.bucket_bytes
    if getattr(args, "no_reshard_after_forward", False):
        opts["reshard_after_forward"] = False
    if getattr(args, "async_reduce_scatter", False):
        opts["async_reduce_scatter"] = True
    prefetch = getattr(args, "prefetch", None)
    if prefetch is not None:
        opts["backward_prefetch"] = prefetch in ("backward", "both")
        opts["forward_prefetch"] = prefetch in ("forward", "both")
    return opts


def model_config(args):
    """The --model preset; --hidden / --depth resize the MLP (and only the MLP)."""
    model = get_model(args.model)
    if args.hidden is not None or args.depth is not None:
        if not isinstance(model, MLPConfig):
            raise ValueError("--hidden and --depth size the mlp model; use --model mlp")
        model = MLPConfig(hidden=args.hidden or MLPConfig.hidden, depth=args.depth or MLPConfig.depth)
    return model


def config_from_args(args, world_size: int) -> ResolvedConfig:
    if args.outer != 1 and not catalog.get_spec(args.strategy).hybrid:
        hybrid = ", ".join(n for n in catalog.STRATEGIES if catalog.get_spec(n).hybrid)
        raise ValueError(f"--outer {args.outer}: M is the dp_outer axis of a hybrid strategy ({hybrid}); "
                         f"{args.strategy} is flat over the world size")
    model = model_config(args)
    adam = None if args.lr is None else AdamConfig(lr=args.lr)
    return RunConfig(args.strategy, world_size, steps=args.steps, recipe=args.recipe, m=args.outer,
                     global_batch=args.global_batch, model=model, adam=adam, options=_options(args),
                     micro_batches=args.micro_batches, recompute=args.recompute, attention=args.attention,
                     clip_grad_norm=args.clip_grad_norm, collectives=args.collectives,
                     links=getattr(args, "link", None), timeline=args.record,
                     tp=getattr(args, "tp", 1), sequence_parallel=getattr(args, "sequence_parallel", False),
                     cp=getattr(args, "cp", 1), zigzag=getattr(args, "zigzag", False),
                     pp=getattr(args, "pp", 1), schedule=getattr(args, "schedule", "1f1b"),
                     emulate=getattr(args, "emulate", None),
                     experts=getattr(args, "experts", 0), top_k=getattr(args, "top_k", 1),
                     capacity_factor=getattr(args, "capacity_factor", None),
                     ep=getattr(args, "ep", 1)).resolved()


class Progress:
    """One line on stderr, rewritten as `rank` finishes each step: step, loss, time. With a pipeline
    the loss is the last stage's, so the line follows that stage's first rank (`loss_rank`)."""

    def __init__(self, steps: int, stream=None, dtype: str = "bf16", rank: int = 0):
        # sys.stderr as it is now, not as it was when this module was imported (a caller that
        # redirects stderr, a notebook or a test, gets the line where it looks)
        stream = sys.stderr if stream is None else stream
        self.steps, self.stream, self.t0 = steps, stream, time.perf_counter()
        self.tty = stream.isatty()
        self.dtype = dtype  # the recipe's 16-bit compute dtype, named on the line
        self.rank = rank

    def __call__(self, msg: dict) -> None:
        if msg.get("type") != "progress" or msg.get("rank") != self.rank:
            return
        k = msg["step"] + 1
        bar = "#" * (20 * k // self.steps)
        line = (f"step {k:>{len(str(self.steps))}}/{self.steps} [{bar:<20}] loss {msg['loss']:.4f}  "
                f"{time.perf_counter() - self.t0:.1f} s")
        if msg.get("matmul16"):  # a 16-bit recipe: whether this CPU's products are native or emulated
            line += f"  {self.dtype} matmul: {msg['matmul16']}"
        if self.tty:
            self.stream.write("\r" + line + ("\n" if k == self.steps else ""))
        elif k == self.steps or k == 1 or k % max(1, self.steps // 10) == 0:
            self.stream.write(line + "\n")  # a log file gets about ten lines, not one per step
        self.stream.flush()


def loss_rank(cfg) -> int:
    """The first rank that computes the loss: rank 0, or with a pipeline (pp outermost) the first
    rank of the last stage."""
    return cfg.world_size - cfg.world_size // cfg.pp


def check_world(world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"--world-size must be >= 1, got {world_size}")
    if world_size > cluster.MAX_LOCAL_RANKS and not cluster.under_torchrun():
        raise ValueError(f"--world-size {world_size} exceeds the local rank limit "
                         f"{cluster.MAX_LOCAL_RANKS} (1..{cluster.MAX_LOCAL_RANKS}); use torchrun for more")


def check_trace_path(path: str) -> None:
    """ValueError unless the trace can be written where `--trace` says, checked before any rank
    starts (a run must not train for minutes and then lose its report to a bad path)."""
    per_rank = os.path.isdir(path) or not path.endswith(".json")
    target = path if per_rank else (os.path.dirname(path) or ".")
    if not per_rank and os.path.isdir(path):
        raise ValueError(f"--trace {path}: a folder, not a .json file")
    existing = target
    while existing and not os.path.exists(existing):  # a folder is made when missing: its first existing parent
        existing = os.path.dirname(existing.rstrip(os.sep)) or "."
    if not per_rank and not os.path.isdir(target):
        raise ValueError(f"--trace {path}: the folder {target} does not exist")
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--trace {path}: cannot write into {existing}")


def cmd_run(args) -> int:
    if args.json_timelines and not args.json:
        raise ValueError("--json-timelines prints timelines in the --json output: add --json")
    if getattr(args, "trace", None):
        check_trace_path(args.trace)
    if cluster.under_torchrun():
        return _run_torchrun(args)
    stale = cluster.stale_torchrun_variables()
    if stale:
        print(f"zeroedu: warning: {', '.join(stale)} set, but this process was not started by torchrun "
              f"(no TORCHELASTIC_RUN_ID): ignored; running {args.world_size} local ranks", file=sys.stderr)
    check_world(args.world_size)
    cfg = config_from_args(args, args.world_size)
    if not args.quiet:
        print(f"starting {cfg.world_size} ranks: {cfg.strategy}, {cfg.model.name} "
              f"(Ψ = {cfg.model.param_count():,}), {cfg.steps} steps ...", file=sys.stderr, flush=True)
    if args.predict and cfg.links is None:
        raise ValueError("--predict replays the run's schedule on its emulated links: add --link")
    if args.predict and not args.quiet:
        print("calibration run (no emulated link) for --predict ...", file=sys.stderr, flush=True)
    report = run(cfg, warm=False, timeout=args.timeout, on_event=None if args.quiet else Progress(cfg.steps, dtype=recipes.get_recipe(cfg.recipe).param, rank=loss_rank(cfg)),
                 predict=args.predict)
    _emit(report, args)
    return 0


def _run_torchrun(args) -> int:
    cfg = config_from_args(args, int(os.environ["WORLD_SIZE"]))
    if cfg.links is not None:
        raise ValueError("--link emulates links between the local ranks of one machine; under torchrun "
                         "the links are real: run without --link")
    ranks = cluster.run_torchrun(train_job, {"cfg": config_to_dict(cfg)}, timeout=args.timeout)
    if ranks is not None:  # rank 0 prints for everyone
        _emit(assemble(cfg, ranks), args)
    return 0


def _emit(report, args):
    # The report first: whatever happens to the trace's file, the run's result is out.
    if args.json:
        print(json.dumps(plain(report, timeline=args.json_timelines), indent=1, allow_nan=False), flush=True)
    else:
        print(summary(report), flush=True)
    if getattr(args, "trace", None):
        from ..notebook import trace

        per_rank = os.path.isdir(args.trace) or not args.trace.endswith(".json")
        try:
            files = trace.write(report, args.trace, per_rank=per_rank)
        except OSError as e:
            raise ValueError(f"--trace {args.trace}: {e.strerror or e} (the report above is complete)") from None
        print(f"trace: {', '.join(files)} (Chrome trace-event JSON: Perfetto, chrome://tracing"
              f"{', Holistic Trace Analysis' if per_rank else ''})", file=sys.stderr)


def add_common(p) -> None:
    """Options `run` and `tour` share: model, steps, batch, accumulation, recompute, clipping."""
    p.add_argument("--model", choices=list(PRESETS), default=DEFAULT_MODEL,
                   help=f"what to train (default {DEFAULT_MODEL}, the notebooks' model)")
    p.add_argument("--steps", type=positive_int, default=5, help="optimizer steps (default 5)")
    p.add_argument("--hidden", type=positive_int, default=None, help="mlp width (--model mlp only)")
    p.add_argument("--depth", type=positive_int, default=None, help="mlp Linear layers (--model mlp only)")
    p.add_argument("--global-batch", type=positive_int, default=None,
                   help="sequences (samples) per optimizer step over all ranks; must divide by the "
                        "world size (default: the model's, 8 for gpt-*, 24 for mlp)")
    p.add_argument("--micro-batches", type=positive_int, default=1,
                   help="gradient accumulation: micro-batches per optimizer step (default 1)")
    p.add_argument("--recompute", choices=list(RECOMPUTE_MODES), default="none",
                   help="activation recompute for gpt-* models (default none)")
    p.add_argument("--attention", choices=list(ATTENTION), default=None,
                   help="gpt-* attention: eager (default: softmax(q kᵀ) v spelled out, the B·H·S² "
                        "probabilities saved, so every saved tensor can be named and Korthikanti et "
                        "al.'s count is reproduced) or fused (torch's scaled_dot_product_attention, "
                        "FlashAttention-style: no scores saved, as trainers run today)")
    p.add_argument("--clip-grad-norm", type=positive_float, default=None,
                   help="clip the global gradient norm to this value")
    p.add_argument("--lr", type=positive_float, default=None, help="Adam learning rate (default: the model's)")
    p.add_argument("--collectives", choices=list(IMPLEMENTATIONS), default="auto",
                   help="ring: zeroedu's ring reduce-scatter/all-gather (the ring bound on the wire); "
                        "backend: torch's (gloo's reduce-scatter sends an all-reduce's bytes); "
                        "auto (default): ring on gloo, backend on NCCL")
    p.add_argument("--record", choices=list(TIMELINE_MODES), default="full",
                   help="full (default): every lifecycle event and the wire per collective; "
                        "minimal: only the report's figures (model states, activations, peak at "
                        "lifecycle events, wire per step), for less overhead")


def _emulate(text: str) -> tuple[float, float]:
    try:
        tf, tb = (float(v) / 1e3 for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes FORWARD_MS,BACKWARD_MS (e.g. 50,100), got {text!r}") from None
    return tf, tb


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("run", help="train one strategy on N real ranks; measured vs predicted")
    add_arguments(p)


def add_arguments(p, strategy_required: bool = True) -> None:
    """Every option of `zeroedu run`, on parser `p` (`zeroedu experts` is `run` with other defaults)."""
    p.add_argument("--strategy", required=strategy_required,
                   help="one of: " + ", ".join(list(catalog.STRATEGIES) + list(catalog.ALIASES)))
    p.add_argument("--world-size", type=int, default=4, help="ranks (local: 1..16; torchrun: its own)")
    p.add_argument("--outer", "--m", dest="outer", type=positive_int, default=1,
                   help="M: replicas/domains on the dp_outer axis (hsdp, hfsdp)")
    p.add_argument("--tp", type=positive_int, default=1,
                   help="tensor parallelism (gpt-* models): every block split over TP contiguous ranks "
                        "(Megatron's column / row-parallel layers), the strategy data-parallel over the "
                        "world / TP replicas across them; bytes and memory per axis (default 1: none)")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="with --tp: sequence parallelism inside tp (LayerNorm and residual activations "
                        "split along the sequence; all-gather / reduce-scatter in place of all-reduce)")
    p.add_argument("--pp", type=positive_int, default=1,
                   help="pipeline parallelism (gpt-* models): the blocks cut into PP stages on the outermost "
                        "axis, each step's --micro-batches run by --schedule through the strategy, which is "
                        "data-parallel over each stage's ranks; sends and activations per stage (default 1: none)")
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b",
                   help="with --pp: GPipe (every forward, then every backward) or 1F1B (default)")
    p.add_argument("--emulate", default=None, metavar="F_MS,B_MS", type=_emulate,
                   help="with --pp: pace every forward / backward of a micro-batch to these milliseconds (an "
                        "emulated device), so each stage's idle share shows beside (pp-1)/(m+pp-1)")
    p.add_argument("--cp", type=positive_int, default=1,
                   help="context parallelism (gpt-* models, --attention eager): every sequence split over CP "
                        "contiguous ranks, keys and values passed around a ring; the strategy reduces and "
                        "shards over dp x CP; ring bytes and activations per rank (default 1: none)")
    p.add_argument("--zigzag", action="store_true",
                   help="with --cp: the zig-zag split, chunks r and 2CP-1-r, so every rank does the same causal work")
    p.add_argument("--experts", type=positive_int, default=0,
                   help="a mixture of experts (gpt-* models): every block's MLP E experts behind a top-k router, "
                        "each sequence routed on its own with capacity 1.25 k S / E (default: dense)")
    p.add_argument("--top-k", type=positive_int, default=1, help="with --experts: experts per token (default 1)")
    p.add_argument("--capacity-factor", type=positive_float, default=None,
                   help="with --experts: an expert takes at most ceil(F k S / E) of a sequence's assignments (default 1.25)")
    p.add_argument("--ep", type=positive_int, default=1,
                   help="expert parallelism (with --experts; ddp, zero1, zero2): E/EP experts per rank, tokens "
                        "carried to them by all-to-all, each EP rank its own share of the batch; the experts' "
                        "gradients reduced over dp, the rest over dp x EP; all-to-all bytes from the router's "
                        "counts (default 1: none)")
    p.add_argument("--recipe", choices=list(recipes.RECIPES), default=None,
                   help="precision recipe (default: the strategy's own)")
    p.add_argument("--bucket-bytes", type=positive_int, default=None, help="DDP/ZeRO bucket size")
    p.add_argument("--no-reshard-after-forward", action="store_true",
                   help="FSDP: keep unsharded params from forward to backward")
    p.add_argument("--prefetch", choices=["none", "backward", "forward", "both"], default=None,
                   help="FSDP all-gather prefetch")
    p.add_argument("--async-reduce-scatter", action="store_true",
                   help="FSDP2: one unit's reduce-scatter in flight during the next unit's backward (torch's default)")
    p.add_argument("--link", action="append", default=None, metavar="LINK",
                   help="emulated links, on which communication overlaps compute: a preset "
                        f"({', '.join(LINK_PRESETS)}), one link for every axis (200MB/s,50us), or one "
                        "per axis (dp_shard=200MB/s,50us --link dp_outer=20MB/s,500us); each message "
                        "arrives alpha + bytes/beta after it starts. Needs zeroedu's ring collectives")
    p.add_argument("--predict", action="store_true",
                   help="with --link: also predict each step's time, replaying a calibration run's "
                        "schedule (the same run, no link) on the links; printed beside the measured time")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="write the ranks' timelines as a Chrome trace: PATH.json one file for every "
                        "rank; a folder, one rank<r>.json per rank (Holistic Trace Analysis's layout)")
    p.add_argument("--timeout", type=positive_float, default=cluster.DEFAULT_TIMEOUT,
                   help="seconds before a silent rank counts as hung (default 60)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    # Two flags, two questions: --record says what the ranks record (`RunConfig.timeline`),
    # --json-timelines what --json prints of it.
    p.add_argument("--json-timelines", action="store_true",
                   help="with --json: print each rank's recorded timeline too (events, marks, collectives)")
    p.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    add_common(p)
    p.set_defaults(func=cmd_run)
