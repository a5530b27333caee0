"""A button that trains a strategy on N real ranks, with a live memory plot per rank.

Controls: strategy, model (gpt-small by default, the notebooks' model), recipe, steps, N, and M
for the hybrid strategies only (the slider is hidden for the others, which have no outer axis);
an x-axis choice for the timeline (the rank's clock, or the lifecycle event index).

After the run, the table summarises the report by quantity rather than listing every rank's
every row: one row per category (model states, activations, bytes sent by each collective as
the ring model of the payloads, bytes on the wire, peak), the ranks collapsed where they agree
and a rank that differs called out on a row of its own (`summary_rows`).
"""
from __future__ import annotations

import html
import time
from dataclasses import dataclass
from typing import Any

import ipywidgets as W
from matplotlib.figure import Figure

from ... import catalog
from ...fmt import number
from ...models import DEFAULT_MODEL, PRESETS
from ...recipes import RECIPES
from .. import viz
from ..report import CATS
from .common import BAD_STYLE, DEFAULT_RECIPE, OK_STYLE, message, png
from ...reports import Event, RunReport


def _ranks_text(ranks: list[int], world: int) -> str:
    if len(ranks) == world:
        return f"all {world} ranks" if world > 1 else "rank 0"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}–{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


@dataclass(frozen=True)
class SummaryRow:
    """One quantity of the run panel's table: ranks that agree share a row."""
    what: str
    predicted: Any  # None: no closed form (the peak)
    measured: Any  # a number, or (lowest, highest) over the ranks
    match: bool | None
    ranks: str  # "all 4 ranks", "rank 1", ...
    differs: bool  # a group of ranks other than the largest


def _grouped(what: str, values: list[tuple], ok) -> list[SummaryRow]:
    """Rows for one quantity: ranks with equal (predicted, measured) collapsed into one row, the
    largest group first; any other group is a row flagged `differs`."""
    groups: dict[tuple, list[int]] = {}
    for rank, pm in enumerate(values):
        groups.setdefault(pm, []).append(rank)
    order = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    rows = []
    for i, ((pred, meas), ranks) in enumerate(order):
        rows.append(SummaryRow(what, pred, meas, ok(pred, meas) if callable(ok) else ok,
                               _ranks_text(ranks, len(values)), differs=i > 0))
    return rows


def summary_rows(report: RunReport) -> list[SummaryRow]:
    """The report as one row per quantity (`SummaryRow`); ranks that agree share a row, a rank
    that differs gets its own (differs=True).
    Byte quantities are exact; the wire row compares with the payload the ring model predicts
    plus gloo's framing (`report.match.wire`); the peak has no closed form here."""
    ranks = report.ranks
    eq = lambda p, m: p == m  # noqa: E731
    rows: list[SummaryRow] = []
    for k in CATS:
        rows += _grouped(k, [(getattr(r.predicted, k), getattr(r.measured, k)) for r in ranks], eq)
    if any(r.predicted.activations is not None for r in ranks):
        rows += _grouped("activations (one micro-batch)",
                         [(r.predicted.activations, r.measured.activations) for r in ranks], eq)
    ops = sorted({op for r in ranks for op in set(r.predicted.comm) | set(r.measured.comm)})
    for op in ops:
        rows += _grouped(f"sent by {op} (ring model)",
                         [(r.predicted.comm.get(op, 0), r.measured.comm.get(op, 0)) for r in ranks], eq)
    if all(r.wire.sent is not None for r in ranks):
        rows += _grouped("on the wire (kernel counters)",
                         [(r.predicted.wire, r.wire.sent) for r in ranks],
                         bool(report.match.wire))
    # The peak depends on when asynchronous collectives finish: a range over the ranks, not a
    # rank that "differs".
    peaks = [r.peak for r in ranks]
    rows.append(SummaryRow("peak (largest at a lifecycle event)", None,
                           min(peaks) if min(peaks) == max(peaks) else (min(peaks), max(peaks)),
                           None, _ranks_text(list(range(len(ranks))), len(ranks)), differs=False))
    return rows


def summary_html(report: RunReport) -> str:
    head = ("what", "predicted", "measured", "match", "ranks")
    body = []
    for row in summary_rows(report):
        cells = [row.what, "—" if row.predicted is None else number(row.predicted),
                 ("—" if row.measured is None else "–".join(map(number, row.measured))
                  if isinstance(row.measured, tuple) else number(row.measured)),
                 "—" if row.match is None else ("yes" if row.match else "NO"),
                 row.ranks + (" (differs)" if row.differs else "")]
        style = ' style="background:#FFF3CD"' if row.differs else ""
        style = ' style="color:#C62828"' if row.match is False else style
        body.append(f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return ("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(body) + "</tbody></table>")


class RunPanel:
    """Train a strategy on N real ranks from a button; watch memory per rank while it runs."""

    def __init__(self, default_strategy: str = "ddp", n: int = 4, steps: int = 5, recipe: str | None = None,
                 redraw_every: float = 0.25, model: str = DEFAULT_MODEL, m: int = 2):
        from ...strategies import available

        style = {"description_width": "80px"}
        names = available()
        default = catalog.get_spec(default_strategy).name
        if default not in names:
            names = names + [default]  # selectable; running it says it is not implemented yet
        self.strategy = W.Dropdown(options=names, value=default, description="strategy", style=style)
        self.model = W.Dropdown(options=list(PRESETS), value=model, description="model", style=style)
        self.n = W.IntSlider(value=n, min=1, max=8, description="N ranks", style=style)
        self.m = W.IntSlider(value=m, min=1, max=4, description="M (hybrid)", style=style)
        self.recipe = W.Dropdown(options=[DEFAULT_RECIPE] + list(RECIPES), value=recipe or DEFAULT_RECIPE,
                                 description="recipe", style=style)
        self.steps = W.IntSlider(value=steps, min=1, max=20, description="steps", style=style)
        self.x = W.ToggleButtons(options=[("time", "time"), ("event index", "event")], value="time",
                                 description="x axis", style={"description_width": "80px", "button_width": "90px"})
        self.button = W.Button(description="Run on N ranks", button_style="primary", icon="play")
        self.progress = W.IntProgress(value=0, min=0, max=1, description="progress", style=style)
        self.status = W.HTML()
        self.message = W.HTML()
        self.image = W.Image(format="png", layout=W.Layout(width="760px"))
        self.table = W.HTML()
        self.redraw_every = redraw_every
        self.button.on_click(lambda _b: self.run())
        self.n.observe(lambda ch: self._label(), names="value")
        self.strategy.observe(lambda ch: self._show_m(), names="value")
        self.x.observe(lambda ch: self._redraw_final(), names="value")
        self._label()
        self._show_m()
        self.widget = W.VBox([
            W.HBox([W.VBox([self.strategy, self.model, self.recipe, self.steps]),
                    W.VBox([self.n, self.m, self.button])]),
            self.x, self.progress, self.status, self.message, self.image, self.table,
        ])
        self.report: RunReport | None = None
        self.events: dict[int, list[Event]] = {}
        self.events_received = 0
        self.live_redraws = 0
        self._predicted: dict[int, float] = {}
        # fixed margins, not a layout engine: a live redraw must stay cheap; the legend sits
        # right of the plot
        self._fig = Figure(figsize=(9.5, 3.2))
        self._fig.subplots_adjust(left=0.08, right=0.78, bottom=0.15, top=0.9)
        self._ax = self._fig.add_subplot()

    def _label(self):
        self.button.description = f"Run on {self.n.value} rank" + ("s" if self.n.value > 1 else "")

    def hybrid(self) -> bool:
        return catalog.get_spec(self.strategy.value).hybrid

    def _show_m(self):
        """M is the outer (dp_outer) axis: only the hybrids have one."""
        self.m.layout.display = None if self.hybrid() else "none"

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)

    def config(self):
        from ...train import RunConfig

        rec = None if self.recipe.value == DEFAULT_RECIPE else self.recipe.value
        return RunConfig(self.strategy.value, self.n.value, steps=self.steps.value, recipe=rec,
                         m=self.m.value if self.hybrid() else 1, model=self.model.value).resolved()

    def _draw(self, title: str, marks: dict | None = None) -> None:
        self._ax.clear()
        viz.timeline_axes(self._ax, self.events, self._predicted, title, x=self.x.value, marks_by_rank=marks)
        self.image.value = png(self._fig)

    def _redraw_final(self) -> None:
        if self.report is not None:
            rep = self.report
            self._draw(f"{rep.strategy}, {viz.mesh(rep)}, {rep.recipe}, {rep.model}: memory per rank",
                       {r.rank: r.timeline.marks for r in rep.ranks})

    def on_event(self, msg: dict) -> None:
        """Called (in this process) for every ledger event a rank streams while the job runs."""
        if msg.get("type") != "event":
            return
        r = msg["rank"]
        self.events.setdefault(r, []).append(Event.from_plain({k: v for k, v in msg.items() if k not in ("type", "rank")}))
        self.events_received += 1
        self._last_step[r] = max(self._last_step.get(r, -1), msg.get("step", -1))
        done = min(self._last_step.get(q, -1) for q in range(self._world)) + 1
        self.progress.value = max(0, min(done, self.progress.max))
        if time.perf_counter() - self._last_draw >= self.redraw_every or self.live_redraws == 0:
            self.live_redraws += 1
            self.status.value = f"running: {self.events_received} events received"
            self._draw("live: memory per rank (dashed: predicted model states)")
            # measured from the end of the draw, so a slow machine still spends most time training
            self._last_draw = time.perf_counter()

    def run(self) -> dict | None:
        """Launch the run on the warm pool; returns the report, or None after showing the error."""
        from ...runtime.cluster import RankError
        from ...train import predicted, run
        from ..report import all_match

        message(self.message, "")
        self.table.value = ""
        self.report = None
        self.events, self.events_received, self.live_redraws = {}, 0, 0
        self._last_step, self._last_draw = {}, 0.0
        try:
            cfg = self.config()
            self._world = cfg.world_size
            self._predicted = {r: float(predicted(cfg, r % cfg.n).total) for r in range(cfg.world_size)}
            self.progress.max, self.progress.value = cfg.steps, 0
            self.status.value = f"starting {cfg.strategy} on {cfg.world_size} ranks ({cfg.recipe}, {cfg.model.name})..."
            self.button.disabled = True
            t0 = time.perf_counter()
            report = run(cfg, on_event=self.on_event)
        except RankError as e:
            # the rank's own exception is the last line of its traceback
            last = [ln for ln in e.detail.strip().splitlines() if ln.strip()]
            who = f"rank {e.rank}" if e.rank is not None else "ranks"
            message(self.message, f"RankError: {who} {e.kind}: {last[-1] if last else ''}")
            self.status.value = "failed"
            return None
        except (ValueError, NotImplementedError, RuntimeError, TimeoutError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            message(self.message, f"{type(e).__name__}: {first}")
            self.status.value = "failed"
            return None
        finally:
            self.button.disabled = False
        self.report = report
        self.progress.value = self.progress.max
        # The final picture comes from the report: every event of every rank, nothing dropped.
        self.events = {r.rank: r.timeline.events for r in report.ranks}
        self._redraw_final()
        ok = all_match(report)
        self.status.value = (f"done in {time.perf_counter() - t0:.2f} s: {self.events_received} events streamed; "
                             f'predicted vs measured — match: <b style="{OK_STYLE if ok else BAD_STYLE}">{ok}</b>')
        self.table.value = summary_html(report)
        return report


def run_panel(default_strategy: str = "ddp", **kw) -> RunPanel:
    """A button that trains on N real ranks with a live memory plot (see `RunPanel`)."""
    return RunPanel(default_strategy, **kw)
