"""Each notebook of the course says what it will teach and what it assumes, and ends with a one-screen
takeaway, before any appendix (the fact-check notebook ends with its summary table and interview corner
instead)."""
from __future__ import annotations

import json
import re
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
    appendix = [i for i, c in enumerate(cells) if "".join(c["source"]).startswith("## Appendix")]
    end = cells[appendix[0] - 1] if appendix else cells[-1]  # the takeaway closes the course text
    last = "".join(end["source"])
    assert end["cell_type"] == "markdown" and last.startswith("## Takeaway")
    assert len(last.split()) <= 250 and last.count("\n- ") >= 2  # a few points, one screen


def test_the_learner_editions_keep_them():
    for p in COURSE:
        learner = json.loads((ROOT / "notebooks" / p.name).read_text())["cells"]
        assert any("".join(c["source"]).startswith("## Takeaway") for c in learner), p.name


WORD_BUDGET = 18_000  # words of markdown a learner reads on the main path, all notebooks together


def main_path_words(text: str) -> int:
    """Words of a markdown cell outside its `<details>` deep dives (nesting counted, so text after an
    inner `</details>` is still inside the outer one)."""
    depth, kept = 0, []
    for piece in re.split(r"(<details>|</details>)", text):
        if piece == "<details>":
            depth += 1
        elif piece == "</details>":
            depth = max(depth - 1, 0)
        elif depth == 0:
            kept.append(piece)
    return len(" ".join(kept).split())


READING_RATE = 200  # words a minute: the README's "read" column


def test_the_readme_states_each_notebooks_reading_time():
    """Each notebook's main path (learner edition, markdown outside `<details>`) fits the reading
    time the README's table states for it, at 200 words a minute, and the table has a row for
    every notebook of the course."""
    readme = (ROOT / "README.md").read_text()
    stated = {m.group(1): int(m.group(2)) for m in re.finditer(
        r"^\| \[(\d\d_\w+)\]\(notebooks/\1\.ipynb\) \|.*?\| (\d+) min \| [^|]+\|$", readme, re.M)}
    learner = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert sorted(stated) == learner
    for name, minutes in stated.items():
        cells = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())["cells"]
        words = sum(main_path_words("".join(c["source"])) for c in cells if c["cell_type"] == "markdown")
        assert words <= minutes * READING_RATE, (name, words, minutes)


def test_main_path_words():
    assert main_path_words("a b <details><summary>s</summary> c <details>d</details> e </details> f") == 3
    counts = {}
    for p in sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb")):
        cells = json.loads(p.read_text())["cells"]
        counts[p.stem] = sum(main_path_words("".join(c["source"])) for c in cells if c["cell_type"] == "markdown")
    assert sum(counts.values()) <= WORD_BUDGET, counts
