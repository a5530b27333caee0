"""ipywidgets dashboards: the closed forms under sliders, and real runs behind a button.

* `memory_explorer()`: Ψ, N, M, recipe, strategy, GPU memory, TP/PP and offload sliders; bars of
  device bytes per GPU by category and of bytes sent per step by collective, for every
  strategy in the catalog, plus a table (memory, communication, time, "does it fit?"). Pure
  arithmetic on `zeroedu.theory`, redrawn on every change.
* `run_panel()`: strategy, N, recipe, steps and a "Run on N ranks" button that trains on the warm
  rank pool (`zeroedu.train.run`) while ledger events stream back; a live memory-timeline plot
  per rank with the prediction overlaid, a progress bar, then the predicted-vs-measured table.

Both are plain objects holding their widgets: `update()` / `run()` are ordinary methods, so a test
drives them without a browser, and the observers only call them. Bad input never raises into
the notebook: it is clamped or rejected, and a visible message says so.

The explorer's bars are HTML/CSS (a redraw costs microseconds, so they follow a dragged slider);
the run panel's timeline is a matplotlib PNG in an `ipywidgets.Image`, redrawn at most every
`redraw_every` seconds while events stream, which updates in JupyterLab from inside a running
callback and needs no particular matplotlib backend.
"""
from __future__ import annotations

import html
import io
import math
import time
from numbers import Real

import ipywidgets as W
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from . import catalog, theory, viz
from .recipes import RECIPES

DEFAULT_RECIPE = "default (each strategy's own)"
_OK = "color:#2E7D32"
_BAD = "color:#C62828;font-weight:bold"


def _png(fig: Figure, dpi: int = 72) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _msg(widget: W.HTML, text: str, ok: bool = False) -> None:
    widget.value = f'<span style="{_OK if ok else _BAD}">{html.escape(text)}</span>' if text else ""


def bar_chart_html(title: str, data: dict[str, dict[str, float] | None], highlight: str | None = None,
                   line: tuple[float, str] | None = None, width_px: int = 330) -> str:
    """Horizontal stacked bars as HTML: one row per key of `data` ({segment: bytes}, or None for
    "not applicable"), segments coloured as in `zeroedu.viz`, an optional vertical marker line."""
    top = max([sum(v.values()) for v in data.values() if v] + [line[0] if line else 0.0, 1e-30])
    cats = []
    for v in data.values():
        for c in v or {}:
            if c not in cats:
                cats.append(c)
    rows = []
    for name, v in data.items():
        bold = "font-weight:bold;" if name == highlight else ""
        if v is None:
            bar = '<span style="color:grey;font-size:11px">n/a</span>'
            total = ""
        else:
            bar = "".join(f'<div title="{c}: {viz.human_bytes(b)}" style="background:{viz.COLORS.get(c, "#888")};'
                          f'width:{100 * b / top:.3f}%;height:100%"></div>' for c, b in v.items() if b > 0)
            total = viz.human_bytes(sum(v.values()))
        marker = ""
        if line:
            marker = (f'<div style="position:absolute;left:{100 * line[0] / top:.3f}%;top:-2px;bottom:-2px;'
                      'border-left:2px dashed #C62828"></div>')
        outline = "outline:2px solid black;" if name == highlight else ""
        rows.append(
            f'<div style="display:flex;align-items:center;height:17px;margin:2px 0;{bold}">'
            f'<div style="width:120px;font-size:11px">{html.escape(name)}</div>'
            f'<div style="position:relative;width:{width_px}px;height:13px;background:#F4F4F4;{outline}">'
            f'<div style="display:flex;height:100%">{bar}</div>{marker}</div>'
            f'<div style="width:80px;font-size:11px;padding-left:6px">{total}</div></div>')
    legend = "".join(f'<span style="display:inline-block;width:10px;height:10px;background:'
                     f'{viz.COLORS.get(c, "#888")};margin:0 3px 0 8px"></span>{c}' for c in cats)
    if line:
        legend += (f'<span style="display:inline-block;width:10px;border-left:2px dashed #C62828;'
                   f'height:10px;margin:0 3px 0 8px"></span>{html.escape(line[1])}')
    return (f'<div><div style="font-size:12px;font-weight:bold">{html.escape(title)}</div>'
            + "".join(rows) + f'<div style="font-size:11px">{legend}</div></div>')


# =============================================================================== collectives
class CollectiveExplorer:
    """N and payload sliders; bytes each rank sends per collective under the ring model, next to
    the naive "everyone sends to rank 0, rank 0 sends the sum back" scheme."""

    def __init__(self, n: int = 4, nbytes: float = 1e9):
        self.n = W.IntSlider(value=n, min=1, max=1024, description="N ranks")
        self.nbytes = W.FloatLogSlider(value=nbytes, base=10, min=3, max=12, description="payload S",
                                       readout_format=".3g")
        self.plot = W.HTML()
        self.updates = 0
        for w in (self.n, self.nbytes):
            w.observe(lambda ch: self.update(), names="value")
        self.widget = W.VBox([self.n, self.nbytes, self.plot])
        self.update()

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)

    def compute(self) -> dict:
        n, s = self.n.value, self.nbytes.value
        out = {c: float(theory.sent_bytes(c, s, n)) for c in theory.COLLECTIVES}
        # naive all-reduce through one root: the root receives N-1 payloads and sends N-1 back
        out["naive all-reduce (root)"] = float((n - 1) * s)
        return out

    def update(self) -> None:
        d = self.compute()
        self.plot.value = bar_chart_html(
            f"bytes one rank sends, N={self.n.value}, S={viz.human_bytes(self.nbytes.value)}",
            {k: {("all_reduce" if "naive" in k else k): v} for k, v in d.items()}, width_px=380)
        self.updates += 1


def collective_explorer(**kw) -> CollectiveExplorer:
    return CollectiveExplorer(**kw)


# =============================================================================== memory explorer
class MemoryExplorer:
    """Sliders over the closed forms for every strategy. `update()` recomputes and redraws."""

    PSI_RANGE = (1e6, 1e12)
    N_RANGE = (1, 1024)
    M_RANGE = (1, 64)
    GPU_GB_RANGE = (1.0, 1024.0)

    def __init__(self, psi: float = 7e9, n: int = 8, m: int = 1, recipe: str | None = None,
                 strategy: str = "zero1", gpu_gb: float = 80.0, strategies=None):
        self.strategies = list(strategies or catalog.STRATEGIES)
        style = {"description_width": "110px"}
        lay = W.Layout(width="420px")
        self.psi = W.FloatLogSlider(value=psi, base=10, min=6, max=12, step=0.05,
                                    description="Ψ (params)", readout_format=".3g", style=style, layout=lay)
        self.n = W.IntSlider(value=n, min=1, max=1024, description="N (shard GPUs)", style=style, layout=lay)
        self.m = W.IntSlider(value=m, min=1, max=64, description="M (domains)", style=style, layout=lay)
        self.recipe = W.Dropdown(options=[DEFAULT_RECIPE] + list(RECIPES), value=recipe or DEFAULT_RECIPE,
                                 description="recipe", style=style, layout=lay)
        self.strategy = W.Dropdown(options=self.strategies, value=catalog.get_spec(strategy).name,
                                   description="strategy", style=style, layout=lay)
        self.gpu_gb = W.BoundedFloatText(value=gpu_gb, min=1.0, max=1024.0, step=1.0,
                                         description="GPU memory GB", style=style, layout=lay)
        self.tp = W.IntSlider(value=1, min=1, max=64, description="tensor par. tp", style=style, layout=lay)
        self.pp = W.IntSlider(value=1, min=1, max=64, description="pipeline par. pp", style=style, layout=lay)
        self.offload = W.Dropdown(options=list(theory.OFFLOAD_MODES), value="none",
                                  description="offload", style=style, layout=lay)
        self.message = W.HTML()
        self.summary = W.HTML()
        self.table = W.HTML()
        self.plot = W.HTML()
        self.plot.add_class("zeroedu-explorer-plot")
        self.controls = [self.psi, self.n, self.m, self.recipe, self.strategy, self.gpu_gb, self.tp,
                         self.pp, self.offload]
        for w in self.controls:
            w.observe(self._on_change, names="value")
        self.updates = 0
        self._muted = False
        self.last_update_seconds = 0.0
        self.data: dict = {}
        self.widget = W.VBox([
            W.HBox([W.VBox(self.controls[:5]), W.VBox(self.controls[5:])]),
            self.message, self.summary, self.plot, self.table,
        ])
        self.update()

    # observers only call update(): the logic stays testable without a browser
    def _on_change(self, change):
        if not self._muted:
            self.update()

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)

    def set(self, **values) -> bool:
        """Set controls from Python (or a test). Out-of-range numbers are clamped, values of the
        wrong kind rejected; either way `message` says what happened. Returns True if all applied."""
        ranges = {"psi": self.PSI_RANGE, "n": self.N_RANGE, "m": self.M_RANGE, "tp": (1, 64),
                  "pp": (1, 64), "gpu_gb": self.GPU_GB_RANGE}
        notes, ok = [], True
        self._muted = True  # one update for the whole batch, not one per control
        try:
            for key, v in values.items():
                w = getattr(self, key, None)
                if not isinstance(w, W.ValueWidget) or w not in self.controls:
                    notes.append(f"unknown control {key!r}")
                    ok = False
                    continue
                if key in ranges:
                    lo, hi = ranges[key]
                    integral = key not in ("psi", "gpu_gb")
                    if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v) or \
                            (integral and v != int(v)):
                        notes.append(f"{key} = {v!r} rejected: needs {'an integer' if integral else 'a number'}")
                        ok = False
                        continue
                    if not lo <= v <= hi:
                        notes.append(f"{key} = {v:g} clamped to [{lo:g}, {hi:g}]")
                        v = min(max(v, lo), hi)
                    w.value = int(v) if integral else float(v)
                else:
                    options = list(w.options)
                    if v is None and key == "recipe":
                        v = DEFAULT_RECIPE
                    if key == "strategy":
                        try:
                            v = catalog.get_spec(v).name
                        except (ValueError, TypeError):
                            pass
                    if v not in options:
                        notes.append(f"{key} = {v!r} rejected: choose one of {', '.join(map(str, options))}")
                        ok = False
                        continue
                    w.value = v
        finally:
            self._muted = False
        self.update(notes)
        return ok

    def _recipe(self):
        return None if self.recipe.value == DEFAULT_RECIPE else self.recipe.value

    def compute(self) -> dict:
        """Everything the figure and table show, from the closed forms."""
        psi, n, m, rec = self.psi.value, self.n.value, self.m.value, self._recipe()
        tp, pp, off = self.tp.value, self.pp.value, self.offload.value
        gpu = self.gpu_gb.value * 1e9
        mem = viz.theory_memory(self.strategies, psi, n, m, rec, tp, pp, off)
        comm = viz.theory_comm(self.strategies, psi / (tp * pp), n, m, rec)
        out = {}
        for s in self.strategies:
            spec = catalog.get_spec(s)
            row = {"gpus": n * (m if spec.hybrid else 1) * tp * pp}
            if isinstance(mem[s], dict):
                row.update(mem[s])
                row["fits"] = row["total"] <= gpu
            else:
                row["error"] = mem[s]
            if isinstance(comm[s], dict):
                row["comm"] = comm[s]
                c = theory.comm_per_rank(s, psi / (tp * pp), n, m, rec)
                row["comm_seconds"] = theory.comm_time(c)
            out[s] = row
        return out

    def update(self, notes: list[str] | None = None) -> None:
        t0 = time.perf_counter()
        notes = list(notes or [])
        try:
            self.data = self.compute()
        except (ValueError, ZeroDivisionError, NotImplementedError) as e:
            _msg(self.message, f"rejected: {e}")
            return
        sel = self.strategy.value
        if "error" in self.data[sel]:
            notes.append(f"{sel}: {self.data[sel]['error']}")
        if self.m.value > 1 and not catalog.get_spec(sel).hybrid:
            notes.append(f"M = {self.m.value} only affects hybrid strategies (hsdp, hfsdp); {sel} ignores it")
        _msg(self.message, "; ".join(notes))
        self._draw()
        self.summary.value = self._summary_html(sel)
        self.table.value = self._table_html()
        self.updates += 1
        self.last_update_seconds = time.perf_counter() - t0

    def _draw(self) -> None:
        """Two stacked horizontal bar charts in HTML/CSS: a redraw costs microseconds, so the
        bars follow a slider as it is dragged (a matplotlib PNG takes tens of milliseconds)."""
        gpu = self.gpu_gb.value * 1e9
        sel = self.strategy.value
        mem = {s: ({c: d[c] for c in viz.STATE_CATS} if "total" in d else None) for s, d in self.data.items()}
        com = {s: ({c: d["comm"].get(c, 0.0) for c in theory.COLLECTIVES} if "comm" in d else None)
               for s, d in self.data.items()}
        self.plot.value = (
            '<div style="display:flex;gap:28px;flex-wrap:wrap">'
            + bar_chart_html(f"model states per GPU (device), Ψ={self.psi.value:.3g}", mem, sel,
                             line=(gpu, f"GPU {self.gpu_gb.value:g} GB"))
            + bar_chart_html("bytes sent per GPU per step (ring model)", com, sel)
            + "</div>")

    def _summary_html(self, s: str) -> str:
        d = self.data[s]
        spec = catalog.get_spec(s)
        if "total" not in d:
            return f"<b>{s}</b>: {html.escape(d['error'])}"
        fit = (f'<span style="{_OK}">fits</span>' if d["fits"] else f'<span style="{_BAD}">does not fit</span>')
        host = f", host {viz.human_bytes(d['host'])}" if d["host"] else ""
        comm = viz.human_bytes(sum(d.get("comm", {}).values()))
        return (f"<b>{s}</b> ({html.escape(spec.summary)}): {viz.human_bytes(d['total'])} per GPU"
                f"{host}, {comm} sent per step, {d.get('comm_seconds', 0) * 1e3:.1f} ms of communication "
                f"at default bandwidths; {fit} in {self.gpu_gb.value:g} GB.")

    def _table_html(self) -> str:
        head = ["strategy", "GPUs", "param", "grad", "optim", "device total", "host", "sent/step",
                "comm time", f"fits {self.gpu_gb.value:g} GB?"]
        rows = []
        for s, d in self.data.items():
            style = ' style="background:#FFF3CD"' if s == self.strategy.value else ""
            if "total" not in d:
                cells = [s, str(d["gpus"])] + ["n/a"] * 8
            else:
                cells = [s, str(d["gpus"])] + [viz.human_bytes(d[k]) for k in
                                                ("param", "grad", "optim", "total", "host")]
                cells += [viz.human_bytes(sum(d.get("comm", {}).values())),
                          f"{d.get('comm_seconds', 0) * 1e3:.1f} ms", "yes" if d["fits"] else "no"]
            rows.append(f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
        return ("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
                + "".join(rows) + "</tbody></table>")


def memory_explorer(**kw) -> MemoryExplorer:
    """Sliders over the closed forms for every strategy (see `MemoryExplorer`)."""
    return MemoryExplorer(**kw)


# =============================================================================== run panel
class RunPanel:
    """Train a strategy on N real ranks from a button; watch memory per rank while it runs."""

    def __init__(self, default_strategy: str = "ddp", n: int = 4, steps: int = 5, recipe: str | None = None,
                 redraw_every: float = 0.25):
        from .strategies import available

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
        from .train import RunConfig

        rec = None if self.recipe.value == DEFAULT_RECIPE else self.recipe.value
        return RunConfig(self.strategy.value, self.n.value, steps=self.steps.value, recipe=rec,
                         m=self.m.value).resolved()

    def _draw(self, title: str) -> None:
        self._ax.clear()
        viz.timeline_axes(self._ax, self.events, self._predicted, title)
        self.image.value = _png(self._fig)

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
        from .cluster import RankError
        from .nbtools import match_table
        from .train import predicted, run

        _msg(self.message, "")
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
            _msg(self.message, f"RankError: {who} {e.kind}: {last[-1] if last else ''}")
            self.status.value = "failed"
            return None
        except (ValueError, NotImplementedError, RuntimeError, TimeoutError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            _msg(self.message, f"{type(e).__name__}: {first}")
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
        ok = report["match"]["model_states"] and report["match"]["comm"]
        self.status.value = (f"done in {time.perf_counter() - t0:.2f} s: {self.events_received} events streamed; "
                             f'predicted vs measured — match: <b style="{_OK if ok else _BAD}">{ok}</b>')
        self.table.value = match_table(report).html
        return report


def run_panel(default_strategy: str = "ddp", **kw) -> RunPanel:
    """A button that trains on N real ranks with a live memory plot (see `RunPanel`)."""
    return RunPanel(default_strategy, **kw)


__all__ = ["CollectiveExplorer", "collective_explorer", "bar_chart_html", "MemoryExplorer", "memory_explorer", "RunPanel", "run_panel", "DEFAULT_RECIPE"]
