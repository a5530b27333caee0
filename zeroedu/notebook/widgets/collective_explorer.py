"""N and payload sliders over the ring model: bytes each rank sends per collective."""
from __future__ import annotations

import ipywidgets as W

from ... import theory
from .. import viz
from .common import bar_chart_html

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
