"""A button that trains a strategy on N real ranks, with a live memory plot per rank."""
from __future__ import annotations

import time

import ipywidgets as W
from matplotlib.figure import Figure

from ... import catalog
from ...recipes import RECIPES
from .. import viz
from .common import BAD_STYLE, DEFAULT_RECIPE, OK_STYLE, message, png

class RunPanel:
    """Train a strategy on N real ranks from a button; watch memory per rank while it runs."""

    def __init__(self, default_strategy: str = "ddp", n: int = 4, steps: int = 5, recipe: str | None = None,
                 redraw_every: float = 0.25):
        from ...strategies import available

        style = {"description_width": "80px"}
        names = available()
        default = catalog.get_spec(default_strategy).name
        if default not in names:
            names = names + [default]  # selectable; running it says it is not implemented yet
        self.strategy = W.Dropdown(options=names, value=default, description="strategy", style=style)
        self.n = W.IntSlider(value=n, min=1, max=8, description="N ranks", style=style)
        self.m = W.IntSlider(value=1, min=1, max=4, description="M (hybrid)", style=style)
        self.recipe = W.Dropdown(options=[DEFAULT_RECIPE] + list(RECIPES), value=recipe or DEFAULT_RECIPE,
                                 description="recipe", style=style)
        self.steps = W.IntSlider(value=steps, min=1, max=20, description="steps", style=style)
        self.button = W.Button(description="Run on N ranks", button_style="primary", icon="play")
        self.progress = W.IntProgress(value=0, min=0, max=1, description="progress", style=style)
        self.status = W.HTML()
        self.message = W.HTML()
        self.image = W.Image(format="png", layout=W.Layout(width="720px"))
        self.table = W.HTML()
        self.redraw_every = redraw_every
        self.button.on_click(lambda _b: self.run())
        self.n.observe(lambda ch: self._label(), names="value")
        self._label()
        self.widget = W.VBox([
            W.HBox([W.VBox([self.strategy, self.recipe, self.steps]), W.VBox([self.n, self.m, self.button])]),
            self.progress, self.status, self.message, self.image, self.table,
        ])
        self.report: dict | None = None
        self.events: dict[int, list[dict]] = {}
        self.events_received = 0
        self.live_redraws = 0
        # fixed margins, not a layout engine: a live redraw must stay cheap
        self._fig = Figure(figsize=(9, 3.2))
        self._fig.subplots_adjust(left=0.08, right=0.98, bottom=0.15, top=0.9)
        self._ax = self._fig.add_subplot()

    def _label(self):
        self.button.description = f"Run on {self.n.value} rank" + ("s" if self.n.value > 1 else "")

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)

    def config(self):
        from ...train import RunConfig

        rec = None if self.recipe.value == DEFAULT_RECIPE else self.recipe.value
        return RunConfig(self.strategy.value, self.n.value, steps=self.steps.value, recipe=rec,
                         m=self.m.value).resolved()

    def _draw(self, title: str) -> None:
        self._ax.clear()
        viz.timeline_axes(self._ax, self.events, self._predicted, title)
        self.image.value = png(self._fig)

    def on_event(self, msg: dict) -> None:
        """Called (in this process) for every ledger event a rank streams while the job runs."""
        if msg.get("kind") != "event":
            return
        r = msg["rank"]
        self.events.setdefault(r, []).append(msg)
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
        from ..nbtools import match_table
        from ..report import all_match

        message(self.message, "")
        self.table.value = ""
        self.report = None
        self.events, self.events_received, self.live_redraws = {}, 0, 0
        self._last_step, self._last_draw = {}, 0.0
        try:
            cfg = self.config()
            self._world = cfg.world_size
            self._predicted = {r: float(predicted(cfg, r % cfg.n)["total"]) for r in range(cfg.world_size)}
            self.progress.max, self.progress.value = cfg.steps, 0
            self.status.value = f"starting {cfg.strategy} on {cfg.world_size} ranks ({cfg.recipe})..."
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
        self.events = {r["rank"]: r["timeline"]["events"] for r in report["ranks"]}
        self._draw(f"{report['strategy']}, N={report['n']}, {report['recipe']}: memory per rank "
                   "(dashed: predicted model states)")
        ok = all_match(report)
        self.status.value = (f"done in {time.perf_counter() - t0:.2f} s: {self.events_received} events streamed; "
                             f'predicted vs measured — match: <b style="{OK_STYLE if ok else BAD_STYLE}">{ok}</b>')
        self.table.value = match_table(report).html
        return report


def run_panel(default_strategy: str = "ddp", **kw) -> RunPanel:
    """A button that trains on N real ranks with a live memory plot (see `RunPanel`)."""
    return RunPanel(default_strategy, **kw)
