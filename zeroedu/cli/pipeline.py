"""``zeroedu pipeline``: train a GPT on a pipeline of real ranks, one stage each; print what each
stage sent and held beside the closed forms, and the losses beside one process's.

    zeroedu pipeline --pp 4 --micro-batches 8 --schedule 1f1b --model gpt-tiny --layers 4
    zeroedu pipeline --pp 2 --dp 2 --strategy zero2 --micro-batches 4   # dp bytes grow with m
    zeroedu pipeline --pp 4 --micro-batches 4 --layers 4 --emulate 50,100  # the bubble, timed

A pipeline that cannot exist (layers not divisible by the stages, a batch not divisible by the
micro-batches) is refused with one line. m < p is allowed: every micro-batch is then in flight at
once and the bubble, (p-1)/(m+p-1), is most of the step.
"""
from __future__ import annotations

import dataclasses
import json

from ..fmt import number
from ..models import GPTConfig, PRESETS, get_model
from ..theory.pipeline import SCHEDULES
from ..train import pipeline
from .args import positive_int


def cmd_pipeline(args) -> int:
    model = get_model(args.model)
    if not isinstance(model, GPTConfig):
        raise ValueError(f"a pipeline cuts a GPT's blocks into stages: {args.model} is not a gpt-* model")
    if args.layers is not None:
        model = dataclasses.replace(model, n_layers=args.layers, preset="")
    if args.pp < 2:
        raise ValueError("--pp: a pipeline has at least 2 stages")
    compute = None
    if args.emulate is not None:
        try:
            tf, tb = (float(v) / 1e3 for v in args.emulate.split(","))
        except ValueError:
            raise ValueError(f"--emulate takes FORWARD_MS,BACKWARD_MS (e.g. 50,100), got {args.emulate!r}") from None
        compute = (tf, tb)
    rep = pipeline.run(model, args.pp, args.micro_batches, args.schedule, steps=args.steps,
                       global_batch=args.global_batch, dp=args.dp, strategy=args.strategy, compute=compute)
    if args.json:
        print(json.dumps(dataclasses.asdict(rep), indent=1))
        return 0 if rep.losses_match and all(s.match for s in rep.per_stage) else 1
    m, p = rep.microbatches, rep.stages
    dp = f"  x dp {rep.dp} ({rep.strategy} per stage)" if rep.strategy else ""
    print(f"pipeline {rep.schedule}  {p} stages x {m} micro-batches{dp}  model {rep.model}  "
          f"global batch {rep.global_batch}  steps {rep.steps}")
    if m < p:
        print(f"note: m = {m} < p = {p}: no steady state, every micro-batch is in flight at once")
    device = ("an emulated device: forward {:g} ms, backward {:g} ms per micro-batch".format(*(1e3 * t for t in rep.compute))
              if rep.compute else "real compute on this machine's cores (--emulate paces it)")
    print(f"bubble: (p-1)/(m+p-1) = {rep.bubble:.1%} of the step (closed form); idle on the timeline, per stage: "
          + "  ".join(f"{b:.1%}" for b in rep.measured_bubble) + f"  ({device})")
    head = ["rank", "stage", "blocks", "pp sent B (records)", "predicted", "wire B (kernel)", "in flight",
            "peak activations B", "predicted"] + (["dp sent B", "predicted"] if rep.strategy else []) + ["match"]
    rows = [[str(s.rank), str(s.stage), f"{s.layers[0]}..{s.layers[1] - 1}", number(s.sent), number(s.predicted_sent),
             "n/a" if s.wire is None else number(s.wire), str(s.in_flight), number(s.peak_activations),
             number(s.predicted_peak_activations)]
            + ([number(sum(s.dp_sent.values())), number(sum(s.predicted_dp_sent.values()))] if rep.strategy else [])
            + ["yes" if s.match else "NO"] for s in rep.per_stage]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    for r in [head, ["-" * w for w in widths]] + rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    print("wire = records + 144 B of gloo framing per message")
    print("losses            " + "  ".join(f"{x:.6f}" for x in rep.losses))
    print("reference losses  " + "  ".join(f"{x:.6f}" for x in rep.reference_losses)
          + f"   (one process) — match: {rep.losses_match}")
    print(f"parameters after {rep.steps} steps: largest relative difference from one process {rep.param_error:.1e}")
    return 0 if rep.losses_match and all(s.match for s in rep.per_stage) else 1


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("pipeline", help="pipeline parallelism (GPipe, 1F1B) on real ranks, measured")
    p.add_argument("--pp", type=positive_int, default=2, help="pipeline stages = ranks (default 2)")
    p.add_argument("--micro-batches", type=positive_int, default=4, help="micro-batches per step (default 4)")
    p.add_argument("--schedule", choices=list(SCHEDULES), default="1f1b", help="default 1f1b")
    p.add_argument("--model", choices=[k for k, v in PRESETS.items() if isinstance(v, GPTConfig)],
                   default="gpt-tiny", help="default gpt-tiny")
    p.add_argument("--layers", type=positive_int, default=None, help="override the model's block count")
    p.add_argument("--dp", type=positive_int, default=1, help="data-parallel replicas of each stage (default 1)")
    p.add_argument("--strategy", choices=["ddp", "zero1", "zero2", "megatron_distopt", "fsdp1", "fsdp2"], default=None,
                   help="each stage's data-parallel strategy over its dp ranks (with --dp > 1)")
    p.add_argument("--steps", type=positive_int, default=3, help="optimizer steps (default 3)")
    p.add_argument("--global-batch", type=positive_int, default=None, help="sequences per step (default: the model's)")
    p.add_argument("--emulate", default=None, metavar="F_MS,B_MS",
                   help="pace every forward / backward of a micro-batch to these milliseconds (an emulated device)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_pipeline)
