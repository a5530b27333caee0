"""The benchmarking report: the student's own lab 7 and lab 8 code timed on an emulated link,
their reasoning beside the measurements, and a rubric that marks the reasoning.

What is measured (`measure`), with the student's files, on N = 2 real ranks over zeroedu's ring
collectives paced by the `domain` link (α = 50 µs, 80 MB/s: `runtime.links.DOMAIN`), on a report
MLP of 24 layers 128 wide (400 K parameters, 1.6 MB in fp32), whose backward is a sizeable share
of the time its gradients take to move:

* **buckets** (lab 7): the step time for bucket sizes from 24 buckets (one layer each) to one
  bucket, each beside the number of buckets the run made and the closed form of its all-reduces
  alone, nothing overlapped (k·2(N-1)·α + 2(N-1)/N·Ψ/β, `theory.timing`). The step is the slowest
  rank's median after the first step, read from its timeline (`STEP_END` marks).
* **prefetch** (lab 8): FSDP2's step with backward prefetch off and on, and the most bytes of
  gathered parameters at once (the ledger's `gathered` category): what prefetch costs in memory.

Times vary with the machine, so nothing here is graded automatically: the rubric's points are
for the student's reasoning, which the instructor marks. The student writes `report.md` from
`template()` (its sections, by heading); `collect` measures every student's code itself (a
student's own numbers are never trusted) and writes one Markdown report per student: the
measured tables, the student's sections in the template's order, and the rubric with a blank
score per item, so the instructor marks reasoning, not formatting.

The collected report is the instructor's document, so what the student controls is data in it,
never markup: each section of their text sits in a fenced block longer than any run of backticks
in it (so `<script>`, a forged rubric table or an unclosed `<!--` is shown as text, and cannot
hide what follows), capped at `MAX_SECTION` characters (the report read is capped at
`MAX_REPORT` bytes); the messages of runs that failed (which a submission can raise with any
text) are fenced the same way; the student's name is escaped. A `report.md` that is a link, or
whose folders are, is refused by name (`paths`).
"""
from __future__ import annotations

import os
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..kinds import EventKind
from ..runtime import cluster
from ..runtime.links import DOMAIN
from ..theory.timing import ring_steps, ring_time
from . import checks, paths, training
from .grading import safe_text
from .rubric import (REPORT_MODEL, REPORT_N, RUBRIC, RUBRIC_POINTS, SECTIONS, RubricItem, Section, report_parameters,
                     sections, template)

REPORT_BATCH = 512  # samples per step: backward of about the all-reduce's time on two cores
REPORT_STEPS = 6  # the first is a warm-up; the step is the median of the rest
# 24, 12, 6, 3 and 2 buckets of whole layers (a weight is 64 KiB), then one bucket
BUCKETS = (64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 1 << 30)
QUICK_BUCKETS = (64 << 10, 1 << 30)
MAX_REPORT = 256 * 1024  # bytes of report.md read: the template's answers fit in a few kB
MAX_SECTION = 20_000  # characters of one section shown
MAX_PROBLEM = 500  # characters of one failed run's message shown


@dataclass(frozen=True)
class BucketRow:
    bucket_bytes: int
    buckets: int
    step_ms: float  # measured
    comm_ms: float  # closed form: the bucket all-reduces alone, nothing overlapped


@dataclass(frozen=True)
class PrefetchRow:
    backward_prefetch: bool
    step_ms: float  # measured
    peak_gathered: int  # bytes, the ledger's most gathered parameters at once


@dataclass(frozen=True)
class Tables:
    buckets: tuple[BucketRow, ...]
    prefetch: tuple[PrefetchRow, ...]
    problems: tuple[str, ...]  # why a table is missing (the lab does not pass, a run failed)


# ------------------------------------------------------------------ measuring
def _step_ms(timeline) -> float:
    ends = sorted(e.t for e in timeline.events if e.kind == EventKind.STEP_END and e.step >= 0)
    steps = [b - a for a, b in zip(ends, ends[1:])]  # from the second step on: the first warms up
    return 1e3 * statistics.median(steps)


def _run(lab: int, path: Path, params: list[dict]) -> list[list[dict]]:
    pool = cluster.get_pool(REPORT_N, checks.BACKEND, limits=checks.limits_for(path))
    per_rank = pool.run(training.train_lab_job, {"lab": lab, "path": str(path), "cases": [
        training.rank_case(lab, p, REPORT_N) for p in params]}, timeout=120.0 * len(params))
    return [[rr[i] for rr in per_rank] for i in range(len(params))]


def _base() -> dict:
    d = REPORT_MODEL.as_dict()
    d.pop("kind")
    return {"model": d, "steps": REPORT_STEPS, "global_batch": REPORT_BATCH, "links": "domain"}


def measure(directory: str | Path, quick: bool = False, root: str | Path | None = None) -> Tables:
    """Time the student's labs 7 and 8 in `directory` (each must pass its check first; `root`:
    the student's folder the files must lie in, without links: `checks.check`)."""
    directory = Path(directory)
    problems, buckets, prefetch = [], [], []
    psi_bytes = sum(p.numel() for p in REPORT_MODEL.build().parameters()) * 4
    for lab in (7, 8):
        path = checks.lab_path(lab, directory)
        res = checks.check(lab, path, quiet=True, directory=directory, root=root)
        linked = next((m for m in res.messages if m.startswith("refused:")), None)
        if linked is not None:
            problems.append(f"lab {lab}: {linked}")
            continue
        if not res.ok:
            problems.append(f"lab {lab} does not pass its check yet ({res.points:g}/{res.max_points}): "
                            "its table is left out")
            continue
        if lab == 7:
            sizes = QUICK_BUCKETS if quick else BUCKETS
            params = [{**_base(), "options": {"bucket_bytes": b}} for b in sizes]
        else:
            params = [{**_base(), "options": {"backward_prefetch": on, "forward_prefetch": False}}
                      for on in (False, True)]
        try:
            runs = _run(lab, path, params)
        except cluster.RankError as e:
            problems.append(f"lab {lab}: a timed run failed on rank {e.rank} ({e.kind})")
            continue
        finally:
            cluster.shutdown_pools()
        for p, ranks in zip(params, runs):
            bad = next((r for r in ranks if "error" in r), None)
            if bad is not None:
                problems.append(f"lab {lab}: a timed run raised: {bad['message']}")
                break
            step = max(_step_ms(r["timeline"]) for r in ranks)  # the slowest rank sets the step
            if lab == 7:
                b = p["options"]["bucket_bytes"]
                k = len(ranks[0]["buckets"])
                # the buckets the run made, each paying the ring's latency; the bytes once
                comm = k * ring_steps("all_reduce", REPORT_N) * DOMAIN.alpha + ring_time(
                    "all_reduce", psi_bytes, REPORT_N, DOMAIN.beta)
                buckets.append(BucketRow(b, k, step, 1e3 * comm))
            else:
                peak = max(e.bytes["gathered"] for e in ranks[0]["timeline"].events
                           if e.bytes is not None and e.step >= 0)
                prefetch.append(PrefetchRow(p["options"]["backward_prefetch"], step, peak))
    return Tables(tuple(buckets), tuple(prefetch), tuple(problems))


# ------------------------------------------------------------------ the documents
def tables_markdown(t: Tables) -> str:
    out = []
    if t.buckets:
        best = min(t.buckets, key=lambda r: r.step_ms)
        out += ["| bucket size | buckets | step, measured (ms) | all-reduces alone, closed form (ms) |",
                "|---:|---:|---:|---:|"]
        for r in t.buckets:
            size = "one bucket" if r.buckets == 1 else (f"{r.bucket_bytes >> 10} KiB" if r.bucket_bytes < 1 << 20
                                                         else f"{r.bucket_bytes >> 20} MiB")
            mark = " (fastest)" if r is best else ""
            out.append(f"| {size}{mark} | {r.buckets} | {r.step_ms:.1f} | {r.comm_ms:.1f} |")
        out.append("")
    if t.prefetch:
        out += ["| backward prefetch | step, measured (ms) | most gathered at once (bytes) |", "|---|---:|---:|"]
        out += [f"| {'on' if r.backward_prefetch else 'off'} | {r.step_ms:.1f} | {r.peak_gathered:,} |"
                for r in t.prefetch]
        out.append("")
    if t.problems:
        # a failed run's message is the submission's text: shown as text, one fenced block
        out += ["Not measured:", "", fenced("\n".join(f"- {_one_line(p, MAX_PROBLEM)}" for p in t.problems))]
    return "\n".join(out).rstrip() + "\n"


def _one_line(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit:,} more characters cut)"


def fenced(text: str) -> str:
    """`text` as a fenced block that nothing in it can close (a fence longer than its longest run
    of backticks): Markdown and HTML inside are shown, not rendered."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _escaped_name(name: str) -> str:
    """A folder name for a Markdown heading: printable, and no character Markdown or HTML acts on."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>&])", r"\\\1", safe_text(name))


def render(student: str, t: Tables, text: str) -> str:
    """One student's report: the measured tables, their sections in order, the rubric to mark."""
    body = sections(text)
    out = [f"# Benchmarking report: {_escaped_name(student)}", "",
           f"Measured by the instructor's run of the student's labs 7 and 8 (N = {REPORT_N}, the domain link, "
           f"an MLP of {report_parameters():,} parameters; `zeroedu.labs.report`).", "", tables_markdown(t)]
    for s in SECTIONS:
        b = body[s.heading]
        if len(b) > MAX_SECTION:
            b = f"{b[:MAX_SECTION]}\n... ({len(b) - MAX_SECTION:,} more characters cut)"
        out += [f"## {s.heading}", "", fenced(b) if b else "*(not written)*", ""]
    out += ["## Rubric", "", "| section | points | what earns them | score |", "|---|---:|---|---:|"]
    out += [f"| {r.section} | {r.points} | {r.earns} | |" for r in RUBRIC]
    out += [f"| total | {RUBRIC_POINTS} | | |", ""]
    return "\n".join(out)


def collect(class_dir: str | Path, out_dir: str | Path, quick: bool = False, progress=None) -> list[Path]:
    """Every student folder of `class_dir`: measure their labs 7 and 8, read their report.md, write
    `out_dir`/<student>.md."""
    from .classroom import _lab_dir, students

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for folder in students(class_dir):
        if progress is not None:
            progress(folder.name)
        labs = _lab_dir(folder)
        text, notes = "", []
        for p in (labs / "report.md", folder / "report.md"):
            refused = paths.link_refusal(folder, p, root_too=True)
            if refused is not None:
                notes.append(refused)
                break
            if os.path.lexists(p):
                try:
                    text, more = paths.read_text(p, MAX_REPORT)
                except OSError as e:
                    notes.append(f"report.md unreadable ({e})")
                    break
                if more:
                    notes.append(f"report.md is over {MAX_REPORT:,} bytes: only its first {MAX_REPORT:,} are read")
                break
        tables = measure(labs, quick=quick, root=folder)
        tables = Tables(tables.buckets, tables.prefetch, tables.problems + tuple(notes))
        dst = out_dir / f"{folder.name}.md"
        dst.write_text(render(folder.name, tables, text), encoding="utf-8")
        written.append(dst)
    return written


__all__ = ["BUCKETS", "RUBRIC", "RUBRIC_POINTS", "SECTIONS", "BucketRow", "PrefetchRow", "RubricItem", "Section",
           "Tables", "collect", "fenced", "measure", "render", "sections", "tables_markdown", "template"]
