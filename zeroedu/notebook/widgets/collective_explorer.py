"""N, payload and implementation controls over the ring model: bytes each rank sends per collective."""
from __future__ import annotations

import ipywidgets as W

from ... import theory
from .. import viz
from .common import bar_chart_html

IMPLEMENTATIONS = {"ring": "ring (zeroedu's, NCCL's large messages)", "backend": "gloo's own"}


class CollectiveExplorer:
    """N, payload and implementation controls; the bytes each rank sends per collective, next to
    the naive "everyone sends to rank 0, rank 0 sends the sum back" scheme.

    `implementation="ring"` is the ring bound; `"backend"` is what gloo's own collectives put on
    the wire (`theory.comm.on_the_wire`): the same except the reduce-scatter, which gloo runs
    as an all-reduce with one chunk kept, 2(N-1)/N · S (measured in notebook 01)."""

    def __init__(self, n: int = 4, nbytes: float = 1e9, implementation: str = "ring"):
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {', '.join(IMPLEMENTATIONS)}, got {implementation!r}")
        self.n = W.IntSlider(value=n, min=1, max=1024, description="N ranks")
        self.nbytes = W.FloatLogSlider(value=nbytes, base=10, min=3, max=12, description="payload S",
                                       readout_format=".3g")
        self.implementation = W.ToggleButtons(options=[(v, k) for k, v in IMPLEMENTATIONS.items()],
                                              value=implementation, description="collectives")
        self.plot = W.HTML()
        self.updates = 0
        for w in (self.n, self.nbytes, self.implementation):
            w.observe(lambda ch: self.update(), names="value")
        self.widget = W.VBox([self.n, self.nbytes, self.implementation, self.plot])
        self.update()

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)

    def compute(self) -> dict:
        n, s = self.n.value, self.nbytes.value
        out = {}
        for c in theory.COLLECTIVES:
            op = theory.CommOp("world", c, "", s, n)
            out[c] = float(theory.comm.on_the_wire(theory.CommBytes([op], ("world",)), self.implementation.value))
        # naive all-reduce through one root: the root receives N-1 payloads and sends N-1 back
        out["naive all-reduce (root)"] = float((n - 1) * s)
        return out

    def update(self) -> None:
        d = self.compute()
        impl = IMPLEMENTATIONS[self.implementation.value]
        self.plot.value = bar_chart_html(
            f"bytes one rank sends, N={self.n.value}, S={viz.human_bytes(self.nbytes.value)}, {impl}",
            {k: {("all_reduce" if "naive" in k else k): v} for k, v in d.items()}, width_px=380)
        self.updates += 1


def collective_explorer(**kw) -> CollectiveExplorer:
    return CollectiveExplorer(**kw)
