"""What the dashboards share: a figure as PNG bytes, a red/green message line, HTML bar charts,
the checking of numbers set from Python."""
from __future__ import annotations

import html
import io
import math
from numbers import Real

import ipywidgets as W
from matplotlib.figure import Figure

from .. import viz

DEFAULT_RECIPE = "default (each strategy's own)"
OK_STYLE = "color:#2E7D32"
BAD_STYLE = "color:#C62828;font-weight:bold"


def png(fig: Figure, dpi: int = 72) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def message(widget: W.HTML, text: str, ok: bool = False) -> None:
    widget.value = f'<span style="{OK_STYLE if ok else BAD_STYLE}">{html.escape(text)}</span>' if text else ""


def bar_chart_html(title: str, data: dict[str, dict[str, float] | None], highlight: str | None = None,
                   line: tuple[float, str] | None = None, width_px: int = 330) -> str:
    """Horizontal stacked bars as HTML: one row per key of `data` ({segment: bytes}, or None for
    "not applicable"), segments coloured as in `zeroedu.notebook.viz`, an optional vertical marker line."""
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


def checked_number(key: str, v, lo: float, hi: float, integral: bool, notes: list[str]):
    """A control's new value from Python: None (and a note) when `v` is not a finite number of the
    right kind; clamped to [lo, hi] with a note when outside it. Shared by the explorers' `set`."""
    if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v) or (integral and v != int(v)):
        notes.append(f"{key} = {v!r} rejected: needs {'an integer' if integral else 'a number'}")
        return None
    if not lo <= v <= hi:
        notes.append(f"{key} = {v:g} clamped to [{lo:g}, {hi:g}]")
        v = min(max(v, lo), hi)
    return int(v) if integral else float(v)
