"""Flat ZeRO-3 vs HSDP vs HFSDP across domains (closed forms), with the time model's assumptions
as controls: M and N, NICs per node, the bandwidth one NIC achieves, and how flat ZeRO-3's ring
crosses the domain boundary (`theory.hybrid`: one lockstep ring over one NIC, or rings striped
over all the node's NICs)."""
from __future__ import annotations

import html

import ipywidgets as W

from ...theory.hybrid import FLAT_RINGS, cross_domain_table
from ..viz.theory import cross_domain_figure
from .common import message, png

RING_LABELS = {"single": "one lockstep ring (paced by one NIC)", "striped": "striped over the node's NICs"}


class CrossDomainWidget:
    """Sliders over `cross_domain_table`; `update()` recomputes the table and the figure."""

    def __init__(self, psi=7e9, n: int = 8, m: int = 2, recipe=None, nics_per_node: int | None = None,
                 nic_gbps: float = 50.0, flat_ring: str = "single"):
        style = {"description_width": "130px"}
        lay = W.Layout(width="380px")
        self.psi, self.recipe = psi, recipe
        self.m = W.IntSlider(value=m, min=1, max=16, description="M (domains)", style=style, layout=lay)
        self.n = W.IntSlider(value=n, min=1, max=16, description="N (GPUs per domain)", style=style, layout=lay)
        self.nics = W.IntSlider(value=n if nics_per_node is None else nics_per_node, min=1, max=16,
                                description="NICs per node", style=style, layout=lay)
        self.nic_gbps = W.FloatSlider(value=nic_gbps, min=5.0, max=100.0, step=1.0, readout_format=".0f",
                                      description="NIC GB/s (achieved)", style=style, layout=lay)
        self.flat_ring = W.Dropdown(options=[(RING_LABELS[k], k) for k in FLAT_RINGS], value=flat_ring,
                                    description="flat ZeRO-3 ring", style=style, layout=lay)
        self.message, self.table = W.HTML(), W.HTML()
        self.image = W.Image(format="png", layout=W.Layout(width="760px"))
        self.rows: list[dict] = []
        for w in (self.m, self.n, self.nics, self.nic_gbps, self.flat_ring):
            w.observe(lambda _c: self.update(), names="value")
        self.widget = W.VBox([W.HBox([W.VBox([self.m, self.n, self.flat_ring]), W.VBox([self.nics, self.nic_gbps])]),
                              self.message, self.table, self.image])
        self.update()

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)

    def model(self) -> dict:
        return {"nics_per_node": self.nics.value, "nic_bandwidth": self.nic_gbps.value * 1e9}

    def update(self) -> None:
        try:
            self.rows = cross_domain_table(self.psi, self.n.value, self.m.value, self.recipe,
                                           flat_ring=self.flat_ring.value, **self.model())
            fig = cross_domain_figure(self.psi, self.n.value, self.m.value, self.recipe, **self.model())
        except ValueError as e:
            message(self.message, f"rejected: {e}")
            return
        message(self.message, "")
        self.table.value = self._table_html()
        self.image.value = png(fig)

    def _table_html(self) -> str:
        head = ["layout", "ranks", "model states / rank", "sent / rank / step", "crosses domains / rank",
                f"comm. ms ({html.escape(RING_LABELS[self.flat_ring.value])})"]
        body = "".join(
            "<tr>" + "".join(f"<td>{c}</td>" for c in (
                r["layout"], r["world_size"], f"{float(r['bytes_per_rank']) / 1e9:.3f} GB",
                f"{float(r['sent_per_rank']) / 1e9:.3f} GB", f"{float(r['cross_domain_per_rank']) / 1e9:.3f} GB",
                f"{1e3 * r['comm_seconds']:.1f}")) + "</tr>" for r in self.rows)
        note = (f'<div style="font-size:11px;color:#555">Time model: bandwidth terms only, nothing overlapped; '
                f"NVLink 450 GB/s per GPU inside a domain; {self.nics.value} NICs per node at "
                f"{self.nic_gbps.value:g} GB/s each (400 Gb/s is 50 GB/s on the line; NCCL measures 46-48 GB/s "
                "per NDR NIC); the hybrids' outer all-reduce shares the node's NICs among its N ranks.</div>")
        return ("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
                + body + "</tbody></table>" + note)


def cross_domain_widget(psi=7e9, n: int = 8, m: int = 2, recipe=None, **kw) -> CrossDomainWidget:
    """M, N, NIC and ring-reading controls over `cross_domain_table` (see `CrossDomainWidget`)."""
    return CrossDomainWidget(psi, n, m, recipe, **kw)
