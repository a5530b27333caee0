"""Who owns which element: FSDP1's flat layout vs FSDP2's dim-0 layout, drawn from `zeroedu.shard`.

`flat_ownership` / `dim0_ownership` list, for every parameter, which rank stores which element
range (and which ranges are padding), using only `shard.FlatLayout.param_slices` and
`shard.dim0_rows`: the picture is the same index math the strategies and the closed forms use.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from ... import shard
from .common import rank_color


def _param_labels(unit_shapes, names=None, unit_ids=None) -> list[str]:
    ids = list(range(len(unit_shapes))) if unit_ids is None else list(unit_ids)
    out = []
    for k, (u, unit) in enumerate(zip(ids, unit_shapes)):
        for j, s in enumerate(unit):
            what = names[k][j] if names is not None else ("weight" if len(s) > 1 else "bias")
            out.append(f"unit {u} {what} {tuple(s)}")
    return out


def flat_ownership(unit_shapes, n: int) -> list[list[tuple[int, int, int]]]:
    """Per parameter (all units in order): (start, end, rank) element ranges of its flattened
    tensor, from `FlatLayout.param_slices` (per-parameter range of each rank's slice); the
    unit's padding is appended to the unit's last parameter as (start, end, -1 - rank)."""
    out = []
    for unit in unit_shapes:
        layout = shard.FlatLayout(unit, n)
        per = [[] for _ in unit]
        for r in range(n):
            for s in layout.param_slices(r):
                per[s.index].append((s.param.start, s.param.end, r))
        last = len(unit) - 1
        base = layout.numels[last]
        for r in range(n):  # padding positions [numel, padded) belong to the last rank(s)
            pad = layout.shard_range(r).intersect(shard.Range(layout.numel, layout.padded_numel))
            if pad.size:
                per[last].append((base + pad.start - layout.numel, base + pad.end - layout.numel, -1 - r))
        out += [sorted(p) for p in per]
    return out


def dim0_ownership(unit_shapes, n: int) -> list[list[tuple[int, int, int]]]:
    """Per parameter: (start, end, rank) element ranges under dim-0 sharding (`shard.dim0_rows`);
    the rows a short chunk is padded with on the wire appear as (start, end, -1 - rank)."""
    out = []
    for unit in unit_shapes:
        for s in unit:
            cols = shard.numel(s[1:])
            c = shard.dim0_chunk_rows(s[0], n)
            per, wire = [], shard.numel(s)
            for r in range(n):
                rows = shard.dim0_rows(s[0], n, r)
                if rows.size:
                    per.append((rows.start * cols, rows.end * cols, r))
                missing = c - rows.size  # rows this rank sends as zeros in an all-gather
                if missing:
                    per.append((wire, wire + missing * cols, -1 - r))
                    wire += missing * cols
            out.append(per)
    return out


def ownership_figure(unit_shapes, n: int, *, units=None, names=None, relative: bool = False) -> Figure:
    """Two panels, FSDP1 (flat) above FSDP2 (dim-0): one bar per parameter along its flattened
    elements, coloured by the rank that stores them; hatched blocks are padding (stored
    padding for the flat layout, wire-only padding for dim-0).

    `units`: indices of the units to draw (default all; FSDP1's flat layout is per unit, so a
    unit is drawn whole or not at all). `names`: per unit, its parameters' names, for the labels.
    `relative=True` draws every bar as a fraction of its own parameter (x from 0 to 1, padding
    beyond 1), so that a 256-element LayerNorm weight is as visible as a 262,144-element matrix."""
    ids = list(range(len(unit_shapes))) if units is None else list(units)
    shapes = [unit_shapes[u] for u in ids]
    if names is not None:
        names = [names[u] for u in ids]
    labels = _param_labels(shapes, names, ids)
    numels = [shard.numel(s) for unit in shapes for s in unit]
    panels = [("FSDP1: flat buffer per unit, padded to a multiple of N, N equal chunks",
               flat_ownership(shapes, n)),
              ("FSDP2: every parameter cut on dim 0 (rows), chunk = ceil(rows/N); hatched = wire padding",
               dim0_ownership(shapes, n))]
    fig = Figure(figsize=(8.0, 1.4 + 0.3 * len(labels) * 2), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    xmax = 1
    for ax, (title, own) in zip(axes, panels):
        for i, ranges in enumerate(own):
            scale = numels[i] if relative else 1
            for a, b, r in ranges:
                pad = r < 0
                rank = -1 - r if pad else r
                ax.add_patch(Rectangle((a / scale, i - 0.35), (b - a) / scale, 0.7,
                                       facecolor="white" if pad else rank_color(rank),
                                       edgecolor=rank_color(rank), hatch="///" if pad else None, linewidth=0.6))
                xmax = max(xmax, b / scale)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        ax.set_title(title, fontsize=9)
    axes[-1].set_xlim(0, xmax * 1.02)
    axes[-1].set_xlabel("fraction of the parameter's elements (flattened, row-major)" if relative
                        else "element of the parameter's flattened tensor (row-major)")
    handles = [Patch(facecolor=rank_color(r), label=f"rank {r}") for r in range(n)]
    handles.append(Patch(facecolor="white", edgecolor="grey", hatch="///", label="padding"))
    fig.legend(handles=handles, fontsize=7, frameon=False, ncol=n + 1, loc="outside lower center")
    return fig
