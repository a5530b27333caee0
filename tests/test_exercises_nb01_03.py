"""Notebooks 01-03: the contexts their exercises are checked with are the real thing.

The generic test (every exercise rejects the placeholder and its anticipated wrong answers and
accepts the expected answer in its example context) lives in `test_exercises.py`. Here: the
example contexts are what real ranks produce (so the exercises are checked against figures a
learner can actually get), the hand-written ring all-gather gathers, and the find-the-bug strategy
shows exactly the symptom its exercise describes: every byte figure right, the losses wrong.
"""
import pytest
import torch

from zeroedu import theory
from zeroedu.notebook.exercises import get, nb01
from zeroedu.notebook.nbtools import loss_rel_diff
from zeroedu.runtime import cluster
from zeroedu.runtime.collectives import collectives_job, rank_tensor, wire_collectives_job
from zeroedu.runtime.wire import FRAMING_PER_MESSAGE, messages
from zeroedu.train import RunConfig, run


@pytest.mark.parametrize("n", [1, 3, 4])
def test_ring_all_gather_by_hand_gathers_the_shards(n):
    numel = 24
    want = sum(rank_tensor(r, numel) for r in range(n))
    for res in cluster.run(collectives_job, n, {"numel": numel}):
        assert torch.equal(res["ring_all_gather"], want)
        padded = numel + (-numel) % n
        assert res["comm"][3].get("send", 0.0) == float(theory.sent_bytes("all_gather", padded * 4, n))


def test_notebook01_example_is_what_four_ranks_measure():
    """The exercises' example context (ring model + gloo's message counts) equals the wire."""
    res = cluster.run(wire_collectives_job, 4, {"numel": nb01.S // 4, "repeats": 1})
    example = nb01._example()["wire"][4][0]
    for rank in res:
        for impl, figs in rank.items():
            for op, f in figs.items():
                assert f["ok"], (impl, op)
                assert f["wire"][0] == example[impl][op]["wire"][0], (impl, op)
                assert f["model"] == example[impl][op]["model"]
                assert f["messages"] == messages(op, nb01.S // 4, 4, 4, impl) == example[impl][op]["messages"]
    # and the measure exercises accept what the run gives
    ctx = {"wire": {4: res}}
    assert get("01.5").right(get("01.5").expected(**ctx), ctx)
    assert get("01.5").expected(**ctx) == pytest.approx(3 / 4, rel=1e-3)  # (N-1)/N of S: 01.4's prediction
    # gloo's reduce-scatter is an all-reduce on the wire, the ring's is on the bound
    r0 = res[0]
    assert r0["backend"]["reduce_scatter"]["wire"][0] == r0["backend"]["all_reduce"]["wire"][0]
    assert (r0["ring"]["reduce_scatter"]["wire"][0]
            == r0["ring"]["reduce_scatter"]["model"] + FRAMING_PER_MESSAGE * 3)


def test_buggy_zero1_has_the_symptom_its_exercise_describes():
    """Memory, collectives and the wire equal ZeRO-1's closed forms; only the losses are off."""
    rep = run(RunConfig("zero1", 4, steps=3, recipe="fp32", model="gpt-tiny",
                        strategy_class="zeroedu.notebook.bugs.nb03:BuggyZeRO1"))
    assert all(v in (True, None) for k, v in rep.match.plain().items() if k != "losses"), rep.match
    assert rep.match.losses is False and loss_rel_diff(rep) > 1e-2
    good = run(RunConfig("zero1", 4, steps=3, recipe="fp32", model="gpt-tiny"))
    assert [r.wire.sent for r in rep.ranks] == [r.wire.sent for r in good.ranks]
    assert loss_rel_diff(good) < 1e-5


@pytest.mark.fast
def test_predictions_come_from_the_closed_forms():
    # 03.1: on a ring, zero1 sends 2Ψ where zero1_allreduce sends 3Ψ
    assert get("03.1").expected() == "a"
    # 02.1: the optimizer state is the largest of the four figures for notebook 02's run
    assert get("02.1").expected() == "c"
