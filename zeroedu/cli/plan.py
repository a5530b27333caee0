"""``zeroedu plan``: size a job over dp × tp × pp × cp with a ZeRO level (`theory.planner`).

    zeroedu plan                         # Llama-2-70B on 256 H100s, global batch 1024 x 4096 tokens
    zeroedu plan --gpus 512 --top 10
    zeroedu plan --check 8,8,4,1,1       # one plan (dp,tp,pp,cp,zero): its memory and time, or why not
    zeroedu plan --design "dp 8, tp 8, pp 4, ZeRO-1"   # the design exercise: which conditions hold
    zeroedu plan --gpus 16 --global-batch 64 --offload  # also the plans with the optimizer on the host
    zeroedu plan --fp8                   # the linear layers in FP8: their FLOPs, saved inputs, ZeRO-3 gathers

Every plan that exists and fits in HBM, ranked by the stated time model (compute, the pipeline
bubble, each axis's exposed communication), with why each of the top three beats the next.
"""
from __future__ import annotations

from ..fmt import table
from ..theory import planner
from .args import positive_float, positive_int


def _row(i, e: planner.Estimate, offload: bool = False) -> list[str]:
    t = e.terms()
    zero = f"{e.plan.zero}{' + off' if e.plan.offload else ''}"
    row = [str(i), str(e.plan.dp), str(e.plan.tp), str(e.plan.pp), str(e.plan.cp), zero,
           str(e.microbatches), f"{e.states / 1e9:.1f}", f"{e.activations / 1e9:.1f}", f"{e.step:.2f}",
           f"{1e3 * t['bubble']:.0f}", f"{1e3 * t['tp']:.0f}", f"{1e3 * t['cp']:.0f}", f"{1e3 * t['dp']:.0f}"]
    return row + [f"{e.host / 1e9:.1f}", f"{1e3 * t['offload']:.0f}"] if offload else row


HEAD = ["#", "dp", "tp", "pp", "cp", "ZeRO", "m", "states GB", "activ. GB", "step s", "bubble ms", "tp ms",
        "cp ms", "dp ms"]
OFFLOAD_HEAD = ["host GB", "offload ms"]


def cmd_plan(args) -> int:
    model = planner.LLAMA2_70B
    if args.design is not None:
        g = planner.grade_design(args.design)
        print(f"design exercise: Llama-2-70B on {planner.DESIGN_GPUS} GPUs (8 per node, 80 GB), global batch "
              f"{planner.DESIGN_BATCH} sequences" + (f"; your plan: {g.plan}" if g.plan else ""))
        for c in g.conditions:
            print(f"  {'ok ' if c.held else 'NO '} {c.name}: {c.detail}")
        print("a good plan" if g.ok else "not yet: " + ", ".join(c.name for c in g.broken()))
        return 0 if g.ok else 1
    cluster = planner.Cluster(args.gpus, args.per_node, args.hbm * 1e9, args.nvlink * 1e9, args.nic * 1e9,
                              args.tflops * 1e12, args.efficiency, fp8_flops=args.fp8_tflops * 1e12,
                              pcie=args.pcie * 1e9, host_memory=args.host_memory * 1e9)
    head = HEAD + (OFFLOAD_HEAD if args.offload else [])
    if args.check:
        try:
            d, t, p, c, z = (int(x) for x in args.check.split(","))
        except ValueError:
            raise ValueError(f"--check takes dp,tp,pp,cp,zero (e.g. 8,8,4,1,1), got {args.check!r}") from None
        pl = planner.Plan(d, t, p, c, z, args.offload, args.fp8)
        why = planner.refusal(model, cluster, pl, args.global_batch)
        if why:
            raise ValueError(f"{pl}: {why}")
        e = planner.estimate(model, cluster, pl, args.global_batch)
        print(table(head, [_row(1, e, args.offload)]))
        print(f"memory {e.memory / 1e9:.1f} GB of {cluster.hbm / 1e9:.0f} GB: "
              + ("fits" if e.fits else "does not fit"))
        return 0 if e.fits else 1
    rep = planner.plan(model, cluster, args.global_batch, offload=(False, True) if args.offload else (False,),
                       fp8=(args.fp8,))
    print(f"{model.name}: {model.params():,} parameters, {model.layers} layers, hidden {model.hidden}, "
          f"{model.heads} heads ({model.kv_heads} KV), FFN {model.ffn}, sequence {model.seq}; global batch "
          f"{args.global_batch} sequences")
    print(f"{cluster.gpus} GPUs, {cluster.per_node} per node, {cluster.hbm / 1e9:.0f} GB HBM, NVLink "
          f"{cluster.nvlink / 1e9:.0f} GB/s, NIC {cluster.nic / 1e9:.0f} GB/s, {cluster.peak_flops / 1e12:.0f} "
          f"TFLOP/s at {cluster.efficiency:.0%} (an assumption)"
          + (f"; FP8 linear layers at {cluster.fp8_flops / 1e12:.0f} TFLOP/s" if args.fp8 else "")
          + (f"; offload over PCIe {cluster.pcie / 1e9:.0f} GB/s, the CPU's Adam at {cluster.host_memory / 1e9:.0f} "
             "GB/s of host memory (an assumption)" if args.offload else ""))
    print(f"{len(rep.ranked)} plans fit, {rep.too_big} exist but do not fit; refused: "
          + ", ".join(f"{k} ({v})" for k, v in sorted(rep.refused.items())))
    if not rep.ranked:
        print("no plan fits")
        return 1
    print(table(head, [_row(i + 1, e, args.offload) for i, e in enumerate(rep.ranked[:args.top])]))
    for i in range(min(3, len(rep.ranked) - 1)):
        print(f"#{i + 1} {rep.ranked[i].plan}: {planner.why_better(rep.ranked[i], rep.ranked[i + 1])}")
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("plan", help="size Llama-2-70B over dp x tp x pp x cp and a ZeRO level")
    p.add_argument("--gpus", type=positive_int, default=256, help="GPUs in the job (default 256)")
    p.add_argument("--per-node", type=positive_int, default=8, help="GPUs per NVLink node (default 8)")
    p.add_argument("--hbm", type=positive_float, default=80, help="GB of HBM per GPU (default 80, H100 SXM)")
    p.add_argument("--nvlink", type=positive_float, default=450, help="GB/s per GPU per direction (default 450)")
    p.add_argument("--nic", type=positive_float, default=50, help="GB/s per GPU across nodes (default 50: 400 Gb/s)")
    p.add_argument("--tflops", type=positive_float, default=989, help="dense BF16 peak (default 989, H100 SXM)")
    p.add_argument("--efficiency", type=positive_float, default=0.5, help="share of peak reached (default 0.5)")
    p.add_argument("--global-batch", type=positive_int, default=1024, help="sequences per step (default 1024)")
    p.add_argument("--offload", action="store_true",
                   help="also rank plans with the optimizer's partition on the host (ZeRO-1..3 + ZeRO-Offload)")
    p.add_argument("--fp8", action="store_true",
                   help="train the linear layers in FP8 (their FLOPs at the FP8 peak, saved inputs and ZeRO-3 gathers 1 byte)")
    p.add_argument("--fp8-tflops", type=positive_float, default=1979, help="dense FP8 peak (default 1979, H100 SXM)")
    p.add_argument("--pcie", type=positive_float, default=63, help="GB/s per GPU to its host, per direction (default 63: PCIe 5.0 x16)")
    p.add_argument("--host-memory", type=positive_float, default=50,
                   help="GB/s of host memory per GPU for the CPU's Adam step (default 50, an assumption)")
    p.add_argument("--top", type=positive_int, default=10, help="plans to print (default 10)")
    p.add_argument("--check", default=None, metavar="DP,TP,PP,CP,ZERO", help="one plan: its figures, or why not")
    p.add_argument("--design", default=None, metavar="ANSWER",
                   help="grade an answer to the design exercise (70B on 256 GPUs, global batch 256), e.g. 'dp 8, tp 8, pp 4, ZeRO-1'")
    p.set_defaults(func=cmd_plan)
