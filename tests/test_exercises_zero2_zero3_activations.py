"""Notebooks 05, 07 and 09 (ZeRO-2, ZeRO-3, activations): the broken strategies their find-the-bug
exercises run still show exactly the symptoms the exercises' options are told apart by (gpt-tiny, 2 ranks, so the checks stay quick).

Expected values come from the closed forms (the report's prediction) and single-process
training (the report's reference losses), never from the broken strategies themselves."""
from __future__ import annotations

import pytest

from zeroedu.notebook.exercises import get
from zeroedu.notebook.report import max_rel_diff
from zeroedu.train import RunConfig, run
from zeroedu.kinds import EventKind


def _run(strategy, cls, **kw):
    return run(RunConfig(strategy, 2, model="gpt-tiny", strategy_class=f"zeroedu.notebook.bugs.{cls}", **kw))


def test_zero2_broken_loses_micro_batches_and_nothing_else():
    rep = _run("zero2", "nb05:ZeRO2Broken", steps=3, micro_batches=2, recipe="fp32")
    assert rep.match.plain() == {"model_states": True, "comm": True, "wire": True, "activations": True, "losses": False}
    assert max_rel_diff(rep.losses, rep.reference_losses) > 1e-5  # fp32 ZeRO-2 is within 1e-6
    same = _run("zero2", "nb05:ZeRO2Broken", steps=2, recipe="fp32")  # one micro-batch: nothing to lose
    assert max_rel_diff(same.losses, same.reference_losses) < 1e-5
    assert get("05.6").expected() == "c"


def test_fsdp_broken_keeps_units_gathered_and_sends_two_thirds_of_the_all_gathers():
    rep = _run("fsdp1", "nb07:FSDPBroken", steps=2)
    r0 = rep.ranks[0]
    assert rep.match.model_states and rep.match.activations and not rep.match.comm
    assert r0.measured.comm["all_gather"] * 2 == r0.predicted.comm["all_gather"]
    assert r0.measured.comm["reduce_scatter"] == r0.predicted.comm["reduce_scatter"]
    assert max_rel_diff(rep.losses, rep.reference_losses) < 1e-2  # the mixed-bf16 tolerance
    last = [e for e in r0.timeline.events if e.step == rep.steps - 1]
    boundary = next(e for e in last if e.kind == EventKind.FORWARD_END)
    assert boundary.bytes["gathered"] == r0.predicted.param * 2  # every unit's bf16 params, N = 2
    assert get("07.5").expected() == "b"


@pytest.mark.parametrize("k", [2, 3])
def test_ddp_broken_syncs_every_micro_batch_on_the_running_sum(k):
    rep = _run("ddp", "nb09:DDPBroken", steps=2, micro_batches=k, recipe="fp32", global_batch=12)
    r0 = rep.ranks[0]
    assert rep.match.model_states and not rep.match.comm
    assert r0.measured.comm["all_reduce"] == (k + 1) * r0.predicted.comm["all_reduce"]
    assert max_rel_diff(rep.losses, rep.reference_losses) > 1e-5  # fp32 DDP is within 1e-6
    assert get("09.5").expected() == "a"
