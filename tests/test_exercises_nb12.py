"""Notebook 12: the broken ZeRO-2 of exercise 12.5 shows the symptom the exercise and the
diagnoses of its wrong options rely on, on real ranks: more gradient bytes than the closed form
(the full bf16 buffer, never freed), while the ring model, the wire and the losses all still
agree with correct ZeRO-2. The predictions 12.2 and 12.4 follow from the closed forms written
out by hand."""
from __future__ import annotations

import pytest

from zeroedu import shard
from zeroedu.models import make_model, unit_shapes
from zeroedu.notebook.exercises import get
from zeroedu.notebook.nbtools import loss_rel_diff
from zeroedu.train import RunConfig, run


def test_zero2_that_zeroes_instead_of_freeing_holds_the_full_gradient():
    n = 4
    r = run(RunConfig("zero2", n, steps=3, model="gpt-tiny",
                      strategy_class="zeroedu.notebook.bugs.nb12:ZeRO2ZeroedNotFreed"))
    psi_p = sum(shard.padded_numel(sum(shard.numel(s) for s in u), n)
                for u in unit_shapes(make_model("gpt-tiny")))
    for rk in r.ranks:
        me, pr = rk.measured, rk.predicted
        assert me.grad - pr.grad == 2 * psi_p  # option a: the full bf16 buffer outlives its reduction
        assert (me.param, me.optim) == (pr.param, pr.optim)
        assert me.comm == pr.comm  # not b (no all-reduce) and not d (one gather per step)
    assert not r.match.model_states and r.match.comm and r.match.wire
    assert loss_rel_diff(r) <= 1e-2  # not c: the same training as single-process
    assert get("12.5").expected() == "a"


@pytest.mark.fast
def test_predictions_follow_the_ring_model():
    # FSDP: 2 all-gathers + 1 reduce-scatter of Ψ (3 halves of an all-reduce) against DDP's 2
    assert get("12.2").expected() == "b"  # 3/2
    # ZeRO-2 with K = 4 micro-batches: 4 reduce-scatters + 1 all-gather against ZeRO-1's 1 + 1
    assert get("12.4").expected() == "c"  # 5/2
