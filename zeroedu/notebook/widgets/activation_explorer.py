"""Will it fit? Sliders for a GPT's shape and the batch, one stacked bar per strategy.

The shape is Megatron-style GPT (`theory.TransformerShape`): L layers, hidden size H, A heads,
sequence S, micro-batch B, recompute none / selective / full; its parameter count Ψ follows from
the shape (12H² + 13H per layer plus the tied embedding). Each bar is `theory.device_bytes`
for one GPU of N: the strategy's model states + the activations of one micro-batch
(Korthikanti et al. 2022, `theory.transformer_activation_bytes`) + the largest unit a
ZeRO-3-family strategy gathers; the dashed line is the GPU's memory. Pure closed forms, no ranks.

Bad input never raises into the notebook: `set()` clamps numbers to the sliders' ranges and
rejects values of the wrong kind, and a red line says which; a head count that does not divide
H is rejected and the bars keep their last good state.
"""
from __future__ import annotations

import html

import ipywidgets as W

from ... import theory
from ...theory.activations import ATTENTION, DEFAULT_ATTENTION, RECOMPUTE
from .. import viz
from .common import BAD_STYLE, OK_STYLE, bar_chart_html, checked_number, message

STRATEGIES = ("ddp", "zero1", "zero2", "megatron_distopt", "fsdp1")


class ActivationExplorer:
    """Sliders over S, B, L, H, A, recompute, N and the GPU size; `update()` redraws."""

    RANGES = {"seq": (128, 131072), "micro_batch": (1, 64), "layers": (1, 128), "hidden": (128, 16384),
              "heads": (1, 128), "n": (1, 1024), "gpu_gb": (1.0, 1024.0)}

    def __init__(self, seq: int = 4096, micro_batch: int = 1, layers: int = 32, hidden: int = 4096,
                 heads: int = 32, recompute: str = "selective", n: int = 8, gpu_gb: float = 80.0,
                 strategies=STRATEGIES, vocab: int = 50257, attention: str = DEFAULT_ATTENTION):
        self.strategies = list(strategies)
        self.vocab = vocab
        style = {"description_width": "120px"}
        lay = W.Layout(width="430px")
        R = self.RANGES
        self.seq = W.IntSlider(value=seq, min=R["seq"][0], max=R["seq"][1], step=128,
                               description="sequence S", style=style, layout=lay)
        self.micro_batch = W.IntSlider(value=micro_batch, min=R["micro_batch"][0], max=R["micro_batch"][1],
                                       description="micro-batch B", style=style, layout=lay)
        self.layers = W.IntSlider(value=layers, min=R["layers"][0], max=R["layers"][1],
                                  description="layers L", style=style, layout=lay)
        self.hidden = W.IntSlider(value=hidden, min=R["hidden"][0], max=R["hidden"][1], step=128,
                                  description="hidden H", style=style, layout=lay)
        self.heads = W.IntSlider(value=heads, min=R["heads"][0], max=R["heads"][1],
                                 description="heads A", style=style, layout=lay)
        self.recompute = W.ToggleButtons(options=list(RECOMPUTE), value=recompute, description="recompute",
                                         style={"description_width": "120px", "button_width": "80px"})
        # fused: FlashAttention-style kernels store no s² scores (what trainers run); eager: the paper's count
        self.attention = W.ToggleButtons(options=list(ATTENTION), value=attention, description="attention",
                                         style={"description_width": "120px", "button_width": "80px"})
        self.n = W.IntSlider(value=n, min=R["n"][0], max=256, description="N GPUs", style=style, layout=lay)
        self.gpu_gb = W.BoundedFloatText(value=gpu_gb, min=R["gpu_gb"][0], max=R["gpu_gb"][1], step=1.0,
                                         description="GPU memory GB", style=style, layout=lay)
        self.message = W.HTML()
        self.summary = W.HTML()
        self.plot = W.HTML()
        self.controls = [self.seq, self.micro_batch, self.layers, self.hidden, self.heads, self.recompute,
                         self.attention, self.n, self.gpu_gb]
        for w in self.controls:
            w.observe(self._on_change, names="value")
        self._muted = False
        self.updates = 0
        self.data: dict = {}
        self.widget = W.VBox([W.HBox([W.VBox(self.controls[:5]), W.VBox(self.controls[5:])]),
                              self.message, self.summary, self.plot])
        self.update()

    def _on_change(self, change):
        if not self._muted:
            self.update()

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)

    # ------------------------------------------------------------------ input
    def set(self, **values) -> bool:
        """Set controls from Python (or a test). Numbers outside a slider's range are clamped,
        values of the wrong kind rejected; `message` says which. True if everything applied."""
        notes, ok = [], True
        self._muted = True  # one update for the batch
        try:
            for key, v in values.items():
                w = getattr(self, key, None)
                if w not in self.controls:
                    notes.append(f"unknown control {key!r}")
                    ok = False
                    continue
                if key in ("recompute", "attention"):
                    allowed = RECOMPUTE if key == "recompute" else ATTENTION
                    if v not in allowed:
                        notes.append(f"{key} = {v!r} rejected: choose one of {', '.join(allowed)}")
                        ok = False
                        continue
                    w.value = v
                    continue
                lo, hi = self.RANGES[key]
                if key == "n":
                    hi = w.max
                integral = key != "gpu_gb"
                v = checked_number(key, v, lo, hi, integral, notes)
                if v is None:
                    ok = False
                    continue
                step = getattr(w, "step", 1)
                if integral and step > 1 and v % step:
                    rounded = max(lo, round(v / step) * step)
                    notes.append(f"{key} = {v:g} rounded to {rounded} (a multiple of {step})")
                    v = rounded
                w.value = int(v) if integral else float(v)
        finally:
            self._muted = False
        self.update(notes)
        return ok and not self._bad_shape()

    def _bad_shape(self) -> str:
        h, a = self.hidden.value, self.heads.value
        return "" if h % a == 0 else f"heads A = {a} rejected: hidden H = {h} is not divisible by it"

    # ------------------------------------------------------------------ closed forms
    def shape(self) -> theory.TransformerShape:
        return theory.transformer_shape(1.0, layers=self.layers.value, hidden=self.hidden.value,
                                        heads=self.heads.value, seq=self.seq.value,
                                        micro_batch=self.micro_batch.value, vocab=self.vocab)

    def compute(self) -> dict:
        """Per strategy: model states, activations, gathered unit, total (bytes), fits (bool)."""
        sh = self.shape()
        psi, n, gpu = sh.params, self.n.value, self.gpu_gb.value * 1e9
        out = {}
        for s in self.strategies:
            d = theory.device_bytes(s, psi, n, shape=sh, recompute=self.recompute.value,
                                    attention=self.attention.value)
            ms = d["model_states"]
            out[s] = {"param": float(ms.param), "grad": float(ms.grad), "optim": float(ms.optim),
                      "states": float(ms.total), "activations": float(d["activations"]),
                      "unit": float(d["gathered_unit"]), "total": float(d["total"]),
                      "fits": float(d["total"]) <= gpu}
        return out

    def update(self, notes: list[str] | None = None) -> None:
        notes = list(notes or [])
        bad = self._bad_shape()
        if bad:
            message(self.message, "; ".join(notes + [bad + " (the bars keep the last good shape)"]))
            return
        try:
            self.data = self.compute()
        except (ValueError, ZeroDivisionError) as e:
            message(self.message, "; ".join(notes + [f"rejected: {e}"]))
            return
        message(self.message, "; ".join(notes))
        sh = self.shape()
        gpu = self.gpu_gb.value * 1e9
        bars = {s: {"param": d["param"], "grad": d["grad"], "optim": d["optim"], "activation": d["activations"],
                    "gathered": d["unit"]} for s, d in self.data.items()}
        self.plot.value = bar_chart_html(
            f"one GPU of N = {self.n.value}: model states + activations + gathered unit", bars,
            line=(gpu, f"GPU {self.gpu_gb.value:g} GB"), width_px=420)
        act = theory.transformer_activation_bytes(sh, self.recompute.value, attention=self.attention.value)
        fits = [s for s, d in self.data.items() if d["fits"]]
        verdict = (f'<span style="{OK_STYLE}">fits: {html.escape(", ".join(fits))}</span>' if fits
                   else f'<span style="{BAD_STYLE}">no strategy fits</span>')
        self.summary.value = (
            f"Ψ = {sh.params / 1e9:.3g}B parameters (L = {sh.layers}, H = {sh.hidden}, A = {sh.heads}, "
            f"V = {sh.vocab}); activations {viz.human_bytes(act['total'])} per micro-batch of B = {sh.micro_batch} "
            f"× S = {sh.seq} ({html.escape(act['formula'].split(': ')[-1].split(' per layer')[0])} per layer, "
            f"recompute {self.recompute.value}, {self.attention.value} attention); {verdict} in {self.gpu_gb.value:g} GB.")
        self.updates += 1


def activation_explorer(**kw) -> ActivationExplorer:
    """Sliders for S, B, L, H, A and recompute over 'does it fit?' (see `ActivationExplorer`)."""
    return ActivationExplorer(**kw)
