"""Pipeline parallelism drawn: the schedule each stage ran, read from its timeline, above the one
the closed form predicts; and the bubble against the number of micro-batches."""
from __future__ import annotations

from typing import Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ...reports import PipelineWork, measured_bubble
from ...theory import pipeline as theory
from .common import new_figure

_FILL = {theory.FORWARD: "#4C72B0", theory.BACKWARD: "#DD8452"}


def _gantt(ax, rows: list[list[tuple[str, int, float, float]]], title: str) -> None:
    """One bar per action: row s is stage s (stage 0 on top), the micro-batch's number inside."""
    for s, acts in enumerate(rows):
        for what, i, start, end in acts:
            ax.broken_barh([(start, end - start)], (s - 0.4, 0.8), facecolors=_FILL[what], edgecolors="white",
                           linewidth=0.6)
            ax.text((start + end) / 2, s, str(i), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(rows)), [f"stage {s}" for s in range(len(rows))])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_title(title, fontsize=9, loc="left")


def pipeline_schedule(report) -> Figure:
    """The last step of a pipeline run (a `RunReport` with pp >= 2): each stage's forwards (blue)
    and backwards (orange) as its timeline recorded them (`RankReport.pipeline`, the first rank
    of each stage), in ms from the step's first action; below, the same schedule with every
    action lasting the emulated device's t_f and t_b (`theory.pipeline.timed_schedule`), or the
    measured medians when compute was real."""
    first: dict[int, PipelineWork] = {}
    for rk in report.ranks:
        first.setdefault(rk.pipeline.stage, rk.pipeline)
    stages = [first[s] for s in sorted(first)]
    work = [s.work for s in stages]
    t0 = min(w[2] for ws in work for w in ws)
    measured = [[(what, i, 1e3 * (start - t0), 1e3 * (end - t0)) for what, i, start, end in sorted(ws, key=lambda a: a[2])]
                for ws in work]
    if report.emulate is not None:
        t_f, t_b = (1e3 * t for t in report.emulate)
    else:
        def median(kind):
            d = sorted(end - start for ws in work for what, _, start, end in ws if what == kind)
            return 1e3 * d[len(d) // 2]
        t_f, t_b = median(theory.FORWARD), median(theory.BACKWARD)
    p, m = report.pp, report.micro_batches
    predicted = theory.timed_schedule(report.schedule, p, m, t_f, t_b)
    fig = new_figure(7.5, 1.2 + 0.55 * 2 * p)
    top, bottom = fig.subplots(2, 1, sharex=True)
    idle = "  ".join(f"{b:.1%}" for b in measured_bubble(stages))
    _gantt(top, measured, f"measured ({report.schedule}, p = {p}, m = {m}): idle per stage {idle}")
    _gantt(bottom, predicted, f"closed form: t_f = {t_f:.0f} ms, t_b = {t_b:.0f} ms, "
                              f"idle (p-1)/(m+p-1) = {float(theory.bubble_fraction(p, m)):.1%}")
    bottom.set_xlabel("ms from the step's first action")
    top.legend(handles=[Patch(color=_FILL["F"], label="forward"), Patch(color=_FILL["B"], label="backward")],
               fontsize=7, frameon=False, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2,
               borderaxespad=0.0)
    return fig


def bubble_figure(rows: Sequence, m_max: int = 16) -> Figure:
    """The bubble against m: the closed form (p-1)/(m+p-1) as a line per p, each measured row
    (`time_lessons.BubbleRow`: the mean over stages) as a marker, GPipe and 1F1B apart."""
    fig = new_figure(6.0, 3.2)
    ax = fig.subplots()
    colors = {2: "#4C72B0", 4: "#C44E52", 8: "#55A868"}
    ms = list(range(1, m_max + 1))
    for p in sorted({r.p for r in rows}):
        c = colors.get(p, "#8C8C8C")
        ax.plot(ms, [float(theory.bubble_fraction(p, m)) for m in ms], color=c, lw=1.2,
                label=f"p = {p}: (p-1)/(m+p-1)")
        for kind, marker in ((theory.GPIPE, "o"), (theory.ONE_F_ONE_B, "x")):
            pts = [(r.m, r.mean) for r in rows if r.p == p and r.schedule == kind]
            if pts:
                ax.plot(*zip(*pts), marker, color=c, ms=6, mfc="none" if marker == "o" else c,
                        label=f"p = {p}, {kind}: measured")
    ax.set_xscale("log", base=2)
    ax.set_xticks([m for m in (1, 2, 4, 8, 16) if m <= m_max], [str(m) for m in (1, 2, 4, 8, 16) if m <= m_max])
    ax.set_xlabel("micro-batches per step, m")
    ax.set_ylabel("idle fraction of the step")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, frameon=False)
    return fig
