"""Cheats a student might try on the lab grader, each of which must score 0 or be refused with its
reason (`zeroedu.labs.guard`, lab 4 in a process of its own, `zeroedu.labs.checks`)."""
from __future__ import annotations

import json

import pytest

from zeroedu.labs import checks, generate, guard, report
from zeroedu.labs.__main__ import main
from zeroedu.labs.registry import LABS


def _key(lab: int) -> str:
    return generate.render(generate.default_source() / LABS[lab].file, "key")


def _file(tmp_path, lab: int, text: str):
    p = tmp_path / LABS[lab].file
    p.write_text(text)
    return p


LAB4_KEY_FN = '    """Model-state bytes on one GPU: {"param": ..., "grad": ..., "optim": ..., "total": ...}."""\n'

# (lab, what is added at the top of the answer key, the reason the guard gives)
REFUSED = [
    (4, "from zeroedu.labs import grading\ngrading.LabResult.ok = property(lambda self: True)\n", "the grader"),
    (4, "from zeroedu import theory\n", "zeroedu's own implementation (zeroedu.theory)"),
    (5, "from zeroedu.strategies.zero2 import ZeRO2\n", "zeroedu's own implementation (zeroedu.strategies)"),
    (2, "import zeroedu.strategies.zero2 as z\n", "zeroedu.strategies"),
    (1, "import sys\ncase = lambda: sys._getframe(1).f_locals['case']\n", "frames"),
    (1, "import inspect\nup = lambda: inspect.currentframe().f_back\n", "frames"),
    (3, "import sys\nsys.path.insert(0, 'labs/source')\n", "sys.path"),
    (3, "from lab3_fsdp_linear import *\n", "answer key"),
    (6, "import importlib\nkey = importlib.import_module('zeroedu.strategies.fsdp2')\n", "importlib"),
    (1, "run = __import__\n", "__import__"),
    # Attempts that once scored full marks. Lab 1: a raw all-reduce, then N-1 dummy sends so the
    # counted bytes matched the ring's; lab 3: dW all-reduced with raw dist behind a decoy.
    (1, "import torch.distributed as dist\n\ndef cheat(x, rank, world, send, recv):\n"
        "    s = x.clone()\n    dist.all_reduce(s)\n    for _ in range(world - 1):\n"
        "        send(torch.zeros(x.numel() // world), (rank + 1) % world)\n    return s.chunk(world)[rank]\n",
     "not raw torch.distributed"),
    (3, "import torch\n\ndef cheat(dw):\n    torch.distributed.all_reduce(dw)\n", "not raw collectives"),
    (3, "from torch import distributed\n", "torch.distributed"),
    # Lab 4 through a module that re-exports the closed forms; the package's front door.
    (4, "from zeroedu.quiz.figures import model_states\n", "lab 4 may import only zeroedu.recipes"),
    (4, "import zeroedu\n", "lab 4 may import only zeroedu.recipes"),
    # Lab 6: the real Unit.unshard and FSDP1._prefetch through the class behind the handed objects.
    (6, "def cheat(unit):\n    return type(unit).__mro__[1].unshard(unit)\n", "(.__mro__)"),
    (6, "def cheat(unit):\n    return super(LabFlatUnit, unit).unshard()\n", "uses super"),
    (6, "def cheat(fsdp, j):\n    return fsdp._prefetch(j)\n", "private attribute (._prefetch)"),
    (6, "def cheat(o):\n    return getattr(o, 'unsh' + 'ard')\n", "uses getattr"),
    # Modules that reach the process and the objects in it, by name at run time.
    (6, "import operator\nprefetch_of = operator.attrgetter('_pre' + 'fetch')\n", "imports operator"),
    (5, "from sys import modules\n", "imports sys"),
    (5, "import gc\nobjs = gc.get_objects()\n", "imports gc"),
    (1, "import ctypes\n", "imports ctypes"),
    (1, "import torch\nar = torch.ops.c10d.allreduce_\n", "uses .c10d"),
    # The grader's bookkeeping on the objects a lab hands over.
    (5, "def cheat(zero2):\n    zero2.violations.clear()\n", "bookkeeping (.violations)"),
    (5, "def cheat(zero2):\n    zero2.comm.ledger.comm.clear()\n", "bookkeeping (.ledger)"),
]


@pytest.mark.fast
@pytest.mark.parametrize("lab,cheat,reason", REFUSED)
def test_each_cheat_is_refused_with_its_reason_and_scores_zero(tmp_path, lab, cheat, reason):
    text = cheat + _key(lab)
    why = guard.refusal(lab, text)
    assert why is not None and why.startswith("refused: your file") and reason in why and "line " in why
    res = checks.check(lab, _file(tmp_path, lab, text), quiet=True)  # refused before any rank starts
    assert res.points == 0 and res.status == "error" and any(why in m for m in res.messages)


@pytest.mark.fast
def test_every_skeleton_and_answer_key_passes_the_guard():
    # what the skeletons import themselves (zeroedu.shard, recipes, lab 6's three state names) is allowed
    for lab in LABS:
        for kind in ("student", "key"):
            assert guard.refusal(lab, generate.render(generate.default_source() / LABS[lab].file, kind)) is None
    assert guard.refusal(3, "import torch\nx = torch.stack([torch.ones(1)])\n") is None  # torch.stack is fine


def test_lab4_runs_apart_from_the_grader_loops_and_exits_are_reported(tmp_path, monkeypatch, capsys):
    key = _key(4)
    assert key.count(LAB4_KEY_FN) == 1  # the function's docstring: what follows it runs in the function
    # a print() in the student's function cannot corrupt the grade's JSON: it goes to the rank's log
    printed = key.replace(LAB4_KEY_FN, LAB4_KEY_FN + "    print('{\"points\": 100}')\n", 1)
    assert main(["check", "4", "--json", "--path", str(_file(tmp_path, 4, printed))]) == 0
    g = json.loads(capsys.readouterr().out)
    assert g["points"] == 10 and g["labs"][0]["status"] == "passed"
    # --out: the grade in a file, written by the grader's process
    out = tmp_path / "grade.json"
    assert main(["check", "4", "--out", str(out), "--path", str(tmp_path / LABS[4].file)]) == 0
    assert json.loads(out.read_text())["points"] == 10 and "10/10 points" in capsys.readouterr().out
    # a submission that ends the process that ran it: that lab's error, 0 points (the guard,
    # which refuses `os`, switched off: this is the rank's own defence)
    monkeypatch.setattr(guard, "refusal", lambda lab, text: None)
    exits = key.replace(LAB4_KEY_FN, LAB4_KEY_FN + "    import os\n    os.kill(os.getpid(), 9)\n", 1)
    res = checks.check(4, _file(tmp_path, 4, exits), quiet=True)
    assert res.points == 0 and res.status == "error" and any("stopped the process" in m for m in res.messages)
    # an endless loop is cut at the time limit
    monkeypatch.setattr(checks, "TIMEOUT", 3.0)
    loops = key.replace(LAB4_KEY_FN, LAB4_KEY_FN + "    while True:\n        pass\n", 1)
    res = checks.check(4, _file(tmp_path, 4, loops), quiet=True)
    assert res.points == 0 and any("time limit" in m for m in res.messages)


def test_a_bad_byte_is_one_labs_error_inside_valid_json(tmp_path, capsys):
    (tmp_path / LABS[4].file).write_bytes(b"x = 1  # caf\xe9\n")  # latin-1, not UTF-8
    assert main(["check", "4", "--json", "--dir", str(tmp_path)]) == 0
    g = json.loads(capsys.readouterr().out)
    lab = g["labs"][0]
    assert lab["status"] == "error" and lab["points"] == 0
    assert "not UTF-8 text (byte 0xe9 at offset 12)" in json.dumps(lab)
    # --path names a file: a folder is a usage error, said in one line
    with pytest.raises(SystemExit) as e:
        main(["check", "4", "--path", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "is a folder: --path names one lab's file" in err


def test_garbage_padding_gets_the_same_grade_every_run(tmp_path):  # 10 runs
    """Lab 2 padded with torch.empty: the ranks fill uninitialised memory (NaN), so the grade does
    not depend on what the allocator's page held: below full marks, with the padding named."""
    src = _key(2)
    old = "padded = torch.zeros(shard.padded_numel(numel, n), dtype=flat_grad.dtype)"
    assert src.count(old) == 1
    p = _file(tmp_path, 2, src.replace(old, old.replace("torch.zeros", "torch.empty")))
    grades = []
    for _ in range(10):
        res = checks.check(2, p, quiet=True)
        grades.append(res.points)
        msgs = [d.message for c in res.tests["values"].cases for d in c.diagnosis]
        assert any("the padding" in m and "torch.zeros" in m for m in msgs), msgs
    assert len(set(grades)) == 1 and grades[0] < LABS[2].points


def test_publish_hands_out_no_solution_and_its_labs_still_grade(tmp_path, capsys):
    out = tmp_path / "course"
    assert main(["publish", str(out)]) == 0
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == sorted(["labs/README.md", "labs/student/report.md"] + [f"labs/student/{LABS[k].file}" for k in LABS])
    assert (out / "labs" / "student" / "report.md").read_text() == report.template()  # the blank report
    for k in LABS:  # the skeleton exactly, no solution region and no key header
        published = (out / "labs" / "student" / LABS[k].file).read_text()
        src = generate.default_source() / LABS[k].file
        assert published == generate.render(src, "student") != generate.render(src, "key")
        assert "BEGIN SOLUTION" not in published and "ANSWER KEY" not in published
        student_lines = set(published.splitlines())
        own = [ln for region in generate.solution_regions(src.read_text()) for ln in region.splitlines()
               if ln.strip() and ln not in student_lines]
        assert own  # every lab's solution has lines of its own, and none of them was published
    capsys.readouterr()
    assert main(["check", "4", "--json", "--dir", str(out / "labs" / "student")]) == 0  # the skeleton grades
    g = json.loads(capsys.readouterr().out)
    assert g["labs"][0]["status"] == "not_implemented" and g["points"] == 0
    with pytest.raises(SystemExit) as e:  # a second time: the folder is not fresh
        main(["publish", str(out)])
    assert e.value.code == 2


def test_a_submission_that_patches_the_grader_on_its_rank_is_not_graded(tmp_path, monkeypatch):
    """Lab 5's functions are handed the scaffold: replacing its violation record (so an early
    free would go unseen) through the object is refused by the guard and, were it written so
    the guard missed it, found by identity on the rank before any result is read."""
    src = _key(5)
    anchor = "def free_finished(zero2, wait=False):\n"
    assert src.count(anchor) == 1
    patched = src.replace(anchor, anchor + "    type(zero2)._violate = lambda self, *a: None\n", 1)
    assert "(._violate)" in guard.refusal(5, patched)
    monkeypatch.setattr(guard, "refusal", lambda lab, text: None)  # the guard off: the rank's check alone
    res = checks.check(5, _file(tmp_path, 5, patched), quiet=True)
    assert res.points == 0
    assert any("replaced part of the grader" in m and "ZeRO2Lab._violate" in m for m in res.messages), str(res)


def test_a_submission_that_hogs_memory_or_cpu_is_stopped_by_its_ranks_limits(tmp_path, monkeypatch):
    """Every rank that loads a submission limits itself (`checks.LIMITS`, `rank.Limits`): an
    allocation past the memory limit fails inside the submission, and a file that burns CPU is
    ended by the kernel (SIGXCPU) before the wall-clock limit; each is that lab's error, 0 points."""
    hog = "import torch\n_table = torch.ones(1 << 30, dtype=torch.float64)  # 8 GiB\n" + _key(1)
    res = checks.check(1, _file(tmp_path, 1, hog), quiet=True)
    assert res.points == 0 and any("allocate" in m for m in res.messages), res.messages
    monkeypatch.setattr(checks, "LIMITS", checks.Limits(cpu_seconds=2, memory_bytes=2 << 30))
    burn = "while True:\n    pass\n" + _key(1)
    res = checks.check(1, _file(tmp_path, 1, burn), quiet=True)
    assert res.points == 0 and any("SIGXCPU: it used more than its 2 s of CPU time" in m for m in res.messages), \
        res.messages


# Lab 1 as it once scored 10/10: the sum from a raw all-reduce, then N-1 sends of a chunk's size
# so the bytes counted through `send` matched the ring's. The module is reached through a path the
# guard's list of names once missed, and the tests below also switch the guard off: the bytes
# criterion reads the rank's sockets, so the traffic shows there whatever the source looks like.
LAB1_RAW = '''import torch
from torch.nn.parallel.distributed import dist


def ring_reduce_scatter(x, rank, world, send, recv):
    s = x.clone()
    dist.all_reduce(s)
    for _ in range(world - 1):
        send(torch.zeros(x.numel() // world), (rank + 1) % world)
        recv(torch.zeros(x.numel() // world), (rank - 1) % world)
    return s.chunk(world)[rank].clone()
'''


@pytest.mark.fast
def test_raw_collectives_through_another_module_are_refused():
    assert "distributed" in guard.refusal(1, LAB1_RAW)
    assert "private module" in guard.refusal(3, "import torch._C._distributed_c10d as c\n")


def test_traffic_around_the_handed_primitives_shows_on_the_wire(tmp_path, monkeypatch):
    monkeypatch.setattr(guard, "refusal", lambda lab, text: None)  # the guard off: the wire alone
    res = checks.check(1, _file(tmp_path, 1, LAB1_RAW), quiet=True, hidden=1, seed=5)
    by_test = res.tests
    assert by_test["values"].passed and not by_test["bytes"].passed  # right sums, bytes refused
    assert any("went another way" in m for m in res.messages), res.messages
    # Lab 3: dW all-reduced with raw dist, a reduce-scatter of zeros as the decoy.
    key3 = _key(3)
    cheat = key3.replace("    comm.reduce_scatter(mine, padded, axis, tag=\"lab3/dW\")\n",
                         "    comm.reduce_scatter(mine, torch.zeros_like(padded), axis, tag=\"lab3/dW\")\n"
                         "    getattr(torch, 'distributed').all_reduce(padded)\n"
                         "    mine.copy_(padded.chunk(n)[axis.rank])\n")
    assert cheat != key3
    res = checks.check(3, _file(tmp_path, 3, cheat), quiet=True)
    by_test = res.tests
    assert by_test["dw"].passed and not by_test["bytes"].passed, res.messages
    assert any("went another way" in m for m in res.messages), res.messages
