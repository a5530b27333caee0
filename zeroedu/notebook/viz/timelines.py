"""Timelines of one run's report: memory per rank at every ledger event, and collectives against backward.

Memory timelines (`memory_timeline`, `timeline_axes`) read a rank's ledger events: every event
is (time, kind, unit, step, bytes by category), its kind a `zeroedu.kinds.EventKind`. Lifecycle
moments are recognised from the kind (`lifecycle_kind`): a unit's UNSHARD and RESHARD are drawn
as ▲ / ▼ ticks on the top edge (the unshard's unit number beside it), the optimizer step as a
dotted line, backward (BACKWARD_BEGIN / BACKWARD_END marks) as a grey band and activation re-runs
(RECOMPUTE marks) as small ticks inside it. Any other kind is drawn as a plain event, so
strategies can add events freely.
The x axis is either the rank's clock (``x="time"``) or the event index (``x="event"``): by
index every lifecycle step gets the same width, which makes FSDP's saw-tooth one tooth per unit
whatever the time each unit took. Legends sit outside the data, right of the panels.
"""
from __future__ import annotations

import bisect
from typing import Iterable, Sequence

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ...kinds import EventKind, MODEL_STATE, TimelineMode
from ...runtime import analysis
from .common import COLORS, TIMELINE_CATS, byte_scale, category_label, mesh, new_figure, outside_legend, rank_color
from .runs import _rank
from ...reports import Event, RankReport, RunReport

TIMELINE_X = ("time", "event")
TIMELINE_LAYOUTS = ("overlay", "panels")
# Colours for categories a newer ledger may add (the known ones are in COLORS).
_EXTRA_COLORS = ("#CCB974", "#A6A6A6", "#9EDAE5", "#F7B6D2")
BACKWARD_COLOR = "#EDEDED"
STEP_COLOR = "#555555"
RECOMPUTE_COLOR = "#8172B3"
# Lifecycle events drawn as ticks on the top edge: marker, colour, legend text.
TICKS = {"unshard": ("^", COLORS["gathered"], "unshard (unit #)"), "reshard": ("v", "#777777", "reshard"),
         "grad alloc": ("^", COLORS["grad"], "full grad allocated (unit #)"),
         "grad free": ("v", "#A0522D", "full grad freed")}
HEADROOM = 1.2  # the y axis goes this far above the data: the lifecycle ticks sit in the gap


# How the figures draw an event or mark, by its kind (kinds not here are plain events).
_FIGURE_KIND = {EventKind.UNSHARD: "unshard", EventKind.RESHARD: "reshard", EventKind.GRAD_ALLOC: "grad alloc",
                EventKind.GRAD_FREED: "grad free", EventKind.RECOMPUTE: "recompute",
                EventKind.FORWARD_END: "forward end", EventKind.BACKWARD_BEGIN: "backward begin",
                EventKind.BACKWARD_END: "backward end", EventKind.OPTIMIZER_STEP: "step"}


def lifecycle_kind(event: Event) -> str | None:
    """How the figures draw a ledger event or mark (its ``kind``): "unshard", "reshard",
    "grad alloc", "grad free", "forward end", "step", "backward begin", "backward end",
    "recompute"; None for any other kind (drawn as a plain event)."""
    try:
        return _FIGURE_KIND.get(EventKind(event.kind))
    except ValueError:  # a kind a newer ledger wrote: a plain event
        return None


def _step_filter(steps) -> set | None:
    if steps is None:
        return None
    if isinstance(steps, int):
        return {steps}
    return set(steps)


def _select(items: list[Event], steps) -> list[Event]:
    keep = _step_filter(steps)
    return list(items) if keep is None else [e for e in items if e.step in keep]


# Stacked from the bottom: the model states, then activations, then what a ZeRO-3 unit holds for
# a moment (its gathered parameters, its full gradient waiting for the reduce-scatter) on top, so
# the saw-tooth rides on the outline instead of hiding under the activations' hill.
STACK_ORDER = MODEL_STATE + ("activation", "backward_temp", "optimizer_temp", "gathered", "comm_buffer")


def _categories(events: list[Event]) -> list[str]:
    """The timeline categories in `STACK_ORDER`, then any others a newer ledger sends."""
    seen = [c for c in STACK_ORDER] + [c for c in TIMELINE_CATS if c not in STACK_ORDER]
    for e in events:
        for c in e.bytes:
            if c not in seen:
                seen.append(c)
    return seen


def _color(cat: str, cats: Sequence[str]) -> str:
    if cat in COLORS:
        return COLORS[cat]
    extra = [c for c in cats if c not in COLORS]
    return _EXTRA_COLORS[extra.index(cat) % len(_EXTRA_COLORS)]


class _XMap:
    """Event times -> x positions: the time itself, or the event's index; a mark between two
    events (x="event") sits halfway between them."""

    def __init__(self, events: list[Event], x: str):
        if x not in TIMELINE_X:
            raise ValueError(f"x must be one of {TIMELINE_X}, got {x!r}")
        self.x = x
        self.ts = [e.t for e in events]

    def events(self) -> list[float]:
        return list(self.ts) if self.x == "time" else list(range(len(self.ts)))

    def at(self, t: float) -> float:
        if self.x == "time":
            return t
        i = bisect.bisect_left(self.ts, t)
        if i < len(self.ts) and self.ts[i] == t:
            return float(i)
        return i - 0.5

    @property
    def label(self) -> str:
        return "seconds since the rank started" if self.x == "time" else "lifecycle event (index)"


def _decorate(ax, events: list[Event], marks: list[Event], xm: _XMap, annotate: bool) -> set[str]:
    """Backward bands, optimizer-step lines, unshard/reshard ticks, recompute ticks; returns the
    kinds drawn (for the legend)."""
    drawn = set()
    begin = None
    for m in sorted(marks, key=lambda m: m.t):
        kind = lifecycle_kind(m)
        if kind == EventKind.BACKWARD_BEGIN:
            begin = m.t
        elif kind == EventKind.BACKWARD_END and begin is not None:
            ax.axvspan(xm.at(begin), xm.at(m.t), color=BACKWARD_COLOR, zorder=0, linewidth=0)
            drawn.add("backward")
            begin = None
        elif kind == EventKind.RECOMPUTE:
            ax.plot([xm.at(m.t)], [0.9], marker="|", markersize=10, markeredgewidth=1.5, color=RECOMPUTE_COLOR,
                    transform=ax.get_xaxis_transform(), clip_on=False, linestyle="none")
            drawn.add("recompute")
    xs = xm.events()
    span = (max(xs) - min(xs)) if xs else 1.0
    last_label, low = None, False  # a unit number close to the one before drops a line, so they do not overlap
    for x, e in zip(xs, events):
        kind = lifecycle_kind(e)
        if kind == "step":
            ax.axvline(x, color=STEP_COLOR, linestyle=":", linewidth=1.0, zorder=1)
            drawn.add("step")
        elif kind in TICKS:
            marker, color, _ = TICKS[kind]
            ax.plot([x], [0.975], marker=marker, markersize=5, color=color, transform=ax.get_xaxis_transform(),
                    clip_on=False, linestyle="none")
            drawn.add(kind)
            u = e.unit
            if annotate and marker == "^" and u is not None:
                low = last_label is not None and x - last_label < 0.025 * span and not low
                ax.annotate(str(u), (x, 0.975), xycoords=ax.get_xaxis_transform(), xytext=(0, -13 if low else -5),
                            textcoords="offset points", ha="center", va="top", fontsize=6, color=color)
                last_label = x
    return drawn


def _headroom(ax, top: float, x: str = "time") -> None:
    """y from 0 to a little above the data: room for the lifecycle ticks on the top edge; whole
    numbers on an event-index axis."""
    ax.set_ylim(0, max(top, 1e-9) * HEADROOM)
    if x == "event":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _legend_handles(drawn: set[str]) -> list:
    out = []
    if "backward" in drawn:
        out.append(Patch(color=BACKWARD_COLOR, label="backward"))
    if "step" in drawn:
        out.append(Line2D([], [], color=STEP_COLOR, linestyle=":", label="optimizer step"))
    for kind, (marker, color, label) in TICKS.items():
        if kind in drawn:
            out.append(Line2D([], [], color=color, marker=marker, linestyle="none", label=label))
    if "recompute" in drawn:
        out.append(Line2D([], [], color=RECOMPUTE_COLOR, marker="|", linestyle="none", label="recompute (re-run)"))
    return out


def timeline_axes(ax, events_by_rank: dict[int, list[Event]], predicted_total: dict[int, float] | None,
                  title: str = "", *, x: str = "time", marks_by_rank: dict[int, list[Event]] | None = None,
                  legend: str = "outside") -> None:
    """Draw total bytes held per rank over time on `ax` (shared by `memory_timeline` and the live
    run panel, which calls it with partial event lists while a run streams). The predicted model
    states are each rank's dashed baseline; lifecycle moments are marked (module docstring) from
    the first rank's events and marks. `legend`: "outside" (right of the data), "inside", None."""
    allv = [sum(e.bytes.values()) for evs in events_by_rank.values() for e in evs]
    allv += list((predicted_total or {}).values())
    div, unit = byte_scale(allv or [1])
    drawn: set[str] = set()
    first = True
    for r in sorted(events_by_rank):
        evs = events_by_rank[r]
        if not evs:
            continue
        xm = _XMap(evs, x)
        tot = [sum(e.bytes.values()) / div for e in evs]
        line, = ax.step(xm.events(), tot, where="post", label=f"rank {r}", linewidth=1.2, color=rank_color(r))
        if predicted_total and r in predicted_total:
            ax.axhline(predicted_total[r] / div, color=line.get_color(), linestyle="--", linewidth=0.9)
        if first:
            drawn = _decorate(ax, evs, (marks_by_rank or {}).get(r, []), xm, annotate=False)
            first = False
    ax.set_xlabel(_XMap([], x).label)
    ax.set_ylabel(f"{unit} held")
    _headroom(ax, max(allv or [1]) / div, x)
    if title:
        ax.set_title(title, fontsize=9)
    if events_by_rank and legend:
        handles, _ = ax.get_legend_handles_labels()
        if predicted_total:
            handles.append(Line2D([], [], color="black", linestyle="--", label="predicted model states"))
        handles += _legend_handles(drawn)
        if legend == "outside":
            outside_legend(ax, handles)
        else:
            ax.legend(handles=handles, fontsize=7, frameon=False, loc="lower right", ncol=2)


def _stacked(ax, rank_report: RankReport, x: str, steps, annotate: bool | None, div: float,
             baseline: bool = True) -> tuple[list[str], set[str]]:
    """One rank's bytes by category, stacked, with its lifecycle marks; returns (categories
    drawn, lifecycle kinds drawn)."""
    tl = rank_report.timeline
    events = _select(tl.events, steps)
    marks = _select(tl.marks, steps)
    xm = _XMap(events, x)
    cats = [c for c in _categories(events) if any(e.bytes.get(c, 0) for e in events)]
    if events and cats:
        bands = ax.stackplot(xm.events(), *[[e.bytes.get(c, 0) / div for e in events] for c in cats],
                             labels=[category_label(c) for c in cats], colors=[_color(c, cats) for c in cats],
                             step="post")
        for band, c in zip(bands, cats):
            band.set_gid(c)  # the category, for readers of the figure (its label is for people)
    if baseline:
        ax.axhline(rank_report.predicted.total / div, color="black", linestyle="--", linewidth=1,
                   label="predicted model states")
    if annotate is None:
        annotate = len(events) <= 80
    drawn = _decorate(ax, events, marks, xm, annotate)
    top = max([sum(e.bytes.values()) for e in events] + [rank_report.predicted.total])
    _headroom(ax, top / div, x)
    return cats, drawn


def memory_timeline(report: RunReport, ranks: Sequence[int] | None = None, stacked_rank: int | None = 0, *,
                    x: str = "time", layout: str = "overlay", steps: int | Iterable[int] | None = None,
                    annotate: bool | None = None) -> Figure:
    """Bytes each rank holds at every ledger event, against the predicted model states (dashed
    baseline), with backward, the optimizer step and each unit's unshard / reshard marked.

    layout="overlay" (default): a panel with every rank's total, one line per rank, and, with
    `stacked_rank`, a panel that splits that rank's bytes by category (model states sit on the
    baseline; activations, gathered units and full gradients rise above it and fall back).
    layout="panels": small multiples, one stacked panel per rank in `ranks`, same y scale, so a
    rank that differs stands out (`stacked_rank` is then not used).
    x="time" | "event" (event index: every lifecycle step equally wide); `steps` keeps only
    those training steps (an int or several; on a time axis the default leaves out a full
    record's first step, whose backward is recorded op by op and runs several times slower);
    `annotate` writes the unit number over each unshard (default: when at most 80 events are shown)."""
    if layout not in TIMELINE_LAYOUTS:
        raise ValueError(f"layout must be one of {TIMELINE_LAYOUTS}, got {layout!r}")
    if x not in TIMELINE_X:
        raise ValueError(f"x must be one of {TIMELINE_X}, got {x!r}")
    skipped = ""
    if steps is None and x == "time" and report.timeline_mode == TimelineMode.FULL and report.steps > 1:
        # a full record watches the first step's backward op by op, several times slower than
        # the steps after it: on a time axis it would squash them, so it is left out, and said so
        steps = range(1, report.steps)
        skipped = " (step 0, recorded op by op, left out)"
    ranks = list(range(len(report.ranks))) if ranks is None else list(ranks)
    for r in ranks + ([] if stacked_rank is None or layout == "panels" else [stacked_rank]):
        _rank(report, r)
    where = "" if steps is None else f", step{'s' if not isinstance(steps, int) else ''} " + (
        str(steps) if isinstance(steps, int) else ", ".join(map(str, sorted(_step_filter(steps)))))
    where += skipped
    head = f"{report.strategy}, {mesh(report)}, {report.recipe}"
    if layout == "panels":
        cols = min(len(ranks), 4)
        rows = -(-len(ranks) // cols)
        width = {1: 6.4, 2: 3.8}.get(cols, 2.6)  # one chosen rank gets a full-width panel
        fig = new_figure(width * cols + 1.8, (3.0 if rows == 1 and cols <= 2 else 2.3) * rows + 0.4)
        axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
        allv = [sum(e.bytes.values()) for r in ranks
                for e in _select(report.ranks[r].timeline.events, steps)]
        allv += [report.ranks[r].predicted.total for r in ranks]
        div, unit = byte_scale(allv or [1])
        cats_all, drawn_all = [], set()
        for i, r in enumerate(ranks):
            ax = axes[i // cols][i % cols]
            cats, drawn = _stacked(ax, report.ranks[r], x, steps, annotate, div)
            cats_all += [c for c in cats if c not in cats_all]
            drawn_all |= drawn
            ax.set_title(f"rank {r}", fontsize=8)
            if i % cols == 0:
                ax.set_ylabel(f"{unit} held")
            ax.set_xlabel(_XMap([], x).label, fontsize=7)
            ax.tick_params(labelsize=7)
        _headroom(axes[0][0], max(allv or [1]) / div, x)  # shared y: the largest rank sets it
        for j in range(len(ranks), rows * cols):
            axes[j // cols][j % cols].set_visible(False)
        handles = [Line2D([], [], color="black", linestyle="--", label="predicted model states")]
        handles += [Patch(color=_color(c, cats_all), label=category_label(c)) for c in cats_all[::-1]]  # top-down
        handles += _legend_handles(drawn_all)
        fig.legend(handles=handles, fontsize=7, frameon=False, loc="outside right upper")
        fig.suptitle(f"{head}: memory per rank by category{where}", fontsize=9)
        return fig

    evs = {r: _select(report.ranks[r].timeline.events, steps) for r in ranks}
    marks = {r: _select(report.ranks[r].timeline.marks, steps) for r in ranks}
    pred = {r: report.ranks[r].predicted.total for r in ranks}
    fig = new_figure(8.5, 3.0 if stacked_rank is None else 5.8)
    axes = fig.subplots(1 if stacked_rank is None else 2, 1, squeeze=False)[:, 0]
    timeline_axes(axes[0], evs, pred, f"{head}: memory per rank{where}", x=x, marks_by_rank=marks)

    if stacked_rank is not None:
        ax = axes[1]
        rr = report.ranks[stacked_rank]
        shown = _select(rr.timeline.events, steps)
        div, unit = byte_scale([sum(e.bytes.values()) for e in shown] + [rr.predicted.total])
        _, drawn = _stacked(ax, rr, x, steps, annotate, div)
        ax.set_xlabel(_XMap([], x).label)
        ax.set_ylabel(f"{unit} held")
        ax.set_title(f"rank {stacked_rank} by category", fontsize=9)
        handles, _ = ax.get_legend_handles_labels()  # the categories bottom-up, then the baseline
        baseline, cats = handles[-1:], handles[:-1]
        outside_legend(ax, baseline + cats[::-1] + _legend_handles(drawn))  # top-down, as stacked
    return fig


def overlap_timeline(report: RunReport, rank: int = 0, step: int | None = None) -> Figure:
    """One step on one rank: the backward interval and each collective's [start, end] interval.

    Asynchronous collectives that sit inside the backward band are communication hidden behind
    compute (bucketed DDP's all-reduces, FSDP's prefetched all-gathers); synchronous ones
    (hatched: FSDP's reduce-scatter in its post-backward hook) stall backward while they run;
    bars after the band are exposed time the step waits for. The share hidden is
    `zeroedu.runtime.analysis.overlap_fraction`."""
    r = _rank(report, rank)
    tl = r.timeline
    step = report.steps - 1 if step is None else step
    windows = analysis.backward_windows(tl, step)
    comm = [c for c in tl.comm if c.step == step]
    fig = new_figure(7.5, 1.4 + 0.22 * max(len(comm), 1))
    ax = fig.add_subplot()
    t0 = min([c.t_start for c in comm] + [b for b, _ in windows] + [float("inf")])
    t0 = 0.0 if t0 == float("inf") else t0
    ms = 1e3
    for b, e in windows:
        ax.axvspan((b - t0) * ms, (e - t0) * ms, color="#DDDDDD")
    for i, c in enumerate(comm):
        te = c.t_end if c.t_end is not None else c.t_start
        ax.broken_barh([((c.t_start - t0) * ms, max((te - c.t_start) * ms, 1e-3))], (i - 0.4, 0.8),
                       facecolor=COLORS.get(c.op, "#4C72B0"), edgecolor="black" if c.blocking else "none",
                       hatch="///" if c.blocking else None, linewidth=0.3)
    ax.set_yticks(range(len(comm)), [c.tag for c in comm], fontsize=7.5)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds since the step's first collective or backward")
    frac = analysis.overlap_fraction(tl, step)
    ax.set_title(f"{report.strategy}, rank {rank}, step {step}: collectives against backward"
                 + (f"\nthis rank and step: {100 * frac:.0f} % of the gradient reductions' time inside backward"
                    if frac is not None else ""), fontsize=9)
    ops = sorted({c.op for c in comm})
    extra = ([Patch(facecolor="white", edgecolor="black", hatch="///", label="synchronous (stalls backward)")]
             if any(c.blocking for c in comm) else [])
    outside_legend(ax, [Patch(color="#DDDDDD", label="backward")] +
                   [Patch(color=COLORS.get(o, "#4C72B0"), label=o) for o in ops] + extra)
    return fig




_PHASE_COLORS = {"forward": "#A1C9F4", "backward": "#8DE5A1", "optimizer": "#FFB482"}


def trace_figure(trace: dict, step: int | None = None) -> Figure:
    """A Chrome trace (`zeroedu.notebook.trace.trace`) drawn as Perfetto draws it: one row per
    track (each rank's compute, then its communication axes), the slices of one step (default:
    the last) as bars: forward, backward and the optimizer step on compute; every collective,
    coloured by kind, on its axis's rows (hatched when it blocked the rank). The same data the
    trace file holds, from the step's start on the earliest rank, in milliseconds."""
    events = trace["traceEvents"]
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    steps = [e for e in events if e["ph"] == "X" and e.get("cat") == "user_annotation"]
    if not steps:
        raise ValueError("the trace has no step slices (ProfilerStep#k) to draw")
    step = max(e["args"]["step"] for e in steps) if step is None else step
    windows = {e["pid"]: (e["ts"], e["ts"] + e["dur"]) for e in steps if e["args"]["step"] == step}
    if not windows:
        raise ValueError(f"the trace has no step {step}")
    t0 = min(a for a, _ in windows.values())

    def shown(e) -> bool:  # a slice of this step on its rank's tracks
        if e["ph"] != "X" or e["pid"] not in windows or e.get("cat") == "user_annotation":
            return False
        a, b = windows[e["pid"]]
        return e["ts"] + e["dur"] >= a and e["ts"] <= b

    rows = sorted({(e["pid"], e["tid"]) for e in events if shown(e)})
    fig = new_figure(8.0, 1.0 + 0.32 * len(rows))
    ax = fig.add_subplot()
    kinds = set()
    row = {key: y for y, key in enumerate(rows)}
    for e in events:
        if shown(e):
            y = row[e["pid"], e["tid"]]
            if e.get("cat") == "collective":
                kind = e["args"]["collective"]
                color, hatch = COLORS.get(kind, "#4C72B0"), "///" if e["args"].get("blocking") else None
            else:
                kind = e.get("cat", "")
                color, hatch = _PHASE_COLORS.get(kind, "#CCCCCC"), None
            kinds.add(kind)
            ax.broken_barh([((e["ts"] - t0) / 1e3, max(e["dur"] / 1e3, 1e-3))], (y - 0.4, 0.8), facecolor=color,
                           edgecolor="black" if hatch else "none", hatch=hatch, linewidth=0.3)
    ax.set_yticks(range(len(rows)), [f"rank {pid} {names.get((pid, tid), tid)}" for pid, tid in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"milliseconds from step {step}'s start")
    ax.set_title(f"the trace, step {step}: compute and communication tracks per rank", fontsize=9)
    handles = [Patch(color=_PHASE_COLORS[k], label=k) for k in _PHASE_COLORS if k in kinds]
    handles += [Patch(color=COLORS.get(k, "#4C72B0"), label=k) for k in sorted(kinds - set(_PHASE_COLORS))]
    outside_legend(ax, handles)
    return fig
