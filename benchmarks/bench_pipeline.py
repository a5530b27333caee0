"""Pipeline parallelism on real ranks: equal to one process and to torch's pipeline, the bubble on
each stage's timeline beside (p-1)/(m+p-1), and data parallelism per stage on the dp axis.

Three tables, each from real runs of `zeroedu run --pp` (`zeroedu.train.run` with `pp`):

1. **Equality** (gpt-small, 4 layers): p = 2 and 4 stages, GPipe and 1F1B, m = 1, 2, 4, 8
   micro-batches, 3 Adam steps. Per configuration: the losses beside one process's (relative, the
   largest over the steps), the parameters' largest relative difference after the steps, every
   stage's bytes on the pp axis and its peak activations beside the closed forms (exact), and one
   step's gradients beside torch.distributed.pipelining's (`ScheduleGPipe` / `Schedule1F1B`) and
   one process's.
2. **The bubble** (the same shapes): each stage's idle fraction of the last step, read from its
   timeline (the begin and end marks of every forward and backward, `reports.PipelineWork`), on an
   emulated device whose forward on one micro-batch takes `--forward-ms` and backward
   `--backward-ms` on every stage (`strategies.pipeline.EmulatedCompute`; the real compute runs
   inside that time). Four ranks on two cores cannot compute at full speed at once, so without
   the emulation the measurement would time the cores' sharing, not the schedule. What the
   closed form leaves out is the hand-off between stages (a send and a receive, about 1 ms here),
   on the critical path about 2(m + p - 1) times: the measured bubble sits slightly above it.
3. **ZeRO with a pipeline** (gpt-small, dp = 2 x pp = 2, 1F1B): bytes each rank sends on the dp
   axis per step, by collective, for ZeRO-1, ZeRO-2, FSDP1 and FSDP2 at m = 1, 2, 4, measured
   (the ledger's records) beside `theory.exact_comm` for the stage with m micro-batches.

Written to benchmarks/results/pipeline.json (`zeroedu.notebook.time_lessons.pipeline_results`
reads it for notebook 14).

    .venv/bin/python benchmarks/bench_pipeline.py [--quick] [--forward-ms 250] [--backward-ms 500]
"""
from __future__ import annotations

import argparse
import time

import common
import torch

from zeroedu.kinds import DP_SHARD, PP
from zeroedu.models import get_model
from zeroedu.reports import measured_bubble
from zeroedu.runtime import cluster
from zeroedu.theory.pipeline import bubble_fraction
from zeroedu.train import RunConfig, run
from zeroedu.train.reference import parameter_error

DP_STRATEGIES = ("zero1", "zero2", "fsdp1", "fsdp2")


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def torch_gradients(model, p: int, kind: str, m: int, batch: int) -> tuple[float, float]:
    """One step's gradients: zeroedu's against torch's pipeline and against one process's (the
    largest per-tensor relative difference of each)."""
    ranks = cluster.run("zeroedu.references.torch_pipeline:torch_pipeline_job", p, {
        "model": model.as_dict(), "schedule": kind, "microbatches": m, "global_batch": batch})
    gpt = model.build()
    x, y = model.batch(0, batch)
    gpt.loss(gpt(x), y).backward()
    one = {n: q.grad for n, q in gpt.named_parameters()}
    vs_torch = vs_one = 0.0
    for r in ranks:
        for n, g in r["zeroedu"].items():
            scale = one[n].norm().clamp_min(1e-12)
            vs_torch = max(vs_torch, ((g - r["torch"][n]).norm() / scale).item())
            vs_one = max(vs_one, ((g - one[n]).norm() / scale).item())
    return vs_torch, vs_one


def pipeline_run(model, p: int, m: int, kind: str, steps: int, batch: int, dp: int = 1, strategy: str = "ddp",
                 emulate: tuple[float, float] | None = None):
    """One run on the spine: `p` stages x `dp` ranks each, fp32, beside one process."""
    return run(RunConfig(strategy, p * dp, pp=p, micro_batches=m, schedule=kind, model=model, global_batch=batch,
                         steps=steps, recipe="fp32", emulate=emulate, return_params=True))


def param_rel(model, rep) -> float:
    names = [n for n, _ in model.build().named_parameters()]
    return parameter_error(dict(zip(names, rep.params)), dict(zip(names, rep.reference_params)), model.d_model)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--forward-ms", type=float, default=250.0)
    ap.add_argument("--backward-ms", type=float, default=500.0)
    ap.add_argument("--stages", type=_ints, default=[2, 4], help="pipeline sizes p (default 2,4)")
    ap.add_argument("--micro", type=_ints, default=[1, 2, 4, 8], help="micro-batches m (default 1,2,4,8)")
    ap.add_argument("--dp-micro", type=_ints, default=[1, 2, 4], help="m for the ZeRO table (default 1,2,4)")
    ap.add_argument("--quick", action="store_true", help="m = 1 and 4 only, 2 steps, dp table at m = 1, 2")
    args = ap.parse_args(argv)
    model = get_model(args.model)
    batch = model.default_global_batch
    micro = [m for m in args.micro if not args.quick or m in (1, 4)]
    shapes = [(p, kind, m) for p in args.stages for kind in ("gpipe", "1f1b") for m in micro]
    steps = 2 if args.quick else 3
    compute = (args.forward_ms / 1e3, args.backward_ms / 1e3)
    t_all = time.monotonic()

    print(f"== equality: {model.name}, {steps} Adam steps, global batch {batch}")
    print(f"{'p':>2} {'schedule':8s} {'m':>2}  {'loss rel':>8} {'params rel':>10} {'grad vs torch':>13} "
          f"{'grad vs 1 proc':>14}  pp bytes & peak activations == closed form")
    equality = []
    for p, kind, m in shapes:
        rep = pipeline_run(model, p, m, kind, steps, batch)
        loss_rel = max(abs(a - b) / abs(b) for a, b in zip(rep.losses, rep.reference_losses))
        err = param_rel(model, rep)
        # torch's Schedule1F1B refuses m < p (torch/distributed/pipelining/schedules.py, Schedule1F1B.__init__)
        vs_torch, vs_one = (None, None) if kind == "1f1b" and m < p else torch_gradients(model, p, kind, m, batch)
        exact = rep.match.all()
        equality.append({"p": p, "schedule": kind, "m": m, "loss_rel": loss_rel, "param_rel": err,
                         "grad_vs_torch": vs_torch, "grad_vs_one_process": vs_one, "exact": exact,
                         "pp_sent": [sum(rk.measured.comm_by_axis[PP].values()) for rk in rep.ranks],
                         "peak_activations": [rk.measured.activations for rk in rep.ranks]})
        torch_cols = (f"{vs_torch:13.1e} {vs_one:14.1e}" if vs_torch is not None
                      else f"{'(m < p: torch':>13} {'refuses 1F1B)':>14}")
        print(f"{p:>2} {kind:8s} {m:>2}  {loss_rel:8.1e} {err:10.1e} {torch_cols}  {'yes' if exact else 'NO'}")

    print(f"\n== the bubble: an emulated device, forward {args.forward_ms:g} ms, backward {args.backward_ms:g} ms "
          "per micro-batch per stage; idle fraction of the last step per stage")
    print(f"{'p':>2} {'schedule':8s} {'m':>2}  {'closed form':>11}  {'measured (per stage)':28s} {'worst':>6}")
    bubbles = []
    for p, kind, m in shapes:
        rep = pipeline_run(model, p, m, kind, 2, batch, emulate=compute)
        measured = measured_bubble([rk.pipeline for rk in rep.ranks])
        bubble = float(bubble_fraction(p, m))
        worst = max(abs(b / bubble - 1) for b in measured)
        bubbles.append({"p": p, "schedule": kind, "m": m, "predicted": bubble, "measured": measured,
                        "compute": list(compute)})
        print(f"{p:>2} {kind:8s} {m:>2}  {bubble:11.1%}  {'  '.join(f'{b:.1%}' for b in measured):28s} "
              f"{worst:+6.1%}")

    ms = [m for m in args.dp_micro if not args.quick or m in (1, 2)]
    print(f"\n== ZeRO with a pipeline: dp = 2 x pp = 2, 1F1B, bytes rank 0 (stage 0) sends on dp per step")
    print(f"{'strategy':9s} {'m':>2}  {'all-gather B':>12} {'reduce-scatter B':>16}  == closed form")
    dp_rows = []
    for strategy in DP_STRATEGIES:
        for m in ms:
            rep = pipeline_run(model, 2, m, "1f1b", 2, batch, dp=2, strategy=strategy)
            r0 = rep.ranks[0]
            sent, predicted = r0.measured.comm_by_axis.get(DP_SHARD, {}), r0.predicted.comm_by_axis.get(DP_SHARD, {})
            exact = rep.match.all()
            dp_rows.append({"strategy": strategy, "m": m, "sent": sent, "predicted": predicted, "exact": exact})
            print(f"{strategy:9s} {m:>2}  {sent.get('all_gather', 0):12,.0f} "
                  f"{sent.get('reduce_scatter', 0):16,.0f}  {'yes' if exact else 'NO'}")

    path = common.write_results("pipeline", {
        "model": model.name, "global_batch": batch, "steps": steps, "torch": torch.__version__,
        "equality": equality, "bubble": bubbles, "dp": dp_rows, "seconds": round(time.monotonic() - t_all, 1)})
    print(f"\nwritten: {path} ({time.monotonic() - t_all:.0f} s)")
    return {"equality": equality, "bubble": bubbles, "dp": dp_rows}


if __name__ == "__main__":
    main()
