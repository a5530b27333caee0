"""Classroom labs: one source -> student + instructor; the instructor key passes every check on
real ranks, the student skeleton fails each with a message (never a traceback), and common
mistakes are diagnosed precisely. References are computed independently in zeroedu.labs.checks
(plain torch sums/products on the same inputs; zeroedu.theory for the HFSDP estimate)."""
from __future__ import annotations

import pytest

from zeroedu.labs import checks, generate
from zeroedu.labs.checks import LABS, check


def test_generated_files_are_up_to_date():
    assert generate.stale() == [], "run `python -m zeroedu.labs build` and commit labs/"


def test_one_source_per_lab():
    assert [s.name for s in generate.source_files()] == [lab.file for lab in LABS.values()]


@pytest.mark.parametrize("src", generate.source_files(), ids=lambda p: p.stem)
def test_versions_from_one_source(src):
    text = src.read_text()
    student, instructor = generate.render(src, "student"), generate.render(src, "instructor")
    for t in (student, instructor):
        compile(t, src.name, "exec")
        assert "BEGIN SOLUTION" not in t and "END SOLUTION" not in t
    regions = text.count("# BEGIN SOLUTION")
    assert student.count("raise NotImplementedError(") == regions >= 1
    assert 'NotImplementedError("write' in student or "NotImplementedError('write" in student
    # the instructor key is the source minus the marker lines
    body = [l for l in text.splitlines() if "# BEGIN SOLUTION" not in l and "# END SOLUTION" not in l]
    assert instructor.splitlines()[2:] == body


@pytest.mark.parametrize("bad", ["x = 1\n", "# BEGIN SOLUTION a\nx = 1\n", "# END SOLUTION\n",
                                 "# BEGIN SOLUTION a\n# BEGIN SOLUTION b\n# END SOLUTION\n"])
def test_malformed_regions_are_rejected(bad):
    with pytest.raises(ValueError):
        generate.strip(bad, "student")


def test_build_writes_both_versions(tmp_path):
    written = generate.build(tmp_path)
    assert len(written) == 2 * len(LABS)
    assert generate.stale(tmp_path) == []
    (tmp_path / "student" / LABS[1].file).write_text("# edited\n")
    assert generate.stale(tmp_path) == [str(tmp_path / "student" / LABS[1].file)]


@pytest.mark.parametrize("lab", list(LABS))
def test_instructor_passes(lab):
    res = check(lab, version="instructor", quiet=True)
    assert res.ok, str(res)


@pytest.mark.parametrize("lab", list(LABS))
def test_student_fails_helpfully(lab):
    res = check(lab, version="student", quiet=True)
    assert not res.ok
    assert res.messages and res.messages[0].startswith("not implemented yet: write"), str(res)
    assert "Traceback" not in str(res)


def _mutant(tmp_path, lab, old, new):
    src = generate.render(generate.source_files()[lab - 1], "instructor")
    assert old in src, old
    p = tmp_path / LABS[lab].file
    p.write_text(src.replace(old, new))
    return p


MISTAKES = [
    (1, "chunks[(rank - s - 2) % world] += incoming", "pass", "unreduced"),
    (1, "return chunks[rank]", "return torch.cat(chunks)", "returned the whole tensor"),
    (2, "    out /= n\n", "", "looks like the SUM over ranks: divide by N"),
    (2, "shard.shard_range(numel, n, axis.rank)", "shard.data_range(numel, n, axis.rank)",
     "zeroedu.shard.shard_range("),
    (2, 'comm.reduce_scatter(out, padded, axis, tag="lab2/grads")',
     'comm.reduce_scatter(out, padded, axis, tag="lab2/grads"); raise ValueError("boom")',
     "rank 0 raised ValueError: boom (your file, line"),
    (3, "    mine /= n", "    pass", "looks like the SUM over ranks"),
    (3, "return dx, mine[: r.size]", "return dx, mine", "row(s), but this rank owns"),
    (3, "dx = dy @ w", "dx = dy @ w * n", "dX = dY W needs no reduction"),
    (4, "optim = r.optim_bytes * psi / (n * m)", "optim = r.optim_bytes * psi / n",
     "also cut across the M domains"),
    (4, "param = r.param_bytes * psi / n", "param = r.param_bytes * psi / (n * m)",
     "params are replicated across domains"),
]


@pytest.mark.parametrize("lab,old,new,expect", MISTAKES, ids=[f"lab{m[0]}-{m[3][:20]}" for m in MISTAKES])
def test_mistakes_are_diagnosed(tmp_path, lab, old, new, expect):
    res = check(lab, _mutant(tmp_path, lab, old, new), quiet=True)
    assert not res.ok
    assert any(expect in m for m in res.messages), str(res)
    assert "Traceback" not in str(res)


def test_syntax_error_and_missing_file(tmp_path):
    p = tmp_path / "broken.py"
    p.write_text("def f(:\n")
    res = check(2, p, quiet=True)
    assert not res.ok and "syntax error, line 1" in res.messages[0]
    res = check(2, tmp_path / "nope.py", quiet=True)
    assert not res.ok and "no file at" in res.messages[0]


def test_hung_ring_is_reported(tmp_path, monkeypatch):
    # receiving from the right neighbour: every rank waits for a message nobody sends
    monkeypatch.setattr(checks, "TIMEOUT", 4.0)
    p = _mutant(tmp_path, 1, "recv(incoming, left)", "recv(incoming, right)")
    res = check(1, p, quiet=True)
    assert not res.ok
    assert any("hung" in m and "recv()" in m for m in res.messages), str(res)
