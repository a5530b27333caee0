"""What a submission does reaches nothing outside its ranks (`runtime.confine`, `runtime.strays`).

Each attack below scored full marks once (a submission rewrote the installed grader, read a key
file into its grade, wrote into another student's file, forged a line on the grader's stdout
through /proc, left a process that rewrote the grade file after it was written, mapped memory
past its limit as a shared mapping). Each runs here as lab 4 (one rank, the cheapest) and must
leave the grader's files, the other files and the process table as they were.
"""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from zeroedu.labs import checks, generate, grading, guard
from zeroedu.labs.__main__ import main
from zeroedu.labs.registry import LABS
from zeroedu.runtime import confine, strays

LAB4 = LABS[4].file


@pytest.fixture(autouse=True)
def _guard_off(monkeypatch):
    """Each attack here imports what the guard refuses (os, ctypes, mmap): with the guard on it
    would score 0 before any rank ran. These tests are of the second line, the ranks'
    confinement, so the guard is switched off, as if the attack had been written so it missed it."""
    monkeypatch.setattr(guard, "refusal", lambda lab, text: None)


def _key() -> str:
    return generate.render(generate.default_source() / LAB4, "key")


def _submit(folder, attack: str):
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / LAB4
    p.write_text(attack + "\n" + _key())
    return p


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_this_machine_confines_ranks():
    # Landlock (Linux 5.13+) is what the rest of this file relies on; CI's machine has it.
    assert confine.abi() >= 1


def test_the_installed_grader_cannot_be_rewritten_and_a_later_stub_still_scores_zero(tmp_path):
    target = grading.__file__
    before = _sha(target)
    attack = (f"try:\n    open({target!r}, 'a').write('\\nLabResult.ok = property(lambda s: True)\\n')\n"
              "except PermissionError:\n    pass\n")
    res = checks.check(4, _submit(tmp_path / "a", attack), quiet=True)
    assert _sha(target) == before and res.points == LABS[4].points  # the attempt changed nothing
    stub = _submit(tmp_path / "b", "")
    stub.write_text(generate.render(generate.default_source() / LAB4, "student"))
    assert checks.check(4, stub, quiet=True).points == 0


def test_a_key_outside_the_submission_folder_is_unreadable_and_never_in_the_grade(tmp_path, capsys):
    secret = tmp_path / "key" / LAB4
    secret.parent.mkdir()
    secret.write_text("SECRET-ANSWER-7731\n")
    p = _submit(tmp_path / "student", f"raise RuntimeError(open({str(secret)!r}).read())\n")
    assert main(["check", "4", "--json", "--path", str(p)]) == 0
    out = capsys.readouterr().out
    g = json.loads(out)
    assert g["points"] == 0 and "SECRET-ANSWER-7731" not in out
    assert "PermissionError" in json.dumps(g["labs"][0]["messages"]), g["labs"][0]["messages"]


def test_another_students_file_cannot_be_written(tmp_path):
    alice = _submit(tmp_path / "alice", "")
    before = _sha(alice)
    attack = f"try:\n    open({str(alice)!r}, 'w').write('x = 1\\n')\nexcept PermissionError:\n    pass\n"
    checks.check(4, _submit(tmp_path / "bob", attack), quiet=True)
    assert _sha(alice) == before


def test_nothing_reaches_the_graders_stdout_or_signals_it(tmp_path, capfd):
    grader = os.getpid()
    attack = (f"open('/proc/{grader}/fd/1', 'w').write('{{\"points\": 100}}\\n')\n")
    assert main(["check", "4", "--json", "--path", str(_submit(tmp_path / "a", attack))]) == 0
    out = capfd.readouterr().out
    g = json.loads(out)  # nothing forged ahead of the grade: the whole output is one JSON object
    assert g["points"] == 0 and "PermissionError" in json.dumps(g["labs"][0]["messages"])
    if confine.abi() >= 6:  # signals are scoped from Landlock's ABI 6
        res = checks.check(4, _submit(tmp_path / "b", f"import os\nos.kill({grader}, 0)\n"), quiet=True)
        assert res.points == 0 and any("PermissionError" in m for m in res.messages), res.messages


def _named(marker: str) -> list[int]:
    """Processes whose name (/proc/<pid>/comm) is `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if open(f"/proc/{pid}/comm").read().strip() == marker:
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_processes_a_submission_starts_end_with_its_check(tmp_path):
    """A forked child that sleeps and a daemon (setsid, second fork) that would rewrite the grade
    after it is written, each named so the test can find it wherever it was re-parented: both are
    gone when `check` returns, and nothing else below the grader is left."""
    marker = f"zz-stray-{os.getpid() % 10000}"
    before = strays.descendants()
    name = f"ctypes.CDLL(None).prctl(15, b{marker!r}, 0, 0, 0)"
    attack = ("import ctypes, os, time\n"
              f"if os.fork() == 0:\n    {name}\n    time.sleep(60)\n    os.kill(os.getpid(), 9)\n"
              "if os.fork() == 0:\n    os.setsid()\n"
              f"    if os.fork() == 0:\n        {name}\n        time.sleep(60)\n        os.kill(os.getpid(), 9)\n"
              "    os.kill(os.getpid(), 9)\n"
              "time.sleep(0.5)\n")  # both children named before the check goes on
    res = checks.check(4, _submit(tmp_path, attack), quiet=True)
    assert res.points == LABS[4].points  # the key's answers, graded
    assert _named(marker) == []
    from multiprocessing import forkserver, resource_tracker

    from zeroedu.runtime import cluster

    harness = {forkserver._forkserver._forkserver_pid, resource_tracker._resource_tracker._pid}
    assert strays.descendants() - before - harness - set(cluster.rank_pids()) == set()


def test_a_shared_mapping_cannot_pass_the_memory_limit(tmp_path):
    """RLIMIT_DATA does not count MAP_SHARED memory; the address-space limit does."""
    attack = "import mmap\n_m = mmap.mmap(-1, 3 << 30, flags=mmap.MAP_SHARED)\n"
    res = checks.check(4, _submit(tmp_path, attack), quiet=True)
    assert res.points == 0 and any("Cannot allocate memory" in m or "MemoryError" in m for m in res.messages), \
        res.messages


def test_a_grading_run_leaves_no_process_and_no_changed_file(tmp_path, capsys):
    """A detached process that waits for the grade file and rewrites it with full marks (the
    attack that once fooled the aggregation script): when `check --out` returns, it is gone, the
    grade the grader wrote stays as written, and neither the repository nor the package changed."""
    import sys
    import time

    sys.path.insert(0, os.path.dirname(__file__))
    try:
        import tree_state
    finally:
        sys.path.pop(0)
    out = tmp_path / "grades" / "g.json"
    out.parent.mkdir()
    marker = f"zz-forge-{os.getpid() % 10000}"
    forge = f"open({str(out)!r}, 'w').write('{{\"points\": 100}}')"
    attack = ("import ctypes, os, time\n"
              "if os.fork() == 0:\n    os.setsid()\n"
              f"    if os.fork() == 0:\n        ctypes.CDLL(None).prctl(15, b{marker!r}, 0, 0, 0)\n"
              "        for _ in range(40):\n            time.sleep(0.1)\n"
              f"            try:\n                {forge}\n            except OSError:\n                pass\n"
              "        os.kill(os.getpid(), 9)\n"
              "    os.kill(os.getpid(), 9)\n"
              "time.sleep(0.3)\n")
    p = _submit(tmp_path / "student", attack)
    tree, submission = tree_state.snapshot(), _sha(p)
    assert main(["check", "4", "--out", str(out), "--path", str(p)]) == 0
    assert "wrote" in capsys.readouterr().out
    written = out.read_text()
    assert _named(marker) == []  # gone before the grade was written
    time.sleep(1.0)  # what a surviving forger would have needed
    assert out.read_text() == written and json.loads(written)["points"] == LABS[4].points
    assert sorted(f.name for f in out.parent.iterdir()) == ["g.json"]  # no temporary file left
    assert tree_state.snapshot() == tree and _sha(p) == submission


def test_out_is_checked_before_grading(tmp_path, capsys):
    import pytest

    p = _submit(tmp_path / "student", "")
    for bad in (tmp_path / "missing" / "g.json", tmp_path):
        with pytest.raises(SystemExit) as e:
            main(["check", "4", "--out", str(bad), "--path", str(p)])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "--out" in err and "points" not in err


def test_signed_grades_verify_and_an_edited_or_forged_one_does_not(tmp_path, capsys):
    """The aggregation's side: a grade written with --sign verifies; the same grade with its
    points edited, or one written without the key, does not (exit 1, named)."""
    key = tmp_path / "private" / "labs.key"
    key.parent.mkdir()
    key.write_text("0123456789abcdef0123456789abcdef\n")
    p = _submit(tmp_path / "student", "")
    good, edited, forged = (tmp_path / f"{n}.json" for n in ("good", "edited", "forged"))
    assert main(["check", "4", "--out", str(good), "--sign", str(key), "--path", str(p), "--student", "good"]) == 0
    g = json.loads(good.read_text())
    assert g["points"] == LABS[4].points and len(g["signature"]) == 64 and g["student"] == "good"
    edited.write_text(good.read_text().replace(f'"points": {g["points"]}', '"points": 0', 1))
    assert json.loads(edited.read_text())["points"] == 0
    forged.write_text(json.dumps({**g, "signature": "0" * 64}))
    capsys.readouterr()
    assert main(["verify", "--key", str(key), str(good)]) == 0
    assert "verified: student 'good', visible cases only" in capsys.readouterr().out
    assert main(["verify", "--key", str(key), str(good), str(edited), str(forged), "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == {str(good): LABS[4].points, str(edited): None, str(forged): None}
    # the key may not sit where the graded submission's ranks can read it
    inside = p.parent / "labs.key"
    inside.write_text(key.read_text())
    import pytest

    with pytest.raises(SystemExit) as e:
        main(["check", "4", "--out", str(good), "--sign", str(inside), "--path", str(p), "--student", "good"])
    assert e.value.code == 2 and "outside every submission folder" in capsys.readouterr().err


def test_a_signed_grade_is_bound_to_its_student_course_and_cases(tmp_path, capsys):
    """A byte copy of a classmate's signed grade verifies as the classmate's, not one's own; so
    do a grade of another course, seed or hidden-case count; a duplicate `points` key (which JSON
    readers resolve differently) is refused; signing without naming the student is refused."""
    import pytest

    key = tmp_path / "private" / "labs.key"
    key.parent.mkdir()
    key.write_text("0123456789abcdef0123456789abcdef\n")
    p = _submit(tmp_path / "alice", "")
    grades = tmp_path / "grades"
    grades.mkdir()
    alice = grades / "alice.json"
    assert main(["check", "4", "--path", str(p), "--hidden", "1", "--seed", "7", "--student", "alice",
                 "--course", "c27", "--out", str(alice), "--sign", str(key)]) == 0
    (grades / "bob.json").write_bytes(alice.read_bytes())  # bob hands in alice's file as his own
    capsys.readouterr()
    assert main(["verify", "--key", str(key), str(alice), "--course", "c27", "--seed", "7", "--hidden", "1"]) == 0
    assert "alice.json: 10/10 points, verified: student 'alice', course 'c27', seed 7, 1 hidden" \
        in capsys.readouterr().out
    assert main(["verify", "--key", str(key), str(grades / "bob.json"), "--course", "c27"]) == 1
    assert "NOT VERIFIED: signed for student 'alice', not 'bob'" in capsys.readouterr().out
    for extra, why in ((["--course", "c28"], "signed for course 'c27', not 'c28'"),
                       (["--course", "c27", "--seed", "8"], "graded with seed 7, not 8"),
                       (["--course", "c27", "--hidden", "3"], "graded with 1 hidden cases per lab, not 3"),
                       (["--course", "c27", "--student", "bob"], "signed for student 'alice', not 'bob'")):
        assert main(["verify", "--key", str(key), str(alice), *extra]) == 1
        assert why in capsys.readouterr().out
    roster = tmp_path / "roster.txt"
    roster.write_text("alice\ncarol\n")
    assert main(["verify", "--key", str(key), str(alice), "--roster", str(roster), "--course", "c27"]) == 0
    roster.write_text("carol\n")
    assert main(["verify", "--key", str(key), str(alice), "--roster", str(roster), "--course", "c27"]) == 1
    assert "'alice' (the file's name) is not on the roster" in capsys.readouterr().out
    # the signed text with a second "points" key in front: json keeps the last (the signed one),
    # another reader may take the first
    text = alice.read_text()
    alice.write_text(text.replace('{\n', '{\n  "points": 0,\n', 1))
    assert main(["verify", "--key", str(key), str(alice), "--course", "c27"]) == 1
    assert "the key 'points' appears twice" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["check", "4", "--path", str(p), "--out", str(alice), "--sign", str(key)])
    assert e.value.code == 2 and "give --student ID" in capsys.readouterr().err
