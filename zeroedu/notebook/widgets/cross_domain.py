"""An M (and N) slider over flat ZeRO-3 vs HSDP vs HFSDP across domains (closed forms)."""
from __future__ import annotations

import io

import ipywidgets as W

from ...theory.hybrid import cross_domain_table
from ..report import format_cross_domain_table
from ..viz import cross_domain_figure


def cross_domain_widget(psi=7e9, n: int = 8, m: int = 2, recipe=None):
    """An M slider (and N) over `cross_domain_table`: the text table and `cross_domain_figure`."""
    ms = W.IntSlider(value=m, min=1, max=16, description="M (domains)")
    ns = W.IntSlider(value=n, min=1, max=16, description="N (per domain)")
    table, image = W.HTML(), W.Image(format="png", layout=W.Layout(width="720px"))

    def update(_=None):
        rows = cross_domain_table(psi, ns.value, ms.value, recipe)
        table.value = f"<pre>{format_cross_domain_table(rows)}</pre>"
        buf = io.BytesIO()
        cross_domain_figure(psi, ns.value, ms.value, recipe).savefig(buf, format="png", dpi=72)
        image.value = buf.getvalue()

    for w in (ms, ns):
        w.observe(update, names="value")
    update()
    return W.VBox([W.HBox([ms, ns]), table, image])
