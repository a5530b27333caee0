"""Figures build from real reports and from the closed forms, and draw what those say.

Expected values come from `zeroedu.theory` (closed forms) and from the report's own measured /
predicted blocks (the figure must show exactly the numbers it was given), never from a figure.
"""
import io
from fractions import Fraction
from functools import lru_cache

import matplotlib.colors
from dataclasses import replace

import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from zeroedu import catalog, theory
from zeroedu.models import get_model, unit_shapes
from zeroedu.notebook import nbtools, viz
from zeroedu.recipes import get_recipe
from zeroedu.train import RunConfig, run
from zeroedu.kinds import EventKind, MODEL_STATE

from .shared_runs import RUNS


def _report(strategy, n, recipe="fp32", steps=5):
    return RUNS(RunConfig(strategy, n, steps=steps, recipe=recipe, model="mlp"))


def _png(fig):
    assert isinstance(fig, Figure)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=40)
    assert buf.getvalue()[:4] == b"\x89PNG"


@pytest.mark.parametrize("strategy", list(catalog.STRATEGIES))
@pytest.mark.parametrize("n,m", [(1, 1), (4, 1), (3, 2)])
def test_sharding_diagram_shows_theory_fraction(strategy, n, m):
    """The bars are drawn to scale (each category's height is its bytes per parameter, 2 + 2 + 12
    in mixed precision), and the filled part of each on each GPU is the closed form's bytes."""
    spec = catalog.get_spec(strategy)
    rec = get_recipe(spec.default_recipe)
    fig = viz.sharding_diagram(strategy, n, m)
    ms = theory.model_states(strategy, 1, n, m)
    full = {"param": rec.param_bytes, "grad": rec.grad_bytes, "optim": rec.optim_bytes}
    tallest = max(full.values())
    world = n * (m if spec.hybrid else 1)
    patches = [p for p in fig.axes[0].patches if p.get_gid()]
    for g in range(min(world, 8)):
        for cat in viz.STATE_CATS:
            mine = [p for p in patches if p.get_gid().startswith(f"gpu{g}/{cat}/")]
            whole = sum(Fraction(p.get_height()).limit_denominator(10000) for p in mine)
            assert whole * tallest == full[cat], (strategy, g, cat)  # to scale
            held = [p for p in mine if p.get_gid().endswith("/held")]
            got = sum(Fraction(p.get_height()).limit_denominator(10000) for p in held)
            assert got * tallest == getattr(ms, cat), (strategy, g, cat)
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


def test_the_offload_bars_draw_the_host_beside_the_device_on_a_scale_that_reads():
    """11's 70B offload figure: beside each strategy's device bar, a hatched bar of what its share
    puts in host memory (`theory.offload`'s host total); the bars are far below the GPU's 80 GB,
    so the axis follows them and a note gives the largest bar's share of the GPU instead of a
    line that would flatten them."""
    kw = dict(psi=70e9, n=8, m=2, tp=8, pp=4, offload="optimizer")
    strategies = ["ddp", "zero1", "zero2", "fsdp1", "hfsdp"]
    fig = viz.theory_memory_bars(strategies, gpu_bytes=80e9, **kw)
    ax = fig.axes[0]
    data = viz.theory_memory(strategies, 70e9, 8, 2, None, 8, 4, "optimizer")
    div, _ = viz.byte_scale([max(max(d["total"], d["host"]) for d in data.values() if isinstance(d, dict))])
    hosts = {p.get_gid(): p for p in ax.patches if (p.get_gid() or "").startswith("host/")}
    assert set(hosts) == {f"host/{s}" for s in strategies if isinstance(data[s], dict)}  # ddp has nothing to move
    for s, d in data.items():
        if isinstance(d, dict):
            assert hosts[f"host/{s}"].get_height() * div == pytest.approx(d["host"]) and d["host"] > 0
    top = max(max(d["total"], d["host"]) for d in data.values() if isinstance(d, dict))
    assert ax.get_ylim()[1] * div < 2 * top < 80e9  # the axis follows the bars, not the GPU
    note = next(t for t in ax.texts if t.get_gid() == "capacity note").get_text()
    assert f"{max(d['total'] for d in data.values() if isinstance(d, dict)) / 80e9:.0%}" in note
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "on the host (CPU memory)" in labels
    _png(fig)


def test_report_figures_show_the_report():
    rep = _report("ddp", 2)
    fig = viz.memory_bars(rep, rank=1)
    bars = fig.axes[0].patches
    keys = ["param", "grad", "optim", "total"]
    div, _ = viz.byte_scale([rep.ranks[1].measured.model_states()[k] for k in keys])
    assert [b.get_height() * div for b in bars[:4]] == pytest.approx([rep.ranks[1].predicted.model_states()[k] for k in keys])
    assert [b.get_height() * div for b in bars[4:]] == pytest.approx([rep.ranks[1].measured.model_states()[k] for k in keys])
    fig = viz.comm_bars(rep)
    r0 = rep.ranks[0]
    wire = r0.wire.by_collective["all_reduce"]  # DDP runs one kind of collective: measured alone
    div, _ = viz.byte_scale([r0.predicted.comm["all_reduce"], r0.measured.comm["all_reduce"], wire])
    assert [b.get_height() * div for b in fig.axes[0].patches] == pytest.approx(
        [r0.predicted.comm["all_reduce"], r0.measured.comm["all_reduce"], wire])
    _png(fig)

    # on a time axis the first step, whose backward is recorded op by op, is left out, and said so
    fig = viz.memory_timeline(rep)
    ax = fig.axes[0]
    assert rep.steps > 1 and "step 0, recorded op by op, left out" in ax.get_title()
    lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("rank")]
    assert len(lines) == 2
    for r, ln in enumerate(lines):
        assert len(ln.get_xdata()) == len([e for e in rep.ranks[r].timeline.events if e.step > 0])
    fig = viz.memory_timeline(rep, steps=range(rep.steps))  # every step, when asked
    ax = fig.axes[0]
    lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("rank")]
    for r, ln in enumerate(lines):
        assert len(ln.get_xdata()) == len([e for e in rep.ranks[r].timeline.events if e.step in range(rep.steps)])
    evs = rep.ranks[0].timeline.events
    div, _ = viz.byte_scale([sum(e.bytes.values()) for e in evs] + [rep.ranks[0].predicted.total])
    dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--" and len(ln.get_ydata()) == 2]
    assert any(ln.get_ydata()[0] * div == pytest.approx(rep.ranks[0].predicted.total) for ln in dashed)
    assert len(fig.axes) == 2 and fig.axes[1].collections  # the stacked per-category panel
    _png(fig)
    _png(viz.loss_curves(rep))
    with pytest.raises(ValueError):
        viz.memory_bars(rep, rank=2)


def test_overlap_timeline_draws_every_collective_of_the_step():
    rep = _report("ddp_bucketed", 2)
    fig = viz.overlap_timeline(rep, rank=0)
    step = rep.steps - 1
    comm = [c for c in rep.ranks[0].timeline.comm if c.step == step]
    bars = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    assert len(bars) == len(comm) > 1  # one bar per bucket all-reduce
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [c.tag for c in comm]
    _png(fig)


def test_trace_figure_draws_every_slice_of_the_step_on_its_track():
    from zeroedu.notebook import trace
    rep = _report("fsdp2", 2)
    tr = trace.trace(rep)
    fig = viz.trace_figure(tr, step=2)
    bars = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    # per rank: forward, backward, optimizer, and every collective of step 2 (issued inside the step)
    collectives = sum(1 for r in rep.ranks for c in r.timeline.comm if c.step == 2)
    assert len(bars) == 2 * 3 + collectives
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[0] == "rank 0 compute" and "rank 1 comm dp_shard" in labels
    with pytest.raises(ValueError, match="no step 9"):
        viz.trace_figure(tr, step=9)
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
    bad = replace(rep, match=replace(rep.match, model_states=False))
    with pytest.raises(AssertionError):
        nbtools.assert_match(bad)


# ---------------------------------------------------------------- timelines: options, marks, legends
@lru_cache(maxsize=None)
def _gpt_report(strategy, recompute="none", prefetch=True):
    return run(RunConfig(strategy, 2, steps=2, model="gpt-tiny", recompute=recompute,
                         options={} if prefetch else {"backward_prefetch": False}))


def _markers(ax, marker, color):
    want = tuple(int(color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return [ln for ln in ax.get_lines() if ln.get_marker() == marker
            and tuple(matplotlib.colors.to_rgb(ln.get_color())) == want]


def test_lifecycle_kinds_are_read_from_the_event_kind_and_unknown_kinds_are_plain_events():
    from zeroedu.notebook.viz.timelines import lifecycle_kind

    def ev(kind, **kw):  # an event as a report's JSON holds it, read back (typed)
        from zeroedu.reports import Event

        return Event.from_plain({"t": 0.0, "kind": kind.value if isinstance(kind, EventKind) else kind, "step": 0, **kw})

    assert lifecycle_kind(ev(EventKind.UNSHARD, unit=3)) == "unshard"
    assert lifecycle_kind(ev(EventKind.RESHARD, unit=3)) == "reshard"
    assert lifecycle_kind(ev(EventKind.GRAD_ALLOC, unit=2)) == "grad alloc"
    assert lifecycle_kind(ev(EventKind.GRAD_FREED, unit=2)) == "grad free"
    assert lifecycle_kind(ev(EventKind.OPTIMIZER_STEP)) == "step"
    assert lifecycle_kind(ev(EventKind.RECOMPUTE, block=1)) == "recompute"
    assert lifecycle_kind(ev(EventKind.COPY_IN, unit=0)) is None
    # a label that reads like an unshard is not one: only the kind counts
    assert lifecycle_kind(ev(EventKind.OTHER, label="unit 3 unshard")) is None
    assert lifecycle_kind(ev("a kind from a newer ledger")) is None
    assert EventKind.UNSHARD.label(unit=3) == "unit 3 unshard" and EventKind.RECOMPUTE.label(block=1) == "recompute 1"


def test_memory_timeline_by_event_index_marks_every_unshard_and_the_step():
    rep = _gpt_report("fsdp1", prefetch=False)
    last = rep.steps - 1
    events = [e for e in rep.ranks[0].timeline.events if e.step == last]
    fig = viz.memory_timeline(rep, x="event", steps=last)
    top, stacked = fig.axes[:2]
    lines = [ln for ln in top.get_lines() if ln.get_label().startswith("rank")]
    assert [list(ln.get_xdata()) for ln in lines] == [list(range(len(events)))] * 2
    unshards = sum(e.kind == EventKind.UNSHARD for e in events)
    shapes = unit_shapes(get_model("gpt-tiny").build())
    assert unshards == sum(op.collective == "all_gather" for op in theory.exact_comm("fsdp1", shapes, 2).ops)
    assert len(_markers(stacked, "^", viz.COLORS["gathered"])) == unshards
    assert len(_markers(stacked, "v", "#777777")) == sum(e.kind == EventKind.RESHARD for e in events)
    # unit numbers over the unshards, in forward then backward order
    texts = [t.get_text() for t in stacked.texts]
    assert texts == [str(e.unit) for e in events if e.kind == EventKind.UNSHARD]
    step_x = [i for i, e in enumerate(events) if e.kind == EventKind.OPTIMIZER_STEP]
    dotted = [ln for ln in stacked.get_lines() if ln.get_linestyle() == ":"]
    assert [ln.get_xdata()[0] for ln in dotted] == step_x
    assert any(p.get_facecolor()[:3] == pytest.approx(matplotlib.colors.to_rgb("#EDEDED")) for p in stacked.patches)
    # the saw-tooth rides on top: gathered parameters and full gradients are stacked above the
    # activations, not hidden under them
    order = [c.get_gid() for c in stacked.collections if c.get_gid() in (*MODEL_STATE, "activation",
                                                                           "gathered", "comm_buffer")]
    assert order[-3:] == ["activation", "gathered", "comm_buffer"], order
    # the legend says what each band holds in the text's words (07: "the unit's unsharded gradient")
    legend = [t.get_text() for t in stacked.get_legend().get_texts()]
    assert "comm_buffer: unsharded gradients, collective buffers" in legend
    assert "gathered: gathered (unsharded) parameters" in legend and "activation: saved activations" in legend
    # the legend sits right of the data
    fig.canvas.draw()
    for ax in (top, stacked):
        assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1
    _png(fig)


@pytest.mark.parametrize("strategy", ["ddp", "zero1"])
def test_the_activations_are_drawn_gone_before_the_gradients_collectives(strategy):
    """02's and 03's memory timelines: backward frees the activations before naive DDP's
    all-reduce (ZeRO-1's reduce-scatter) starts, so the band drawn from the events ends at
    backward's end (an event of its own) instead of running on to the optimizer step."""
    from zeroedu.runtime import analysis

    rep = _gpt_report(strategy)
    last = rep.steps - 1
    for r in rep.ranks:
        first = min(c.t_start for c in analysis.grad_comm(r.timeline, last))
        before = [e for e in r.timeline.events if e.step == last and e.t <= first]
        assert before[-1].kind == EventKind.BACKWARD_END and before[-1].bytes["activation"] == 0, before[-1]
    events = [e for e in rep.ranks[0].timeline.events if e.step == last]
    fig = viz.memory_timeline(rep, x="event", steps=last)
    ax = fig.axes[1]
    band = next(c for c in ax.collections if c.get_gid() == "activation").get_paths()[0]
    lo, hi = ax.get_ylim()

    def drawn(i):  # does the band cover any height over event i's stretch of the x axis?
        return any(band.contains_point((i + 0.5, lo + (hi - lo) * k / 2000)) for k in range(2001))

    fwd = next(i for i, e in enumerate(events) if e.kind == EventKind.FORWARD_END)
    end = next(i for i, e in enumerate(events) if e.kind == EventKind.BACKWARD_END)
    assert drawn(fwd) and not drawn(end)
    _png(fig)


def test_memory_timeline_small_multiples_one_panel_per_rank_and_new_categories():
    rep = _gpt_report("zero2")
    fig = viz.memory_timeline(rep, layout="panels", x="event")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 2 and all(ax.collections for ax in panels)
    assert panels[0].get_ylim() == panels[1].get_ylim()  # one y scale: a rank that differs stands out
    top = max(sum(e.bytes.values()) for r in rep.ranks for e in r.timeline.events)
    div, _ = viz.byte_scale([top, rep.ranks[0].predicted.total])
    assert panels[0].get_ylim()[1] >= top / div
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "predicted model states" in labels and "full grad allocated (unit #)" in labels
    # a category the figures have no colour for is still drawn, and labelled
    doctored = replace(rep, ranks=[replace(r, timeline=replace(r.timeline, events=[
        replace(e, bytes={**e.bytes, "something_new": 1000}) for e in r.timeline.events]))
        for r in rep.ranks])
    fig = viz.memory_timeline(doctored, layout="panels", ranks=[1])
    assert "something_new" in [t.get_text() for t in fig.legends[0].get_texts()]
    _png(fig)
    with pytest.raises(ValueError):
        viz.memory_timeline(rep, x="steps")
    with pytest.raises(ValueError):
        viz.memory_timeline(rep, layout="grid")
    with pytest.raises(ValueError):
        viz.memory_timeline(rep, layout="panels", ranks=[5])


def test_recompute_marks_sit_inside_backward():
    rep = _gpt_report("zero2", recompute="full")
    fig = viz.memory_timeline(rep, x="time", steps=1, layout="panels", ranks=[0])
    ax = fig.axes[0]
    marks = [m for m in rep.ranks[0].timeline.marks if m.step == 1]
    reruns = [m.t for m in marks if m.kind == EventKind.RECOMPUTE]
    ticks = [ln.get_xdata()[0] for ln in ax.get_lines() if ln.get_marker() == "|"]
    assert sorted(ticks) == sorted(reruns) and len(reruns) == 2  # gpt-tiny: 2 blocks
    begin = next(m.t for m in marks if m.kind == EventKind.BACKWARD_BEGIN)
    end = next(m.t for m in marks if m.kind == EventKind.BACKWARD_END)
    assert all(begin <= t <= end for t in ticks)


def test_accumulation_and_activation_figures_show_the_reports():
    from zeroedu.notebook.viz.runs import accumulation_figure, activation_bars

    reps = {s: {k: run(RunConfig(s, 2, steps=1, micro_batches=k, model="gpt-tiny")) for k in (1, 2)}
            for s in ("zero1", "zero2")}
    fig = accumulation_figure(reps)
    ax = fig.axes[0]
    allv = [v for runs in reps.values() for r in runs.values()
            for v in (sum(r.ranks[0].predicted.comm.values()), r.ranks[0].wire.sent)]
    div, _ = viz.byte_scale(allv)
    for s in reps:
        line = next(ln for ln in ax.get_lines() if ln.get_label() == s)
        assert [y * div for y in line.get_ydata()] == pytest.approx(
            [sum(reps[s][k].ranks[0].predicted.comm.values()) for k in (1, 2)])
    zero2 = next(ln for ln in ax.get_lines() if ln.get_label() == "zero2").get_ydata()
    assert zero2[1] > zero2[0]  # ZeRO-2 reduce-scatters every micro-batch
    _png(fig)
    recs = [_gpt_report("zero2"), _gpt_report("zero2", recompute="full")]
    fig = activation_bars(recs)
    bars = fig.axes[0].patches
    div, _ = viz.byte_scale([r.ranks[0].measured.activations for r in recs])
    assert [b.get_height() * div for b in bars[2:]] == pytest.approx([r.ranks[0].measured.activations for r in recs])
    _png(fig)
    with pytest.raises(ValueError):
        accumulation_figure({})


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_the_ring_picture_follows_the_ring(n):
    """01's step-by-step ring: each rank sends one chunk a step; after the reduce-scatter's N-1
    steps rank r holds the full sum of chunk r only (lab 1's and torch's convention), after the
    all-gather's N-1 every rank holds every chunk's; the figure draws exactly that."""
    sched = viz.ring_schedule(n)
    assert len(sched) == 1 + 2 * (n - 1)
    assert all(len(st["sent"]) == n for st in sched[1:])  # one chunk per rank per step: 2(N-1) chunks of S/N
    after_rs = sched[n - 1]["holds"]
    for r in range(n):
        assert [len(after_rs[r][c]) == n for c in range(n)] == [c == r for c in range(n)]
    assert all(len(cell) == n for row in sched[-1]["holds"] for cell in row)
    fig = viz.ring_steps(n)
    cells = [p for ax in fig.axes for p in ax.patches if p.get_gid()]
    assert len(cells) == len(sched) * n * n
    for k, st in enumerate(sched):
        for r in range(n):
            for c in range(n):
                assert any(p.get_gid() == f"step{k}/r{r}/c{c}/{len(st['holds'][r][c])}" for p in cells)
    # every send drawn: one arrow per rank and step, from the chunk it sent to the same chunk of
    # its right neighbour, which is outlined there; the legend names each shade, the sum and the arrow
    arrows = {a.get_gid(): a for ax in fig.axes for a in ax.texts if (a.get_gid() or "").startswith("step")}
    assert set(arrows) == {f"step{k}/send/r{r}/c{c}" for k, st in enumerate(sched) for r, c in st["sent"].items()}
    for k, st in enumerate(sched):
        for r, c in st["sent"].items():
            tip, tail = arrows[f"step{k}/send/r{r}/c{c}"].xy, arrows[f"step{k}/send/r{r}/c{c}"].xyann
            assert (tail, tip) == ((c + 0.5, n - 0.5 - r), (c + 0.5, n - 0.5 - (r + 1) % n))
            assert any(p.get_gid() == f"step{k}/r{(r + 1) % n}/c{c}/{len(st['holds'][(r + 1) % n][c])}"
                       and p.get_linewidth() > 1 for p in cells)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[0] == "its own part only" and labels[n - 1] == f"all {n}: the full sum"
    assert len(labels) == n + 1 and "right neighbour" in labels[-1]
    _png(fig)
    with pytest.raises(ValueError):
        viz.ring_steps(1)


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("zigzag", [False, True])
def test_the_zigzag_grid_draws_the_score_elements_each_rank_computes(cp, zigzag):
    """Each rank's colored cells in the causal grid, times a chunk pair's S/(2cp) x S/(2cp)
    scores, are the score elements `theory.context.work_elements` counts for it (the ring's work,
    which the runs measure); plain: the last rank cp times the first; zig-zag: 2cp + 1 each."""
    from zeroedu.theory.context import work_elements

    seq = 16 * cp
    fig = viz.zigzag_grid(cp)
    drawn = [p.get_gid() for ax in fig.axes for p in ax.patches if p.get_gid()]
    for r in range(cp):
        cells = [g for g in drawn if g.startswith(f"{'zigzag' if zigzag else 'plain'}/r{r}/")]
        assert len(cells) * (seq // (2 * cp)) ** 2 == work_elements(1, 1, seq, cp, r, zigzag)
    counts = [len(viz.causal_blocks(cp, zigzag)[r]) for r in range(cp)]
    assert counts == ([2 * cp + 1] * cp if zigzag else [4 * (r + 1) for r in range(cp)])


@pytest.mark.parametrize("t", [2, 4])
@pytest.mark.parametrize("sp", [False, True])
def test_the_tensor_parallel_figure_splits_a_by_columns_and_b_by_rows(t, sp):
    """A's t blocks tile its width (columns), B's tile its height (rows); X and Z are whole on
    every rank, or with sequence parallelism split by sequence into t bands, and the collectives
    named are the ones whose bytes are the all-reduce's halves."""
    from zeroedu.theory.comm import sent_bytes

    fig = viz.tensor_parallel_mlp(t, sp)
    ax = fig.axes[0]
    by = {p.get_gid(): p for p in ax.patches if p.get_gid()}
    a = [by[f"A/r{i}"] for i in range(t)]
    b = [by[f"B/r{i}"] for i in range(t)]
    assert len({round(p.get_height(), 9) for p in a}) == 1 and len({round(p.get_y(), 9) for p in a}) == 1
    assert len({round(p.get_width(), 9) for p in b}) == 1 and len({round(p.get_x(), 9) for p in b}) == 1
    assert round(sum(p.get_width() for p in a), 9) == round(t * a[0].get_width(), 9)
    texts = {x.get_text() for x in ax.texts}
    if sp:
        assert {f"X/r{i}" for i in range(t)} <= set(by) and {f"Z/r{i}" for i in range(t)} <= set(by)
        assert {"all-gather", "reduce-scatter"} <= texts and "all-reduce" not in texts
    else:
        assert "X/whole" in by and "Z/whole" in by and "all-reduce" in texts
    S = 1 << 20
    assert sent_bytes("all_reduce", S, t) == sent_bytes("all_gather", S, t) + sent_bytes("reduce_scatter", S, t)


def test_the_expert_routing_figure_draws_the_routers_counts_and_the_rows_that_cross():
    """Each cell is the rows the rank's router sent to that expert over the step's micro-batches,
    outlined where the rank holds the expert; the rows that cross are the rest."""
    from zeroedu.notebook.exercises import example_report
    from zeroedu.reports import ExpertRouting

    rep = example_report({"routing": ExpertRouting([0, 1], [[[3, 1, 4, 1], [5, 9, 2, 6]]], [[[0, 0], [0, 0]]], [0])},
                         {"routing": ExpertRouting([2, 3], [[[2, 7, 1, 8], [2, 8, 1, 8]]], [[[0, 0], [0, 0]]], [0])})
    fig = viz.expert_routing(rep)
    ax = fig.axes[0]
    cells = {p.get_gid(): p for p in ax.patches if p.get_gid()}
    assert {g for g in cells} == {"r0/e0/8", "r0/e1/10", "r0/e2/6", "r0/e3/7", "r1/e0/4", "r1/e1/15", "r1/e2/2",
                                 "r1/e3/16"}
    held = {g for g, p in cells.items() if p.get_linewidth() > 1}
    assert held == {"r0/e0/8", "r0/e1/10", "r1/e2/2", "r1/e3/16"}
    texts = {t.get_text() for t in ax.texts}
    assert "13 rows cross" in texts and "19 rows cross" in texts
