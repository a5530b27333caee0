"""Matplotlib figures drawn from run reports (measured) and from `zeroedu.theory` (predicted).

Every function is pure: it takes a report or closed-form inputs and returns a new
`matplotlib.figure.Figure` built without pyplot, so there is no global figure state, nothing
leaks between calls, and the functions run headless (tests, CLI) as well as inline in Jupyter,
where a returned Figure renders as its PNG.

Generic over strategies: what a strategy shards comes from `zeroedu.catalog` (its ZeRO level on
each mesh axis), how many bytes from `zeroedu.theory`, so a strategy added to the catalog is
drawn without touching this module.

Figures
    ring_scaling          bytes a rank sends per collective as N grows (ring model)
    sharding_diagram      per-GPU param / grad / optimizer bars, full vs 1/N segments
    theory_memory_bars    bytes per GPU by category for several strategies (closed form)
    theory_comm_bars      bytes sent per GPU per step by collective (closed form)
    memory_bars           one run: predicted vs measured model states by category
    comm_bars             one run: predicted vs measured bytes sent by collective
    memory_timeline       one run: bytes held per rank over time, prediction overlaid
    overlap_timeline      one run: backward interval vs each collective's interval
    fsdp_lifecycle        ZeRO-3 / FSDP unit lifecycle: unshard, compute, reshard, reduce-scatter
    loss_curves           one run's losses against the single-process reference
"""
from __future__ import annotations

from typing import Iterable, Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from . import analysis, catalog, theory
from .recipes import get_recipe

# One colour per ledger category, shared by every figure so "grad" is always the same colour.
COLORS = {
    "param": "#4C72B0", "grad": "#DD8452", "optim": "#55A868",
    "master": "#55A868", "main_grad": "#8C8C8C", "m": "#64B5CD", "v": "#8172B3",
    "gathered": "#C44E52", "comm_buffer": "#937860", "activation": "#DA8BC3",
    "all_reduce": "#4C72B0", "reduce_scatter": "#DD8452", "all_gather": "#55A868",
    "send": "#8172B3", "recv": "#937860", "broadcast": "#8C8C8C",
}
STATE_CATS = ("param", "grad", "optim")
TIMELINE_CATS = ("param", "grad", "master", "main_grad", "m", "v", "gathered", "comm_buffer",
                 "activation")


def _fig(w: float = 7.0, h: float = 3.2, **kw) -> Figure:
    return Figure(figsize=(w, h), layout="constrained", **kw)


def human_bytes(x: float) -> str:
    """1.5e9 -> '1.50 GB' (decimal units, as GPU memory is quoted)."""
    x = float(x)
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} B"


def _scale(values: Iterable[float]) -> tuple[float, str]:
    """A common unit for an axis: (divisor, label)."""
    top = max([abs(float(v)) for v in values] + [0.0])
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if top >= scale:
            return scale, unit
    return 1.0, "bytes"


# --------------------------------------------------------------------------- theory figures
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
    fig = _fig(max(6.5, 1.2 + 1.15 * shown), 3.4)
    ax = fig.add_subplot()
    segs = n * m if spec.hybrid else n
    per_cat = {"param": rec.param_bytes, "grad": rec.grad_bytes, "optim": rec.optim_bytes}
    for g in range(shown):
        domain, r = divmod(g, n)  # inner ranks are contiguous (catalog / cluster.mesh)
        for j, cat in enumerate(STATE_CATS):
            x0 = g * 1.15 + j * 0.33
            on_inner, on_outer = inner[cat], spec.hybrid and outer[cat]
            for s in range(segs):
                # segment s of the flat buffer: inner shard s // m, and within it outer piece s % m
                s_inner, s_outer = divmod(s, m) if spec.hybrid else (s, 0)
                mine = (not on_inner or s_inner == r) and (not on_outer or s_outer == domain)
                y0 = s / segs
                ax.add_patch(Rectangle((x0, y0), 0.28, 1 / segs, facecolor=COLORS[cat] if mine else "white",
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
    """Stacked bars: device bytes per GPU by category for each strategy (closed forms)."""
    data = theory_memory(strategies, psi, n, m, recipe, tp, pp, offload)
    names = list(data)
    fig = _fig(max(5.0, 0.62 * len(names) + 1.5), 3.2)
    ax = fig.add_subplot()
    vals = [v["total"] for v in data.values() if isinstance(v, dict)] + ([gpu_bytes] if gpu_bytes else [])
    div, unit = _scale(vals)
    for i, s in enumerate(names):
        d = data[s]
        if not isinstance(d, dict):
            ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=7, color="grey")
            continue
        bottom = 0.0
        for cat in STATE_CATS:
            ax.bar(i, d[cat] / div, bottom=bottom, color=COLORS[cat], width=0.7,
                   edgecolor="black" if s == highlight else None, linewidth=1.5 if s == highlight else 0)
            bottom += d[cat] / div
    if gpu_bytes:
        ax.axhline(gpu_bytes / div, color="red", linestyle="--", linewidth=1)
        ax.text(len(names) - 0.5, gpu_bytes / div, f"GPU {human_bytes(gpu_bytes)}", color="red",
                ha="right", va="bottom", fontsize=7)
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel(f"{unit} per GPU")
    ax.set_title(f"model states per GPU: Ψ={psi:.3g}, N={n}, M={m}" + (f", tp={tp}, pp={pp}" if tp * pp > 1 else "")
                 + (f", offload={offload}" if offload != "none" else ""), fontsize=9)
    ax.legend(handles=[Patch(color=COLORS[c], label=c) for c in STATE_CATS], fontsize=7, frameon=False)
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
    fig = _fig(max(5.0, 0.62 * len(names) + 1.5), 3.2)
    ax = fig.add_subplot()
    div, unit = _scale([sum(v.values()) for v in data.values() if isinstance(v, dict)])
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
    ax.set_title(f"communication per step (ring model): Ψ={psi:.3g}, N={n}, M={m}", fontsize=9)
    ax.legend(handles=[Patch(color=COLORS[c], label=c) for c in theory.COLLECTIVES], fontsize=7,
              frameon=False)
    return fig


def ring_scaling(nbytes: float, n_max: int = 16, measured: dict | None = None) -> Figure:
    """Bytes one rank sends for a payload of `nbytes` as the group grows (ring model): an
    all-reduce tends to 2S, a reduce-scatter or an all-gather to S, whatever N is.
    `measured` = {n: {collective: bytes}} adds points from real runs."""
    if not isinstance(n_max, int) or n_max < 1:
        raise ValueError(f"n_max must be an integer >= 1, got {n_max!r}")
    ns = list(range(1, n_max + 1))
    fig = _fig(5.5, 3.0)
    ax = fig.add_subplot()
    for c in theory.COLLECTIVES:
        ax.plot(ns, [float(theory.sent_bytes(c, nbytes, n)) / nbytes for n in ns], "-", color=COLORS[c],
                label=f"{c} (formula)")
        for n, d in sorted((measured or {}).items()):
            if c in d:
                ax.plot([n], [d[c] / nbytes], "o", color=COLORS[c], markersize=7, markeredgecolor="black")
    if measured:
        ax.plot([], [], "o", color="white", markeredgecolor="black", label="measured on real ranks")
    ax.axhline(2, color="grey", linestyle=":", linewidth=0.8)
    ax.axhline(1, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("N (ranks in the group)")
    ax.set_ylabel("bytes sent per rank / S")
    ax.set_title(f"ring collectives, payload S = {human_bytes(nbytes)}", fontsize=9)
    ax.legend(fontsize=7, frameon=False)
    return fig


# --------------------------------------------------------------------------- report figures
def _rank(report: dict, rank: int) -> dict:
    ranks = report["ranks"]
    if not 0 <= rank < len(ranks):
        raise ValueError(f"rank must be in [0, {len(ranks)}), got {rank!r}")
    return ranks[rank]


def _paired_bars(ax, keys, pred, meas, div):
    xs = range(len(keys))
    ax.bar([x - 0.2 for x in xs], [pred.get(k, 0) / div for k in keys], 0.4, label="predicted",
           color="#BBBBBB", edgecolor="black", hatch="//")
    ax.bar([x + 0.2 for x in xs], [meas.get(k, 0) / div for k in keys], 0.4, label="measured",
           color=[COLORS.get(k, "#4C72B0") for k in keys])
    ax.set_xticks(list(xs), keys, fontsize=8)
    ax.legend(fontsize=7, frameon=False)


def memory_bars(report: dict, rank: int = 0) -> Figure:
    """One run, one rank: model-state bytes by category, predicted (closed form) vs measured."""
    r = _rank(report, rank)
    keys = ["param", "grad", "optim", "total"]
    pred, meas = r["predicted"], r["measured"]
    div, unit = _scale([pred[k] for k in keys] + [meas[k] for k in keys])
    fig = _fig(5.0, 3.0)
    ax = fig.add_subplot()
    _paired_bars(ax, keys, pred, meas, div)
    ax.set_ylabel(unit)
    ax.set_title(f"{report['strategy']} rank {rank}, N={report['n']}, {report['recipe']}: model states",
                 fontsize=9)
    return fig


def comm_bars(report: dict, rank: int = 0) -> Figure:
    """One run, one rank: bytes sent in the last step by collective, predicted vs measured."""
    r = _rank(report, rank)
    pred, meas = r["predicted"]["comm"], r["measured"]["comm"]
    keys = sorted(set(pred) | set(meas)) or ["(none)"]
    div, unit = _scale(list(pred.values()) + list(meas.values()))
    fig = _fig(5.0, 3.0)
    ax = fig.add_subplot()
    _paired_bars(ax, keys, pred, meas, div)
    ax.set_ylabel(f"{unit} sent per step")
    ax.set_title(f"{report['strategy']} rank {rank}, N={report['n']}: communication", fontsize=9)
    return fig


def _events_series(events: list[dict], stacked: bool):
    ts = [e["t"] for e in events]
    if stacked:
        return ts, {c: [e["bytes"].get(c, 0) for e in events] for c in TIMELINE_CATS}
    return ts, [sum(e["bytes"].values()) for e in events]


def timeline_axes(ax, events_by_rank: dict[int, list[dict]], predicted_total: dict[int, float] | None,
                  title: str = "") -> None:
    """Draw total bytes held per rank over time on `ax` (shared by `memory_timeline` and the live
    run panel, which calls it with partial event lists while a run streams)."""
    allv = [sum(e["bytes"].values()) for evs in events_by_rank.values() for e in evs]
    allv += list((predicted_total or {}).values())
    div, unit = _scale(allv or [1])
    for r in sorted(events_by_rank):
        evs = events_by_rank[r]
        if not evs:
            continue
        ts, tot = _events_series(evs, stacked=False)
        line, = ax.step(ts, [v / div for v in tot], where="post", label=f"rank {r}", linewidth=1.2)
        if predicted_total and r in predicted_total:
            ax.axhline(predicted_total[r] / div, color=line.get_color(), linestyle="--", linewidth=0.9)
    if predicted_total:
        ax.plot([], [], color="black", linestyle="--", label="predicted model states")
    ax.set_xlabel("seconds since the rank started")
    ax.set_ylabel(f"{unit} held")
    ax.set_ylim(bottom=0)
    if title:
        ax.set_title(title, fontsize=9)
    if events_by_rank:
        ax.legend(fontsize=7, frameon=False, loc="lower right", ncol=2)


def memory_timeline(report: dict, ranks: Sequence[int] | None = None, stacked_rank: int | None = 0) -> Figure:
    """Bytes each rank holds at every ledger event, with the predicted model-state total as a
    dashed line; `stacked_rank` adds a panel that splits that rank's bytes by category (model
    states sit on the line; activations and gathered units rise above it and fall back)."""
    ranks = list(range(len(report["ranks"]))) if ranks is None else list(ranks)
    evs = {r: report["ranks"][r]["timeline"]["events"] for r in ranks}
    pred = {r: report["ranks"][r]["predicted"]["total"] for r in ranks}
    fig = _fig(7.5, 3.0 if stacked_rank is None else 5.6)
    axes = fig.subplots(1 if stacked_rank is None else 2, 1, squeeze=False)[:, 0]
    timeline_axes(axes[0], evs, pred, f"{report['strategy']}, N={report['n']}, {report['recipe']}: "
                                      "memory per rank over time")
    if stacked_rank is not None:
        ax = axes[1]
        events = report["ranks"][stacked_rank]["timeline"]["events"]
        ts, series = _events_series(events, stacked=True)
        cats = [c for c in TIMELINE_CATS if any(series[c])]
        div, unit = _scale([sum(e["bytes"].values()) for e in events] or [1])
        ax.stackplot(ts, *[[v / div for v in series[c]] for c in cats], labels=cats,
                     colors=[COLORS[c] for c in cats], step="post")
        ax.axhline(report["ranks"][stacked_rank]["predicted"]["total"] / div, color="black",
                   linestyle="--", linewidth=1, label="predicted model states")
        ax.set_xlabel("seconds since the rank started")
        ax.set_ylabel(f"{unit} held")
        ax.set_title(f"rank {stacked_rank} by category", fontsize=9)
        ax.legend(fontsize=7, frameon=False, loc="upper left", ncol=5)
    return fig


def overlap_timeline(report: dict, rank: int = 0, step: int | None = None) -> Figure:
    """One step on one rank: the backward interval and each collective's [start, end] interval.

    Bars that sit inside the backward band are communication hidden behind compute (bucketed
    DDP, FSDP's reduce-scatter); bars after it are exposed time the step waits for. The share
    hidden is `zeroedu.analysis.overlap_fraction`."""
    r = _rank(report, rank)
    tl = r["timeline"]
    step = report["steps"] - 1 if step is None else step
    windows = analysis.backward_windows(tl, step)
    comm = [c for c in tl["comm"] if c["step"] == step]
    fig = _fig(7.5, 1.4 + 0.22 * max(len(comm), 1))
    ax = fig.add_subplot()
    t0 = min([c["t_start"] for c in comm] + [b for b, _ in windows] + [float("inf")])
    t0 = 0.0 if t0 == float("inf") else t0
    ms = 1e3
    for b, e in windows:
        ax.axvspan((b - t0) * ms, (e - t0) * ms, color="#DDDDDD")
    for i, c in enumerate(comm):
        te = c["t_end"] if c["t_end"] is not None else c["t_start"]
        ax.broken_barh([((c["t_start"] - t0) * ms, max((te - c["t_start"]) * ms, 1e-3))], (i - 0.4, 0.8),
                       color=COLORS.get(c["op"], "#4C72B0"))
    ax.set_yticks(range(len(comm)), [c["tag"] for c in comm], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds")
    frac = analysis.overlap_fraction(tl, step)
    ax.set_title(f"{report['strategy']} rank {rank}, step {step}: collectives vs backward"
                 + (f" ({100 * frac:.0f}% of gradient-reduction time inside backward)" if frac is not None else ""),
                 fontsize=9)
    ops = sorted({c["op"] for c in comm})
    ax.legend(handles=[Patch(color="#DDDDDD", label="backward")] +
              [Patch(color=COLORS.get(o, "#4C72B0"), label=o) for o in ops], fontsize=7, frameon=False,
              loc="lower right")
    return fig


def fsdp_lifecycle(n_units: int = 3, reshard_after_forward: bool = True) -> Figure:
    """ZeRO-3 / FSDP per-unit lifecycle over one step (FSDP paper §3.2): each unit is unsharded
    (all-gather) just before its forward, resharded after it, gathered again before its backward
    (unless `reshard_after_forward=False` kept it), then its gradient is reduce-scattered and
    the unsharded copy freed. Forward runs units 0..U-1, backward U-1..0."""
    if not isinstance(n_units, int) or n_units < 1:
        raise ValueError(f"n_units must be an integer >= 1, got {n_units!r}")
    U = n_units
    fig = _fig(8.0, 0.9 + 0.5 * U)
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


def loss_curves(report: dict) -> Figure:
    """Mean loss over ranks per step against the single-process reference (they coincide)."""
    fig = _fig(5.0, 2.8)
    ax = fig.add_subplot()
    steps = range(len(report["losses"]))
    ax.plot(steps, report["reference_losses"], "o-", color="grey", label="single process (torch.optim.Adam)")
    ax.plot(steps, report["losses"], "x--", color="#C44E52", label=f"{report['strategy']} on N={report['n']}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=7, frameon=False)
    return fig


__all__ = ["COLORS", "human_bytes", "ring_scaling", "sharding_diagram", "theory_memory", "theory_memory_bars",
           "theory_comm", "theory_comm_bars", "memory_bars", "comm_bars", "timeline_axes",
           "memory_timeline", "overlap_timeline", "fsdp_lifecycle", "loss_curves"]
