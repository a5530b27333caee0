"""Sliders over the closed forms for every strategy: memory per GPU, bytes per step, time, "fits".

What one GPU holds is `theory.device_bytes`: device model states (after TP/PP and offload) +
activations + the largest unit a ZeRO-3-family strategy gathers. Activations are Korthikanti et
al. 2022's for the GPT shape `theory.transformer_shape` infers from Ψ (L, h, a; the note under
the summary names it) at the chosen sequence length S, micro-batch B and recomputation; "fits"
compares that sum with the GPU. The time column is communication only, nothing overlapped, at
the default bandwidths. N is the data-parallel degree: the GPU column is N·tp·pp (N·M·tp·pp for
the hybrids). Hybrids at M = 1 have one domain and are flat ZeRO-3 over N, so their rows are
greyed and marked until M >= 2 (the dashboard opens at M = 2). A combination the closed forms
refuse (offloading a DDP, say) reads "not applicable" with the reason.
"""
from __future__ import annotations

import html
import time

import ipywidgets as W

from ... import catalog, theory
from ...recipes import RECIPES, get_recipe
from ...theory.activations import ATTENTION, DEFAULT_ATTENTION, DEFAULT_MICRO_BATCH, DEFAULT_SEQ, RECOMPUTE
from .. import viz
from .common import BAD_STYLE, DEFAULT_RECIPE, OK_STYLE, bar_chart_html, checked_number, message

def _params(psi: float) -> str:
    """7e9 -> '7B', 1.25e8 -> '125M': how model sizes are usually written."""
    return f"{psi / 1e9:.3g}B" if psi >= 1e9 else f"{psi / 1e6:.3g}M"


def _short(reason: str) -> str:
    """The first clause of a closed form's refusal, for a table cell (the full text is its tooltip)."""
    return reason.split(";")[0].split(": ")[0]


class MemoryExplorer:
    """Sliders over the closed forms for every strategy. `update()` recomputes and redraws."""

    PSI_RANGE = (1e6, 1e12)
    N_RANGE = (1, 1024)
    M_RANGE = (1, 64)
    GPU_GB_RANGE = (1.0, 1024.0)
    SEQ_RANGE = (1, 262144)
    MICRO_BATCH_RANGE = (1, 1024)

    def __init__(self, psi: float = 7e9, n: int = 8, m: int = 1, recipe: str | None = None,
                 strategy: str = "zero1", gpu_gb: float = 80.0, strategies=None,
                 seq: int = DEFAULT_SEQ, micro_batch: int = DEFAULT_MICRO_BATCH,
                 recompute: str = theory.DEFAULT_RECOMPUTE, attention: str = DEFAULT_ATTENTION):
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
        self.seq = W.BoundedIntText(value=seq, min=self.SEQ_RANGE[0], max=self.SEQ_RANGE[1],
                                    description="sequence S", style=style, layout=lay)
        self.micro_batch = W.BoundedIntText(value=micro_batch, min=self.MICRO_BATCH_RANGE[0],
                                            max=self.MICRO_BATCH_RANGE[1], description="micro-batch B",
                                            style=style, layout=lay)
        self.recompute = W.Dropdown(options=list(RECOMPUTE), value=recompute, description="recompute",
                                    style=style, layout=lay)
        # fused: FlashAttention-style kernels store no s² scores (what trainers run); eager: the paper's count
        self.attention = W.Dropdown(options=list(ATTENTION), value=attention, description="attention",
                                    style=style, layout=lay)
        self.message = W.HTML()
        self.summary = W.HTML()
        self.note = W.HTML()
        self.table = W.HTML()
        self.plot = W.HTML()
        self.plot.add_class("zeroedu-explorer-plot")
        self.controls = [self.psi, self.n, self.m, self.recipe, self.strategy, self.gpu_gb, self.tp,
                         self.pp, self.offload, self.seq, self.micro_batch, self.recompute, self.attention]
        for w in self.controls:
            w.observe(self._on_change, names="value")
        self.updates = 0
        self._last_m = m  # the "M only affects hybrids" message follows a change of M
        self._muted = False
        self.last_update_seconds = 0.0
        self.data: dict = {}
        self.widget = W.VBox([
            W.HBox([W.VBox(self.controls[:5]), W.VBox(self.controls[5:9]), W.VBox(self.controls[9:])]),
            self.message, self.summary, self.note, self.plot, self.table,
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
                  "pp": (1, 64), "gpu_gb": self.GPU_GB_RANGE, "seq": self.SEQ_RANGE,
                  "micro_batch": self.MICRO_BATCH_RANGE}
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
                    v = checked_number(key, v, lo, hi, key not in ("psi", "gpu_gb"), notes)
                    if v is None:
                        ok = False
                        continue
                    w.value = v
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

    def shape(self) -> theory.TransformerShape:
        """The GPT shape the activations assume: L, h, a inferred from Ψ, S and B from the controls."""
        return theory.transformer_shape(self.psi.value, seq=self.seq.value, micro_batch=self.micro_batch.value)

    def flat_hybrid(self, s: str) -> bool:
        """A hybrid at M = 1: one domain, so it is flat ZeRO-3 over N (greyed in the views)."""
        return catalog.get_spec(s).hybrid and self.m.value == 1

    def compute(self) -> dict:
        """Everything the figure and table show, from the closed forms."""
        psi, n, m, rec = self.psi.value, self.n.value, self.m.value, self._recipe()
        tp, pp, off = self.tp.value, self.pp.value, self.offload.value
        gpu = self.gpu_gb.value * 1e9
        shape = self.shape()
        mem = viz.theory_memory(self.strategies, psi, n, m, rec, tp, pp, off)
        comm = viz.theory_comm(self.strategies, psi / (tp * pp), n, m, rec)
        out = {}
        for s in self.strategies:
            spec = catalog.get_spec(s)
            row = {"gpus": theory.gpu_count(s, n, m, tp, pp)}
            if isinstance(mem[s], dict):
                row.update(mem[s])
                d = theory.device_bytes(s, psi, n, m, rec, tp, pp, off, shape=shape,
                                        recompute=self.recompute.value, attention=self.attention.value)
                row.update(activations=float(d["activations"]), unit=float(d["gathered_unit"]),
                           device_total=float(d["total"]))
                row["fits"] = row["device_total"] <= gpu
            else:
                row["error"] = mem[s]
            if isinstance(comm[s], dict):
                row["comm"] = comm[s]
                c = theory.comm_per_rank(s, psi / (tp * pp), n, m, rec)
                row["comm_seconds"] = theory.comm_time(c)
            row["recipe"] = get_recipe(rec or spec.default_recipe).name
            out[s] = row
        return out

    def update(self, notes: list[str] | None = None) -> None:
        t0 = time.perf_counter()
        notes = list(notes or [])
        try:
            self.data = self.compute()
        except (ValueError, ZeroDivisionError, NotImplementedError) as e:
            message(self.message, f"rejected: {e}")
            return
        sel = self.strategy.value
        if "error" in self.data[sel]:
            notes.append(f"{sel}: {self.data[sel]['error']}")
        if self.m.value != self._last_m and self.m.value > 1 and not catalog.get_spec(sel).hybrid:
            notes.append(f"M = {self.m.value} only affects hybrid strategies (hsdp, hfsdp); {sel} ignores it")
        self._last_m = self.m.value
        message(self.message, "; ".join(notes))
        self._draw()
        self.summary.value = self._summary_html(sel)
        self.note.value = self._note_html()
        self.table.value = self._table_html()
        self.updates += 1
        self.last_update_seconds = time.perf_counter() - t0

    def _label(self, s: str) -> str:
        return f"{s} (M=1: fsdp1)" if self.flat_hybrid(s) else s

    def _draw(self) -> None:
        """Two stacked horizontal bar charts in HTML/CSS: a redraw costs microseconds, so the
        bars follow a slider as it is dragged (a matplotlib PNG takes tens of milliseconds)."""
        gpu = self.gpu_gb.value * 1e9
        sel = self._label(self.strategy.value)
        cats = list(viz.STATE_CATS)
        mem = {self._label(s): ({**{c: d[c] for c in cats}, "activation": d["activations"],
                                 "gathered": d["unit"]} if "total" in d else None)
               for s, d in self.data.items()}
        com = {self._label(s): ({c: d["comm"].get(c, 0.0) for c in theory.COLLECTIVES} if "comm" in d else None)
               for s, d in self.data.items()}
        self.plot.value = (
            '<div style="display:flex;gap:28px;flex-wrap:wrap">'
            + bar_chart_html(f"per GPU (device): model states + activations + gathered unit, "
                             f"Ψ = {_params(self.psi.value)}", mem, sel,
                             line=(gpu, f"GPU {self.gpu_gb.value:g} GB"))
            + bar_chart_html("bytes sent per GPU per step (ring model)", com, sel)
            + "</div>")

    def _summary_html(self, s: str) -> str:
        d = self.data[s]
        spec = catalog.get_spec(s)
        if "total" not in d:
            return f"<b>{s}</b>: {html.escape(d['error'])}"
        fit = (f'<span style="{OK_STYLE}">fits</span>' if d["fits"] else f'<span style="{BAD_STYLE}">does not fit</span>')
        host = f", host {viz.human_bytes(d['host'])}" if d["host"] else ""
        comm = viz.human_bytes(sum(d.get("comm", {}).values()))
        flat = " At M = 1 it is flat ZeRO-3 over N: set M &ge; 2 for a hybrid." if self.flat_hybrid(s) else ""
        return (f"<b>{s}</b> ({html.escape(spec.summary)}): {viz.human_bytes(d['device_total'])} per GPU "
                f"= model states {viz.human_bytes(d['total'])} + activations {viz.human_bytes(d['activations'])}"
                f" + gathered unit {viz.human_bytes(d['unit'])}{host}; {comm} sent per step, "
                f"{d.get('comm_seconds', 0) * 1e3:.1f} ms of communication alone (nothing overlapped, "
                f"default bandwidths); {fit} in {self.gpu_gb.value:g} GB.{flat}")

    def _note_html(self) -> str:
        sh = self.shape()
        grey = (" Greyed rows: hybrids at M = 1 (one domain) are flat ZeRO-3 over N; set M &ge; 2 to "
                "compare them." if self.m.value == 1 else
                f" M = {self.m.value} applies to the hybrids (hsdp, hfsdp: N·M GPUs); the other strategies "
                f"shard over N.")
        return (f'<span style="font-size:11px;color:#555">Activations: GPT shape inferred from Ψ '
                f"(L = {sh.layers}, h = {sh.hidden}, a = {sh.heads}, V = {sh.vocab}; GPT-3 family, "
                f"h = 128·L), S = {sh.seq}, B = {sh.micro_batch}, recompute = {self.recompute.value}, "
                f"attention = {self.attention.value}; "
                f"Korthikanti et al. 2022 (tp: no sequence parallelism; pp: the first stage). "
                f"Gathered unit: one unsharded layer or the embedding, ZeRO-3 family only.{grey}</span>")

    def _table_html(self) -> str:
        head = ["strategy", "GPUs", "param", "grad", "optim", "model states", "host", "activations",
                "gathered unit", "device total", "sent/step", "comm time, nothing overlapped",
                f"fits {self.gpu_gb.value:g} GB?"]
        rows = []
        for s, d in self.data.items():
            style = "background:#FFF3CD;" if s == self.strategy.value else ""
            style += "color:#999;" if self.flat_hybrid(s) else ""
            style = f' style="{style}"' if style else ""
            if "total" not in d:
                rows.append(f"<tr{style}><td>{html.escape(self._label(s))}</td><td>{d['gpus']}</td>"
                            f'<td colspan="{len(head) - 2}" title="{html.escape(d["error"])}">not applicable: '
                            f"{html.escape(_short(d['error']))}</td></tr>")
                continue
            else:
                cells = [self._label(s), str(d["gpus"])] + [viz.human_bytes(d[k]) for k in
                                                ("param", "grad", "optim", "total", "host",
                                                 "activations", "unit", "device_total")]
                cells += [viz.human_bytes(sum(d.get("comm", {}).values())),
                          f"{d.get('comm_seconds', 0) * 1e3:.1f} ms", "yes" if d["fits"] else "no"]
            rows.append(f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
        return ("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
                + "".join(rows) + "</tbody></table>")


def memory_explorer(**kw) -> MemoryExplorer:
    """Sliders over the closed forms for every strategy (see `MemoryExplorer`)."""
    return MemoryExplorer(**kw)
