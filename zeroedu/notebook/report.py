"""Turn reports and closed forms into text: the measured-vs-predicted tables the CLI, `make tour`
and the notebooks print, and the cross-domain table of `zeroedu.theory.hybrid`."""
from __future__ import annotations

import math
from typing import Any

from ..kinds import Implementation, TimelineMode
from ..fmt import number as _fmt
from ..recipes import get_recipe
from ..reports import RunReport
from ..train.launch import rank_wire_ok

CATS = ("param", "grad", "optim", "total")


def match_rows(report: RunReport) -> list[tuple[int, str, Any, Any, bool]]:
    """(rank, quantity, predicted, measured, equal) for model states, activations, the ring
    model of every collective (the closed form vs the payloads the strategy really handed to
    comm) and the wire (the payload predicted vs the bytes the kernel counted, gloo's framing
    allowed for), every rank."""
    rows = []
    for r in report.ranks:
        pr, me = r.predicted.model_states(), r.measured.model_states()
        for k in CATS:
            rows.append((r.rank, k, pr[k], me[k], pr[k] == me[k]))
        pr, me = r.predicted, r.measured
        if pr.activations is not None:
            rows.append((r.rank, "activations", pr.activations, me.activations, pr.activations == me.activations))
        if report.tp > 1 or report.cp > 1 or report.pp > 1 or report.ep > 1:  # two axes, each its own link in a real cluster: per axis, per collective
            for a in sorted(set(pr.comm_by_axis) | set(me.comm_by_axis)):
                p, m = pr.comm_by_axis.get(a, {}), me.comm_by_axis.get(a, {})
                rows += [(r.rank, f"ring model: {a} {c}", p.get(c, 0), m.get(c, 0), p.get(c, 0) == m.get(c, 0))
                         for c in sorted(set(p) | set(m))]
        else:
            for c in sorted(set(pr.comm) | set(me.comm)):
                rows.append((r.rank, f"ring model: {c}", pr.comm.get(c, 0), me.comm.get(c, 0),
                             pr.comm.get(c, 0) == me.comm.get(c, 0)))
        ok = rank_wire_ok(r)
        if ok is not None:
            rows.append((r.rank, "on the wire (kernel)", pr.wire, r.wire.sent, ok))
    return rows


def rank_rows(report: RunReport) -> list[list[str]]:
    """`match_rows` as text cells (measured first), each rank followed by its peak."""
    rows, compared = [], match_rows(report)
    for r in report.ranks:
        rows += [[str(rank), what, _fmt(meas), _fmt(pred), "yes" if equal else "NO"]
                 for rank, what, pred, meas, equal in compared if rank == r.rank]
        rows.append([str(r.rank), "peak", _fmt(r.peak), "", f"at '{r.peak_label}'"])
    return rows


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.rjust(w) if i >= 2 else c.ljust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def max_rel_diff(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) / max(abs(y), 1e-30) for x, y in zip(a, b)), default=0.0)


def rel_diff_text(x: float, floor: float) -> str:
    """A relative difference as a lesson reads it: ``"< 1e-06"`` below `floor`, else two digits.

    Below the recipe's rounding level the digits of a difference come from the CPU's summation
    order (they change from one processor to another), not from the algorithm: what the lesson
    can state, and a stored output can keep, is the bound."""
    return f"< {floor:.0e}" if x < floor else f"{x:.1e}"


def _curve(xs: list[float], most: int = 10) -> str:
    """Every loss of a short run; first, ~8 evenly spaced and last of a long one."""
    if len(xs) <= most:
        return "  ".join(f"{x:.6f}" for x in xs)
    idx = sorted({round(i * (len(xs) - 1) / (most - 1)) for i in range(most)})
    return "  ".join(f"[{i}] {xs[i]:.4f}" for i in idx)


def routing_lines(report: RunReport) -> list[str]:
    """Expert parallelism: what each rank's routers did in the last step (their own counts), the
    figures the all-to-alls' closed form reads."""
    rows = []
    for r in report.ranks:
        g = r.routing
        if g is None:
            continue
        sent = sum(n for layer in g.sent for micro in layer for n in micro)
        received = sum(n for layer in g.received for micro in layer for n in micro)
        rows.append([str(r.rank), f"{g.held[0]}-{g.held[-1]}", _fmt(sent), _fmt(received), _fmt(sum(g.dropped))])
    if not rows:
        return []
    return ["routing in the last step (the routers' own counts, over the layers): rows each rank sent to the "
            "experts, rows its experts received, assignments dropped over capacity",
            table(rows, ["rank", "experts", "rows sent", "rows received", "dropped"])]


def pipeline_lines(report: RunReport) -> list[str]:
    """Pipeline parallelism: each stage's blocks and the most micro-batches it held at once, read
    from its marks, beside the schedule's; with an emulated device, each stage's idle share of the
    last step beside (p-1)/(m+p-1) (real compute on two cores is uneven and shares the cores)."""
    from ..reports import measured_bubble

    stages = [r for r in report.ranks if r.pipeline is not None]
    if not stages:
        return []
    first = {}  # the first replica of each stage
    for r in stages:
        first.setdefault(r.pipeline.stage, r.pipeline)
    idle = measured_bubble([first[s] for s in sorted(first)])
    rows = [[str(r.rank), str(w.stage), f"{w.layers[0]}-{w.layers[1] - 1}", str(w.in_flight), str(w.predicted_in_flight),
             "yes" if w.in_flight == w.predicted_in_flight else "NO", f"{idle[w.stage]:.1%}"]
            for r in stages for w in [r.pipeline]]
    bubble = (report.pp - 1) / (report.micro_batches + report.pp - 1)
    return [f"pipeline, last step ({report.schedule}, {report.micro_batches} micro-batches; idle: the stage's share of "
            f"the step spent waiting, (p-1)/(m+p-1) = {bubble:.1%} with equal stages"
            + ("" if report.emulate else "; real compute, so not the formula's") + ")",
            table(rows, ["rank", "stage", "blocks", "in flight", "predicted", "match", "idle"])]


def ring_lines(report: RunReport) -> list[str]:
    """Context parallelism: the positions each rank holds and the score elements its ring computed
    (counted from the tensors multiplied) beside `theory.context.work_elements`."""
    rows = [[str(r.rank), ",".join(f"{a}-{b - 1}" for a, b in r.ring.positions), _fmt(r.ring.score_elements),
             _fmt(r.ring.predicted_score_elements), "yes" if r.ring.score_elements == r.ring.predicted_score_elements
             else "NO"] for r in report.ranks if r.ring is not None]
    if not rows:
        return []
    return ["ring attention's work over the run (score elements its forwards computed, all layers; a block on the "
            "diagonal computed whole)", table(rows, ["rank", "positions", "score elements", "predicted", "match"])]


def summary(report: RunReport) -> str:
    head = (f"strategy {report.strategy}  world size {report.world_size} "
            f"(N = {report.n}, M = {report.m})  recipe {report.recipe}  "
            f"model {report.model} (Ψ = {_fmt(report.psi)})  steps {report.steps}")
    if report.tp > 1:
        head = head.replace(f"(N = {report.n}, M = {report.m})",
                            f"(dp N = {report.n} x tp {report.tp}{', sequence parallel' if report.sequence_parallel else ''})")
    if report.pp > 1:
        head = head.replace(f"(N = {report.n}, M = {report.m})",
                            f"(pp {report.pp} x dp N = {report.n}, {report.schedule})")
    if report.cp > 1:
        head = head.replace(f"(N = {report.n}, M = {report.m})",
                            f"(N = {report.n}: dp {report.n // report.cp} x cp {report.cp}"
                            f"{', zig-zag' if report.zigzag else ''})")
    if report.ep > 1:
        axes = f"(N = {report.n}: dp {report.n // report.ep} x ep {report.ep}; the experts over dp {report.n // report.ep}"
        head = head.replace(f"(N = {report.n}, M = {report.m})", axes + ")").replace(
            f"(dp N = {report.n} x tp {report.tp})", f"{axes}; x tp {report.tp})")
    extras = [f"{k.replace('_', ' ')} {v}" for k, v in (("micro_batches", report.micro_batches),
                                                         ("recompute", report.recompute),
                                                         ("clip_grad_norm", report.clip_grad_norm))
              if v not in (None, 1, "none")]
    if extras:
        head += "  " + "  ".join(extras)
    if report.matmul16 is not None:  # how this CPU multiplied the recipe's 16-bit matrices (runtime.matmul16)
        head += f"  {get_recipe(report.recipe).param} matmul: {report.matmul16}"
    out = [head, "bytes per rank: model states at the optimizer step, activations at the forward/backward "
                 "boundary of one micro-batch, sent per optimizer step; measured vs zeroedu.theory (exact mode)",
           table(rank_rows(report), ["rank", "what", "measured", "predicted", "match"])]
    out += routing_lines(report) + ring_lines(report) + pipeline_lines(report)
    out += [f"losses            {_curve(report.losses)}",
            f"reference losses  {_curve(report.reference_losses)}",
            f"max relative loss difference vs single process: {max_rel_diff(report.losses, report.reference_losses):.2e}"]
    out += wire_lines(report)
    if report.rank0.overlap is not None:
        out.append("overlap (comm hidden behind backward): "
                   + "  ".join(f"rank {r.rank} {r.overlap:.0%}" for r in report.ranks if r.overlap is not None))
    out += time_lines(report)
    out.append(f"predicted vs measured — match: {all_match(report)}")
    return "\n".join(out)


def time_lines(report: RunReport) -> list[str]:
    """Step time per rank, measured on its timeline: the median over the steps after the first."""
    meds = [(r.rank, r.time.median()) for r in report.ranks]
    if not all(m is not None for _, m in meds):
        return []
    preds = {r.rank: r.time.predicted_median() for r in report.ranks}
    axes = sorted({a for _, m in meds for a in m.comm})
    rows = []
    for rank, m in meds:
        rows.append([str(rank), "measured" if preds[rank] else "", f"{1e3 * m.seconds:.1f}", f"{1e3 * m.compute:.1f}",
                     f"{1e3 * m.exposed:.1f}", *[f"{1e3 * m.comm.get(a, 0.0):.1f}" for a in axes],
                     f"{1e3 * m.hidden:.1f}"])
        if (p := preds[rank]) is not None:
            rows.append(["", f"predicted ({p.seconds / m.seconds:.2f}x)", f"{1e3 * p.seconds:.1f}",
                         f"{1e3 * p.compute:.1f}", f"{1e3 * p.exposed:.1f}",
                         *[f"{1e3 * p.comm.get(a, 0.0):.1f}" for a in axes], f"{1e3 * p.hidden:.1f}"])
    k = report.steps - 1 if report.steps > 1 else 1
    link = "no emulated link" if report.links is None else f"links {_links_text(report.links)}"
    head = [f"time per step, ms (median of {k} step{'s' if k > 1 else ''}{' after the first' if report.steps > 1 else ''}; "
            f"{link}): exposed = waited for communication, compute = the rest of the step, "
            "hidden = communication in flight while the rank computed"]
    if any(preds.values()):
        head.append("predicted: a calibration run's schedule (the same run on links that cost nothing) replayed "
                    "on the links, each collective its ring steps' alpha + bytes/beta or what it took the "
                    "machine, whichever is longer (zeroedu.theory.schedule)")
    else:
        rows = [[r[0], *r[2:]] for r in rows]
    out = head + [table(rows, ["rank", *(["time"] if any(preds.values()) else []), "step", "compute", "exposed",
                               *[f"comm {a}" for a in axes], "hidden"])]
    effs = [(r.rank, r.time.efficiency()) for r in report.ranks]
    if all(e is not None for _, e in effs):
        out.append("overlap efficiency (the best step any overlap reaches on these links, max(compute + the "
                   "communication nothing computes beside, head + busiest link + tail), over the measured step): "
                   + "  ".join(f"rank {k} {e:.0%}" for k, e in effs))
    return out


def _links_text(links: dict) -> str:
    if links.get("preset"):
        return links["preset"]
    return " ".join(f"{a}={x['beta'] / 1e6:g}MB/s,{x['alpha'] * 1e6:g}us"
                    for a in ("dp_shard", "dp_outer") if (x := links.get(a)) is not None)


def wire_lines(report: RunReport) -> list[str]:
    """Ring model vs the wire, per rank: what the closed forms say each collective sends, and
    what the kernel counted on the rank's sockets (per collective where it ran alone)."""
    r0 = report.rank0
    w = r0.wire
    if w.sent is None:
        return [f"on the wire: not measured ({w.reason or 'no meter'})"]
    impl = report.collectives
    rows = []
    for r in report.ranks:
        wr, ring = r.wire, r.measured.comm
        for op in sorted(set(ring) | set(wr.by_collective)):
            got = wr.by_collective.get(op)
            rows.append([str(r.rank), op, _fmt(ring.get(op, 0)), "—" if got is None else _fmt(got)])
        rows.append([str(r.rank), "total", _fmt(sum(ring.values())), _fmt(wr.sent)])
    dash = ("not read per collective with a minimal record" if report.timeline_mode == TimelineMode.MINIMAL
            else "overlapped with other collectives")
    out = [f"bytes sent per step: ring model vs the wire (collectives: {impl}; kernel byte counters; "
           f"'—': {dash}, in the total only)",
           table(rows, ["rank", "collective", "ring model", "wire"])]
    exp = r0.predicted.wire
    out.append(f"rank 0: wire {_fmt(w.sent)} B = expected {_fmt(exp)} B of payload + gloo framing "
               f"{w.messages} messages x 144 B ({_fmt(w.sent - exp)} B over the payload, "
               f"{100 * (w.sent / exp - 1):.2f} %)" if exp else f"rank 0: wire {_fmt(w.sent)} B")
    if report.tp > 1 and w.by_axis:  # each axis's sockets, counted apart
        out.append("rank 0 per axis, ring model -> wire: " + ", ".join(
            f"{a} {_fmt(sum(r0.measured.comm_by_axis.get(a, {}).values()))} -> {_fmt(w.by_axis.get(a, 0))} B"
            for a in sorted(w.by_axis)))
    if impl == Implementation.BACKEND and any("reduce_scatter" in r.measured.comm for r in report.ranks):
        out.append("note: gloo's reduce_scatter_single is an all-reduce with one chunk kept, so it sends "
                   "2(g-1)/g of its input, twice the ring model; --collectives ring sends the ring bound")
    return out


def all_match(report: RunReport) -> bool:
    """Every figure that has a prediction equals its measurement (activations of a model
    without a closed form are measured only)."""
    return report.match.all()


def tour_row(report: RunReport) -> list[str]:
    r0 = report.rank0
    me, pr = r0.measured, r0.predicted
    return [report.strategy, report.recipe, _fmt(me.total), _fmt(pr.total),
            _fmt(me.comm_total), _fmt(pr.comm_total), _fmt(r0.peak),
            f"{max_rel_diff(report.losses, report.reference_losses):.1e}",
            str(all_match(report))]


TOUR_HEADER = ["strategy", "recipe", "bytes/rank", "predicted", "sent/step", "predicted",
               "peak", "loss vs ref", "match"]


def plain(report: RunReport, timeline: bool = False) -> dict[str, Any]:
    """The JSON-able part of a report (`RunReport.plain`: tensors dropped, timelines only on
    request), strict JSON: a float that is not finite (NaN has no JSON spelling) becomes null.
    A run whose loss is not finite never gets here: it stops (`train.runner.NonFiniteLoss`)."""
    return _finite(report.plain(timeline) if isinstance(report, RunReport) else report)


def _finite(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def format_cross_domain_table(rows: list[dict], unit: float = 1e9, striped: list[dict] | None = None) -> str:
    """Plain-text table (GB and ms) for the CLI and notebooks. `rows` from
    `theory.hybrid.cross_domain_table`; `striped`, the same table with `flat_ring="striped"`,
    adds its times as a second column, so both readings of the time model stand side by side."""
    if striped is not None and [r["layout"] for r in striped] != [r["layout"] for r in rows]:
        raise ValueError("striped must list the same layouts as rows")
    head = f"{'layout':<11} {'ranks':>5} {'GB/rank':>9} {'sent GB':>9} {'cross GB':>9} {'comm ms':>9}"
    if striped is not None:
        head = head.replace("  comm ms", "  1-ring ms") + f" {'striped ms':>10}"
    lines = [head]
    for i, r in enumerate(rows):
        line = (f"{r['layout']:<11} {r['world_size']:>5} {float(r['bytes_per_rank']) / unit:>9.3f} "
                f"{float(r['sent_per_rank']) / unit:>9.3f} "
                f"{float(r['cross_domain_per_rank']) / unit:>9.3f} {1e3 * r['comm_seconds']:>9.1f}")
        if striped is not None:
            line += f" {1e3 * striped[i]['comm_seconds']:>10.1f}"
        lines.append(line)
    return "\n".join(lines)
