"""Notebooks 04, 06 and 08 (the distributed optimizer, the FSDP linear layer, FSDP1 vs FSDP2): the broken
variants show the symptoms their find-the-bug exercises describe,
and the per-call layer job measures what notebook 06 says it measures. Small models, few steps."""
from __future__ import annotations

import torch

from zeroedu import shard
from zeroedu.models import get_model, make_model, unit_shapes
from zeroedu.runtime import cluster
from zeroedu.strategies.fsdp_linear import linear_job, make_linear
from zeroedu.train import RunConfig, run

LAYER = {"in_features": 12, "out_features": 7, "global_batch": 24, "steps": 2, "lr": 0.1}


def test_layer_job_measures_each_call_and_the_broken_layer_forgets_the_mean():
    n = 4
    good = cluster.run(linear_job, n, {"layer": "zeroedu.strategies.fsdp_linear:FSDPLinear", **LAYER})
    bad = cluster.run(linear_job, n, {"layer": "zeroedu.notebook.bugs.nb06:BrokenFSDPLinear", **LAYER})
    c = shard.dim0_chunk_rows(7, n)
    s_w, s_b = 4 * c * n * 12, 4 * c * n
    for g, b in zip(good, bad):
        calls = g["calls"]
        assert calls["forward"]["ring_model"] == 3 / 4 * (s_w + s_b)
        assert calls["backward"]["ring_model"] == 3 / 4 * (2 * s_w + s_b)
        for call in ("forward", "backward"):
            # zeroedu's ring collectives: N - 1 messages each, 144 B of gloo framing per message
            assert calls[call]["messages"] == (n - 1) * len(calls[call]["collectives"])
            assert calls[call]["wire"] == calls[call]["ring_model"] + 144 * calls[call]["messages"]
            assert b["calls"][call] == calls[call]
        assert calls["saved_bytes"] == 4 * (24 // n) * 12  # X only
        assert b["losses"][0] == g["losses"][0] and b["losses"][1] != g["losses"][1]
    init = [p.detach() for p in make_linear(12, 7).parameters()]
    for p0, pg, pb in zip(init, good[0]["params_after_first_step"], bad[0]["params_after_first_step"]):
        ratio = (pb - p0) / (pg - p0)
        assert torch.allclose(ratio, torch.full_like(ratio, float(n)), rtol=1e-3)


def test_broken_fsdp2_matches_bytes_and_memory_but_only_the_short_rank_learns_wrong():
    cfg = dict(steps=1, recipe="fp32", model="gpt-tiny", global_batch=6, return_params=True)
    bug = run(RunConfig("fsdp2", 3, strategy_class="zeroedu.notebook.bugs.nb08:BrokenFSDP2", **cfg))
    assert bug.match.model_states and bug.match.comm and bug.match.wire
    assert abs(bug.losses[0] - bug.reference_losses[0]) <= 1e-6 * bug.reference_losses[0]
    shapes = [s for u in unit_shapes(make_model(get_model("gpt-tiny"))) for s in u]
    worst = [0.0] * 3
    for s, p, q in zip(shapes, bug.params, bug.reference_params):
        for r in range(3):
            rows = shard.dim0_rows(s[0], 3, r)
            if rows.size and s != (96,):  # qkv bias: its key third moves on round-off alone
                worst[r] = max(worst[r], float((p[rows.start:rows.end] - q[rows.start:rows.end]).abs().max()))
    assert worst[0] < 1e-4 and worst[1] < 1e-4 and worst[2] > 1e-4


def test_broken_distopt_halves_the_reduce_scatter():
    bug = run(RunConfig("megatron_distopt", 2, steps=2, model="gpt-tiny",
                        strategy_class="zeroedu.notebook.bugs.nb04:BrokenDistOpt"))
    assert bug.match.model_states and not bug.match.comm and not bug.match.wire
    for r in bug.ranks:
        assert r.measured.comm["reduce_scatter"] == r.predicted.comm["reduce_scatter"] / 2
        assert r.measured.comm["all_gather"] == r.predicted.comm["all_gather"]
