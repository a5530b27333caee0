"""Each notebook of the course says what it will teach and what it assumes, and ends with a one-screen
takeaway (the fact-check notebook ends with its summary table and interview corner instead)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
COURSE = [p for p in sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb")) if not p.name.startswith("13_")]


@pytest.mark.parametrize("path", COURSE, ids=[p.stem for p in COURSE])
def test_goals_assumptions_and_a_takeaway(path):
    cells = json.loads(path.read_text())["cells"]
    opening = "".join(cells[0]["source"])
    assert "**Goals" in opening and "**Assumes**" in opening
    last = "".join(cells[-1]["source"])
    assert cells[-1]["cell_type"] == "markdown" and last.startswith("## Takeaway")
    assert len(last.split()) <= 250 and last.count("\n- ") >= 2  # a few points, one screen


def test_the_learner_editions_keep_them():
    for p in COURSE:
        learner = json.loads((ROOT / "notebooks" / p.name).read_text())["cells"]
        assert "".join(learner[-1]["source"]).startswith("## Takeaway"), p.name
