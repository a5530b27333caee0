"""``zeroedu context``: train a GPT with context parallelism (ring attention) on real ranks and
print what each rank sent, saved and computed beside the closed forms, and the losses beside one
process's.

    zeroedu context --cp 4                 # plain split: the last rank computes 4x the first's scores
    zeroedu context --cp 4 --zigzag        # chunks r and 2cp-1-r: the same work on every rank
    zeroedu context --cp 2 --dp 2 --zigzag # four ranks: two replicas of two

A split that cannot exist (a sequence not divisible into cp, or 2cp with --zigzag, chunks; a batch
not divisible over dp) is refused with one line.
"""
from __future__ import annotations

import dataclasses

from ..fmt import number, table
from ..models import PRESETS, GPTConfig, get_model
from ..train import context
from .args import positive_int


def cmd_context(args) -> int:
    model = get_model(args.model)
    if args.layers is not None:
        model = dataclasses.replace(model, n_layers=args.layers, preset="")
    if args.cp < 2:
        raise ValueError("--cp: context parallelism splits the sequence over at least 2 ranks")
    rep = context.compare(model, args.cp, zigzag=args.zigzag, dp=args.dp, steps=args.steps,
                          global_batch=args.global_batch)
    split = "zig-zag (chunks r and 2cp-1-r)" if rep.zigzag else "plain (contiguous)"
    print(f"context parallel  cp {rep.cp} x dp {rep.dp}  split {split}  model {rep.model}  "
          f"global batch {rep.global_batch}  steps {rep.steps}")
    print("first step, all layers; sent = bytes this rank put on the wire by the ledger's records")
    head = ["rank", "cp", "dp", "positions", "ring fwd B", "predicted", "ring bwd B", "predicted", "grads B",
            "predicted", "activations B", "predicted", "scores", "predicted", "attn ms", "match"]
    rows = [[str(r.rank), str(r.cp_rank), str(r.dp_rank), r.positions, number(r.forward_sent),
             number(r.predicted_forward), number(r.backward_sent), number(r.predicted_backward), number(r.grads_sent),
             number(r.predicted_grads), number(r.activation_bytes), number(r.predicted_activations),
             number(r.score_elements), number(r.predicted_score_elements), f"{1e3 * r.attention_seconds:.1f}",
             "yes" if r.match else "NO"] for r in rep.rows]
    print(table(head, rows))
    work = [r.score_elements for r in rep.rows]
    print(f"score elements, most / least loaded rank: {max(work) / min(work):.2f}  "
          f"(attn ms: this machine's wall time of the ring's forward compute, all steps)")
    print("losses            " + "  ".join(f"{x:.6f}" for x in rep.losses))
    print("reference losses  " + "  ".join(f"{x:.6f}" for x in rep.reference_losses)
          + f"   (one process) — match: {rep.losses_match}")
    print(f"parameters after {rep.steps} steps: largest relative difference from one process {rep.param_error:.1e}")
    return 0 if rep.match else 1


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("context", help="context parallelism (ring attention) on real ranks, measured")
    p.add_argument("--cp", type=positive_int, default=2, help="ranks that split each sequence (default 2)")
    p.add_argument("--zigzag", action="store_true", help="the load-balanced split: chunks r and 2cp-1-r")
    p.add_argument("--dp", type=positive_int, default=1, help="data-parallel replicas of the cp group (default 1)")
    p.add_argument("--model", choices=[k for k, v in PRESETS.items() if isinstance(v, GPTConfig)],
                   default="gpt-tiny", help="default gpt-tiny")
    p.add_argument("--layers", type=positive_int, default=None, help="override the model's block count")
    p.add_argument("--steps", type=positive_int, default=3, help="optimizer steps (default 3)")
    p.add_argument("--global-batch", type=positive_int, default=4, help="sequences per step (default 4)")
    p.set_defaults(func=cmd_context)
