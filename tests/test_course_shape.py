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


def _next(path: Path) -> str | None:
    """The notebook a takeaway's "**Next**" line links to (its file name), or None."""
    for c in json.loads(path.read_text())["cells"]:
        text = "".join(c["source"])
        if text.startswith("## Takeaway"):
            m = re.search(r"^\*\*Next\*\*: \[[^\]]+\]\((\d\d_\w+\.ipynb)\)", text, re.M)
            return m.group(1) if m else None
    return None


def test_each_takeaway_ends_with_next_and_the_chain_walks_the_whole_course():
    """Every notebook of the course ends its takeaway with a "Next" line naming the notebook to open
    next; followed from 01, the links visit every notebook once (13, the fact-check, last), and
    each link names a notebook that exists, in the learner editions too."""
    seen, here = [], "01_collectives.ipynb"
    while here is not None:
        assert here not in seen, seen
        seen.append(here)
        assert (ROOT / "notebooks" / here).exists(), here
        here = _next(ROOT / "notebooks" / "solutions" / here) if here != "13_fact_check.ipynb" else None
        if seen[-1] != "13_fact_check.ipynb":
            assert here is not None, f"{seen[-1]}: its takeaway has no Next line"
    everything = sorted(p.name for p in (ROOT / "notebooks" / "solutions").glob("*.ipynb"))
    # 04 is an optional side trip, linked beside the next step from 03: all but 04 are on the chain
    assert sorted(seen) == [n for n in everything if not n.startswith("04_")], seen
    assert _next(ROOT / "notebooks" / "solutions" / "04_megatron_distopt.ipynb") == "05_zero2.ipynb"
    for p in COURSE:
        assert _next(ROOT / "notebooks" / p.name) == _next(p), p.name  # the learner edition keeps it


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


WORD_BUDGET = 19_325  # words of markdown a learner reads on the main path, all notebooks together (+50: 01, 07 and 14 say what their redrawn figures show)
# (18,000 until notebook 14 gained the composed dp x tp x pp run, 153 words, with issue 87; 18,150 until
# each takeaway gained the "Next" line that walks the course's order, 163 words, with issue 89; 18,315
# until notebook 14 taught on its main path what its collapsed blocks held, tp's split and SP's bytes,
# the schedules, the online softmax and zig-zag, the experts' data-dependent bytes and why the
# planner's #1 is not a published plan, and the experts' routing figure and exercise, 960 words, with
# issue 89)


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
    """Each notebook's main path (learner edition, markdown outside `<details>`, before its
    appendix) fits the reading
    time the README's table states for it, at 200 words a minute, and the table has a row for
    every notebook of the course."""
    readme = (ROOT / "README.md").read_text()
    stated = {m.group(1): int(m.group(2)) for m in re.finditer(
        r"^\| \[(\d\d_\w+)\]\(notebooks/\1\.ipynb\) \|.*?\| (\d+) min \| [^|]+\|$", readme, re.M)}
    learner = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert sorted(stated) == learner
    for name, minutes in stated.items():
        words = notebook_words(ROOT / "notebooks" / f"{name}.ipynb")
        assert words <= minutes * READING_RATE, (name, words, minutes)



def test_the_readme_counts_each_notebooks_main_path_exercises():
    """The README's "exercises" column is the number of distinct exercises a learner meets on each
    notebook's main path (learner edition, before its appendix), read from the cells that ask them."""
    readme = (ROOT / "README.md").read_text()
    stated = {m.group(1): int(m.group(2)) for m in re.finditer(
        r"^\| \[(\d\d_\w+)\]\(notebooks/\1\.ipynb\) \|.*?\| (\d+) \| \d+ min \| [^|]+\|$", readme, re.M)}
    learner = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert sorted(stated) == learner
    for name, count in stated.items():
        ids = set()
        for c in json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())["cells"]:
            if c["cell_type"] == "markdown" and "".join(c["source"]).lstrip().startswith("## Appendix"):
                break
            ids.update(_exercise_ids(c))
        assert count == len(ids), (name, count, sorted(ids))

def main_path_cells(cells: list[dict]) -> list[dict]:
    """A notebook's markdown cells on its main path: those before its first "## Appendix"
    heading (the substrate's details, read by whoever wants them)."""
    out = []
    for c in cells:
        if c["cell_type"] == "markdown" and "".join(c["source"]).lstrip().startswith("## Appendix"):
            break
        if c["cell_type"] == "markdown":
            out.append(c)
    return out


def notebook_words(path) -> int:
    cells = json.loads(path.read_text())["cells"]
    return sum(main_path_words("".join(c["source"])) for c in main_path_cells(cells))


def test_main_path_words():
    assert main_path_words("a b <details><summary>s</summary> c <details>d</details> e </details> f") == 3
    counts = {}
    for p in sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb")):
        counts[p.stem] = notebook_words(p)
    assert sum(counts.values()) <= WORD_BUDGET, counts


def _exercise_ids(cell) -> list[str]:
    return re.findall(r"""(?:check|show_options)\(\s*["'](\d+\.\d+)["']""", "".join(cell["source"]))


def test_the_course_opens_on_the_idea_and_the_framing_exercise_is_an_appendix():
    """The first prediction of the course is about the ring, not about the CPU substrate (gloo's
    reduce-scatter); the exercise on gloo's framing bytes sits in notebook 06's appendix, after
    its takeaway, in both editions."""
    from zeroedu.notebook.exercises import get

    for folder in (ROOT / "notebooks" / "solutions", ROOT / "notebooks"):
        cells = json.loads((folder / "01_collectives.ipynb").read_text())["cells"]
        first = next(i for c in cells for i in _exercise_ids(c))
        ex = get(first)
        assert "gloo" not in (ex.prompt + " ".join(ex.options.values() if ex.options else [])).lower(), first
        cells = json.loads((folder / "06_fsdp_linear.ipynb").read_text())["cells"]
        heads = ["".join(c["source"]).lstrip().split("\n")[0] for c in cells]
        appendix = heads.index("## Appendix: gloo's framing")
        assert heads.index("## Takeaway") < appendix
        assert next(k for k, c in enumerate(cells) if "06.5" in _exercise_ids(c)) > appendix


def test_no_exercise_about_gloo_on_the_main_path_of_any_notebook():
    """The notebooks teach the idea: an exercise whose question is about gloo (the CPU substrate:
    its reduce-scatter, its framing) sits in an appendix, after the takeaway."""
    from zeroedu.notebook.exercises import get

    for p in sorted((ROOT / "notebooks" / "solutions").glob("[01][0-9]_*.ipynb")):
        cells = json.loads(p.read_text())["cells"]
        for c in cells:
            if c["cell_type"] == "markdown" and "".join(c["source"]).lstrip().startswith("## Appendix"):
                break
            for ex_id in _exercise_ids(c):
                assert "gloo" not in get(ex_id).prompt.lower(), (p.name, ex_id)


def test_notebook_04_is_optional_no_later_notebook_builds_on_it():
    """04 (Megatron's distributed optimizer) says it is optional on a first pass; that stays true
    only while no later notebook sends the reader back to it."""
    first = json.loads((ROOT / "notebooks" / "04_megatron_distopt.ipynb").read_text())["cells"][0]
    assert "Optional on a first pass" in "".join(first["source"])
    for p in sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb")):
        if p.name[:2] > "04":
            text = "".join("".join(c["source"]) for c in json.loads(p.read_text())["cells"] if c["cell_type"] == "markdown")
            assert not re.search(r"[Nn]otebook 04|04_megatron", text), p.name


# What only notebook 14 teaches: a paragraph that names one of these and sends the reader to a notebook
# must send them to 14 (notebook 12 and the README once credited notebook 11 with 14's pipeline,
# ring and expert runs).
TAUGHT_IN_14 = re.compile(r"\b(?:1F1B|GPipe|pipeline bubble|zig-zag|ring attention|all-to-alls?|router)\b", re.I)


def _paragraphs():
    for p in sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb")):
        for i, c in enumerate(json.loads(p.read_text())["cells"]):
            if c["cell_type"] == "markdown":
                yield from ((f"{p.name} cell {i}", para) for para in re.split(r"\n\s*\n", "".join(c["source"])))
    for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        yield from ((p.name, para) for para in re.split(r"\n\s*\n", p.read_text()))


def test_cross_references_name_notebooks_that_exist_and_hold_what_they_claim():
    numbers = {p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    wrong = []
    for where, para in _paragraphs():
        refs = set(re.findall(r"\b[Nn]otebooks? (\d\d)\b", para))
        wrong += [f"{where}: notebook {n} does not exist" for n in refs - numbers]
        if refs and TAUGHT_IN_14.search(para) and "14" not in refs:
            wrong.append(f"{where}: {' '.join(para.split())[:120]} (names {sorted(refs)}, taught in 14)")
    assert not wrong, "\n".join(wrong)
    # the check itself catches the old reference
    assert TAUGHT_IN_14.search("1F1B holds p micro-batches. Notebook 11 measures all three on real ranks.")


def test_step_time_against_n_on_two_cores_is_an_appendix_not_the_main_path():
    """11's timed scaling makes more ranks slower (two cores shared by four ranks): a lesson a
    cluster does not share, so it sits after the takeaway, under an appendix heading that says
    why; the main path keeps the bytes, which scale as on any machine."""
    for folder in (ROOT / "notebooks" / "solutions", ROOT / "notebooks"):
        cells = json.loads((folder / "11_dashboard.ipynb").read_text())["cells"]
        text = ["".join(c["source"]) for c in cells]
        appendix = next(i for i, t in enumerate(text) if t.startswith("## Appendix"))
        timed = [i for i, t in enumerate(text) if 'run_lesson("scaling"' in t or 'results("scaling")' in t]
        assert timed and min(timed) > appendix and "two cores" in text[appendix], folder
        assert any('scaling = {' in t for t in text[:appendix])  # the bytes stay on the main path
