"""Figures of one run's report, or of several side by side: measured bars with the prediction
beside them (model states, communication three ways, activations), loss against the
single-process reference, gradient accumulation's bytes. Timelines are in `timelines`.
"""
from __future__ import annotations

from typing import Sequence

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from .common import COLORS, RANK_COLORS, byte_scale, human_bytes, mesh, new_figure, outside_legend, rank_color
from ...kinds import MODEL_STATE as STATE_ORDER
from ...reports import RankReport, RunReport


def _rank(report: RunReport, rank: int) -> RankReport:
    ranks = report.ranks
    if not 0 <= rank < len(ranks):
        raise ValueError(f"rank must be in [0, {len(ranks)}), got {rank!r}")
    return ranks[rank]


def _paired_bars(ax, keys, pred, meas, div):
    xs = range(len(keys))
    ax.bar([x - 0.2 for x in xs], [pred.get(k, 0) / div for k in keys], 0.4, label="predicted",
           color="#BBBBBB", edgecolor="black", hatch="//")
    ax.bar([x + 0.2 for x in xs], [meas.get(k, 0) / div for k in keys], 0.4, label="measured",
           color=[COLORS.get(k, "#4C72B0") for k in keys])
    ax.set_xticks(list(xs), keys, fontsize=8)
    ax.legend(fontsize=7, frameon=False)


def memory_bars(report: RunReport, rank: int = 0) -> Figure:
    """One run, one rank: model-state bytes by category, predicted (closed form) vs measured."""
    r = _rank(report, rank)
    keys = ["param", "grad", "optim", "total"]
    pred, meas = r.predicted.model_states(), r.measured.model_states()
    div, unit = byte_scale([pred[k] for k in keys] + [meas[k] for k in keys])
    fig = new_figure(5.0, 3.0)
    ax = fig.add_subplot()
    _paired_bars(ax, keys, pred, meas, div)
    ax.set_ylabel(unit)
    ax.set_title(f"{report.strategy} rank {rank}, {mesh(report)}, {report.recipe}: model states",
                 fontsize=9)
    return fig


def comm_bars(report: RunReport, rank: int = 0) -> Figure:
    """One run, one rank: bytes sent in the last step by collective, three ways: the closed
    form (predicted), the ring model of the payloads the rank's collectives carried
    (``measured["comm"]``) and the kernel's byte counters of the rank's sockets
    (``wire["by_collective"]``, gloo's framing included). The wire bar is missing where nothing
    could be counted (NCCL) or where collectives of different kinds shared a window. With the
    backend's collectives on gloo, its reduce-scatter shows at all-reduce cost on the wire."""
    r = _rank(report, rank)
    pred, meas = r.predicted.comm, r.measured.comm
    wire = r.wire.by_collective
    keys = sorted(set(pred) | set(meas) | set(wire)) or ["(none)"]
    div, unit = byte_scale(list(pred.values()) + list(meas.values()) + list(wire.values()))
    fig = new_figure(5.6, 3.0)
    ax = fig.add_subplot()
    xs = range(len(keys))
    ax.bar([x - 0.27 for x in xs], [pred.get(k, 0) / div for k in keys], 0.27, label="closed form",
           color="#BBBBBB", edgecolor="black", hatch="//")
    ax.bar(list(xs), [meas.get(k, 0) / div for k in keys], 0.27, label="ring model",
           color=[COLORS.get(k, "#4C72B0") for k in keys])
    ax.bar([x + 0.27 for x in xs], [wire.get(k, 0) / div for k in keys], 0.27, label="on the wire (kernel)",
           color="#333333")
    ax.set_xticks(list(xs), keys, fontsize=8)
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_ylabel(f"{unit} sent per step")
    ax.set_title(f"{report.strategy} rank {rank}, {mesh(report)}: communication", fontsize=9)
    return fig


def loss_curves(report: RunReport) -> Figure:
    """Mean loss over ranks per step against the single-process reference (they coincide)."""
    fig = new_figure(5.0, 2.8)
    ax = fig.add_subplot()
    steps = range(len(report.losses))
    ax.plot(steps, report.reference_losses, "o-", color="grey", label="single process (torch.optim.Adam)")
    ax.plot(steps, report.losses, "x--", color="#C44E52", label=f"{report.strategy} on {mesh(report)}")
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
    ax.set_ylabel("loss")
    ax.legend(fontsize=7, frameon=False)
    return fig


def learning_curves(data: dict) -> Figure:
    """Long runs, one per strategy family (`benchmarks/bench_loss_curves.py`'s cached result):
    each family's loss against the single-process reference (left; the curves lie on it) and how
    far each step is from it, relative, on a log scale (right; 0, bitwise equal, drawn at the floor)."""
    fig = new_figure(9.0, 3.2)
    left, right = fig.subplots(1, 2, width_ratios=(1.15, 1.0))
    rows = data["rows"]
    steps = range(1, len(rows[0]["reference"]) + 1)
    left.plot(steps, rows[0]["reference"], color="black", lw=3.0, alpha=0.25, label="single process")
    floor = 1e-9
    markers = "osD^vP"
    every = max(1, len(steps) // 8)
    for i, r in enumerate(rows):
        mesh = f"N = {r['n']}" + (f", M = {r['m']}" if r["m"] > 1 else "")
        color = RANK_COLORS[i % len(RANK_COLORS)]
        label = f"{r['strategy']} ({mesh})"
        left.plot(steps, r["losses"], lw=0.9, color=color, marker=markers[i % len(markers)], ms=3.5,
                  markevery=(i * every // len(rows), every), label=label)
        rel = [max(abs(a - b) / abs(b), floor) for a, b in zip(r["losses"], r["reference"])]
        right.plot(steps, rel, lw=0.8, color=color, label=label)
    for ax in (left, right):
        ax.set_xlabel("optimizer step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_ylabel("training loss")
    left.set_title(f"{data['model']}, {data['recipe']}: every family learns, on the single-process curve",
                   fontsize=9)
    right.set_yscale("log")
    right.set_ylim(floor / 2, 1e-3)
    right.set_ylabel("|loss − single process| / loss")
    right.set_title("how far from single-process training (log)", fontsize=9)
    outside_legend(right)
    return fig


# ----------------------------------------------------------------------------- several runs
def wire_bytes(report: RunReport, rank: int = 0) -> int | None:
    """Bytes the kernel counted on this rank's sockets in the last optimizer step (None where
    the wire is not measured, e.g. NCCL)."""
    return _rank(report, rank).wire.sent


def accumulation_figure(reports: dict[str, dict[int, RunReport]], rank: int = 0) -> Figure:
    """Bytes one rank sends per optimizer step against the number of micro-batches K, one line
    per strategy: the wire (kernel counters, dots) over the ring model of the predicted
    payloads (line). `reports` = {strategy label: {K: report}}."""
    if not reports:
        raise ValueError("no reports to draw")
    fig = new_figure(7.8, 3.4)
    ax = fig.add_subplot()
    allv = []
    for runs in reports.values():
        for rep in runs.values():
            allv.append(sum(_rank(rep, rank).predicted.comm.values()))
            w = wire_bytes(rep, rank)
            allv += [w] if w is not None else []
    div, unit = byte_scale(allv or [1])
    ks_all = sorted({k for runs in reports.values() for k in runs})
    styles = ("-", "--", "-.", ":")
    markers = ("o", "s", "^", "D", "v", "P", "X", "*")
    for i, (name, runs) in enumerate(reports.items()):
        ks = sorted(runs)
        color, marker = rank_color(i), markers[i % len(markers)]
        # strategies that send the same bytes draw on top of each other: line styles and
        # marker shapes tell them apart
        pred = [sum(_rank(runs[k], rank).predicted.comm.values()) / div for k in ks]
        ax.plot(ks, pred, styles[i % len(styles)], color=color, linewidth=1.4, label=name,
                marker=marker, markerfacecolor="none", markersize=7)
        wires = [(k, wire_bytes(runs[k], rank)) for k in ks]
        wires = [(k, w / div) for k, w in wires if w is not None]
        if wires:
            ax.plot([k for k, _ in wires], [w for _, w in wires], marker, color=color, markersize=3.5,
                    linestyle="none")
    ax.set_xticks(ks_all)
    ax.set_xlabel("micro-batches per optimizer step K")
    ax.set_ylabel(f"{unit} sent per optimizer step (rank {rank})")
    ax.set_ylim(bottom=0)
    ax.set_title("gradient accumulation: what each strategy sends per optimizer step", fontsize=9)
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], color="black", linestyle="-", marker="o", markerfacecolor="none",
                       label="ring model (predicted)"),
                Line2D([], [], color="black", marker="o", markersize=3.5, linestyle="none",
                       label="wire (measured)")]
    outside_legend(ax, handles)
    return fig


def activation_bars(reports: Sequence[RunReport], rank: int = 0) -> Figure:
    """Activation bytes of one micro-batch for several runs (e.g. recompute none / selective /
    full): predicted (closed form) vs measured (what autograd saved, by the ledger)."""
    if not reports:
        raise ValueError("no reports to draw")
    names = [f"{rep.recompute}" if len({r.strategy for r in reports}) == 1
             else f"{rep.strategy} {rep.recompute}" for rep in reports]
    pred = [_rank(rep, rank).predicted.activations or 0 for rep in reports]
    meas = [_rank(rep, rank).measured.activations or 0 for rep in reports]
    div, unit = byte_scale(pred + meas)
    fig = new_figure(5.5, 3.0)
    ax = fig.add_subplot()
    xs = range(len(reports))
    ax.bar([x - 0.2 for x in xs], [p / div for p in pred], 0.4, label="predicted (closed form)",
           color="#BBBBBB", edgecolor="black", hatch="//")
    ax.bar([x + 0.2 for x in xs], [m / div for m in meas], 0.4, label="measured (saved tensors)",
           color=COLORS["activation"])
    ax.set_xticks(list(xs), names, fontsize=8)
    ax.set_ylabel(f"{unit} saved for backward")
    ax.set_title(f"{reports[0].strategy} rank {rank}: activations of one micro-batch", fontsize=9)
    outside_legend(ax)
    return fig


def update_decomposition(at_update: dict[str, int], temporaries: dict[str, int], title: str = "") -> Figure:
    """What one rank holds while its optimizer update runs, once per Adam implementation: the
    model states by category (measured at the ledger's "update" event) with each implementation's
    temporaries on top (`temporaries`: name -> bytes, e.g. zeroedu's scratch from the same event
    and torch's for-loop / foreach / fused measured by MemTracker on the same tensors)."""
    if not temporaries:
        raise ValueError("no implementations to draw")
    cats = [c for c in STATE_ORDER if at_update.get(c)]
    div, unit = byte_scale([sum(at_update.get(c, 0) for c in cats) + max(temporaries.values())])
    fig = new_figure(6.5, 3.0)
    ax = fig.add_subplot()
    names = list(temporaries)
    for x, name in enumerate(names):
        bottom = 0.0
        for c in cats:
            ax.bar(x, at_update[c] / div, 0.6, bottom=bottom, color=COLORS[c], label=c if x == 0 else None)
            bottom += at_update[c] / div
        ax.bar(x, temporaries[name] / div, 0.6, bottom=bottom, color=COLORS["optimizer_temp"], hatch="//",
               edgecolor="black", label="the update's temporaries" if x == 0 else None)
        ax.annotate(human_bytes(temporaries[name]), (x, bottom + temporaries[name] / div), ha="center",
                    va="bottom", fontsize=7)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel(f"{unit} held during the update")
    ax.set_title(title or "model states + what the optimizer step allocates", fontsize=9)
    outside_legend(ax)
    return fig
