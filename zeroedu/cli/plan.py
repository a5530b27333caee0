"""``zeroedu plan``: size a job over dp × tp × pp × cp with a ZeRO level, a micro-batch size and a
recompute mode (`theory.planner`).

    zeroedu plan                         # Llama-2-70B on 256 H100s, global batch 1024 x 4096 tokens
    zeroedu plan --model gpt-3-175b --gpu a100-80gb --gpus 1024 --global-batch 1536
    zeroedu plan --model mixtral-8x7b --gpus 64 --global-batch 512 --check 8,1,1,8,1,1,1,8   # ep 8
    zeroedu plan --model '{"layers": 48, "hidden": 6144, "heads": 48, "ffn": 24576, "vocab": 51200, "seq": 2048}'
    zeroedu plan --check 8,8,4,1,1       # one plan (dp,tp,pp,cp,zero[,b]): its memory and time, or why not
    zeroedu plan --check 8,8,4,1,1,2,2 --recompute full   # b = 2, interleaved v = 2, every layer recomputed
    zeroedu plan --design "dp 8, tp 8, pp 4, ZeRO-1"   # the design exercise: which conditions hold
    zeroedu plan --gpus 16 --global-batch 64 --offload  # also the plans with the optimizer on the host
    zeroedu plan --fp8                   # the linear layers in FP8: their FLOPs, saved inputs, ZeRO-3 gathers
    zeroedu plan --model gpt-small --gpus 8 [--link domain]   # the suite's model on 8 local ranks

Every plan that exists and fits in HBM, ranked by the stated time model (compute, the pipeline
bubble, each axis's exposed communication), with why each of the top three beats the next.
Bandwidths are line rates; the share of peak the matrix multiplications reach is a model, one
number per GPU calibrated on its published runs (`theory.planner.A100_EFFICIENCY`).

A model the suite runs (gpt-small, gpt-tiny) without --gpu is planned on this machine's local
ranks (`train.plans`): every shape `zeroedu run` builds, each rank's model states, activations
and bytes per axis exactly as its run will report them, ranked by a stated step-time model.
"""
from __future__ import annotations

import json
import os

from ..fmt import table
from ..kinds import RecomputeMode
from ..models import GPT_PRESETS
from ..runtime.cluster import MAX_LOCAL_RANKS
from ..theory import planner
from ..train import plans as suite
from .args import positive_float, positive_int


def _row(i, e: planner.Estimate, gpus: int, offload: bool = False) -> list[str]:
    t = e.terms()
    zero = f"{e.plan.zero}{' + off' if e.plan.offload else ''}"
    row = [str(i), str(e.plan.dp), str(e.plan.tp), str(e.plan.pp), str(e.plan.cp), zero, str(e.plan.micro_batch),
           str(e.plan.v), str(e.plan.ep), e.plan.recompute, str(e.microbatches), f"{e.states / 1e9:.1f}", f"{e.activations / 1e9:.1f}",
           f"{e.step:.2f}", f"{e.throughput(gpus) / 1e12:.0f}", f"{1e3 * t['bubble']:.0f}", f"{1e3 * t['tp']:.0f}",
           f"{1e3 * t['cp']:.0f}", f"{1e3 * t['dp']:.0f}", f"{1e3 * t['pp']:.0f}", f"{1e3 * t['ep']:.0f}"]
    return row + [f"{e.host / 1e9:.1f}", f"{1e3 * t['offload']:.0f}"] if offload else row


HEAD = ["#", "dp", "tp", "pp", "cp", "ZeRO", "b", "v", "ep", "recompute", "m", "states GB", "activ. GB", "step s",
        "TFLOP/s", "bubble ms", "tp ms", "cp ms", "dp ms", "pp ms", "ep ms"]
OFFLOAD_HEAD = ["host GB", "offload ms"]


def _model(text: str) -> planner.ModelShape:
    """A preset's name, a JSON object, or a path to a file holding one."""
    if text.lower() in planner.MODELS:
        return planner.MODELS[text.lower()]
    if text.lstrip().startswith("{") or os.path.isfile(text):
        try:
            spec = json.loads(text if text.lstrip().startswith("{") else open(text).read())
        except json.JSONDecodeError as e:
            raise ValueError(f"--model: not a JSON object ({e.msg} at character {e.pos})") from None
        if not isinstance(spec, dict):
            raise ValueError("--model: a JSON shape is an object: {\"layers\": ..., \"hidden\": ...}")
        return planner.model_shape(spec)
    return planner.model_shape(text)  # refused, naming the presets


def _cluster(args) -> planner.Cluster:
    given = {k: v for k, v in (("per_node", args.per_node), ("hbm", args.hbm and args.hbm * 1e9),
                               ("nvlink", args.nvlink and args.nvlink * 1e9), ("nic", args.nic and args.nic * 1e9),
                               ("peak_flops", args.tflops and args.tflops * 1e12),
                               ("fp8_flops", args.fp8_tflops and args.fp8_tflops * 1e12),
                               ("pcie", args.pcie and args.pcie * 1e9), ("efficiency", args.efficiency))
             if v is not None}
    return planner.Cluster.of(args.gpu or "h100-sxm", args.gpus, host_memory=args.host_memory * 1e9, **given)


def cmd_plan(args) -> int:
    if args.design is not None:
        g = planner.grade_design(args.design)
        print(f"design exercise: Llama-2-70B on {planner.DESIGN_GPUS} GPUs (8 per node, 80 GB), global batch "
              f"{planner.DESIGN_BATCH} sequences" + (f"; your plan: {g.plan}" if g.plan else ""))
        for c in g.conditions:
            print(f"  {'ok ' if c.held else 'NO '} {c.name}: {c.detail}")
        print("a good plan" if g.ok else "not yet: " + ", ".join(c.name for c in g.broken()))
        return 0 if g.ok else 1
    if args.model.lower() in GPT_PRESETS and args.gpu is None:
        return _suite(args)
    if args.link is not None:
        raise ValueError("--link paces the suite's local ranks: plan gpt-small or gpt-tiny without --gpu")
    args.gpu = args.gpu or "h100-sxm"
    args.global_batch = args.global_batch or 1024
    model, cluster = _model(args.model), _cluster(args)
    head = HEAD + (OFFLOAD_HEAD if args.offload else [])
    print(f"{model.name}: {model.params():,} parameters, {model.layers} layers, hidden {model.hidden}, "
          f"{model.heads} heads ({model.kv_heads} KV), FFN {model.ffn} ({'SwiGLU' if model.gated else 'GELU'}"
          + (f"; {model.experts} experts, top-{model.top_k}" if model.experts else "") + "), "
          f"vocab {model.vocab}, sequence {model.seq}; global batch {args.global_batch} sequences")
    print(f"{cluster.gpus} x {args.gpu}, {cluster.per_node} per node, {cluster.hbm / 1e9:.0f} GB HBM; line rates per "
          f"GPU per direction: NVLink {cluster.nvlink / 1e9:.0f} GB/s, NIC {cluster.nic / 1e9:.0f} GB/s"
          + (f", PCIe {cluster.pcie / 1e9:.0f} GB/s" if args.offload else "")
          + f"; {cluster.peak_flops / 1e12:.0f} TFLOP/s dense BF16 at {cluster.efficiency:.1%} "
          + ("(as given)" if args.efficiency is not None else "(a model: calibrated on this GPU's published runs)")
          + (f"; FP8 linear layers at {cluster.fp8_flops / 1e12:.0f} TFLOP/s" if args.fp8 and cluster.fp8_flops else "")
          + (f"; the CPU's Adam at {cluster.host_memory / 1e9:.0f} GB/s of host memory (an assumption)"
             if args.offload else ""))
    print("TFLOP/s = model FLOPs per GPU per second (no recompute counted: what MFU divides by the peak)")
    if args.check:
        try:
            d, t, p, c, z, *bve = (int(x) for x in args.check.split(","))
            if len(bve) > 3:
                raise ValueError
        except ValueError:
            raise ValueError(f"--check takes dp,tp,pp,cp,zero[,b[,v[,ep]]] (e.g. 8,8,4,1,1), got {args.check!r}") from None
        b, v, ep = (*bve, 1, 1, 1)[:3]
        pl = planner.Plan(d, t, p, c, z, args.offload, args.fp8, b,
                          args.recompute[0] if args.recompute else RecomputeMode.SELECTIVE, v, ep)
        why = planner.refusal(model, cluster, pl, args.global_batch)
        if why:
            raise ValueError(f"{pl}: {why}")
        e = planner.estimate(model, cluster, pl, args.global_batch)
        print(table(head, [_row(1, e, cluster.gpus, args.offload)]))
        print(f"memory {e.memory / 1e9:.1f} GB of {cluster.hbm / 1e9:.0f} GB: "
              + ("fits" if e.fits else "does not fit"))
        return 0 if e.fits else 1
    rep = planner.plan(model, cluster, args.global_batch, offload=(False, True) if args.offload else (False,),
                       fp8=(args.fp8,), micro_batches=tuple(args.micro_batch),
                       recompute=tuple(args.recompute or planner.RECOMPUTE), interleave=tuple(args.interleave),
                       ep_sizes=tuple(args.ep))
    print(f"{len(rep.ranked)} plans fit, {rep.too_big} exist but do not fit; refused: "
          + (", ".join(f"{k} ({v})" for k, v in sorted(rep.refused.items())) or "none"))
    if not rep.ranked:
        print("no plan fits")
        return 1
    print(table(head, [_row(i + 1, e, cluster.gpus, args.offload) for i, e in enumerate(rep.ranked[:args.top])]))
    for i in range(min(3, len(rep.ranked) - 1)):
        print(f"#{i + 1} {rep.ranked[i].plan}: {planner.why_better(rep.ranked[i], rep.ranked[i + 1])}")
    return 0


SUITE_HEAD = ["#", "dp", "tp", "sp", "pp", "cp", "ZeRO", "strategy", "k", "states MB", "activ. MB", "dp MB", "tp MB",
              "cp MB", "pp MB", "compute s", "comm s", "step s"]


def _suite_row(i: int, p: suite.SuitePlan) -> list[str]:
    c = p.config

    def sent(axes) -> str:  # the most any rank sends per step on these axes
        return f"{max(sum(sum(r.comm_by_axis.get(a, {}).values()) for a in axes) for r in p.ranks) / 1e6:.2f}"

    big = max(p.ranks, key=lambda r: r.memory)
    return [str(i), str(p.dp), str(c.tp), "yes" if c.sequence_parallel else "", str(c.pp), str(c.cp), str(p.zero),
            c.strategy, str(c.micro_batches), f"{big.model_states / 1e6:.2f}", f"{big.activations / 1e6:.2f}",
            sent(("dp_shard", "dp_outer", "world")), sent(("tp",)), sent(("cp",)), sent(("pp",)),
            f"{p.compute:.3f}", f"{sum(p.comm.values()):.3f}", f"{p.step:.3f}"]


def _suite(args) -> int:
    """The suite's model on local ranks (`train.plans`)."""
    given = [flag for flag, v in (("--check", args.check), ("--offload", args.offload), ("--fp8", args.fp8)) if v]
    if given:
        raise ValueError(f"{given[0]} is the cluster planner's: add --gpu h100-sxm (or another preset)")
    if args.gpus > MAX_LOCAL_RANKS:
        raise ValueError(f"{args.model} is planned on this machine's local ranks, at most {MAX_LOCAL_RANKS}: "
                         f"--gpus 8, say (or --gpu h100-sxm for its shape on a cluster)")
    rep = suite.plan(args.model.lower(), args.gpus, args.global_batch, args.recipe, tuple(args.micro_batch), args.link)
    print(f"{rep.model} on {rep.world_size} local ranks ({rep.cores} cores), global batch {rep.global_batch} "
          f"sequences, {rep.recipe}; links: {rep.links or 'none (communication not timed)'}")
    print(f"step time, a model: compute = {rep.seconds_per_sequence * 1e3:.1f} ms per sequence (this machine, one "
          "thread, measured) x each rank's share x ranks per core, with 1F1B's bubble; comm = the bytes on each "
          "paced axis over its link's bandwidth, exposed whole")
    print(f"{len(rep.ranked)} shapes zeroedu run builds; not built: "
          + (", ".join(f"{k} ({v})" for k, v in sorted(rep.refused.items())) or "none"))
    print("states, activ.: the rank holding the most; dp/tp/cp/pp MB: the most a rank sends per step on that axis")
    print(table(SUITE_HEAD, [_suite_row(i + 1, p) for i, p in enumerate(rep.ranked[:args.top])]))
    if rep.ranked:
        best = rep.ranked[0]
        print(f"run #1: zeroedu run --strategy {best.config.strategy} --world-size {best.config.world_size} "
              f"--model {rep.model} --global-batch {rep.global_batch} --recipe {rep.recipe}"
              + "".join(f" --{flag} {v}" for flag, v in (("micro-batches", best.config.micro_batches),
                                                         ("tp", best.config.tp), ("pp", best.config.pp),
                                                         ("cp", best.config.cp)) if v != 1)
              + (" --sequence-parallel" if best.config.sequence_parallel else "")
              + (f" --link {args.link}" if args.link else ""))
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("plan", help="size a model over dp x tp x pp x cp, a ZeRO level, b and recompute")
    p.add_argument("--model", default="llama-2-70b",
                   help=f"a preset ({', '.join(planner.MODELS)}; default llama-2-70b), a JSON shape or a file holding "
                        "one: layers, hidden, heads, ffn, vocab, seq [, kv_heads, gated, biases, tied, positions]")
    p.add_argument("--gpu", choices=list(planner.GPUS), default=None,
                   help="GPU preset: its HBM, line rates and peaks (default h100-sxm; gpt-small and gpt-tiny "
                        "without it are planned on this machine's local ranks)")
    p.add_argument("--gpus", type=positive_int, default=256, help="GPUs in the job (default 256)")
    p.add_argument("--per-node", type=positive_int, default=None, help="GPUs per NVLink node (default: the preset's 8)")
    p.add_argument("--hbm", type=positive_float, default=None, help="GB of HBM per GPU (default: the preset's)")
    p.add_argument("--nvlink", type=positive_float, default=None,
                   help="NVLink line rate, GB/s per GPU per direction (default: the preset's)")
    p.add_argument("--nic", type=positive_float, default=None,
                   help="NIC line rate, GB/s per GPU across nodes (default: the preset's)")
    p.add_argument("--tflops", type=positive_float, default=None, help="dense BF16 peak (default: the preset's)")
    p.add_argument("--efficiency", type=positive_float, default=None,
                   help="share of peak the matrix multiplications reach (default: the preset's, calibrated on "
                        "that GPU's published runs: A100 0.575, H100 and H200 0.5)")
    p.add_argument("--global-batch", type=positive_int, default=None,
                   help="sequences per step (default 1024; on local ranks 2 per rank)")
    p.add_argument("--recipe", default="mixed-bf16", help="local ranks: the run's precision recipe (default mixed-bf16)")
    p.add_argument("--link", default=None,
                   help="local ranks: emulated links (a preset, e.g. domain): only shapes whose axes they pace")
    p.add_argument("--micro-batch", type=positive_int, nargs="+", default=[1, 2, 4], metavar="B",
                   help="micro-batch sizes to rank (default 1 2 4)")
    p.add_argument("--interleave", type=positive_int, nargs="+", default=[1, 2, 4], metavar="V",
                   help="interleaved 1F1B: model chunks per pipeline rank to rank (default 1 2 4; 1 is plain 1F1B)")
    p.add_argument("--ep", type=positive_int, nargs="+", default=[1, 2, 4, 8], metavar="EP",
                   help="a mixture of experts: expert-parallel sizes to rank (default 1 2 4 8)")
    p.add_argument("--recompute", choices=list(planner.RECOMPUTE), nargs="+", default=None,
                   help="recompute modes to rank (default all; --check takes the first, default selective)")
    p.add_argument("--offload", action="store_true",
                   help="also rank plans with the optimizer's partition on the host (ZeRO-1..3 + ZeRO-Offload)")
    p.add_argument("--fp8", action="store_true",
                   help="train the linear layers in FP8 (their FLOPs at the FP8 peak, saved inputs and ZeRO-3 gathers 1 byte)")
    p.add_argument("--fp8-tflops", type=positive_float, default=None, help="dense FP8 peak (default: the preset's)")
    p.add_argument("--pcie", type=positive_float, default=None,
                   help="PCIe line rate, GB/s per GPU to its host per direction (default: the preset's)")
    p.add_argument("--host-memory", type=positive_float, default=50,
                   help="GB/s of host memory per GPU for the CPU's Adam step (default 50, an assumption)")
    p.add_argument("--top", type=positive_int, default=10, help="plans to print (default 10)")
    p.add_argument("--check", default=None, metavar="DP,TP,PP,CP,ZERO[,B[,V[,EP]]]",
                   help="one plan (b: micro-batch size, v: interleaved chunks, ep: expert parallel): its figures, or why not")
    p.add_argument("--design", default=None, metavar="ANSWER",
                   help="grade an answer to the design exercise (70B on 256 GPUs, global batch 256), e.g. 'dp 8, tp 8, pp 4, ZeRO-1'")
    p.set_defaults(func=cmd_plan)
