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


IDLE = "#BBBBBB"  # a stage waiting: the bubble


def idle_intervals(acts: list[tuple[str, int, float, float]], end: float) -> list[tuple[float, float]]:
    """(start, length) of every stretch of [0, end] in which a stage runs no action: the time it
    spends waiting for its neighbours, what the bubble counts."""
    out, t = [], 0.0
    for _, _, start, stop in sorted(acts, key=lambda a: a[2]):
        if start > t:
            out.append((t, start - t))
        t = max(t, stop)
    if end > t:
        out.append((t, end - t))
    return out


def _gantt(ax, rows: list[list[tuple[str, int, float, float]]], title: str, key: str = "") -> None:
    """One bar per action: row s is stage s (stage 0 on top), the micro-batch's number inside;
    each stage's idle stretches up to the step's last action shaded (gid ``{key}idle/stage{s}``)."""
    end = max(stop for acts in rows for *_, stop in acts)
    for s, acts in enumerate(rows):
        ax.broken_barh(idle_intervals(acts, end), (s - 0.4, 0.8), facecolors="#EEEEEE", edgecolors=IDLE,
                       hatch="////", linewidth=0.0, gid=f"{key}idle/stage{s}")
        for what, i, start, stop in acts:
            ax.broken_barh([(start, stop - start)], (s - 0.4, 0.8), facecolors=_FILL[what], edgecolors="white",
                           linewidth=0.6)
            ax.text((start + stop) / 2, s, str(i), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(rows)), [f"stage {s}" for s in range(len(rows))])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_title(title, fontsize=9, loc="left")


def _measured(report) -> tuple[list, list]:
    """The last step's actions per stage (the first rank of each), in ms from its first action,
    and the stages' `PipelineWork`."""
    first: dict[int, PipelineWork] = {}
    for rk in report.ranks:
        first.setdefault(rk.pipeline.stage, rk.pipeline)
    stages = [first[s] for s in sorted(first)]
    work = [s.work for s in stages]
    t0 = min(w[2] for ws in work for w in ws)
    return [[(what, i, 1e3 * (start - t0), 1e3 * (end - t0)) for what, i, start, end in sorted(ws, key=lambda a: a[2])]
            for ws in work], stages


def _legend(fig) -> None:
    """Below the panels, clear of their titles."""
    fig.legend(handles=[Patch(color=_FILL["F"], label="forward"), Patch(color=_FILL["B"], label="backward"),
                        Patch(facecolor="#EEEEEE", edgecolor=IDLE, hatch="////", label="idle: the bubble")],
               fontsize=7, frameon=False, loc="outside lower center", ncol=3)


def pipeline_schedule(report, *others) -> Figure:
    """The last step of a pipeline run (a `RunReport` with pp >= 2): each stage's forwards (blue)
    and backwards (orange) as its timeline recorded them (`RankReport.pipeline`, the first rank
    of each stage), in ms from the step's first action, each stage's idle time shaded; below, the
    same schedule with every action lasting the emulated device's t_f and t_b
    (`theory.pipeline.timed_schedule`), or the measured medians when compute was real. With
    `others` (say GPipe's run beside 1F1B's at m > p), one measured panel per run, one time axis,
    each titled with its measured idle share and the closed form's (p-1)/(m+p-1)."""
    if others:
        reports = (report, *others)
        fig = new_figure(7.5, 0.9 + sum(0.5 * r.pp + 0.35 for r in reports))
        axes = fig.subplots(len(reports), 1, sharex=True)
        for k, (ax, rep) in enumerate(zip(axes, reports)):
            rows, stages = _measured(rep)
            idle = "  ".join(f"{b:.0%}" for b in measured_bubble(stages))
            _gantt(ax, rows, f"{rep.schedule}, p = {rep.pp}, m = {rep.micro_batches}: idle per stage {idle}; "
                             f"(p-1)/(m+p-1) = {float(theory.bubble_fraction(rep.pp, rep.micro_batches)):.0%}",
                   key=f"run{k}/")
        axes[-1].set_xlabel("ms from the step's first action")
        _legend(fig)
        return fig
    measured, stages = _measured(report)
    if report.emulate is not None:
        t_f, t_b = (1e3 * t for t in report.emulate)
    else:
        def median(kind):
            d = sorted(end - start for acts in measured for what, _, start, end in acts if what == kind)
            return d[len(d) // 2]
        t_f, t_b = median(theory.FORWARD), median(theory.BACKWARD)
    p, m = report.pp, report.micro_batches
    predicted = theory.timed_schedule(report.schedule, p, m, t_f, t_b)
    fig = new_figure(7.5, 1.2 + 0.55 * 2 * p)
    top, bottom = fig.subplots(2, 1, sharex=True)
    idle = "  ".join(f"{b:.1%}" for b in measured_bubble(stages))
    _gantt(top, measured, f"measured ({report.schedule}, p = {p}, m = {m}): idle per stage {idle}", key="measured/")
    _gantt(bottom, predicted, f"closed form: t_f = {t_f:.0f} ms, t_b = {t_b:.0f} ms, "
                              f"idle (p-1)/(m+p-1) = {float(theory.bubble_fraction(p, m)):.1%}", key="predicted/")
    bottom.set_xlabel("ms from the step's first action")
    _legend(fig)
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
