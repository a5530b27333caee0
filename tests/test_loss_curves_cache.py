"""The 200-step loss curves the course and the README show (`benchmarks/results/loss_curves.json`,
written by `benchmarks/bench_loss_curves.py`): one per strategy family, learning, on the
single-process curve; and the figure drawn from them."""
from __future__ import annotations

import json
import os

import pytest

from zeroedu.notebook import viz
from zeroedu.references.bench import RESULTS_DIR

pytestmark = pytest.mark.fast


def test_every_family_learns_on_the_single_process_curve():
    data = json.load(open(os.path.join(RESULTS_DIR, "loss_curves.json")))
    assert data["steps"] == 200 and data["recipe"] == "fp32"
    assert {r["strategy"] for r in data["rows"]} >= {"ddp_bucketed", "zero1", "zero2", "fsdp2", "megatron_distopt",
                                                      "hfsdp"}
    for r in data["rows"]:
        losses, ref = r["losses"], r["reference"]
        assert len(losses) == len(ref) == 200
        assert sum(losses[-20:]) / 20 < 0.5 * sum(losses[:5]) / 5  # it learns: the loss more than halves
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref))
        assert worst == pytest.approx(r["worst_relative"]) and worst < 1e-4, r["strategy"]


def test_the_figure_has_integer_step_ticks_and_a_curve_per_family():
    data = json.load(open(os.path.join(RESULTS_DIR, "loss_curves.json")))
    fig = viz.learning_curves(data)
    left, right = fig.axes[:2]
    assert len(left.lines) == 1 + len(data["rows"]) and len(right.lines) == len(data["rows"])
    ticks = [t for t in left.get_xticks() if 0 <= t <= 200]
    assert ticks and all(float(t).is_integer() for t in ticks)
