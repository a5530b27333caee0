"""Small helpers that notebooks 07-09 need and that nothing else in the package provides.

* `ownership_figure`: which rank owns which element of every parameter, under FSDP1's flat
  layout (one padded buffer per unit, cut into N equal chunks) and FSDP2's dim-0 layout
  (each parameter cut by rows, uneven last chunk). Drawn from `zeroedu.shard` only
  (`FlatLayout.param_slices`, `dim0_rows`), so the picture is the same index math the
  strategies and the closed forms use.
* `cross_domain_figure` / `cross_domain_widget`: `zeroedu.theory.hybrid.cross_domain_table`
  (flat ZeRO-3 over M·N vs HSDP vs HFSDP) as three bar panels, and under an M slider.
* `fsdp2_state_dict_job`: a rank job that trains FSDP2 for a few steps and then takes its
  *local* state dict (`FSDP2.local_state_dict`), recording how many bytes that sends (none),
  next to the gathered full parameters for comparison. `stitch_local_state_dicts` puts the
  N shards back together by their row offsets, the way a checkpoint loader would.

Nothing here implements a strategy; the figure and the job only read what the package computes.
"""
from __future__ import annotations

from fractions import Fraction

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from . import shard

RANK_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def _rank_color(r: int) -> str:
    return RANK_COLORS[r % len(RANK_COLORS)]


def _param_labels(unit_shapes) -> list[str]:
    return [f"unit {u} {'weight' if len(s) > 1 else 'bias'} {tuple(s)}"
            for u, unit in enumerate(unit_shapes) for s in unit]


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


def ownership_figure(unit_shapes, n: int) -> Figure:
    """Two panels, FSDP1 (flat) above FSDP2 (dim-0): one bar per parameter along its flattened
    elements, coloured by the rank that stores them; hatched blocks are padding (stored
    padding for the flat layout, wire-only padding for dim-0)."""
    labels = _param_labels(unit_shapes)
    panels = [("FSDP1: flat buffer per unit, padded to a multiple of N, N equal chunks",
               flat_ownership(unit_shapes, n)),
              ("FSDP2: every parameter cut on dim 0 (rows), chunk = ceil(rows/N); hatched = wire padding",
               dim0_ownership(unit_shapes, n))]
    fig = Figure(figsize=(8.0, 1.4 + 0.3 * len(labels) * 2), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    xmax = 1
    for ax, (title, own) in zip(axes, panels):
        for i, ranges in enumerate(own):
            for a, b, r in ranges:
                pad = r < 0
                rank = -1 - r if pad else r
                ax.add_patch(Rectangle((a, i - 0.35), b - a, 0.7, facecolor="white" if pad else _rank_color(rank),
                                       edgecolor=_rank_color(rank), hatch="///" if pad else None, linewidth=0.6))
                xmax = max(xmax, b)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        ax.set_title(title, fontsize=9)
    axes[-1].set_xlim(0, xmax * 1.02)
    axes[-1].set_xlabel("element of the parameter's flattened tensor (row-major)")
    handles = [Patch(facecolor=_rank_color(r), label=f"rank {r}") for r in range(n)]
    handles.append(Patch(facecolor="white", edgecolor="grey", hatch="///", label="padding"))
    axes[0].legend(handles=handles, fontsize=7, frameon=False, ncol=n + 1, loc="lower right")
    return fig


def cross_domain_figure(psi=7e9, n: int = 8, m: int = 2, recipe=None, bandwidth=None) -> Figure:
    """Bytes per rank, bytes crossing domains per rank per step, and communication seconds per
    step for the three layouts of `theory.hybrid.cross_domain_table` (closed forms only)."""
    from .theory.hybrid import cross_domain_table

    rows = cross_domain_table(psi, n, m, recipe, bandwidth)
    names = [r["layout"] for r in rows]
    fig = Figure(figsize=(8.0, 2.6), layout="constrained")
    axes = fig.subplots(1, 3)
    panels = (("model states per rank (GB)", [float(r["bytes_per_rank"]) / 1e9 for r in rows]),
              ("cross-domain bytes per rank/step (GB)", [float(r["cross_domain_per_rank"]) / 1e9 for r in rows]),
              ("communication per step (ms)", [1e3 * r["comm_seconds"] for r in rows]))
    for ax, (title, vals) in zip(axes, panels):
        ax.bar(range(len(rows)), vals, color=[_rank_color(i) for i in range(len(rows))])
        ax.set_xticks(range(len(rows)), names, fontsize=8)
        ax.set_title(title, fontsize=8)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.3g}", ha="center", va="bottom", fontsize=7)
    fig.suptitle(f"Ψ={float(psi):.3g}, {m} domains × {n} ranks", fontsize=9)
    return fig


def cross_domain_widget(psi=7e9, n: int = 8, m: int = 2, recipe=None):
    """An M slider (and N) over `cross_domain_table`: the text table and `cross_domain_figure`."""
    import io

    import ipywidgets as W

    from .theory.hybrid import cross_domain_table, format_table

    ms = W.IntSlider(value=m, min=1, max=16, description="M (domains)")
    ns = W.IntSlider(value=n, min=1, max=16, description="N (per domain)")
    table, image = W.HTML(), W.Image(format="png", layout=W.Layout(width="720px"))

    def update(_=None):
        rows = cross_domain_table(psi, ns.value, ms.value, recipe)
        table.value = f"<pre>{format_table(rows)}</pre>"
        buf = io.BytesIO()
        cross_domain_figure(psi, ns.value, ms.value, recipe).savefig(buf, format="png", dpi=72)
        image.value = buf.getvalue()

    for w in (ms, ns):
        w.observe(update, names="value")
    update()
    return W.VBox([W.HBox([ms, ns]), table, image])


def fsdp2_state_dict_job(ctx, cfg: dict) -> dict:
    """Train FSDP2 for cfg.steps on this rank, then take the local state dict and count the bytes
    that sent; `full_parameters()` (an all-gather) afterwards, for comparison."""
    from .comm import Comm
    from .ledger import Ledger
    from .models import local_slice, make_batch, make_model
    from .recipes import get_recipe
    from .strategies import build
    from .strategies.base import DistState
    from .train import config_from_dict

    cfg = config_from_dict(cfg)
    ledger = Ledger(ctx.rank)
    dist = DistState(ctx.rank, ctx.world_size, ctx.device, ctx.world_axis(), Comm(ledger), ledger)
    strat = build("fsdp2", make_model(cfg.model), dist, get_recipe(cfg.recipe), cfg.adam, **cfg.options)
    sl = local_slice(cfg.global_batch, ctx.world_size, ctx.rank)
    for step in range(cfg.steps):
        ledger.begin_step(step)
        x, y = make_batch(step, cfg.global_batch, cfg.model)
        strat.forward_backward(x[sl], y[sl])
        strat.step()

    def sent() -> Fraction:
        return sum((Fraction(c.sent) for c in ledger.comm), Fraction(0))

    before = sent()
    local = strat.local_state_dict()
    sd_sent = sent() - before
    full = strat.full_parameters()
    return {"rank": ctx.rank,
            "state_dict": {k: (row, t.float()) for k, (row, t) in local.items()},
            "state_dict_sent": float(sd_sent),
            "full_parameters_sent": float(sent() - before - sd_sent),
            "full": full if ctx.rank == 0 else None}


def stitch_local_state_dicts(per_rank: list[dict]) -> dict[str, torch.Tensor]:
    """Full tensors from N local FSDP2 state dicts: concatenate each parameter's shards in
    row-offset order (empty shards of trailing ranks contribute nothing)."""
    out = {}
    for name in per_rank[0]:
        parts = sorted((sd[name] for sd in per_rank), key=lambda rt: rt[0])
        out[name] = torch.cat([t for _, t in parts], dim=0)
    return out


__all__ = ["flat_ownership", "dim0_ownership", "ownership_figure", "cross_domain_figure",
           "cross_domain_widget", "fsdp2_state_dict_job",
           "stitch_local_state_dicts"]
