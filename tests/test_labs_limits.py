"""What a submission or a grading command can hand the grader that is not a lab file: a device,
a FIFO, a huge file, an exception with a 20 MB message, an empty or student-tree --key folder.
Each is refused before it is read or written, with one line that says why (issue: a grader an
instructor can trust)."""
from __future__ import annotations

import json
import os
import threading

import pytest

from zeroedu.labs import checks, generate
from zeroedu.labs.__main__ import main as labs_main
from zeroedu.labs.grading import MAX_MESSAGE, Diagnosis, LabResult
from zeroedu.labs.registry import LABS

pytestmark = pytest.mark.fast


def _problem(path) -> str:
    res = checks.check(4, path, quiet=True)
    assert res.points == 0 and res.status == "error", res
    return res.messages[0]


def test_a_device_is_not_read():
    assert "not a regular file" in _problem("/dev/zero")  # before: read until the kernel killed the grader


def test_a_fifo_does_not_block_the_grader(tmp_path):
    fifo = tmp_path / LABS[4].file
    os.mkfifo(fifo)
    done = []
    t = threading.Thread(target=lambda: done.append(_problem(fifo)), daemon=True)
    t.start()
    t.join(timeout=20)
    assert done and "not a regular file" in done[0]


def test_a_huge_file_is_refused_by_its_size_before_it_is_read(tmp_path):
    big = tmp_path / LABS[4].file
    with open(big, "wb") as f:
        f.truncate(checks.MAX_SUBMISSION_BYTES + 1)  # sparse: its size, not its bytes, refuses it
    assert "at most" in _problem(big)


def test_feedback_is_capped_per_diagnosis():
    d = Diagnosis("x" * 20_000_000)
    assert len(d.message) < MAX_MESSAGE + 60 and d.message.endswith("more characters cut)")
    res = LabResult(LABS[4], "f.py")
    res.fail_all("y" * 1_000_000, "error")
    assert len(json.dumps(res.as_dict())) < 20_000


def test_the_key_is_never_written_into_the_current_folder_or_a_student_tree(tmp_path, monkeypatch, capsys):
    for empty in ("", "  "):
        with pytest.raises(ValueError, match="empty path"):
            generate.check_key_dir(empty)
    copy = tmp_path / "handed-out" / "student"
    generate.build_student(copy)
    before = {p.name: p.read_bytes() for p in copy.iterdir()}
    for target in (copy, copy.parent):  # the copy itself, or a folder that holds it
        with pytest.raises(SystemExit):
            labs_main(["build", "--student", str(tmp_path / "s2"), "--key", str(target)])
        assert "holds a student tree" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == before
    key = tmp_path / "key"
    generate.build_key(key)
    generate.build_key(key)  # its own earlier key is not a student tree: rebuilding works


def test_hidden_seeds_are_too_many_to_search():
    seeds = {checks.new_seed() for _ in range(64)}
    assert len(seeds) == 64 and max(s.bit_length() for s in seeds) > 120  # 128 random bits, not 32
    big = max(seeds)
    assert checks.cases_for(1, 4, 1, big) == checks.cases_for(1, 4, 1, big)  # still reproducible from the seed
