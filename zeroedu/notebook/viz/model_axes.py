"""Figures of the model axes' splits (notebook 14): tensor parallelism's two matrices of a block's
MLP and context parallelism's causal block grid, plain and zig-zag, both drawn from the
algorithms' own rules (`theory.tensor_parallel`, `theory.context`); and a run's expert routing,
drawn from the router's counts its ranks reported."""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from .common import new_figure, outside_legend, rank_color


def _box(ax, x, y, w, h, color, label=None, gid=None, hatch=None):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="#333333", linewidth=0.6, hatch=hatch,
                           gid=gid))
    if label:
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=7)


def _arrow(ax, x0, x1, y, label):
    ax.add_patch(FancyArrowPatch((x0, y), (x1, y), arrowstyle="-|>", mutation_scale=9, linewidth=0.8,
                                 color="#333333"))
    ax.text((x0 + x1) / 2, y + 0.25, label, ha="center", va="bottom", fontsize=6.5)


def tensor_parallel_mlp(t: int = 2, sp: bool = False) -> Figure:
    """A block's MLP, Z = GELU(X·A)·B, over t tp ranks (Shoeybi et al. 2019, §3): A split by
    columns (column-parallel: rank i computes its own rh/t output features, GELU needs nothing
    from the others), B by rows (row-parallel: rank i multiplies its features by its rows of B,
    a partial Z), then one all-reduce sums the partials. Colors are ranks; grey is held whole by
    every rank. With sequence parallelism (Korthikanti et al. 2022, §4.2.2) X and Z are split by
    sequence: an all-gather before A, a reduce-scatter after B, the same bytes as the all-reduce
    (a reduce-scatter and an all-gather are its two halves)."""
    if not isinstance(t, int) or not 2 <= t <= 4:
        raise ValueError(f"t must be an integer in [2, 4], got {t!r}")
    fig = new_figure(7.6, 2.6)
    ax = fig.subplots()
    grey, H = "#DDDDDD", 3.0

    def rows(x, w, label, gid):  # split by sequence: one band per rank
        for i in range(t):
            _box(ax, x, H - (i + 1) * H / t, w, H / t, rank_color(i), gid=f"{gid}/r{i}")
        ax.text(x + w / 2, -0.35, label, ha="center", va="top", fontsize=7)

    x = 0.0
    if sp:
        rows(x, 1.0, "X, by sequence", "X")
        _arrow(ax, 1.1, 2.0, H / 2, "all-gather")
        x = 2.1
    _box(ax, x, 0, 1.0, H, grey, "X", gid="X/whole")
    ax.text(x + 0.5, -0.35, "X (s x h)\nevery rank", ha="center", va="top", fontsize=7)
    x += 1.3
    for i in range(t):  # A by columns
        _box(ax, x + i * 1.6 / t, 0, 1.6 / t, H, rank_color(i), f"A{i}" if t <= 3 else None, gid=f"A/r{i}")
    ax.text(x + 0.8, -0.35, "A (h x rh)\nby columns", ha="center", va="top", fontsize=7)
    x += 1.9
    for i in range(t):  # Y_i = GELU(X A_i): each rank's own features
        _box(ax, x + i * 1.6 / t, 0, 1.6 / t, H, rank_color(i), f"Y{i}" if t <= 3 else None, gid=f"Y/r{i}")
    ax.text(x + 0.8, -0.35, "GELU(X·Ai)\nno traffic", ha="center", va="top", fontsize=7)
    x += 1.9
    for i in range(t):  # B by rows
        _box(ax, x, H - (i + 1) * H / t, 1.0, H / t, rank_color(i), f"B{i}" if t <= 3 else None, gid=f"B/r{i}")
    ax.text(x + 0.5, -0.35, "B (rh x h)\nby rows", ha="center", va="top", fontsize=7)
    x += 1.6
    for i in range(t):  # each rank's partial Z, stacked as copies
        _box(ax, x + 0.12 * i, 0.12 * (t - 1 - i), 1.0, H - 0.12 * (t - 1), rank_color(i), gid=f"partial/r{i}",
             hatch="//")
    ax.text(x + 0.5, -0.35, "Yi·Bi: a partial\nZ on each rank", ha="center", va="top", fontsize=7)
    x += 1.1 + 0.12 * t
    if sp:
        _arrow(ax, x, x + 1.0, H / 2, "reduce-scatter")
        rows(x + 1.1, 1.0, "Z, by sequence", "Z")
        x += 2.1
    else:
        _arrow(ax, x, x + 1.0, H / 2, "all-reduce")
        _box(ax, x + 1.1, 0, 1.0, H, grey, "Z", gid="Z/whole")
        ax.text(x + 1.6, -0.35, "Z (s x h)\nevery rank", ha="center", va="top", fontsize=7)
        x += 2.1
    ax.set_xlim(-0.2, x + 0.1)
    ax.set_ylim(-1.3, H + 0.5)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"one block's MLP on tp = {t}" + (" with sequence parallelism" if sp else "")
                 + ": one collective forward (and one backward), of s·h activations", fontsize=8)
    outside_legend(ax, [Patch(facecolor=rank_color(i), label=f"tp rank {i}") for i in range(t)]
                   + [Patch(facecolor=grey, label="whole, on every rank")])
    return fig


def causal_blocks(cp: int, zigzag: bool) -> dict[int, list[tuple[int, int]]]:
    """The (query chunk, key chunk) pairs each rank computes under a causal mask, the sequence cut
    into 2cp chunks. Plain: rank r holds chunks 2r and 2r + 1 as one block, and the ring's key
    blocks are blocks of two chunks: it computes every key block not after its own, its diagonal
    block whole and then masked, as zeroedu does (4(r + 1) chunk pairs: the last rank cp times
    the first). Zig-zag: rank r holds chunks r and 2cp - 1 - r and computes, for each, the key
    chunks not after it (2cp + 1 pairs on every rank)."""
    if not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp must be an integer >= 1, got {cp!r}")
    if zigzag:
        return {r: [(q, k) for q in (r, 2 * cp - 1 - r) for k in range(q + 1)] for r in range(cp)}
    return {r: [(q, k) for q in (2 * r, 2 * r + 1) for k in range(2 * r + 2)] for r in range(cp)}


def zigzag_grid(cp: int = 4) -> Figure:
    """Causal attention's work over cp ranks, plain and zig-zag side by side: the sequence in 2cp
    chunks, query chunks down, key chunks across, a computed block colored by the rank that owns
    its queries (`causal_blocks`), hatched where it is computed and then masked. Plain chunks give
    the last rank cp times the first's pairs; zig-zag gives every rank 2cp + 1."""
    fig = new_figure(7.0, 3.3)
    axes = fig.subplots(1, 2)
    n = 2 * cp
    for ax, zz in zip(axes, (False, True)):
        work = causal_blocks(cp, zz)
        done = {(q, k) for pairs in work.values() for q, k in pairs}
        for r, pairs in work.items():
            for q, k in pairs:  # hatched: computed, then masked to nothing (keys after the queries)
                _box(ax, k, n - 1 - q, 1, 1, rank_color(r), gid=f"{'zigzag' if zz else 'plain'}/r{r}/q{q}/k{k}",
                     hatch="xx" if k > q else None)
        for q in range(n):
            for k in range(q + 1, n):
                if (q, k) not in done:  # masked and never computed
                    ax.add_patch(Rectangle((k, n - 1 - q), 1, 1, facecolor="white", edgecolor="#EEEEEE",
                                           linewidth=0.4))
        ax.set_xlim(0, n)
        ax.set_ylim(0, n)
        ax.set_aspect("equal")
        ax.set_xticks([c + 0.5 for c in range(n)], [str(c) for c in range(n)], fontsize=6)
        ax.set_yticks([n - 0.5 - q for q in range(n)], [str(q) for q in range(n)], fontsize=6)
        ax.tick_params(length=0)
        ax.set_xlabel("key chunk", fontsize=7)
        counts = ", ".join(str(len(work[r])) for r in range(cp))
        ax.set_title(f"{'zig-zag' if zz else 'plain'}: chunk pairs per rank {counts}", fontsize=8)
    axes[0].set_ylabel("query chunk", fontsize=7)
    outside_legend(axes[1], [Patch(facecolor=rank_color(r), label=f"cp rank {r}") for r in range(cp)]
                   + [Patch(facecolor="white", edgecolor="#333333", hatch="xx", label="computed, then masked")])
    return fig




def expert_routing(report, layer: int = 0) -> Figure:
    """Where each rank's token rows went in one MoE layer's dispatch, the last step, summed over
    its micro-batches (`reports.ExpertRouting.sent`, the router's own counts): a row per rank, a
    column per expert; outlined, the experts that rank holds (its rows stay home); the rest cross
    the wire in the all-to-all. The bytes follow the data: a rank's dispatch sends its off-rank
    rows times the row's bytes."""
    ranks = [r for r in report.ranks if r.routing is not None]
    if not ranks:
        raise ValueError("this run has no expert routing (train with --experts E --ep P)")
    experts = len(ranks[0].routing.sent[layer][0])
    fig = new_figure(1.0 + 0.55 * experts, 0.7 + 0.45 * len(ranks))
    ax = fig.subplots()
    top = max(1, max(sum(mb[e] for mb in r.routing.sent[layer]) for r in ranks for e in range(experts)))
    for i, r in enumerate(ranks):
        row = len(ranks) - 1 - i
        away = 0
        for e in range(experts):
            n = sum(mb[e] for mb in r.routing.sent[layer])
            home = e in r.routing.held
            away += 0 if home else n
            shade = 1 - 0.75 * n / top
            ax.add_patch(Rectangle((e, row), 1, 1, facecolor=(shade, shade, 1.0), gid=f"r{r.rank}/e{e}/{n}",
                                   edgecolor="#C44E52" if home else "#BBBBBB", linewidth=2.0 if home else 0.5))
            ax.text(e + 0.5, row + 0.5, str(n), ha="center", va="center", fontsize=7)
        ax.text(experts + 0.15, row + 0.5, f"{away} rows cross", va="center", fontsize=7)
    ax.set_xlim(0, experts + 2.2)
    ax.set_ylim(0, len(ranks))
    ax.set_xticks([e + 0.5 for e in range(experts)], [str(e) for e in range(experts)], fontsize=7)
    ax.set_yticks([len(ranks) - 0.5 - i for i in range(len(ranks))], [f"rank {r.rank}" for r in ranks], fontsize=7)
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    ax.set_xlabel("expert", fontsize=7)
    ax.set_title(f"layer {layer}'s dispatch, last step: rows each rank routed to each expert (red: held there)",
                 fontsize=8)
    return fig


__all__ = ["causal_blocks", "expert_routing", "tensor_parallel_mlp", "zigzag_grid"]
