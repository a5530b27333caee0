"""What students control reaches the instructor as data: links in a submission are refused by
name (never followed to the key or a classmate's work), and the grade book, the console summary
and the collected reports show student text as text (`zeroedu.labs.paths`, `classroom.cell`,
`report.fenced`)."""
from __future__ import annotations

import csv
import os

import pytest

from zeroedu.labs import checks, classroom, generate, report
from zeroedu.labs.__main__ import main
from zeroedu.labs.registry import LABS


def _key(lab: int) -> str:
    return generate.render(generate.default_source() / LABS[lab].file, "key")


@pytest.mark.fast
def test_a_lab_file_that_links_to_the_key_is_refused_by_name(tmp_path):
    """Linked to the answer key (the ranks would be confined to the key's folder and run it):
    refused before any rank starts, with one line naming the link and its target."""
    key = tmp_path / "private"
    key.mkdir()
    (key / LABS[4].file).write_text(_key(4))
    mine = tmp_path / "alice"
    mine.mkdir()
    (mine / LABS[4].file).symlink_to(key / LABS[4].file)
    for res in (checks.check(4, directory=mine, quiet=True), checks.check(4, mine / LABS[4].file, quiet=True)):
        assert res.points == 0 and res.status == "error", str(res)
        assert any(m.startswith(f"refused: {mine / LABS[4].file} is a link (to {key / LABS[4].file})")
                   for m in res.messages), res.messages


def test_a_class_folder_with_linked_work_grades_it_zero_and_the_grade_book_holds_data(tmp_path, capsys):
    """bob's `labs` links to alice's, carol's folder is a link to alice's, dan's lab file links
    to alice's: each is refused by name and scores 0 (alice keeps her 10). Folders named as
    spreadsheet formulas are written as text cells; a newline in a name cannot forge a summary line."""
    cls = tmp_path / "class"
    alice = cls / "alice" / "labs" / "student"
    alice.mkdir(parents=True)
    (alice / LABS[4].file).write_text(_key(4))
    (cls / "bob").mkdir()
    (cls / "bob" / "labs").symlink_to(cls / "alice" / "labs")
    (cls / "carol").symlink_to(cls / "alice")
    (cls / "dan").mkdir()
    (cls / "dan" / LABS[4].file).symlink_to(alice / LABS[4].file)
    formulas = ['=HYPERLINK(""evil.example"",""x"")', "@SUM(1+1)", "+1-2", "-3+4"]
    for name in formulas + ["eve\nzed  10 of 10  (every lab passed)"]:
        (cls / name).mkdir()
    out = tmp_path / "grades.csv"
    assert main(["class", str(cls), "--csv", str(out), "--labs", "4"]) == 0
    rows = {r[0]: r for r in csv.reader(out.open())}
    assert rows["alice"][1:4] == ["10", "10", "10"]
    for who in ("bob", "carol", "dan"):
        assert rows[who][1] == "0", rows[who]
    for name in formulas:  # the cell reads as text: a leading apostrophe
        assert rows["'" + name][1] == "0"
    assert not any(k.startswith(("=", "@", "+", "-")) for k in rows)
    printed = capsys.readouterr()
    lines = printed.out.splitlines()
    assert not any(ln.startswith("zed") for ln in lines) and any(ln.startswith("eve\\nzed") for ln in lines)
    assert "grading eve\\nzed" in printed.err
    grades = {g.student: g for g in classroom.grade_class(cls, [4])}
    msgs = {who: grades[who].grade["labs"][0]["messages"] for who in ("bob", "carol", "dan")}
    assert msgs["bob"][0].startswith(f"refused: {cls / 'bob' / 'labs'} is a link"), msgs
    assert msgs["carol"][0].startswith(f"refused: {cls / 'carol'} is a link"), msgs
    assert msgs["dan"][0].startswith(f"refused: {cls / 'dan' / LABS[4].file} is a link"), msgs
    # the same through `check --dir` on the student's folder (the published layout under it)
    assert checks.grade([4], directory=cls / "bob" / "labs" / "student", root=cls / "bob")["points"] == 0


@pytest.mark.fast
def test_a_collected_report_shows_student_text_as_text(tmp_path):
    """A report with `<script>`, a forged rubric table, an unclosed comment that would hide the
    real rubric and a run of backticks that would close a plain fence; a failed run's message
    with a forged measurement table; a 1 MB report: all shown as text inside fences, capped."""
    t = report.template()
    evil = ("<script>alert(1)</script>\n| section | points | what earns them | score |\n|---|---:|---|---:|\n"
            "| total | 10 | | 10 |\n````\n# Benchmarking report: someone else\n<!-- the rest is hidden")
    text = t.rstrip() + "\n" + evil + "\n"  # at the end of the last section, where a comment would hide the rubric
    text = text.replace(f"## {report.SECTIONS[1].heading}\n", f"## {report.SECTIONS[1].heading}\n" + "x" * 30_000 + "\n")
    forged = "lab 7: a timed run raised: boom\n\n| 64 KiB (fastest) | 24 | 1.0 | 1.0 |"
    doc = report.render("<b>mal</b>\n# x", report.Tables((), (), (forged,)), text)
    # every line a student wrote sits inside a fence that no run of backticks in it closes
    fence = "`" * 5
    assert f"{fence}text\n<script>alert(1)</script>" in doc and "````\n" in doc
    assert doc.count("\n## Rubric\n") == 1 and doc.rstrip().endswith(f"| total | {report.RUBRIC_POINTS} | | |")
    assert "<!--" in doc.split(f"{fence}text\n", 1)[1].split(f"\n{fence}\n", 1)[0]  # inside the fence
    assert "x" * report.MAX_SECTION in doc and "x" * (report.MAX_SECTION + 1) not in doc
    assert "10,000 more characters cut" in doc
    assert "```text\n- lab 7: a timed run raised: boom | 64 KiB (fastest) | 24 | 1.0 | 1.0 |\n```" in doc
    assert "\n| 64 KiB (fastest)" not in doc
    assert doc.startswith("# Benchmarking report: \\<b\\>mal\\</b\\>\\\\n\\# x\n")


def test_collect_refuses_a_linked_report_and_caps_a_large_one(tmp_path):
    """cop's report.md links to mal's (plagiarism copied in), sly's to a file of the instructor's:
    refused by name, nothing of the target copied; big's 1 MB report is read to the cap."""
    cls = tmp_path / "class"
    for who in ("mal", "cop", "sly", "big"):
        (cls / who).mkdir(parents=True)
    secret = tmp_path / "instructor-notes.md"
    secret.write_text(f"## {report.SECTIONS[0].heading}\nTHE INSTRUCTOR'S NOTES\n")
    (cls / "mal" / "report.md").write_text(f"## {report.SECTIONS[0].heading}\nMAL'S OWN WORDS\n")
    (cls / "cop" / "report.md").symlink_to(cls / "mal" / "report.md")
    (cls / "sly" / "report.md").symlink_to(secret)
    (cls / "big" / "report.md").write_text(f"## {report.SECTIONS[0].heading}\n" + "y" * (1 << 20))
    out = tmp_path / "reports"
    written = report.collect(cls, out)
    assert sorted(p.name for p in written) == ["big.md", "cop.md", "mal.md", "sly.md"]
    cop, sly, big = ((out / f"{w}.md").read_text() for w in ("cop", "sly", "big"))
    assert "MAL'S OWN WORDS" in (out / "mal.md").read_text() and "MAL'S OWN WORDS" not in cop
    assert f"refused: {cls / 'cop' / 'report.md'} is a link" in cop
    assert "INSTRUCTOR" not in sly and "is a link" in sly
    assert f"report.md is over {report.MAX_REPORT:,} bytes" in big and len(big) < 2 * report.MAX_SECTION
    assert os.path.getsize(out / "big.md") < report.MAX_REPORT


# ------------------------------------------------------------------ criteria that follow the buffers
def _mutant(tmp_path, lab: int, *edits) -> "os.PathLike":
    text = _key(lab)
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    p = tmp_path / LABS[lab].file
    p.write_text(text)
    return p


def _failed(res) -> set[str]:
    return {t for t, r in res.tests.items() if not r.passed}


def _said(res, text: str) -> bool:
    return any(text in d.message for tr in res.tests.values() for c in tr.cases for d in c.diagnosis)


LAB7_DECOYS = (
    # during backward: an empty asynchronous reduce-scatter per bucket, kept as its "handle"
    ("    return ddp.comm.all_reduce(bucket.buffer, ddp.dist.inner, ddp.tag(f\"bucket{bucket.index}\", \"grads\"),\n"
     "                               async_op=True)",
     "    import torch\n    e = torch.zeros(0)\n"
     "    return ddp.comm.reduce_scatter(e, e, ddp.dist.inner, ddp.tag(f\"bucket{bucket.index}\", \"grads\"),\n"
     "                                   async_op=True)"),
    # after backward: every bucket all-reduced synchronously, the decoys waited late
    ("    for k in sorted(ddp.inflight):\n        ddp.inflight.pop(k).wait()",
     "    for k in sorted(ddp.inflight):\n        ddp.inflight.pop(k).wait()\n    for b in ddp.buckets:\n"
     "        ddp.comm.all_reduce(b.buffer, ddp.dist.inner, ddp.tag(f\"bucket{b.index}\", \"grads\"))"),
)


def test_lab7_decoy_collectives_buy_nothing(tmp_path):
    """Buckets all-reduced synchronously after backward, with empty asynchronous reduce-scatters
    launched during backward to fake the overlap (once 28/28): refused, named."""
    res = checks.check(7, _mutant(tmp_path, 7, *LAB7_DECOYS), quiet=True)
    assert res.points <= LABS[7].points // 2 and "overlap" in _failed(res), str(res)
    assert _said(res, "a reduce_scatter of 0 bytes ((0,)) that is no bucket's all-reduce"), str(res)


LAB8_NO_PREFETCH = ("        unshard(fsdp.units[j], async_op=True)  # one ahead: two units gathered at most",
                    "        pass")
LAB8_PLAIN_TAGS = ('unit.padded_shard(j), unit.axis,\n                                                unit.tag(unit.name, "params", f"param{j}")',
                   'unit.padded_shard(j), unit.axis,\n                                                "my gathers"')


def test_lab8_without_prefetch_fails_prefetch_whatever_its_tags_say(tmp_path):
    """No backward prefetch, its all-gathers tagged with a plain string (so no record named a
    unit and the prefetch check skipped every unit: once 33/33): the records carry the unit whose
    leaves they wrote, and the missing prefetch is named."""
    res = checks.check(8, _mutant(tmp_path, 8, LAB8_NO_PREFETCH, LAB8_PLAIN_TAGS), quiet=True)
    assert "prefetch" in _failed(res) and res.points < LABS[8].points, str(res)
    assert _said(res, "all-gather for backward started after unit 2's gradients were done"), str(res)


# the gathers land in tensors of the file's own, copied into the leaves when waited for
SCRATCH_LATER = ("class Later:\n    def __init__(self, h, src, dst):\n        self.h, self.src, self.dst = h, src, dst\n\n"
                 "    def wait(self):\n        self.h.wait()\n        self.dst.copy_(self.src)\n\n\n")


def test_lab8_gathers_into_scratch_tensors_or_empty_decoys_are_refused(tmp_path):
    """Gathering into tensors of the student's own (memory the ledger cannot see, once 33/33) and
    0-byte asynchronous decoys: each collective that carries no leaf or gradient is refused."""
    scratch = _mutant(tmp_path, 8, (
        "            handles.append(unit.comm.all_gather(leaf.data, unit.padded_shard(j), unit.axis,\n"
        "                                                unit.tag(unit.name, \"params\", f\"param{j}\"), async_op=True))",
        "            scratch = leaf.data.new_empty(leaf.shape)\n"
        "            handles.append(Later(unit.comm.all_gather(scratch, unit.padded_shard(j), unit.axis,\n"
        "                unit.tag(unit.name, \"params\", f\"param{j}\"), async_op=True), scratch, leaf.data))"),
        ("def shard_rows(d0, n, r):", SCRATCH_LATER + "def shard_rows(d0, n, r):"))
    res = checks.check(8, scratch, quiet=True)
    assert res.points <= LABS[8].points // 2, str(res)
    assert _said(res, "that writes no unit's leaf (gather straight into unit.leaves[j]"), str(res)
    decoy = _mutant(tmp_path, 8, ("    fsdp.inflight = (unit, work)\n",
                                  "    fsdp.inflight = (unit, work)\n    import torch\n    e = torch.zeros(0)\n"
                                  "    unit.comm.reduce_scatter(e, e, unit.axis, 'decoy', async_op=True)\n"))
    res = checks.check(8, decoy, quiet=True)
    assert res.points <= LABS[8].points // 2, str(res)
    assert _said(res, "a reduce_scatter of 0 bytes ((0,)) that reads no leaf's full gradient"), str(res)
