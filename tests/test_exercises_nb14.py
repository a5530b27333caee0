"""Notebook 14: the ring attention whose work is off shows the symptom its find-the-bug exercise
relies on (every other column equal to its closed form, the losses one process's), the one table
of every axis reads what the runs measured (and says so when a run is off), and the design
exercise is graded by the planner's conditions, whatever the plan's spelling."""
from __future__ import annotations

import pytest

from zeroedu.models import get_model
from zeroedu.notebook.exercises import check, get
from zeroedu.theory.context import work_elements
from zeroedu.train import RunConfig, axes

TINY = get_model("gpt-tiny")
BUG = "zeroedu.notebook.bugs.nb14:MysteryRing"


def _cp(runs, zigzag=False, ring_class=None, cp=4):
    return runs(RunConfig("ddp", cp, steps=1, model="gpt-tiny", recipe="fp32", attention="eager", global_batch=4,
                          cp=cp, zigzag=zigzag, ring_class=ring_class))


@pytest.mark.parametrize("zigzag", [False, True])
def test_mystery_ring_computes_what_the_mask_empties_and_nothing_else_differs(zigzag, runs):
    bug = _cp(runs, zigzag, BUG)
    assert all(v is True for v in vars(bug.match).values()), bug.match  # bytes, activations, losses: all right
    b, heads, s, layers = 4, TINY.n_heads, TINY.seq_len, TINY.n_layers
    for r in bug.ranks:
        # every chunk pair, masked or not: S x S / cp scores per head, as without a causal mask
        assert r.ring.score_elements == layers * b * heads * s * s // 4
        assert r.ring.predicted_score_elements == layers * work_elements(b, heads, s, 4, r.rank, zigzag)
    over = [r.ring.score_elements > r.ring.predicted_score_elements for r in bug.ranks]
    assert over == ([True] * 4 if zigzag else [True, True, True, False])  # plain: the last rank needs every block
    assert get("14.4").expected() == "a"


def test_the_axes_table_reads_every_run_and_flags_one_that_is_off(runs):
    tp = runs(RunConfig("fsdp2", 4, steps=3, model="gpt-tiny", recipe="fp32", tp=2))
    pp = runs(RunConfig("ddp", 2, steps=1, model="gpt-small", recipe="fp32", pp=2, micro_batches=2))
    cp = _cp(runs, True, cp=2)
    ep = runs(RunConfig("zero2", 4, steps=2, model="gpt-tiny", recipe="fp32", experts=4, top_k=2, ep=2))
    rows = axes.summary(tp=tp, pp=pp, cp=cp, ep=ep)
    assert [r.axis for r in rows] == ["tp"] * 3 + ["pp"] * 2 + ["cp"] * 3 + ["ep"] * 3
    assert all(r.match and r.every_rank and r.trains for r in rows)
    r0 = tp.ranks[0]
    assert rows[0].measured == sum(r0.measured.comm_by_axis["tp"].values()) > 0
    assert rows[3].measured == pp.ranks[0].measured.activations > 0
    assert rows[5].measured == sum(cp.ranks[0].measured.comm_by_axis["cp"].values()) > 0
    assert rows[8].measured == sum(ep.ranks[0].measured.comm_by_axis["ep"].values()) > 0
    assert rows[10].measured == ep.ranks[0].measured.total
    bad = axes.summary(cp=_cp(runs, ring_class=BUG, cp=2))
    scores = next(r for r in bad if r.quantity.startswith("score elements"))
    assert not scores.match and not scores.every_rank and scores.trains
    assert "False" in axes.table_text(bad)


@pytest.mark.fast
@pytest.mark.parametrize("answer", ["dp 8, tp 8, pp 4, ZeRO-1", "tp=8 pp=4 dp=8 zero 1", "dp 16, tp 8, pp 2, ZeRO-3"])
def test_the_design_exercise_accepts_good_plans_however_written(answer, capsys):
    check("14.3", answer)
    assert "correct" in capsys.readouterr().out


@pytest.mark.fast
@pytest.mark.parametrize("answer, condition", [
    ("dp 256, tp 1, pp 1, ZeRO-0", "fits in memory"),
    ("tp 8 pp 4 dp 8", "a plan"),  # no ZeRO level named
    ("dp 32, tp 16, pp 1, ZeRO-3", "tp inside a node"),
    ("dp 4, tp 8, pp 4, ZeRO-1", "exists"),  # 128 GPUs
    ("dp 2, tp 8, pp 16, ZeRO-1", "small bubble"),
    ("eight-way tensor parallel, lots of data parallel", "a plan"),
])
def test_the_design_exercise_names_the_condition_a_wrong_plan_breaks(answer, condition):
    with pytest.raises(AssertionError) as ei:
        check("14.3", answer)
    assert f"{condition}:" in str(ei.value)
    assert "Hint" in str(ei.value)
