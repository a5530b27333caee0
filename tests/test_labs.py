"""Classroom labs: one source per lab -> a student tree and a separate answer key; the grader in the
package grades without the key, on real ranks, with visible and hidden cases.

* the key (generated into a tmp dir) gets full points on every lab, hidden cases included;
  the student skeletons get zero, each with "not implemented yet: write ..." (never a traceback);
* a plausible wrong answer per lab (and several for the two large labs) is caught with a
  diagnosis that says what and where;
* an answer hard-coded for the visible case loses points on hidden cases;
* the JSON grade has a stable schema and `check --json` exits 0 even when tests fail;
* no solution text is in the installed package (the sources live in labs/source/, outside it).

Expected values are never the key's output: the grader compares with plain torch on the same
inputs, zeroedu.theory, single-process training and the ledger (see zeroedu.labs.basic/training).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from zeroedu.labs import checks, generate
from zeroedu.labs.__main__ import main
from zeroedu.labs.grading import SCHEMA, grade_dict
from zeroedu.labs.registry import LABS, TOTAL_POINTS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "zeroedu"
SEED = 3896  # hidden cases of this seed: labs 1-2 on N = 5 (beyond the visible N), labs 3-6 on N = 3 and 4


@pytest.fixture(scope="module")
def key_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("key")
    generate.build_key(d)
    return d


def _key_text(lab: int) -> str:
    return generate.render(generate.default_source() / LABS[lab].file, "key")


def _mutant(tmp_path, lab, old, new) -> Path:
    src = _key_text(lab)
    assert src.count(old) == 1, old
    p = tmp_path / LABS[lab].file
    p.write_text(src.replace(old, new))
    return p


def _messages(res, test: str) -> list[str]:
    return [d.message for c in res.tests[test].cases for d in c.diagnosis]


# ------------------------------------------------------------------ one source, two artefacts
@pytest.mark.fast
def test_student_tree_is_up_to_date():
    assert generate.stale() == [], "run `python -m zeroedu.labs build` and commit labs/student"


@pytest.mark.fast
def test_one_source_per_lab():
    assert [s.name for s in generate.source_files()] == [lab.file for lab in LABS.values()]
    assert sorted(p.name for p in (ROOT / "labs" / "student").glob("lab*.py")) == \
        sorted(lab.file for lab in LABS.values())
    assert not (ROOT / "labs" / "instructor").exists(), "the key is generated on request, never committed"


@pytest.mark.fast
@pytest.mark.parametrize("src", generate.source_files(), ids=lambda p: p.stem)
def test_versions_from_one_source(src):
    text = src.read_text()
    student, key = generate.render(src, "student"), generate.render(src, "key")
    for t in (student, key):
        compile(t, src.name, "exec")
        assert "BEGIN SOLUTION" not in t and "END SOLUTION" not in t
    regions = text.count("# BEGIN SOLUTION")
    assert student.count("raise NotImplementedError(") == regions >= 1
    assert re.search(r"NotImplementedError\(['\"]write", student)
    body = [ln for ln in text.splitlines() if "# BEGIN SOLUTION" not in ln and "# END SOLUTION" not in ln]
    assert key.splitlines()[2:] == body  # the key is the source minus the marker lines
    assert "ANSWER KEY" in key.splitlines()[0] and "ANSWER KEY" not in student


@pytest.mark.fast
@pytest.mark.parametrize("bad", ["x = 1\n", "# BEGIN SOLUTION a\nx = 1\n", "# END SOLUTION\n",
                                 "# BEGIN SOLUTION a\n# BEGIN SOLUTION b\n# END SOLUTION\n"])
def test_malformed_regions_are_rejected(bad):
    with pytest.raises(ValueError):
        generate.strip(bad, "student")


@pytest.mark.fast
def test_build_writes_student_and_key_only_where_asked(tmp_path):
    written = generate.build_student(tmp_path / "s")
    assert len(written) == len(LABS) and generate.stale(tmp_path / "s") == []
    (tmp_path / "s" / LABS[1].file).write_text("# edited\n")
    assert generate.stale(tmp_path / "s") == [str(tmp_path / "s" / LABS[1].file)]
    assert len(generate.build_key(tmp_path / "k")) == len(LABS)
    for bad in (PACKAGE / "labs" / "key", ROOT / "labs" / "student" / "key", generate.default_source()):
        with pytest.raises(ValueError, match="refusing"):
            generate.build_key(bad)
    with pytest.raises(ValueError, match="not installed"):
        generate.source_files(tmp_path / "nowhere")


@pytest.mark.fast
def test_no_solution_in_the_installed_package():
    from setuptools import find_packages

    assert all(p.startswith("zeroedu") for p in find_packages(str(ROOT), include=["zeroedu*"]))
    files = [p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    texts = {p: p.read_text(errors="ignore") for p in files}
    for p, t in texts.items():
        if "BEGIN SOLUTION" in t or "END SOLUTION" in t:  # only the stripper may name the markers
            assert p == PACKAGE / "labs" / "generate.py", p
        assert not re.match(r"lab\d_", p.name), p
    for src in generate.source_files():
        for region in generate.solution_regions(src.read_text()):
            code = "\n".join(ln.strip() for ln in region.splitlines() if ln.strip() and not ln.strip().startswith("#"))
            assert code
            for p, t in texts.items():
                flat = "\n".join(ln.strip() for ln in t.splitlines() if ln.strip() and not ln.strip().startswith("#"))
                assert code not in flat, f"{src.name}'s solution is in {p}"
    for p in (ROOT / "labs" / "student").glob("*.py"):  # nor in the student tree
        assert "BEGIN SOLUTION" not in p.read_text()


# ------------------------------------------------------------------ key: full points, stubs: none
def _check_schema(g: dict) -> None:
    assert set(g) == {"schema", "seed", "hidden", "n", "student", "course", "points", "max_points", "labs"}
    assert g["schema"] == SCHEMA and g["max_points"] == TOTAL_POINTS == 161
    assert [lab["lab"] for lab in g["labs"]] == list(LABS)
    for lab in g["labs"]:
        assert set(lab) == {"lab", "name", "title", "path", "status", "points", "max_points", "minutes",
                            "notebook", "tests", "messages"}
        assert lab["status"] in ("passed", "failed", "not_implemented", "missing", "error")
        assert lab["max_points"] == sum(t["max_points"] for t in lab["tests"]) == LABS[lab["lab"]].points
        assert lab["points"] == sum(t["points"] for t in lab["tests"])
        for t in lab["tests"]:
            assert set(t) == {"id", "title", "passed", "points", "max_points", "cases"}
            assert t["points"] in (0, t["max_points"]) and t["cases"]
            for c in t["cases"]:
                assert set(c) == {"case", "hidden", "params", "passed", "diagnosis"}
                assert isinstance(c["params"]["n"], int)
                assert c["passed"] == (not c["diagnosis"])
                for d in c["diagnosis"]:
                    assert set(d) == {"message", "rank", "unit", "shard", "element", "expected", "got"}
    json.dumps(g)


def _grade_warm(**where) -> dict:
    """`checks.grade`'s JSON from `checks.check` of every lab on the session's warm rank pools
    (`grade` gives each lab fresh ranks: eight pool start-ups more, tested through the CLI)."""
    results = [checks.check(k, hidden=1, seed=SEED, quiet=True, **where) for k in LABS]
    return grade_dict(results, seed=SEED, hidden=1, n=checks.DEFAULT_N)


def test_key_gets_full_points_on_visible_and_hidden_cases(key_dir, monkeypatch):
    # with the sources out of reach: grading never reads them, only the file it is handed
    monkeypatch.setattr(generate, "default_source", lambda: Path("/nonexistent"))
    g = _grade_warm(directory=key_dir)
    _check_schema(g)
    assert g["points"] == 161, json.dumps([lab["messages"] for lab in g["labs"]], indent=1)
    for lab in g["labs"]:
        assert lab["status"] == "passed"
        hidden = {c["case"] for t in lab["tests"] for c in t["cases"] if c["hidden"]}
        assert hidden == {"hidden-1"}  # the hidden case ran, and passed


def test_skeletons_get_zero_points_with_a_helpful_message():
    g = _grade_warm()
    _check_schema(g)
    assert g["points"] == 0
    for lab in g["labs"]:
        assert lab["status"] == "not_implemented"
        assert lab["messages"][0].startswith("not implemented yet: write"), lab["messages"]
        assert "Traceback" not in json.dumps(lab)


def test_hard_coded_visible_answers_fail_hidden_cases(tmp_path):
    # lab 4: a table of the visible answers
    from zeroedu import theory

    table = {(psi, n, m, r): theory.model_states("hfsdp", psi, n, m, r).as_dict()
             for psi, n, m, r in checks.basic.LAB4_CASES}
    p = tmp_path / LABS[4].file
    p.write_text(f"TABLE = {table!r}\n"
                 "def hfsdp_bytes_per_gpu(psi, n, m, recipe='mixed-bf16'):\n"
                 "    return TABLE.get((psi, n, m, recipe), dict(param=0, grad=0, optim=0, total=0))\n")
    assert checks.check(4, p, quiet=True).points == 10
    res = checks.check(4, p, hidden=2, seed=SEED, quiet=True)
    assert res.points == 0 and any("hidden" in c.case.id and not c.passed for c in res.tests["optim"].cases)
    # lab 1: a ring that runs N-1 = 3 steps whatever N is; seed 5 draws N = 3 for the hidden case
    p = _mutant(tmp_path, 1, "for s in range(world - 1):", "for s in range(3):")
    assert [c.n for c in checks.cases_for(1, 4, 1, 5) if c.hidden] == [3]
    assert checks.check(1, p, quiet=True).ok
    res = checks.check(1, p, hidden=1, seed=5, quiet=True)
    assert not res.ok and res.points < 10
    assert not res.tests["bytes"].passed  # one chunk too many on the wire at N = 3


@pytest.mark.fast
def test_hidden_cases_follow_the_seed():
    for lab in LABS:
        a, b = checks.cases_for(lab, 4, 3, 5), checks.cases_for(lab, 4, 3, 5)
        assert a == b and a != checks.cases_for(lab, 4, 3, 6)
        assert [c.hidden for c in a].count(True) == 3
    # Hidden world sizes beyond the visible N = 4, and input seeds no submission can search for
    # from its own inputs (62 random bits, not a number below a million).
    drawn = [c for seed in range(40) for lab in (1, 2, 3) for c in checks.cases_for(lab, 4, 2, seed) if c.hidden]
    assert {c.n for c in drawn} == {2, 3, 4, 5, 6}
    assert min(c.params["seed"] for c in drawn) > 1 << 40


# ------------------------------------------------------------------ plausible mistakes
MISTAKES = [
    # lab, old, new, the test that must fail, words its diagnosis must contain
    (1, "chunks[(rank - s - 2) % world] += incoming", "pass", "values", "unreduced"),
    (1, "return chunks[rank]", "return torch.cat(chunks)", "values", "returned the whole tensor"),
    # ring all-reduce's indexing: rank r ends with the full sum of chunk r + 1 and keeps that one
    (1, "send(chunks[(rank - s - 1) % world], right)\n        recv(incoming, left)\n"
        "        chunks[(rank - s - 2) % world] += incoming\n    return chunks[rank]",
     "send(chunks[(rank - s) % world], right)\n        recv(incoming, left)\n"
     "        chunks[(rank - s - 1) % world] += incoming\n    return chunks[(rank + 1) % world]", "values",
     "shift which chunk you send"),
    (2, "    out /= n\n", "", "values", "looks like the SUM over ranks: divide by N"),
    (2, "shard.shard_range(numel, n, axis.rank)", "shard.data_range(numel, n, axis.rank)", "range",
     "zeroedu.shard.shard_range("),
    (2, 'comm.reduce_scatter(out, padded, axis, tag="lab2/grads")',
     'comm.reduce_scatter(out, padded, axis, tag="lab2/grads"); raise ValueError("boom")', "values",
     "rank 0 raised ValueError: boom (your file, line"),
    (3, "    mine /= n", "    pass", "dw", "looks like the SUM over ranks"),
    (3, "return dx, mine[: r.size]", "return dx, mine", "dw", "row(s), but this rank owns"),
    (3, "dx = dy @ w", "dx = dy @ w * n", "dx", "dX = dY W needs no reduction"),
    (4, "optim = r.optim_bytes * psi / (n * m)", "optim = r.optim_bytes * psi / n", "optim",
     "also cut across the M domains"),
    (4, "param = r.param_bytes * psi / n", "param = r.param_bytes * psi / (n * m)", "param",
     "params are replicated across domains"),
    # lab 5: allocating on every gradient loses the ones accumulated so far
    (5, "    if unit.grad_buffer is None:\n        # Autograd", "    if True:\n        # Autograd", "grads",
     "allocate only when unit.grad_buffer is None"),
    # lab 5: freeing the buffer before the collective finished
    (5, "        handle.wait()\n        del zero2.inflight[k]\n        zero2.units[k].free_grad()",
     "        zero2.units[k].free_grad()\n        handle.wait()\n        del zero2.inflight[k]", "no_early_free",
     "still in flight"),
    # lab 5: dividing by N (the optimizer does, in fp32)
    (5, "    return zero2.comm.reduce_scatter(",
     "    unit.grad_buffer /= zero2.dist.inner.size\n    return zero2.comm.reduce_scatter(", "grads",
     "looks like the average"),
    # lab 5: never freeing the full buffers
    (5, "        zero2.units[k].free_grad()\n", "\n", "freed", "ZeRO-2 keeps only the shards"),
    # lab 5: counting wrong, so every reduce-scatter waits for the end of backward
    (5, "    zero2.pending[k] -= 1\n", "    return\n", "overlap", "0 of 3 unit reduce-scatters started during backward"),
    # lab 5: every reduce-scatter launched asynchronously and waited for at once (it hides nothing;
    # it once scored full marks, graded from how it was issued rather than from the timeline)
    (5, "        zero2.inflight[k] = reduce_scatter_unit(zero2, zero2.units[k])\n",
     "        zero2.inflight[k] = reduce_scatter_unit(zero2, zero2.units[k])\n        free_finished(zero2, wait=True)\n",
     "overlap", "hides nothing"),
    # lab 6: "resharding" without freeing the storage
    (6, "    for leaf in unit.leaves:\n        leaf.untyped_storage().resize_(0)\n", "", "memory",
     "resize the leaves' storage to 0"),
    # lab 6: forward before the all-gather was waited for
    (6, "    unshard(unit)\n    if fsdp.forward_prefetch:", "    unshard(unit, async_op=True)\n    if fsdp.forward_prefetch:",
     "lifecycle", "unit 0 is unsharding when its forward runs"),
    # lab 6: no backward prefetch
    (6, "        prefetch(fsdp, unit.index - 1)", "        pass", "prefetch", "did not prefetch unit 1"),
    # lab 6: resharding after forward whatever the option says (one all-gather too many)
    (6, "    if fsdp.reshard_after_forward:\n        reshard(unit)", "    reshard(unit)", "bytes",
     "(2× the prediction)"),
    # lab 7: the optimizer reads the buckets without waiting for their all-reduces
    (7, "        ddp.inflight.pop(k).wait()", "        ddp.inflight.pop(k)", "waited", "bucket 0's all-reduce was not waited for"),
    # lab 7: a bucket reduced twice (its gradient summed over ranks twice)
    (7, "        ddp.inflight[b.index] = all_reduce_bucket(ddp, b)\n",
     "        all_reduce_bucket(ddp, b).wait()\n        ddp.inflight[b.index] = all_reduce_bucket(ddp, b)\n", "bytes",
     "2 all-reduces of it"),
    # lab 7: every all-reduce waited for at once: in order, once each, and hiding nothing
    (7, "        ddp.inflight[b.index] = all_reduce_bucket(ddp, b)\n", "        all_reduce_bucket(ddp, b).wait()\n",
     "overlap", "hides nothing"),
    # lab 7: reducing inside no_sync (every micro-batch, not once per step)
    (7, "    if not ddp.require_sync:\n        return", "    pass", "bytes", "inside no_sync()"),
    # lab 7: nothing launched until finish: one big reduction after backward
    (7, "    if b.pending == 0:\n        launch_ready(ddp)", "    pass", "overlap", "0 of 3 bucket all-reduces started"),
    # lab 8: a wrong shard offset (floor instead of ceil: 7 rows over 4 ranks kept 1 row each)
    (8, "    c = -(-d0 // n)", "    c = d0 // n or 1", "shards", "rank 0, unit 2, 4.weight (7 rows): this rank keeps rows [0, 1)"),
    # lab 8: a backward prefetch that gathers every earlier unit at once
    (8, "        unshard(fsdp.units[j], async_op=True)  # one ahead: two units gathered at most",
     "        for i in range(j + 1):\n            unshard(fsdp.units[i], async_op=True)", "memory",
     "(units [0, 1, 2]), more than two neighbouring units"),
    # lab 8: a reshard that frees the full gradients still being reduce-scattered
    (8, "    unit.wait_unshard()  # never free memory an all-gather is still writing into\n",
     "    unit.wait_unshard()  # never free memory an all-gather is still writing into\n    unit.free_grads()\n",
     "no_early_free", "unit 2, parameter 0: its full gradient was freed while its reduce-scatter was still in flight"),
    # lab 8: the prefetch waited for at once (issued during the unit's backward, hiding nothing)
    (8, "        unshard(fsdp.units[j], async_op=True)  # one ahead: two units gathered at most",
     "        unshard(fsdp.units[j])", "prefetch", "unit 1's all-gather was issued during unit 2's backward but waited for"),
    # lab 6: a prefetch past limit_all_gathers
    (6, "    if fsdp.limit_all_gathers is not None and busy >= fsdp.limit_all_gathers:\n        return", "",
     "prefetch", "limit_all_gathers=1"),
]


@pytest.fixture(scope="module")
def mutants_dir(tmp_path_factory):
    """One folder for every wrong solution in turn: the ranks' limits confine them to it, so the
    same warm pools grade them all (each submission is loaded afresh under its own module name);
    a folder each would restart the ranks per mutant, ~2 s apiece."""
    return tmp_path_factory.mktemp("mutants")


@pytest.mark.parametrize("lab,old,new,test,expect", MISTAKES,
                         ids=[f"lab{m[0]}-{m[3]}-{i}" for i, m in enumerate(MISTAKES)])
def test_mistakes_are_diagnosed(mutants_dir, lab, old, new, test, expect):
    res = checks.check(lab, _mutant(mutants_dir, lab, old, new), quiet=True)
    assert not res.ok and res.points < LABS[lab].points
    assert not res.tests[test].passed
    assert any(expect in m for m in _messages(res, test)), str(res)
    assert "Traceback" not in str(res) and "Traceback" not in json.dumps(res.as_dict())


def test_an_early_free_costs_what_a_wrong_result_costs(tmp_path):
    """Lab 5 freeing each full gradient while its reduce-scatter is in flight: the safety
    criterion fails and so do the reduced shards, whose result cannot be trusted."""
    _, old, new, _, _ = next(m for m in MISTAKES if m[3] == "no_early_free")
    res = checks.check(5, _mutant(tmp_path, 5, old, new), quiet=True)
    assert not res.tests["no_early_free"].passed and not res.tests["grads"].passed
    assert any("read a freed buffer" in m for m in _messages(res, "grads")), str(res)
    lost = LABS[5].points - res.points
    assert lost >= [t.points for t in LABS[5].tests if t.id == "grads"][0] + 2


def test_element_level_diagnosis_names_rank_shard_element(tmp_path):
    p = _mutant(tmp_path, 1, "chunks[(rank - s - 2) % world] += incoming",
                "chunks[(rank - s - 2) % world] += 2 * incoming")
    d = next(d for c in checks.check(1, p, quiet=True).tests["values"].cases for d in c.diagnosis)
    assert d.rank is not None and d.shard is not None
    p = _mutant(tmp_path, 5, "    if unit.grad_buffer is None:\n        # Autograd", "    if True:\n        # Autograd")
    res = checks.check(5, p, quiet=True)
    d = next(d for c in res.tests["grads"].cases for d in c.diagnosis if d.element is not None)
    assert d.rank is not None and d.unit is not None and d.shard is not None
    assert d.expected is not None and d.got is not None and "that is " in d.message  # the parameter element


@pytest.mark.fast
def test_syntax_error_and_missing_file(tmp_path):
    p = tmp_path / "broken.py"
    p.write_text("def f(:\n")
    res = checks.check(2, p, quiet=True)
    assert not res.ok and res.status == "error" and "syntax error, line 1" in res.messages[0]
    res = checks.check(2, tmp_path / "nope.py", quiet=True)
    assert res.status == "missing" and "no file at" in res.messages[0] and res.points == 0


def test_hung_ring_is_reported(tmp_path, monkeypatch):
    # receiving from the right neighbour: every rank waits for a message nobody sends
    monkeypatch.setattr(checks, "TIMEOUT", 3.0)
    res = checks.check(1, _mutant(tmp_path, 1, "recv(incoming, left)", "recv(incoming, right)"), quiet=True)
    assert not res.ok
    assert any("hung" in m and "recv()" in m for m in res.messages), str(res)


# ------------------------------------------------------------------ command line
def test_cli_json_exit_status_and_usage_errors(key_dir, capsys):  # lab 4 runs on a rank of its own
    assert main(["check", "4", "--json", "--path", str(key_dir / LABS[4].file)]) == 0
    g = json.loads(capsys.readouterr().out)
    assert g["points"] == g["max_points"] == 10 and g["labs"][0]["status"] == "passed"
    assert main(["check", "4", "--json", "--hidden", "--seed", "3"]) == 0  # the skeleton: fails, exit 0
    g = json.loads(capsys.readouterr().out)
    assert g["points"] == 0 and g["seed"] == 3 and g["hidden"] == checks.DEFAULT_HIDDEN
    assert main(["check", "4"]) == 1  # text mode: non-zero while a lab is not passed
    assert "not implemented yet" in capsys.readouterr().out
    assert main(["check", "4", "--dir", str(key_dir)]) == 0
    for bad in (["check", "9"], ["check", "all", "--path", "x.py"], ["check", "1", "--n", "1"],
                ["build", "--key", str(PACKAGE / "labs")], ["check", "1", "--hidden", "-1"]):
        with pytest.raises(SystemExit) as e:
            main(bad)
        assert e.value.code == 2, bad
    capsys.readouterr()
    assert main(["list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["max_points"] == 161 and [r["lab"] for r in listed["labs"]] == list(LABS)
    assert all(r["minutes"] > 0 and r["notebook"].startswith("notebooks/") for r in listed["labs"])


@pytest.mark.fast
def test_readme_lists_every_lab():
    text = (ROOT / "labs" / "README.md").read_text()
    for lab in LABS.values():
        assert lab.command in text and lab.file in text and f"{lab.points} points" in text
    from zeroedu.labs import report

    for r in report.RUBRIC:  # the rubric the collector prints is the one the README shows
        assert f"| {r.section} | {r.points} | {r.earns.replace(chr(39), chr(34))} |" in text, r.section


def test_a_class_folder_grades_into_one_csv_row_per_student(tmp_path, capsys):
    """Two students, lab 4 only (one rank, quick): the key earns every point and every hidden case;
    the skeleton none; a table fitted to the visible cases loses the criteria the hidden cases break,
    and its hidden columns read 0. The CSV says so, one row per student, one column per lab and hidden case."""
    import csv

    from zeroedu import theory

    cls = tmp_path / "class"
    (cls / "ada" / "labs" / "student").mkdir(parents=True)  # the published layout
    (cls / "ada" / "labs" / "student" / LABS[4].file).write_text(_key_text(4))
    (cls / "bob").mkdir()  # the files at the top of the folder
    (cls / "bob" / LABS[4].file).write_text(generate.render(generate.default_source() / LABS[4].file, "student"))
    table = {(psi, n, m, r): theory.model_states("hfsdp", psi, n, m, r).as_dict()
             for psi, n, m, r in checks.basic.LAB4_CASES}
    (cls / "cy").mkdir()
    (cls / "cy" / LABS[4].file).write_text(
        f"TABLE = {table!r}\n"
        "def hfsdp_bytes_per_gpu(psi, n, m, recipe='mixed-bf16'):\n"
        "    return TABLE.get((psi, n, m, recipe), dict(param=0, grad=0, optim=0, total=0))\n")
    out = tmp_path / "grades.csv"
    assert main(["class", str(cls), "--csv", str(out), "--labs", "4", "--hidden", "2", "--seed", str(SEED)]) == 0
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["student", "points", "max_points", "lab4", "lab4 hidden-1", "lab4 hidden-2"]
    assert rows[1] == ["ada", "10", "10", "10", "1", "1"]
    assert rows[2] == ["bob", "0", "10", "0", "0", "0"]
    assert rows[3][0] == "cy" and rows[3][4:] == ["0", "0"] and int(rows[3][3]) < 10
    printed = capsys.readouterr().out
    assert "ada" in printed and "every lab passed" in printed and f"seed {SEED}" in printed
    with pytest.raises(SystemExit):  # the grade book inside the submissions is refused
        main(["class", str(cls), "--csv", str(cls / "ada" / "g.csv"), "--labs", "4"])


# ------------------------------------------------------------------ per-student variants
@pytest.mark.fast
def test_variants_follow_the_student_id_and_the_key_predicts_them(tmp_path):
    from zeroedu.labs import variants
    from zeroedu.models import MLPConfig

    a, b = variants.variant("alice"), variants.variant("bob")
    assert a == variants.variant("alice") and a != b and a != variants.variant("alice", course="2027")
    drawn = [variants.variant(f"s{i}") for i in range(60)]
    assert {v.n for v in drawn} == {2, 3, 4} and len({v.model for v in drawn}) == 60
    assert {v.model.depth for v in drawn} == {3, 4} and len({v.bucket_bytes for v in drawn}) > 1
    # the source's by-hand numbers (its comments show the sums) == the closed forms, for the
    # visible case a check without an id runs: the MLP 12-20-20-7 at N = 4, buckets of 512 bytes
    default = variants.Variant("", "", 4, MLPConfig(), 512)
    for lab in variants.PREDICTED:
        p = tmp_path / LABS[lab].file
        p.write_text(_key_text(lab))
        assert variants.read_prediction(p, lab) == (variants.predictions(lab, default), "")
        # a computed prediction, or none, is refused with the reason
        p.write_text(_key_text(lab).replace('return {"step_bytes": ', 'return {"step_bytes": 2 * '))
        assert "not a computation" in variants.read_prediction(p, lab)[1]
        p.write_text(generate.render(generate.default_source() / LABS[lab].file, "student"))
        assert variants.read_prediction(p, lab)[1].startswith("not yet")
    assert variants.predictions(7, default) == {"step_bytes": 4962, "buckets": 3}
    assert variants.predictions(8, default) == {"step_bytes": 7632, "peak_gathered": 2720}


def test_a_key_for_one_variant_loses_points_as_another(tmp_path, capsys):
    """The key built for alice scores full marks as alice; graded as bob, whose N and MLP differ,
    its algorithm still passes but its prediction (alice's numbers) loses the points."""
    key = tmp_path / "key"
    assert main(["build", "--key", str(key), "--for", "alice", "--student", str(tmp_path / "s")]) == 0
    capsys.readouterr()
    ok = checks.check(8, directory=key, student="alice", quiet=True)
    assert ok.points == LABS[8].points and {c.n for c in ok.cases} == {variants_n("alice")}
    other = checks.check(8, directory=key, student="bob", quiet=True)
    assert other.points == LABS[8].points - 3
    assert [t for t, r in other.tests.items() if not r.passed] == ["predict"]
    assert any("predicted step_bytes = " in m for m in _messages(other, "predict")), str(other)


@pytest.mark.fast
def test_a_prediction_that_is_not_a_finite_number_is_a_graded_mistake(tmp_path):
    """`1e999` reads as inf: refused with the reason (a graded mistake), never a checker error."""
    from zeroedu.labs import variants

    for lab, key in ((7, "buckets"), (8, "peak_gathered")):
        p = tmp_path / LABS[lab].file
        good = variants.read_prediction(_mutant(tmp_path, lab, "return {", "return {"), lab)[0]
        p.write_text(_key_text(lab).replace(f'"{key}": {good[key]}', f'"{key}": 1e999'))
        got, why = variants.read_prediction(p, lab)
        assert got is None and f"predicted()'s {key} is inf" in why and "finite" in why


def test_predict_is_graded_against_the_closed_form_not_the_students_own_run(tmp_path):
    """A lab 8 that never prefetches holds one unit gathered at a time (1,680 bytes at most for the
    default MLP at N = 4) where the closed form, with prefetch, says 2,720: "predicting" its own
    run's peak loses `predict` as well as `prefetch`, and the diagnosis does not give 2,720 away."""
    p = _mutant(tmp_path, 8, "        unshard(fsdp.units[j], async_op=True)  # one ahead: two units gathered at most",
                "        pass")
    p.write_text(p.read_text().replace('"peak_gathered": 2720', '"peak_gathered": 1680'))
    res = checks.check(8, p, quiet=True)
    assert {"predict", "prefetch"} <= {t for t, r in res.tests.items() if not r.passed}, str(res)
    msg = _messages(res, "predict")
    assert any("predicted peak_gathered = 1680" in m and "closed forms" in m for m in msg), msg
    assert not any("2720" in m for m in msg)


def variants_n(student: str) -> int:
    from zeroedu.labs import variants

    return variants.variant(student).n


# ------------------------------------------------------------------ the benchmarking report
def test_the_report_collector_measures_each_students_code_and_lays_out_their_reasoning(key_dir, tmp_path, capsys):
    """A class of two: ada hands in the key's labs 7 and 8 and a report with two sections written;
    bob the skeletons and no report. The collector times each student's own code (quick: two
    bucket sizes) and writes one report each: the measured tables (times are the machine's and
    not asserted; the bucket counts and the gathered peak are exact), the student's text under
    the template's headings, the rubric to mark."""
    from zeroedu.labs import report

    cls = tmp_path / "class"
    (cls / "ada").mkdir(parents=True)
    (cls / "bob").mkdir()
    for lab in (7, 8):
        (cls / "ada" / LABS[lab].file).write_text((key_dir / LABS[lab].file).read_text())
        (cls / "bob" / LABS[lab].file).write_text(
            generate.render(generate.default_source() / LABS[lab].file, "student"))
    text = report.template().replace(f"## {report.SECTIONS[0].heading}\n",
                                     f"## {report.SECTIONS[0].heading}\nk buckets pay k·2(N-1)·α; b ≈ 1 MiB.\n")
    text = text.replace(f"## {report.SECTIONS[3].heading}\n",
                        f"## {report.SECTIONS[3].heading}\nPrefetch doubles the gathered bytes.\n")
    (cls / "ada" / "report.md").write_text(text)
    out = tmp_path / "reports"
    assert main(["collect", str(cls), "--out", str(out), "--quick"]) == 0
    ada, bob = (out / "ada.md").read_text(), (out / "bob.md").read_text()
    # 24 layers of 128·128 + 128 fp32 parameters: 64 KiB buckets close after each layer, and
    # backward prefetch holds two such layers gathered at once instead of one
    layer = (128 * 128 + 128) * 4
    assert re.search(r"\| 64 KiB( \(fastest\))? \| 24 \|", ada) and re.search(r"\| one bucket( \(fastest\))? \| 1 \|", ada)
    assert "| off |" in ada and f"| {layer:,} |" in ada and f"| {2 * layer:,} |" in ada
    assert "k buckets pay k·2(N-1)·α; b ≈ 1 MiB." in ada and "Prefetch doubles the gathered bytes." in ada
    assert ada.count("*(not written)*") == 2 and "<!--" not in ada
    assert f"| total | {report.RUBRIC_POINTS} |" in ada and report.RUBRIC_POINTS == 10
    assert "lab 7 does not pass its check yet (0/28)" in bob and "lab 8 does not pass" in bob
    assert bob.count("*(not written)*") == len(report.SECTIONS) and "| 64 KiB" not in bob
    with pytest.raises(SystemExit):  # the reports never go inside the submissions
        main(["collect", str(cls), "--out", str(cls / "reports")])
