"""The time lessons' plumbing (`zeroedu.notebook.time_lessons`), without ranks: rounds merged by
median, the committed results read back, the prediction checked within a tolerance."""
from __future__ import annotations

import json

import pytest

from zeroedu.notebook import time_lessons as tl
from zeroedu.train import RunConfig
from zeroedu.train.config import resolve

pytestmark = pytest.mark.fast


def _row(label, measured, predicted, peak=10):
    return tl.TimedRun(label, None, measured, predicted, bound=predicted / 2, exposed=measured / 4,
                       predicted_exposed=predicted / 4, peak=peak)


def test_rounds_merge_by_median_per_configuration():
    rounds = [[_row("a", 1.0, 2.0), _row("b", 5.0, 5.0, peak=3)],
              [_row("a", 3.0, 1.0), _row("b", 6.0, 4.0, peak=7)],
              [_row("a", 2.0, 9.0), _row("b", 4.0, 6.0, peak=5)]]
    a, b = tl.median_of(rounds)
    assert (a.measured, a.predicted, a.bound) == (2.0, 2.0, 1.0)
    assert (b.measured, b.predicted, b.peak) == (5.0, 5.0, 7)
    with pytest.raises(ValueError, match="different lessons"):
        tl.median_of([[_row("a", 1, 1)], [_row("z", 1, 1)]])


def test_the_derivation_inputs_merge_and_stay_unknown_when_a_round_lacks_them():
    def row(backward, collectives, busy):
        return tl.TimedRun("a", 1, 1.0, 1.0, 1.0, 0.1, 0.1, 1, backward=backward, collectives=collectives,
                           link_busy=busy)
    merged, = tl.median_of([[row(0.1, 7, 0.3)], [row(0.3, 7, 0.1)], [row(0.2, 7, 0.2)]])
    assert (merged.backward, merged.collectives, merged.link_busy) == (0.2, 7, 0.2)
    # a count that differs between rounds (bucket boundaries moved) is not a median
    merged, = tl.median_of([[row(0.1, 7, 0.3)], [row(None, 8, 0.1)]])
    assert (merged.backward, merged.collectives) == (None, None)


def test_committed_results_read_back_and_the_tolerance_bites(tmp_path):
    rows = [_row("one bucket", 0.300, 0.290), _row("1 MiB buckets", 0.200, 0.250)]
    path = tmp_path / "lessons.json"
    path.write_text(json.dumps({"lessons": {"ddp_buckets": [r.plain() for r in rows]}}))
    assert tl.results("ddp_buckets", str(path)) == rows
    tl.check_prediction(rows[:1], 0.05)
    with pytest.raises(AssertionError, match="1 MiB buckets: predicted 250 ms, measured 200 ms"):
        tl.check_prediction(rows, 0.15)
    assert "one bucket" in tl.table(rows)


def test_every_lesson_configuration_is_a_valid_run_on_links():
    for name, configs in tl.LESSONS.items():
        for label, _, kw in configs:
            cfg = resolve(RunConfig(**kw))
            assert cfg.links is not None, (name, label)


def test_gap_table_sums_the_pauses_by_what_they_waited_for():
    from zeroedu.theory import schedule as S

    link = {"dp_shard": S.Link(alpha=0.0, beta=1e6)}
    prog = [S.Issue("all_gather 0 (fsdp2/unit0/params)", "all_gather", 2e6, "dp_shard", 2),
            S.Wait("all_gather 0 (fsdp2/unit0/params)"), S.Compute("forward", 2),
            S.Issue("reduce_scatter 1 (fsdp2/unit0/grads)", "reduce_scatter", 2e6, "dp_shard", 2),
            S.Wait("reduce_scatter 1 (fsdp2/unit0/grads)"), S.Compute("optimizer", 0.5)]
    res = S.simulate(prog, link)  # AG [0,1], forward [1,3], RS [3,4], optimizer [4,4.5]
    text = tl.gap_table(res, S.bound(prog, link), S.gaps(res, "dp_shard"))
    # the gather before the forward and the reduce-scatter before the optimizer hide behind
    # nothing: the bound is the compute plus both, 2.5 + 1 + 1 s, and this schedule reaches it
    assert text.splitlines()[0] == "step 4500 ms (simulated), bound 4500 ms, compute 2500 ms"
    assert "compute waits for  all_gather (params)" in text and "1000.0 ms in  1 pauses" in text
    assert "link idle before   reduce_scatter (grads)           2000.0 ms" in text


def test_a_quick_lesson_runs_its_quick_configurations_for_a_warm_up_and_one_measured_step(monkeypatch):
    asked = []
    monkeypatch.setattr(tl, "timed", lambda label, rep, x=None: _row(label, 1.0, 1.0))
    monkeypatch.setattr(tl.train, "run", lambda cfg, **kw: asked.append(cfg))
    for name, labels in tl.QUICK.items():
        asked.clear()
        rows = tl.run_lesson(name, steps=4, progress=None, quick=True)
        assert [r.label for r in rows] == [lab for lab, _, _ in tl.LESSONS[name] if lab in labels], name
        assert len(rows) == len(labels) >= 2 and {c.steps for c in asked} == {2} == {tl.QUICK_STEPS}, name
        asked.clear()
        assert len(tl.run_lesson(name, steps=3, progress=None)) == len(tl.LESSONS[name]) and asked[0].steps == 3


def test_a_quick_run_is_drawn_at_its_configurations_places():
    committed = [_row(lab, 0.1 * (i + 1), 0.1) for i, (lab, _, _) in enumerate(tl.LESSONS["hybrid"])]
    live = [_row("hsdp, slow outer", 0.7, 0.7)]
    fig = tl.figure(committed, live)
    mine = next(l for l in fig.axes[0].lines if l.get_label() == "measured (this run)")
    assert list(mine.get_xdata()) == [1] and list(mine.get_ydata()) == [pytest.approx(700.0)]


@pytest.mark.parametrize("lesson", sorted(tl.LESSONS))
def test_the_step_time_figures_labels_do_not_overlap(lesson):
    """Every lesson's figure, drawn: no two x tick labels overlap (10's five hybrid layouts once did)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    committed = tl.results(lesson)
    fig = tl.figure(committed, title=lesson)
    FigureCanvasAgg(fig).draw()  # the layout as a notebook renders it
    boxes = [t.get_window_extent() for t in fig.axes[0].get_xticklabels() if t.get_text()]
    assert len(boxes) == len(committed)
    for a, b in zip(boxes, boxes[1:]):
        assert b.x0 - a.x1 >= 4, (lesson, a, b)  # at least a few pixels apart


def test_the_prefetch_figure_shows_both_halves_of_the_trade():
    """07's knobs: beside the step times (an axis zoomed to their spread, so a 290-400 ms range is
    not drawn on 0-450), each configuration's peak memory, what prefetching or keeping the
    parameters costs; no label overlaps another in either panel."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    committed = tl.results("fsdp_prefetch")
    fig = tl.figure(committed, title="prefetch", memory=True)
    FigureCanvasAgg(fig).draw()
    times, mem = fig.axes
    bars = [p for p in mem.patches if p.get_gid() == "peak memory"]
    assert [b.get_height() for b in bars] == pytest.approx([r.peak / 1e6 for r in committed])
    drawn = [1e3 * getattr(r, f) for r in committed for f in ("measured", "predicted", "bound")]
    lo, hi = times.get_ylim()
    assert 0 < lo <= min(drawn) and max(drawn) <= hi and hi - lo < max(drawn)  # zoomed, nothing cut off
    for ax in (times, mem):
        boxes = [t.get_window_extent() for t in ax.get_xticklabels() if t.get_text()]
        assert len(boxes) == len(committed)
        assert all(b.x0 - a.x1 >= 4 for a, b in zip(boxes, boxes[1:])), ax.get_title()


def test_the_knee_is_drawn_where_compute_alone_meets_communication_alone():
    """07's T*: the compute line (6Ψ per token at F) and the communication line cross at T*, and
    the figure marks that point."""
    rows = tl.results("fsdp_tokens")
    psi, flops, comm = 3.2e6, 1.26e11, 0.122
    t_star = comm * flops / (6 * psi)  # where 6Ψ·T/F = comm
    fig = tl.mark_knee(tl.figure(rows), psi, flops, comm, t_star)
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    compute, flat = lines["compute alone: 6Ψ·tokens / F"], lines["communication alone"]
    assert flat.get_ydata()[0] == pytest.approx(1e3 * comm)
    xs, ys = compute.get_xdata(), compute.get_ydata()
    assert ys[0] < 1e3 * comm < ys[-1]  # the crossing is inside the figure
    knee = next(ln for label, ln in lines.items() if label.startswith("T* = "))
    assert knee.get_xdata()[0] == pytest.approx(t_star) and knee.get_ydata()[0] == pytest.approx(1e3 * comm)
    assert 1e3 * 6 * psi * t_star / flops == pytest.approx(1e3 * comm)
