"""``zeroedu experts``: train a mixture-of-experts GPT with expert parallelism on real ranks and
print each rank's all-to-all bytes beside the closed form from the router's actual assignment (and
beside a perfectly balanced router), its expert parameters, the tokens it dropped, and the losses
beside the same MoE in one process.

    zeroedu experts --experts 4 --ep 2 --top-k 1
    zeroedu experts --experts 8 --ep 4 --top-k 2 --capacity-factor 1.25
    zeroedu experts --experts 4 --ep 2 --dp 2     # experts replicated over two groups

A shape that cannot exist (experts not divisible over ep, top-k above the experts, a batch not
divisible over the ranks) is refused with one line.
"""
from __future__ import annotations

import dataclasses

from ..fmt import number, table
from ..models import PRESETS, GPTConfig, get_model
from ..strategies.expert_parallel import MoESpec
from ..train import experts
from .args import positive_float, positive_int


def cmd_experts(args) -> int:
    model = get_model(args.model)
    if args.layers is not None:
        model = dataclasses.replace(model, n_layers=args.layers, preset="")
    if args.ep < 2:
        raise ValueError("--ep: expert parallelism places the experts over at least 2 ranks")
    spec = MoESpec(args.experts, args.top_k, args.capacity_factor, args.aux_weight)
    rep = experts.compare(model, spec, args.ep, dp=args.dp, steps=args.steps, global_batch=args.global_batch)
    print(f"expert parallel  E {spec.experts} experts, top-{spec.top_k}, capacity factor {spec.capacity_factor:g} "
          f"(C = {rep.capacity} per expert of a rank's tokens)  ep {rep.ep} x dp {rep.dp}  model {rep.model}  "
          f"global batch {rep.global_batch}  steps {rep.steps}")
    print("first step, all MoE layers; predicted = the closed form from the router's actual assignment")
    head = ["rank", "ep", "dp", "experts", "dropped", "dispatch B", "predicted", "balanced", "combine B",
            "predicted", "all-to-all B", "predicted", "all-reduce B", "predicted", "params B", "predicted", "match"]
    rows = [[str(r.rank), str(r.ep_rank), str(r.dp_rank), r.experts, str(r.tokens_dropped), number(r.dispatch_sent),
             number(r.predicted_dispatch), number(r.balanced), number(r.combine_sent), number(r.predicted_combine),
             number(r.all_to_all_sent), number(r.predicted_all_to_all), number(r.reduce_sent),
             number(r.predicted_reduce), number(r.param_bytes), number(r.predicted_param_bytes),
             "yes" if r.match else "NO"] for r in rep.rows]
    print(table(head, rows))
    print("all-to-all = dispatch + combine + their gradients + the counts; balanced = k*T*D*4*(ep-1)/ep per layer")
    print("losses            " + "  ".join(f"{x:.6f}" for x in rep.losses))
    print("reference losses  " + "  ".join(f"{x:.6f}" for x in rep.reference_losses)
          + f"   (one process, the same routing) — match: {rep.losses_match}")
    print(f"parameters after {rep.steps} steps: largest relative difference from one process {rep.param_error:.1e}")
    if not rep.routing_match:
        print(f"routing: the same as one process's for the first {rep.same_routing_steps} of {rep.steps} steps; "
              "then round-off tipped a near-tied choice, and the runs trained on different assignments")
    return 0 if rep.match else 1


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("experts", help="expert parallelism (mixture of experts, all-to-all) on real ranks")
    p.add_argument("--experts", type=positive_int, default=4, help="experts per MoE layer (default 4)")
    p.add_argument("--ep", type=positive_int, default=2, help="ranks the experts are placed over (default 2)")
    p.add_argument("--top-k", type=positive_int, default=1, help="experts per token (default 1)")
    p.add_argument("--capacity-factor", type=positive_float, default=1.25, help="default 1.25")
    p.add_argument("--aux-weight", type=float, default=0.01, help="the load-balancing loss's weight (default 0.01)")
    p.add_argument("--dp", type=positive_int, default=1, help="data-parallel replicas of the ep group (default 1)")
    p.add_argument("--model", choices=[k for k, v in PRESETS.items() if isinstance(v, GPTConfig)],
                   default="gpt-tiny", help="default gpt-tiny")
    p.add_argument("--layers", type=positive_int, default=None, help="override the model's block count")
    p.add_argument("--steps", type=positive_int, default=3, help="optimizer steps (default 3)")
    p.add_argument("--global-batch", type=positive_int, default=4, help="sequences per step (default 4)")
    p.set_defaults(func=cmd_experts)
