"""Figures of the closed forms (`zeroedu.theory`): what each GPU holds and sends, predicted; and
two that set runs beside them: bytes per mesh axis, ring model vs the wire (`axis_bytes_bars`),
and bytes and time per step as N grows (`scaling_figure`, from quick runs or from
benchmarks/results/scaling.json)."""
from __future__ import annotations

from typing import Sequence

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from ... import catalog, theory
from ...kinds import EventKind
from ...recipes import get_recipe
from ...theory.hybrid import cross_domain_table
from ...fmt import params
from .common import COLORS, STATE_CATS, byte_scale, human_bytes, new_figure, outside_legend, rank_color
from ...reports import RunReport

def sharding_diagram(strategy: str, n: int = 4, m: int = 1, recipe: str | None = None,
                     max_gpus: int = 8) -> Figure:
    """What each GPU keeps of param / grad / optimizer state: a bar per category per GPU, cut
    into N segments; a filled segment is stored on that GPU, a hollow one lives elsewhere.

    Sharding comes from the strategy's ZeRO levels in `zeroedu.catalog` (the same state the run
    uses), the per-GPU bytes printed under each GPU from `theory.model_states` per Ψ."""
    spec = catalog.get_spec(strategy)
    rec = get_recipe(recipe or spec.default_recipe)
    m = m if spec.hybrid else 1
    ms = theory.model_states(spec.name, 1, n, m, rec.name)  # bytes per parameter
    inner, outer = catalog.shards(spec.inner), catalog.shards(spec.outer)
    world = n * m
    shown = min(world, max_gpus)
    fig = new_figure(max(6.5, 1.2 + 1.15 * shown), 3.4)
    ax = fig.add_subplot()
    segs = n * m if spec.hybrid else n
    per_cat = {"param": rec.param_bytes, "grad": rec.grad_bytes, "optim": rec.optim_bytes}
    # Drawn to scale: each bar's height is its bytes per parameter (2 + 2 + 12 in mixed
    # precision), so the optimizer state is seen to be most of the memory, and what sharding it saves.
    tallest = max(per_cat.values())
    for g in range(shown):
        domain, r = divmod(g, n)  # inner ranks are contiguous (catalog / cluster.mesh)
        for j, cat in enumerate(STATE_CATS):
            x0 = g * 1.15 + j * 0.33
            h = per_cat[cat] / tallest
            on_inner, on_outer = inner[cat], spec.hybrid and outer[cat]
            for s in range(segs):
                # segment s of the flat buffer: inner shard s // m, and within it outer piece s % m
                s_inner, s_outer = divmod(s, m) if spec.hybrid else (s, 0)
                mine = (not on_inner or s_inner == r) and (not on_outer or s_outer == domain)
                y0 = s / segs * h
                ax.add_patch(Rectangle((x0, y0), 0.28, h / segs, facecolor=COLORS[cat] if mine else "white",
                                       edgecolor=COLORS[cat], linewidth=0.6,
                                       gid=f"gpu{g}/{cat}/{'held' if mine else 'elsewhere'}"))
        ax.text(g * 1.15 + 0.47, -0.08, f"GPU {g}", ha="center", va="top", fontsize=8)
    ax.set_xlim(-0.1, shown * 1.15)
    ax.set_ylim(-0.38, 1.02)
    ax.axis("off")
    total = float(ms.total)
    ax.set_title(f"{spec.name}, N={n}" + (f", M={m}" if spec.hybrid else "") +
                 f", {rec.name}: {total:.4g} bytes per parameter on each GPU\n"
                 f"= param {float(ms.param):.3g} + grad {float(ms.grad):.3g} + optim {float(ms.optim):.3g}"
                 f"   (a full replica would be {rec.total_bytes})", fontsize=9)
    handles = [Patch(facecolor=COLORS[c], label=f"{c} ({per_cat[c]} B/param)") for c in STATE_CATS]
    handles.append(Patch(facecolor="white", edgecolor="grey", label="held by another GPU"))
    ax.legend(handles=handles, loc="lower center", ncol=4, fontsize=7, frameon=False)
    if shown < world:
        ax.text(shown * 1.15, -0.08, f"(first {shown} of {world} GPUs)", fontsize=7, ha="right", va="top")
    return fig


def ring_schedule(n: int) -> list[dict]:
    """The ring all-reduce the course writes by hand (lab 1's reduce-scatter, then
    `runtime.collectives.ring_all_gather_by_hand`: each rank sends to its right neighbour r+1 and
    receives from its left, r-1), step by step: the reduce-scatter's N-1 steps, then the
    all-gather's N-1. zeroedu's runtime ring (`runtime.ring`) runs the mirror image, sending left
    in gloo's order, with the same bytes. Each entry holds `phase`, `step` (1-based), `holds`
    (rank -> chunk -> the ranks whose contributions it holds) after the step, and `sent` (rank ->
    the chunk it sent in the step). Entry 0 is the start."""
    holds = [[{r} for _ in range(n)] for r in range(n)]
    out = [{"phase": "start", "step": 0, "holds": [[set(c) for c in row] for row in holds], "sent": {}}]
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(n - 1):
            # reduce-scatter: rank r passes on its partial sum of chunk r-1-s, to which its right
            # neighbour adds its own part (chunk c starts at rank c+1 and ends, whole, at rank c);
            # all-gather: rank r passes on the full chunk r-s
            sent = {r: (r - 1 - s) % n if phase == "reduce-scatter" else (r - s) % n for r in range(n)}
            new = [[set(c) for c in row] for row in holds]
            for r, c in sent.items():
                right = (r + 1) % n
                new[right][c] = new[right][c] | holds[r][c] if phase == "reduce-scatter" else set(holds[r][c])
            holds = new
            out.append({"phase": phase, "step": s + 1, "holds": [[set(c) for c in row] for row in holds],
                        "sent": sent})
    return out


RING_SEND = "#C44E52"  # what moves in a step: the arrow and the outline of the cell it lands in


def ring_steps(n: int = 4) -> Figure:
    """The ring all-reduce drawn step by step (`ring_schedule`): one panel per step, a grid of
    ranks (rows) by chunks (columns), each cell shaded by how many ranks' contributions it holds
    (the legend names each shade; dark: the full sum). An arrow (gid ``step{k}/send/r{r}/c{c}``)
    goes from each sender's chunk to the same chunk one row down, its right neighbour r+1 (the
    last rank's wraps round to rank 0), and the cell it lands in is outlined. After the
    reduce-scatter's N-1 steps each rank holds one chunk's full sum; after the all-gather's N-1
    steps every rank holds all of them. Every rank sends one chunk, S/N, a step: 2(N-1)/N · S in all."""
    if not isinstance(n, int) or not 2 <= n <= 8:
        raise ValueError(f"n must be an integer in [2, 8], got {n!r}")
    sched = ring_schedule(n)
    fig = new_figure(1.25 * len(sched) + 0.4, 2.35)
    axes = fig.subplots(1, len(sched))
    # 1 .. N-1 contributions: light to mid blue; the full sum (N): dark
    shade = [(k - 1) / max(n - 2, 1) for k in range(1, n)]
    cmap = [f"#{int(238 - 110 * t):02X}{int(242 - 82 * t):02X}FF" for t in shade]
    full_color = "#1F3F8F"
    for k, (ax, st) in enumerate(zip(axes, sched)):
        got = {(r + 1) % n: c for r, c in st["sent"].items()}  # the receiver's new chunk
        for r in range(n):
            for c in range(n):
                held = len(st["holds"][r][c])
                ax.add_patch(Rectangle((c, n - 1 - r), 1, 1, facecolor=full_color if held == n else cmap[held - 1],
                                       edgecolor=RING_SEND if got.get(r) == c else "#BBBBBB",
                                       linewidth=1.8 if got.get(r) == c else 0.5,
                                       gid=f"step{k}/r{r}/c{c}/{held}"))
        for r, c in st["sent"].items():
            to = (r + 1) % n
            wrap = to < r  # the last rank's send goes round to rank 0: drawn bowed beside the column
            ax.annotate("", xy=(c + 0.5, n - 1 - to + 0.5), xytext=(c + 0.5, n - 1 - r + 0.5),
                        arrowprops=dict(arrowstyle="-|>", color=RING_SEND, lw=0.9, shrinkA=2, shrinkB=2,
                                        connectionstyle=f"arc3,rad={-0.5 if wrap else 0.0}"),
                        gid=f"step{k}/send/r{r}/c{c}")
        ax.set_xlim(0, n)
        ax.set_ylim(0, n)
        ax.set_aspect("equal")
        ax.set_xticks([c + 0.5 for c in range(n)], [str(c) for c in range(n)], fontsize=6)
        ax.set_yticks([n - 0.5 - r for r in range(n)], [f"r{r}" for r in range(n)], fontsize=6)
        ax.tick_params(length=0)
        title = "start" if st["phase"] == "start" else f"{st['phase']}\nstep {st['step']}"
        ax.set_title(title, fontsize=7)
    axes[0].set_ylabel("rank", fontsize=7)
    axes[0].set_xlabel("chunk (each S/N)", fontsize=6)
    handles = [Patch(facecolor=cmap[h - 1], edgecolor="#BBBBBB",
                     label="its own part only" if h == 1 else f"{h} ranks' parts summed") for h in range(1, n)]
    handles.append(Patch(facecolor=full_color, label=f"all {n}: the full sum"))
    handles.append(Line2D([], [], color=RING_SEND, marker=">", lw=0.9,
                          label="sent this step, to the right neighbour (outlined where it lands)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 3), fontsize=6, frameon=False)
    return fig


def _strategy_list(strategies: Sequence[str] | None) -> list[str]:
    return list(strategies) if strategies else list(catalog.STRATEGIES)


def theory_memory(strategies, psi, n, m=1, recipe=None, tp=1, pp=1, offload="none"):
    """{strategy: {"param", "grad", "optim", "total", "host"} bytes on one GPU, or an error string}.

    Each strategy uses `recipe`, or its own default recipe when `recipe` is None."""
    out = {}
    for s in _strategy_list(strategies):
        try:
            if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or \
                    isinstance(pp, bool) or not isinstance(pp, int) or pp < 1:
                raise ValueError(f"tp and pp must be integers >= 1, got {tp!r}, {pp!r}")
            # with TP/PP each data-parallel rank first holds Ψ/(tp·pp) (theory.compose)
            part = theory.offload(s, theory.inputs.check_psi(psi) / (tp * pp), n, m, recipe, offload)
            dev, host = part["device"], part["host"]
            out[s] = {"param": float(dev.param), "grad": float(dev.grad), "optim": float(dev.optim),
                      "total": float(dev.total), "host": float(host.total)}
        except (ValueError, NotImplementedError) as e:
            out[s] = str(e)
    return out


def theory_memory_bars(strategies=None, psi=7e9, n=8, m=1, recipe=None, gpu_bytes=None,
                       tp=1, pp=1, offload="none", highlight: str | None = None) -> Figure:
    """Stacked bars: device bytes per GPU by category for each strategy (closed forms). With
    `offload`, a hatched bar beside each (gid ``host/{strategy}``) holds what that GPU's share
    puts in the host's memory, the other half of the trade. The GPU's capacity (`gpu_bytes`) is a
    line when the bars come near it; when they are all far below, the axis follows the bars and
    a note says how far, so small bars are still read."""
    data = theory_memory(strategies, psi, n, m, recipe, tp, pp, offload)
    names = list(data)
    host = offload != "none"
    fig = new_figure(max(5.0, (0.9 if host else 0.62) * len(names) + 1.5) + (1.6 if host else 0.0), 3.2)
    ax = fig.add_subplot()
    ok = {s: d for s, d in data.items() if isinstance(d, dict)}
    top = max([d["total"] for d in ok.values()] + [d["host"] for d in ok.values() if host] + [1.0])
    near = bool(gpu_bytes) and gpu_bytes <= 1.5 * top
    div, unit = byte_scale([top] + ([gpu_bytes] if near else []))
    width, shift = (0.38, 0.2) if host else (0.7, 0.0)
    for i, s in enumerate(names):
        d = data[s]
        if not isinstance(d, dict):
            ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=7, color="grey")
            continue
        bottom = 0.0
        for cat in STATE_CATS:
            ax.bar(i - shift, d[cat] / div, bottom=bottom, color=COLORS[cat], width=width,
                   edgecolor="black" if s == highlight else None, linewidth=1.5 if s == highlight else 0)
            bottom += d[cat] / div
        if host:
            ax.bar(i + shift, d["host"] / div, width=width, facecolor="white", edgecolor="#555555", hatch="///",
                   linewidth=0.8, gid=f"host/{s}")
            ax.annotate(f"{d['host'] / div:.3g}", (i + shift, d["host"] / div), ha="center", va="bottom", fontsize=6)
        ax.annotate(f"{bottom:.3g}", (i - shift, bottom), ha="center", va="bottom", fontsize=6)
    if near:
        ax.axhline(gpu_bytes / div, color="red", linestyle="--", linewidth=1)
        ax.text(len(names) - 0.5, gpu_bytes / div, f"GPU {human_bytes(gpu_bytes)}", color="red",
                ha="right", va="bottom", fontsize=7)
        ax.set_ylim(0, 1.12 * max(top, gpu_bytes) / div)
    else:
        ax.set_ylim(0, 1.18 * top / div)
        if gpu_bytes:
            largest = max(d["total"] for d in ok.values()) if ok else 0.0
            ax.text(0.99, 0.97, f"the GPU holds {human_bytes(gpu_bytes)}: the largest bar uses "
                    f"{largest / gpu_bytes:.0%} of it", transform=ax.transAxes, ha="right", va="top", fontsize=7,
                    color="red", gid="capacity note")
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel(f"{unit} per GPU")
    ax.set_title(f"model states per GPU: Ψ = {params(psi)}, N = {n}" + (f", M = {m}" if m > 1 else "") + (f", tp={tp}, pp={pp}" if tp * pp > 1 else "")
                 + (f", offload={offload}" if offload != "none" else ""), fontsize=9)
    handles = [Patch(color=COLORS[c], label=f"{c} (on the GPU)" if host else c) for c in STATE_CATS]
    if host:
        handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="///", label="on the host (CPU memory)"))
    outside_legend(ax, handles)
    return fig


def theory_comm(strategies, psi, n, m=1, recipe=None, reshard_after_forward=True):
    """{strategy: {collective: bytes sent per GPU per step} | error string}."""
    out = {}
    for s in _strategy_list(strategies):
        try:
            c = theory.comm_per_rank(s, psi, n, m, recipe, reshard_after_forward)
            out[s] = {k: float(v) for k, v in c.by_collective().items()}
        except (ValueError, NotImplementedError) as e:
            out[s] = str(e)
    return out


def theory_comm_bars(strategies=None, psi=7e9, n=8, m=1, recipe=None, highlight: str | None = None,
                     reshard_after_forward=True) -> Figure:
    """Stacked bars: bytes each GPU sends per step, by collective (ring model, closed forms)."""
    data = theory_comm(strategies, psi, n, m, recipe, reshard_after_forward)
    names = list(data)
    fig = new_figure(max(5.0, 0.62 * len(names) + 1.5), 3.2)
    ax = fig.add_subplot()
    div, unit = byte_scale([sum(v.values()) for v in data.values() if isinstance(v, dict)])
    for i, s in enumerate(names):
        d = data[s]
        if not isinstance(d, dict):
            continue
        bottom = 0.0
        for c in theory.COLLECTIVES:
            v = d.get(c, 0.0) / div
            ax.bar(i, v, bottom=bottom, color=COLORS[c], width=0.7,
                   edgecolor="black" if s == highlight else None, linewidth=1.5 if s == highlight else 0)
            bottom += v
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel(f"{unit} sent per GPU per step")
    ax.set_title(f"communication per step (ring model): Ψ = {params(psi)}, N = {n}" + (f", M = {m}" if m > 1 else ""), fontsize=9)
    ax.legend(handles=[Patch(color=COLORS[c], label=c) for c in theory.COLLECTIVES], fontsize=7,
              frameon=False)
    return fig


def ring_scaling(nbytes: float, n_max: int = 16, measured: dict | None = None,
                 title: str | None = None, measured_label: str = "measured on real ranks") -> Figure:
    """Bytes one rank sends for a payload of `nbytes` as the group grows (ring model): an
    all-reduce tends to 2S, a reduce-scatter or an all-gather to S, whatever N is.
    `measured` = {n: {collective: bytes}} adds points from real runs (e.g. the wire)."""
    if not isinstance(n_max, int) or n_max < 1:
        raise ValueError(f"n_max must be an integer >= 1, got {n_max!r}")
    ns = list(range(1, n_max + 1))
    fig = new_figure(6.5, 3.0)
    ax = fig.add_subplot()
    curves: dict[tuple, list[str]] = {}  # one line per distinct formula: reduce-scatter's is all-gather's
    for c in theory.COLLECTIVES:
        curves.setdefault(tuple(float(theory.sent_bytes(c, nbytes, n)) / nbytes for n in ns), []).append(c)
    for ys, cs in curves.items():
        ax.plot(ns, ys, "-", color=COLORS[cs[0]], label=" = ".join(cs) + " (formula)")
    # measured points side by side around each N, each collective its own marker, so points
    # that land on one curve (or on the same spot) stay visible
    markers = {"all_reduce": "o", "reduce_scatter": "s", "all_gather": "^", "broadcast": "D"}
    k = len(theory.COLLECTIVES)
    for j, c in enumerate(theory.COLLECTIVES):
        pts = [(n + 0.12 * (j - (k - 1) / 2), d[c] / nbytes) for n, d in sorted((measured or {}).items()) if c in d]
        if pts:
            ax.plot(*zip(*pts), linestyle="none", marker=markers.get(c, "o"), color=COLORS[c], markersize=6,
                    markeredgecolor="black", markeredgewidth=0.6, label=f"{c}, {measured_label}")
    ax.axhline(2, color="grey", linestyle=":", linewidth=0.8)
    ax.axhline(1, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("N (ranks in the group)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("bytes sent per rank / S")
    ax.set_title(title or f"ring collectives, payload S = {human_bytes(nbytes)}", fontsize=9)
    outside_legend(ax)
    return fig


def fsdp_lifecycle(n_units: int = 3, reshard_after_forward: bool = True) -> Figure:
    """ZeRO-3 / FSDP per-unit lifecycle over one step (FSDP paper §3.2): each unit is unsharded
    (all-gather) just before its forward, resharded after it, gathered again before its backward
    (unless `reshard_after_forward=False` kept it), then its gradient is reduce-scattered and
    the unsharded copy freed. Forward runs units 0..U-1, backward U-1..0."""
    if not isinstance(n_units, int) or n_units < 1:
        raise ValueError(f"n_units must be an integer >= 1, got {n_units!r}")
    U = n_units
    fig = new_figure(8.0, 0.9 + 0.5 * U)
    ax = fig.add_subplot()
    kinds = {"all-gather": COLORS["all_gather"], "forward": "#4C72B0", "backward": "#8172B3",
             "reduce-scatter": COLORS["reduce_scatter"], "unsharded": "#F2D7D9"}
    t = 0.0
    held_from = {}
    for u in range(U):  # forward, unit by unit
        ax.broken_barh([(t, 0.5)], (u - 0.35, 0.7), color=kinds["all-gather"])
        held_from[u] = t
        ax.broken_barh([(t + 0.5, 1.0)], (u - 0.35, 0.7), color=kinds["forward"])
        t += 1.5
        if reshard_after_forward:
            ax.broken_barh([(held_from[u], t - held_from[u])], (u - 0.45, 0.9), color=kinds["unsharded"],
                           zorder=0)
    t_fwd_end = t
    for u in reversed(range(U)):  # backward, last unit first
        if reshard_after_forward:
            ax.broken_barh([(t, 0.5)], (u - 0.35, 0.7), color=kinds["all-gather"])
            held_from[u] = t
            t += 0.5
        ax.broken_barh([(t, 1.6)], (u - 0.35, 0.7), color=kinds["backward"])
        ax.broken_barh([(t + 1.6, 0.5)], (u - 0.35, 0.7), color=kinds["reduce-scatter"])
        ax.broken_barh([(held_from[u], t + 1.6 - held_from[u])], (u - 0.45, 0.9), color=kinds["unsharded"],
                       zorder=0)
        t += 1.6
    ax.axvline(t_fwd_end, color="grey", linestyle=":", linewidth=1)
    ax.set_yticks(range(U), [f"unit {u}" for u in range(U)], fontsize=8)
    ax.invert_yaxis()
    ax.set_xticks([])
    ax.set_xlabel("time (schematic): forward →  | ← backward")
    gathers = 2 if reshard_after_forward else 1
    ax.set_title(f"FSDP unit lifecycle, reshard_after_forward={reshard_after_forward}: {gathers} all-gather(s)"
                 " + 1 reduce-scatter per unit per step", fontsize=9)
    ax.legend(handles=[Patch(color=c, label=k + (" (full params alive)" if k == "unsharded" else ""))
                       for k, c in kinds.items()], fontsize=7, frameon=False, ncol=5, loc="upper center",
              bbox_to_anchor=(0.5, -0.18))
    return fig


def cross_domain_figure(psi=7e9, n: int = 8, m: int = 2, recipe=None, bandwidth=None,
                        nics_per_node: int | None = None, nic_bandwidth=None, alpha=None) -> Figure:
    """Bytes per rank, bytes crossing domains per rank per step, and communication seconds per
    step (nothing overlapped) for the three layouts of `theory.hybrid.cross_domain_table`
    (closed forms only). The time panel shows both readings of the time model: flat ZeRO-3 as
    one lockstep ring paced by one NIC ("single ring") and as rings striped over the node's
    NICs ("striped"); the hybrids read the same either way."""
    rows = cross_domain_table(psi, n, m, recipe, bandwidth, nics_per_node=nics_per_node,
                              nic_bandwidth=nic_bandwidth, alpha=alpha)
    names = [r["layout"] for r in rows]
    fig = new_figure(9.0, 2.8)
    axes = fig.subplots(1, 3)
    panels = (("model states per rank (GB)", [float(r["bytes_per_rank"]) / 1e9 for r in rows]),
              ("cross-domain bytes per rank/step (GB)", [float(r["cross_domain_per_rank"]) / 1e9 for r in rows]))
    for ax, (title, vals) in zip(axes, panels):
        ax.bar(range(len(rows)), vals, color=[rank_color(i) for i in range(len(rows))])
        ax.set_xticks(range(len(rows)), names, fontsize=8)
        ax.set_title(title, fontsize=8)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.3g}", ha="center", va="bottom", fontsize=7)
    ax = axes[2]
    for j, (key, label, hatch) in enumerate((("comm_seconds_single_ring", "single ring", None),
                                             ("comm_seconds_striped", "striped over NICs", "//"))):
        xs = [i + (j - 0.5) * 0.38 for i in range(len(rows))]
        vals = [1e3 * r[key] for r in rows]
        ax.bar(xs, vals, 0.38, color=[rank_color(i) for i in range(len(rows))], hatch=hatch,
               edgecolor="white" if hatch else None, label=label)
        for x, v in zip(xs, vals):
            ax.text(x, v, f"{v:.3g}", ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(rows)), names, fontsize=8)
    ax.set_title("communication per step (ms), no overlap", fontsize=8)
    ax.legend(handles=[Patch(facecolor="#BBBBBB", label="flat: one lockstep ring, one NIC"),
                       Patch(facecolor="#BBBBBB", hatch="//", edgecolor="white",
                             label="flat: rings striped over the node's NICs")], fontsize=6, frameon=False)
    nics = n if nics_per_node is None else nics_per_node
    fig.suptitle(f"Ψ = {params(psi)}, {m} domains × {n} ranks; {nics} NICs per node", fontsize=9)
    return fig


def axis_bytes_bars(reports: dict[str, RunReport], rank: int = 0) -> Figure:
    """Bytes one rank sent per step, split by mesh axis (``dp_shard`` inside a domain,
    ``dp_outer`` across domains), one group per run: the ring model of the payloads (the
    ledger's records, hatched) beside the wire (the kernel's byte counters of the rank's
    sockets, `report.ranks[rank].wire.by_axis`, gloo's framing included)."""
    if not reports:
        raise ValueError("give at least one report: {label: report}")
    axes_order = []
    for rep in reports.values():
        r = rep.ranks[rank]
        for ax_name in list(r.measured.comm_by_axis) + list(r.wire.by_axis):
            if ax_name not in axes_order:
                axes_order.append(ax_name)
    fig = new_figure(max(5.0, 2.2 * len(reports) + 1.0), 3.0)
    ax = fig.add_subplot()
    vals = []
    for rep in reports.values():
        r = rep.ranks[rank]
        vals += [sum(v.values()) for v in r.measured.comm_by_axis.values()]
        vals += list(r.wire.by_axis.values())
    div, unit = byte_scale(vals or [1])
    colours = {a: rank_color(i) for i, a in enumerate(axes_order)}
    width = 0.8 / max(1, 2 * len(axes_order))
    for g, (label, rep) in enumerate(reports.items()):
        r = rep.ranks[rank]
        wire = r.wire.by_axis
        for k, axis in enumerate(axes_order):
            ring = sum(r.measured.comm_by_axis.get(axis, {}).values())
            x0 = g - 0.4 + (2 * k) * width + width / 2
            ax.bar(x0, ring / div, width, color="white", edgecolor=colours[axis], hatch="//")
            ax.bar(x0 + width, wire.get(axis, 0) / div, width, color=colours[axis])
            ax.text(x0 + width, wire.get(axis, 0) / div, f"{wire.get(axis, 0) / div:.3g}", ha="center",
                    va="bottom", fontsize=6)
    ax.set_xticks(range(len(reports)), list(reports), fontsize=8)
    ax.set_ylabel(f"{unit} sent per step, rank {rank}")
    handles = []
    for axis in axes_order:
        handles.append(Patch(facecolor="white", edgecolor=colours[axis], hatch="//", label=f"{axis}: ring model"))
        handles.append(Patch(facecolor=colours[axis], label=f"{axis}: wire"))
    top = max([v / div for v in vals] + [1e-30])
    ax.set_ylim(0, 1.4 * top)  # room for the legend above the bars
    ax.legend(handles=handles, fontsize=7, frameon=False, ncol=len(axes_order), loc="upper center")
    ax.set_title("bytes per mesh axis: ring model vs the wire", fontsize=9)
    return fig


SCALING_KEYS = ("ddp", "zero2", "fsdp")  # the strategy keys of benchmarks/results/scaling.json


def step_times(report: RunReport) -> list[float]:
    """Seconds per optimizer step of one run, the slowest rank per step, read from each rank's
    timeline ("step end" events on the rank's own clock); the first step is left out (warm-up)."""
    ends = []
    for r in report.ranks:
        t = {e.step: e.t for e in r.timeline.events if e.kind == EventKind.STEP_END}
        ends.append([t[k] - t[k - 1] for k in sorted(t) if k - 1 in t])
    return [max(col) for col in zip(*ends)] if ends else []


def scaling_results(reports: dict, bandwidth: float, strategy_key=None) -> dict:
    """Quick runs as a results dict in the schema of benchmarks/results/scaling.json
    (`zeroedu.references.bench.SCALING_SCHEMA`), zeroedu's side only: `reports` maps
    (strategy, n) -> report; the closed-form communication time is the ring-model bytes one rank
    sends per step (the prediction) over `bandwidth` (bytes/s). `strategy_key` maps a zeroedu
    strategy to the file's key (default: fsdp1/fsdp2 -> "fsdp", ddp_bucketed -> "ddp")."""
    import statistics

    key = strategy_key or (lambda s: {"fsdp1": "fsdp", "fsdp2": "fsdp", "ddp_bucketed": "ddp"}.get(s, s))
    rows = []
    for (s, n), rep in sorted(reports.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        r0 = rep.ranks[0]
        sent = sum(r0.predicted.comm.values())
        times = step_times(rep)
        rows.append({"n": n, "strategy": key(s),
                     "zeroedu": {"impl": s, "median": statistics.median(times) if times else None,
                                 "steps": len(times), "wire": r0.wire.sent or 0,
                                 "ring_model": sum(r0.measured.comm.values())},
                     "torch": None,
                     "closed_form": {"sent": sent, "t_comm": sent / bandwidth if sent else 0.0}})
    first = next(iter(reports.values()))
    return {"model": first.get("model"), "recipe": first.get("recipe"), "loopback": {"bandwidth": bandwidth},
            "rows": rows}


def scaling_figure(results: dict) -> Figure:
    """Two panels from a scaling results dict (`SCALING_SCHEMA`: benchmarks/results/scaling.json,
    or `scaling_results` of quick runs): bytes one rank sends per step against N (the wire,
    markers; the ring model's closed form, lines), and seconds per step against N (measured step
    time per implementation, markers; the closed-form communication time, lines)."""
    rows = results["rows"]
    keys = [k for k in SCALING_KEYS if any(r["strategy"] == k for r in rows)] + \
        sorted({r["strategy"] for r in rows} - set(SCALING_KEYS))
    fig = new_figure(9.0, 3.2)
    ax_b, ax_t = fig.subplots(1, 2)
    allb = [r["closed_form"]["sent"] for r in rows] + [r["zeroedu"]["wire"] or 0 for r in rows]
    div, unit = byte_scale(allb or [1])
    for i, k in enumerate(keys):
        rs = sorted((r for r in rows if r["strategy"] == k), key=lambda r: r["n"])
        ns = [r["n"] for r in rs]
        col = rank_color(i)
        ax_b.plot(ns, [r["closed_form"]["sent"] / div for r in rs], "-", color=col, label=f"{k}: ring model")
        ax_b.plot(ns, [(r["zeroedu"]["wire"] or 0) / div for r in rs], "o", color=col, label=f"{k}: wire (zeroedu)")
        if any(r.get("torch") and r["torch"].get("wire") for r in rs):
            ax_b.plot(ns, [(r["torch"] or {}).get("wire", 0) / div for r in rs], "x", color=col,
                      label=f"{k}: wire (torch)")
        ax_t.plot(ns, [1e3 * r["closed_form"]["t_comm"] for r in rs], "-", color=col, label=f"{k}: comm. (closed form)")
        ax_t.plot(ns, [1e3 * (r["zeroedu"]["median"] or 0) for r in rs], "o", color=col, label=f"{k}: step (zeroedu)")
        if any(r.get("torch") and r["torch"].get("median") for r in rs):
            ax_t.plot(ns, [1e3 * (r["torch"] or {}).get("median", 0) for r in rs], "x", color=col,
                      label=f"{k}: step (torch)")
    for ax in (ax_b, ax_t):
        ax.set_xlabel("N (ranks)")
        ax.set_xticks(sorted({r["n"] for r in rows}))
        ax.legend(fontsize=6, frameon=False)
    ax_b.set_ylabel(f"{unit} sent per rank per step")
    ax_t.set_ylabel("ms per step")
    bw = (results.get("loopback") or {}).get("bandwidth")
    ax_b.set_title(f"{results.get('model', '')}: bytes per rank", fontsize=9)
    ax_t.set_title("step time (measured) and communication time (closed form"
                   + (f", {bw / 1e9:.2g} GB/s)" if bw else ")"), fontsize=9)
    return fig
