"""Every exercise the notebooks ask: its check rejects the placeholder and the wrong answers it
anticipates (with their diagnosis), accepts the answer zeroedu computes, and the notebooks are
built around them (tagged, placeholders in the learner's edition, no solution leaked)."""
from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from zeroedu.answers import LETTERS as LETTERS_

from zeroedu.notebook.exercises import displayed, shuffled
from zeroedu.reports import RunReport, vouch

from zeroedu.notebook.exercises import STYLES, all_exercises, check, generate, get

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))
EXERCISES = all_exercises()


def _as_shown(ex, value):
    """A choice's key as this learner answers it: the letter they see (`shown_order`)."""
    return displayed(ex, value) if shuffled(ex) and isinstance(value, str) and value in ex.options else value


def _context(ex):
    """The exercise's example context, its reports vouched for as a run's own (`reports.vouch`):
    the examples stand in for the runs a notebook makes."""
    ctx = ex.example() if ex.example is not None else {}
    for v in ctx.values():
        for r in (v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(r, RunReport):
                vouch(r)
    return ctx


@pytest.mark.parametrize("ex", EXERCISES, ids=[e.id for e in EXERCISES])
def test_check_rejects_placeholder_and_wrong_answers_and_accepts_the_right_one(ex):
    ctx = _context(ex)
    out = io.StringIO()
    with redirect_stdout(out):
        assert check(ex.id, ..., **ctx) is None
    assert "not answered yet" in out.getvalue() and ex.prompt in out.getvalue()
    assert "Hint" not in out.getvalue()  # hints only after a wrong attempt
    assert ex.wrong, f"{ex.id} anticipates no wrong answer"
    want = ex.expected(**ctx)
    for w in ex.wrong:
        value = w.resolve(ctx)
        assert not ex.right(value, ctx), f"{ex.id}: the anticipated wrong answer {value!r} is accepted"
        with pytest.raises(AssertionError) as ei:
            check(ex.id, _as_shown(ex, value), **ctx)
        assert w.why in str(ei.value)
        assert not ex.hint or ex.hint in str(ei.value)  # the wrong attempt earns the hint
    out = io.StringIO()
    with redirect_stdout(out):
        assert check(ex.id, _as_shown(ex, want), **ctx) is None
    assert "correct" in out.getvalue()
    if ex.kind == "number":  # any other number is refused, saying by how much
        with pytest.raises(AssertionError, match="factor|%"):
            check(ex.id, 2.5 * float(want) + 1, **ctx)


def _cells(path):
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def test_every_exercise_is_asked_in_exactly_one_notebook_cell_tagged_exercise():
    asked = {}
    for p in SOLUTIONS:
        for c in _cells(p):
            src = "".join(c["source"])
            for ex_id in generate.CHECK_ID.findall(src):
                assert "exercise" in c["metadata"].get("tags", []), f"{p.name}: {ex_id} in an untagged cell"
                assert ex_id.split(".")[0] == p.name[:2], f"{p.name} asks {ex_id}"
                asked.setdefault(ex_id, []).append(p.name)
    assert {e.id for e in EXERCISES} == set(asked)
    assert all(len(v) == 1 for v in asked.values())


def test_every_notebook_has_the_styles_the_course_promises():
    by_nb = {}
    for e in EXERCISES:
        by_nb.setdefault(e.notebook, set()).add(e.style)
    for p in SOLUTIONS:
        nb = p.name[:2]
        styles = by_nb.get(nb, set())
        assert {"predict", "measure"} <= styles, f"{p.name}: {sorted(styles)}"
        if int(nb) >= 3:
            assert "find-the-bug" in styles, f"{p.name}: no find-the-bug exercise"
    assert set().union(*by_nb.values()) <= set(STYLES)


def test_learner_notebooks_are_generated_and_hold_no_solution():
    assert generate.generate(check=True) == []  # `python -m zeroedu.notebook.exercises generate`
    for p in SOLUTIONS:
        learner = ROOT / "notebooks" / p.name
        for c in _cells(learner):
            src = "".join(c["source"])
            assert "# solution" not in src
            if "exercise" in c["metadata"].get("tags", []):
                assert re.search(r"=\s*\.\.\.", src), f"{p.name}: an exercise cell without a placeholder"
                text = "".join("".join(o.get("text", "")) for o in c["outputs"])
                assert "correct" not in text and "not answered yet" in text
                assert "Hint" not in text, f"{p.name}: a hint shown before any attempt"
            if generate.SHOWS_ANSWER in c["metadata"].get("tags", []):
                assert c["outputs"] == [] and c["execution_count"] is None, p.name


def test_a_prediction_is_not_answered_by_the_learners_notebook():
    """After a predict exercise the learner's edition shows no output until the next exercise;
    the solution shows the run (so the clearing is what hides it)."""
    hidden = 0
    for p in SOLUTIONS:
        sol, learner = _cells(p), _cells(ROOT / "notebooks" / p.name)
        hiding = False
        for s, c in zip(sol, learner):
            if "exercise" in c["metadata"].get("tags", []):
                hiding = any(get(i).style == "predict"
                             for i in re.findall(r'check\(\s*"(\d+\.\d+)"', "".join(c["source"])))
                assert (generate.PREDICT_NOTE in "".join("".join(o.get("text", "")) for o in c["outputs"])) == hiding
            elif hiding and c["cell_type"] == "code":
                assert c["outputs"] == [] and c["execution_count"] is None, p.name
                hidden += bool(s["outputs"])
    assert hidden >= 13  # at least one run per notebook whose output the solution shows


def test_find_the_bug_variants_are_strategies_and_unknown_ids_are_refused():
    from zeroedu.runtime.rank import resolve_ref
    from zeroedu.strategies.base import Strategy

    refs = {ref for p in SOLUTIONS for c in _cells(p)
            for ref in re.findall(r'strategy_class="([\w.]+:\w+)"', "".join(c["source"]))}
    assert refs, "no notebook runs a broken variant"
    for ref in refs:
        cls = resolve_ref(ref)
        assert isinstance(cls, type) and issubclass(cls, Strategy), ref
    with pytest.raises(ValueError, match="unknown exercise"):
        get("00.0")


def test_a_measure_check_reads_only_a_report_a_run_returned():
    """The forged answers of a learner who wants the points: a dict shaped like a report, or a
    report typed by hand, are refused where the exercise reads a run's report."""
    from zeroedu.notebook.exercises import example_report

    forged = {"ranks": [{"wire": {"sent": 42}}]}
    with pytest.raises(AssertionError, match="not a dict"):
        check("02.3", 1.0, base=forged, acc=forged)
    typed = example_report({"wire": {"sent": 42}})
    with pytest.raises(AssertionError, match="built by hand"):
        check("02.3", 1.0, base=typed, acc=typed)
    with pytest.raises(AssertionError, match="built by hand"):
        check("09.3", 1.0, **{k: {n: example_report() for n in v} if isinstance(v, dict) else v
                               for k, v in _context(get("09.3")).items()})
    ctx = _context(get("02.3"))  # vouched: as a run's own
    check("02.3", get("02.3").expected(**ctx), **ctx)



def _cell(code: str, name: str):
    """Run `code` as a notebook cell does: its source registered in linecache (IPython does the same)."""
    import linecache

    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    exec(compile(code, name, "exec"), {"check": check})


def test_a_derivation_computed_by_the_package_is_refused():
    out = io.StringIO()
    with redirect_stdout(out):
        _cell('answer = 16 * 1.5e9\ncheck("02.4", answer)\n', "<cell-derive-ok>")
    assert "correct" in out.getvalue()
    for code in ('from zeroedu import theory\nanswer = theory.model_states("ddp", 1.5e9, 8).total\ncheck("02.4", answer)\n',
                 'from zeroedu.theory import model_states\nanswer = model_states("ddp", 1.5e9, 8).total\n'
                 'check("02.4", answer)\n',
                 'from zeroedu import shard\nanswer = shard.dim0_rows(10, 4, 3).size\ncheck("06.1", answer)\n'):
        with pytest.raises(AssertionError, match="asks you to derive"):
            _cell(code, "<cell-derive-bad>")


def test_no_solution_derives_with_the_package():
    from zeroedu.notebook.exercises import _package_calls

    for p in SOLUTIONS:
        for c in _cells(p):
            src = "".join(c["source"])
            if "exercise" in c["metadata"].get("tags", []) and any(
                    get(i).style == "formula" for i in generate.CHECK_ID.findall(src)):
                assert not _package_calls().search(src), (p.name, src)


@pytest.mark.parametrize("learner", ["ada", "grace", "root", "学生"])
def test_notebook_choices_put_the_right_answer_at_every_letter(learner):
    """For any learner, over the notebooks' lettered choices, the right option is shown at each
    letter within ±10 points of 1/k (before: a 11, b 15, c 6, d 0 of 32); the letter they see is
    graded, and so is the option's text."""
    from zeroedu.answers import learner_seed
    from zeroedu.notebook.exercises import canonical, shown_order

    seed = learner_seed(learner)
    four = [e for e in EXERCISES if shuffled(e) and len(e.options) == 4]
    assert len(four) >= 25
    at = [shown_order(e, seed).index(e.expected(**_context(e))) for e in four]
    for p in range(4):
        assert abs(at.count(p) / len(at) - 0.25) <= 0.10, (learner, p, at.count(p), len(at))
    for e in four:
        right = e.expected(**_context(e))
        assert canonical(e, LETTERS_[shown_order(e, seed).index(right)], seed) == right
        assert canonical(e, e.options[right], seed) == right



def test_the_longest_option_is_not_the_tell_in_the_notebooks():
    """Over the notebooks' lettered choices the right option is the longest no more often than
    1/k + 10 points (before: 21 of 31)."""
    choices = [e for e in EXERCISES if shuffled(e)]
    longest = 0
    for e in choices:
        lengths = {k: len(v) for k, v in e.options.items()}
        right = e.expected(**_context(e))
        longest += lengths[right] == max(lengths.values()) and list(lengths.values()).count(max(lengths.values())) == 1
    k = sum(len(e.options) for e in choices) / len(choices)
    assert longest / len(choices) <= 1 / k + 0.10, (longest, len(choices))
