"""Figures of one run's report (measured), with the prediction beside it."""
from __future__ import annotations

from typing import Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ...runtime import analysis
from .common import COLORS, STATE_CATS, TIMELINE_CATS, byte_scale, new_figure

def _rank(report: dict, rank: int) -> dict:
    ranks = report["ranks"]
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


def memory_bars(report: dict, rank: int = 0) -> Figure:
    """One run, one rank: model-state bytes by category, predicted (closed form) vs measured."""
    r = _rank(report, rank)
    keys = ["param", "grad", "optim", "total"]
    pred, meas = r["predicted"], r["measured"]
    div, unit = byte_scale([pred[k] for k in keys] + [meas[k] for k in keys])
    fig = new_figure(5.0, 3.0)
    ax = fig.add_subplot()
    _paired_bars(ax, keys, pred, meas, div)
    ax.set_ylabel(unit)
    ax.set_title(f"{report['strategy']} rank {rank}, N={report['n']}, {report['recipe']}: model states",
                 fontsize=9)
    return fig


def comm_bars(report: dict, rank: int = 0) -> Figure:
    """One run, one rank: bytes sent in the last step by collective, predicted vs measured."""
    r = _rank(report, rank)
    pred, meas = r["predicted"]["comm"], r["measured"]["comm"]
    keys = sorted(set(pred) | set(meas)) or ["(none)"]
    div, unit = byte_scale(list(pred.values()) + list(meas.values()))
    fig = new_figure(5.0, 3.0)
    ax = fig.add_subplot()
    _paired_bars(ax, keys, pred, meas, div)
    ax.set_ylabel(f"{unit} sent per step")
    ax.set_title(f"{report['strategy']} rank {rank}, N={report['n']}: communication", fontsize=9)
    return fig


def _events_series(events: list[dict], stacked: bool):
    ts = [e["t"] for e in events]
    if stacked:
        return ts, {c: [e["bytes"].get(c, 0) for e in events] for c in TIMELINE_CATS}
    return ts, [sum(e["bytes"].values()) for e in events]


def timeline_axes(ax, events_by_rank: dict[int, list[dict]], predicted_total: dict[int, float] | None,
                  title: str = "") -> None:
    """Draw total bytes held per rank over time on `ax` (shared by `memory_timeline` and the live
    run panel, which calls it with partial event lists while a run streams)."""
    allv = [sum(e["bytes"].values()) for evs in events_by_rank.values() for e in evs]
    allv += list((predicted_total or {}).values())
    div, unit = byte_scale(allv or [1])
    for r in sorted(events_by_rank):
        evs = events_by_rank[r]
        if not evs:
            continue
        ts, tot = _events_series(evs, stacked=False)
        line, = ax.step(ts, [v / div for v in tot], where="post", label=f"rank {r}", linewidth=1.2)
        if predicted_total and r in predicted_total:
            ax.axhline(predicted_total[r] / div, color=line.get_color(), linestyle="--", linewidth=0.9)
    if predicted_total:
        ax.plot([], [], color="black", linestyle="--", label="predicted model states")
    ax.set_xlabel("seconds since the rank started")
    ax.set_ylabel(f"{unit} held")
    ax.set_ylim(bottom=0)
    if title:
        ax.set_title(title, fontsize=9)
    if events_by_rank:
        ax.legend(fontsize=7, frameon=False, loc="lower right", ncol=2)


def memory_timeline(report: dict, ranks: Sequence[int] | None = None, stacked_rank: int | None = 0) -> Figure:
    """Bytes each rank holds at every ledger event, with the predicted model-state total as a
    dashed line; `stacked_rank` adds a panel that splits that rank's bytes by category (model
    states sit on the line; activations and gathered units rise above it and fall back)."""
    ranks = list(range(len(report["ranks"]))) if ranks is None else list(ranks)
    evs = {r: report["ranks"][r]["timeline"]["events"] for r in ranks}
    pred = {r: report["ranks"][r]["predicted"]["total"] for r in ranks}
    fig = new_figure(7.5, 3.0 if stacked_rank is None else 5.6)
    axes = fig.subplots(1 if stacked_rank is None else 2, 1, squeeze=False)[:, 0]
    timeline_axes(axes[0], evs, pred, f"{report['strategy']}, N={report['n']}, {report['recipe']}: "
                                      "memory per rank over time")
    if stacked_rank is not None:
        ax = axes[1]
        events = report["ranks"][stacked_rank]["timeline"]["events"]
        ts, series = _events_series(events, stacked=True)
        cats = [c for c in TIMELINE_CATS if any(series[c])]
        div, unit = byte_scale([sum(e["bytes"].values()) for e in events] or [1])
        ax.stackplot(ts, *[[v / div for v in series[c]] for c in cats], labels=cats,
                     colors=[COLORS[c] for c in cats], step="post")
        ax.axhline(report["ranks"][stacked_rank]["predicted"]["total"] / div, color="black",
                   linestyle="--", linewidth=1, label="predicted model states")
        ax.set_xlabel("seconds since the rank started")
        ax.set_ylabel(f"{unit} held")
        ax.set_title(f"rank {stacked_rank} by category", fontsize=9)
        ax.legend(fontsize=7, frameon=False, loc="upper left", ncol=5)
    return fig


def overlap_timeline(report: dict, rank: int = 0, step: int | None = None) -> Figure:
    """One step on one rank: the backward interval and each collective's [start, end] interval.

    Bars that sit inside the backward band are communication hidden behind compute (bucketed
    DDP, FSDP's reduce-scatter); bars after it are exposed time the step waits for. The share
    hidden is `zeroedu.runtime.analysis.overlap_fraction`."""
    r = _rank(report, rank)
    tl = r["timeline"]
    step = report["steps"] - 1 if step is None else step
    windows = analysis.backward_windows(tl, step)
    comm = [c for c in tl["comm"] if c["step"] == step]
    fig = new_figure(7.5, 1.4 + 0.22 * max(len(comm), 1))
    ax = fig.add_subplot()
    t0 = min([c["t_start"] for c in comm] + [b for b, _ in windows] + [float("inf")])
    t0 = 0.0 if t0 == float("inf") else t0
    ms = 1e3
    for b, e in windows:
        ax.axvspan((b - t0) * ms, (e - t0) * ms, color="#DDDDDD")
    for i, c in enumerate(comm):
        te = c["t_end"] if c["t_end"] is not None else c["t_start"]
        ax.broken_barh([((c["t_start"] - t0) * ms, max((te - c["t_start"]) * ms, 1e-3))], (i - 0.4, 0.8),
                       color=COLORS.get(c["op"], "#4C72B0"))
    ax.set_yticks(range(len(comm)), [c["tag"] for c in comm], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds")
    frac = analysis.overlap_fraction(tl, step)
    ax.set_title(f"{report['strategy']} rank {rank}, step {step}: collectives vs backward"
                 + (f" ({100 * frac:.0f}% of gradient-reduction time inside backward)" if frac is not None else ""),
                 fontsize=9)
    ops = sorted({c["op"] for c in comm})
    ax.legend(handles=[Patch(color="#DDDDDD", label="backward")] +
              [Patch(color=COLORS.get(o, "#4C72B0"), label=o) for o in ops], fontsize=7, frameon=False,
              loc="lower right")
    return fig




def loss_curves(report: dict) -> Figure:
    """Mean loss over ranks per step against the single-process reference (they coincide)."""
    fig = new_figure(5.0, 2.8)
    ax = fig.add_subplot()
    steps = range(len(report["losses"]))
    ax.plot(steps, report["reference_losses"], "o-", color="grey", label="single process (torch.optim.Adam)")
    ax.plot(steps, report["losses"], "x--", color="#C44E52", label=f"{report['strategy']} on N={report['n']}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=7, frameon=False)
    return fig
