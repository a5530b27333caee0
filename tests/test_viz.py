"""Figures build from real reports and from the closed forms, and draw what those say.

Expected values come from `zeroedu.theory` (closed forms) and from the report's own measured /
predicted blocks (the figure must show exactly the numbers it was given), never from a figure.
"""
import io
from fractions import Fraction
from functools import lru_cache

import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from zeroedu import catalog, theory
from zeroedu.notebook import nbtools, viz
from zeroedu.recipes import get_recipe
from zeroedu.train import RunConfig, run


@lru_cache(maxsize=None)
def _report(strategy, n, recipe="fp32", steps=3):
    return run(RunConfig(strategy, n, steps=steps, recipe=recipe, model="mlp"))


def _png(fig):
    assert isinstance(fig, Figure)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=40)
    assert buf.getvalue()[:4] == b"\x89PNG"


@pytest.mark.parametrize("strategy", list(catalog.STRATEGIES))
@pytest.mark.parametrize("n,m", [(1, 1), (4, 1), (3, 2)])
def test_sharding_diagram_shows_theory_fraction(strategy, n, m):
    """Filled share of each category bar on each GPU = closed-form bytes / full-replica bytes."""
    spec = catalog.get_spec(strategy)
    rec = get_recipe(spec.default_recipe)
    fig = viz.sharding_diagram(strategy, n, m)
    ms = theory.model_states(strategy, 1, n, m)
    full = {"param": rec.param_bytes, "grad": rec.grad_bytes, "optim": rec.optim_bytes}
    want = {"param": ms.param / full["param"], "grad": ms.grad / full["grad"], "optim": ms.optim / full["optim"]}
    world = n * (m if spec.hybrid else 1)
    patches = [p for p in fig.axes[0].patches if p.get_gid()]
    for g in range(min(world, 8)):
        for cat in viz.STATE_CATS:
            held = [p for p in patches if p.get_gid() == f"gpu{g}/{cat}/held"]
            got = sum(Fraction(p.get_height()).limit_denominator(1000) for p in held)
            assert got == want[cat], (strategy, g, cat)
    # together the GPUs hold every segment of every category
    if world <= 8:
        for cat in viz.STATE_CATS:
            covered = {round(p.get_y(), 9) for p in patches if p.get_gid().endswith(f"/{cat}/held")}
            segs = {round(p.get_y(), 9) for p in patches if f"/{cat}/" in p.get_gid()}
            assert covered == segs
    if (n, m) == (4, 1) and strategy == "zero2":
        _png(fig)


def test_theory_bars_match_closed_forms():
    psi, n = 7e9, 8
    fig = viz.theory_memory_bars(psi=psi, n=n, gpu_bytes=80e9, highlight="zero2")
    ax = fig.axes[0]
    bars = [p for p in ax.patches]
    names = list(catalog.STRATEGIES)
    assert len(bars) == 3 * len(names)  # param, grad, optim stacked per strategy
    for i, s in enumerate(names):
        tops = max(b.get_y() + b.get_height() for b in bars[3 * i:3 * i + 3])
        assert tops * 1e9 == pytest.approx(float(theory.model_states(s, psi, n).total))
    fig = viz.theory_comm_bars(psi=psi, n=n)
    bars = fig.axes[0].patches
    k = len(theory.COLLECTIVES)
    for i, s in enumerate(names):
        tops = max(b.get_y() + b.get_height() for b in bars[k * i:k * i + k])
        want = float(theory.comm_per_rank(s, psi, n).total())
        div, _ = viz.byte_scale([want])
        assert tops * 1e9 == pytest.approx(want) or tops * div == pytest.approx(want) or want == 0
    _png(fig)


def test_theory_memory_offload_and_compose():
    data = viz.theory_memory(["zero1", "fsdp1"], 7e9, 8, tp=2, pp=2, offload="optimizer+params")
    assert isinstance(data["zero1"], str) and "shards params" in data["zero1"]  # rejected, as theory says
    off = theory.offload("fsdp1", 7e9 / 4, 8, what="optimizer+params")
    assert data["fsdp1"]["total"] == float(off["device"].total)
    assert data["fsdp1"]["host"] == float(off["host"].total)
    bad = viz.theory_memory(["ddp"], 7e9, 8, tp=0)  # reported per strategy, never raised into a widget
    assert isinstance(bad["ddp"], str) and "tp" in bad["ddp"]


def test_report_figures_show_the_report():
    rep = _report("ddp", 2)
    fig = viz.memory_bars(rep, rank=1)
    bars = fig.axes[0].patches
    keys = ["param", "grad", "optim", "total"]
    div, _ = viz.byte_scale([rep["ranks"][1]["measured"][k] for k in keys])
    assert [b.get_height() * div for b in bars[:4]] == pytest.approx([rep["ranks"][1]["predicted"][k] for k in keys])
    assert [b.get_height() * div for b in bars[4:]] == pytest.approx([rep["ranks"][1]["measured"][k] for k in keys])
    fig = viz.comm_bars(rep)
    assert [b.get_height() for b in fig.axes[0].patches][1] * viz.byte_scale(rep["ranks"][0]["measured"]["comm"].values())[0] \
        == pytest.approx(rep["ranks"][0]["measured"]["comm"]["all_reduce"])
    _png(fig)

    fig = viz.memory_timeline(rep)
    ax = fig.axes[0]
    lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("rank")]
    assert len(lines) == 2
    for r, ln in enumerate(lines):
        assert len(ln.get_xdata()) == len(rep["ranks"][r]["timeline"]["events"])
    evs = rep["ranks"][0]["timeline"]["events"]
    div, _ = viz.byte_scale([sum(e["bytes"].values()) for e in evs] + [rep["ranks"][0]["predicted"]["total"]])
    dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--" and len(ln.get_ydata()) == 2]
    assert any(ln.get_ydata()[0] * div == pytest.approx(rep["ranks"][0]["predicted"]["total"]) for ln in dashed)
    assert len(fig.axes) == 2 and fig.axes[1].collections  # the stacked per-category panel
    _png(fig)
    _png(viz.loss_curves(rep))
    with pytest.raises(ValueError):
        viz.memory_bars(rep, rank=2)


def test_overlap_timeline_draws_every_collective_of_the_step():
    rep = _report("ddp_bucketed", 2)
    fig = viz.overlap_timeline(rep, rank=0)
    step = rep["steps"] - 1
    comm = [c for c in rep["ranks"][0]["timeline"]["comm"] if c["step"] == step]
    bars = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    assert len(bars) == len(comm) > 1  # one bar per bucket all-reduce
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [c["tag"] for c in comm]
    _png(fig)


@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp_lifecycle_counts_gathers(reshard):
    fig = viz.fsdp_lifecycle(4, reshard_after_forward=reshard)
    colls = fig.axes[0].collections
    gathers = [c for c in colls if tuple(c.get_facecolor()[0][:3]) ==
               tuple(int(viz.COLORS["all_gather"][i:i + 2], 16) / 255 for i in (1, 3, 5))]
    # per unit: one all-gather for forward, one more for backward after resharding (FSDP paper §3.2)
    assert len(gathers) == 4 * (2 if reshard else 1)
    assert len(theory.exact_comm("fsdp1", [[(3,)]] * 4, 2, reshard_after_forward=reshard).ops) == len(gathers) + 4
    with pytest.raises(ValueError):
        viz.fsdp_lifecycle(0)


def test_assert_match_and_table():
    rep = _report("ddp", 2)
    nbtools.assert_match(rep)  # raises when they disagree
    rows = nbtools.match_rows(rep)
    assert all(r[4] for r in rows) and len(rows) == 2 * 7  # 4 states + activations + 1 collective + the wire
    bad = dict(rep, match={"model_states": False, "comm": True})
    with pytest.raises(AssertionError):
        nbtools.assert_match(bad)
