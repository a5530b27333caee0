"""The benchmarking report's page: its sections (the questions the student answers), the
rubric that marks them, and the blank template (`report.md`). What the tables measure, and the
collector, are in `labs.report`; this module imports nothing that runs ranks, so `publish` can
put the blank page beside the skeletons."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..models import MLPConfig
from ..runtime.links import DOMAIN

REPORT_N = 2
REPORT_MODEL = MLPConfig(d_in=128, hidden=128, depth=24, d_out=128, seed=1)


@dataclass(frozen=True)
class Section:
    heading: str
    prompt: str


SECTIONS = (
    Section("The best bucket size, derived",
            "Before looking at the table: with k = ⌈Ψ_bytes / b⌉ buckets, write the time of the step's "
            "all-reduces (latency per bucket, bytes once) and how much of it can hide behind backward. "
            "Which bucket size b minimises the step? Give a number for the report MLP on the domain link."),
    Section("The measurement against the derivation",
            "Which bucket size was fastest in the table? Within what factor of your derivation? Explain "
            "every row that is off by more than 20 %."),
    Section("Where the model breaks",
            "Name at least one effect your model leaves out that the measurements show (or would, on a "
            "real cluster): e.g. the last bucket cannot overlap anything, CPU time per message, the "
            "order buckets become ready in, a bucket larger than the whole model."),
    Section("Prefetch and its memory",
            "From the prefetch table: how much step time did backward prefetch save, and how many bytes "
            "of gathered parameters did it cost? Which units were gathered together at the peak, and "
            "when would you turn prefetch off?"),
)


@dataclass(frozen=True)
class RubricItem:
    section: str
    points: int
    earns: str


RUBRIC = (
    RubricItem(SECTIONS[0].heading, 3, "1 for the latency term k·2(N-1)·α and the bandwidth term 2(N-1)/N·Ψ/β; "
               "1 for the overlap (all but the last bucket can hide behind backward); 1 for a numeric b with "
               "its units"),
    RubricItem(SECTIONS[1].heading, 2, "1 for reading the fastest row correctly; 1 for a reason for each row "
               "more than 20 % off (not 'noise' alone)"),
    RubricItem(SECTIONS[2].heading, 2, "1 per distinct, correct effect tied to a row of the table (at most 2)"),
    RubricItem(SECTIONS[3].heading, 3, "1 for the time saved, 1 for the memory cost in bytes (== two "
               "neighbouring units at the peak), 1 for when prefetch is not worth it"),
)
RUBRIC_POINTS = sum(r.points for r in RUBRIC)


def template() -> str:
    """The blank report a student fills in (`report.md`)."""
    out = ["# Benchmarking report", "",
           "Write under each heading; keep the headings as they are (the collector finds your text by "
           "them). The tables are measured by the instructor's run of your lab 7 and lab 8 files, on "
           f"N = {REPORT_N} ranks, the domain link (α = {DOMAIN.alpha * 1e6:g} µs, "
           f"{DOMAIN.beta / 1e6:g} MB/s) and an MLP of {report_parameters():,} parameters; "
           "`python -m zeroedu.labs report --dir YOUR_FOLDER` prints them for you.", ""]
    for s in SECTIONS:
        out += [f"## {s.heading}", "", f"<!-- {s.prompt} -->", "", ""]
    return "\n".join(out)


def report_parameters() -> int:
    """The report MLP's parameter count (396,288)."""
    return sum(p.numel() for p in REPORT_MODEL.build().parameters())


def sections(text: str) -> dict[str, str]:
    """The student's text under each of the template's headings ('' when missing), comments dropped."""
    found: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        m = re.match(r"^##\s+(.*\S)\s*$", line)
        if m:
            cur = m.group(1) if m.group(1) in {s.heading for s in SECTIONS} else None
            if cur is not None:
                found[cur] = []
            continue
        if cur is not None:
            found[cur].append(line)
    out = {}
    for s in SECTIONS:
        body = re.sub(r"<!--.*?-->", "", "\n".join(found.get(s.heading, [])), flags=re.S).strip()
        out[s.heading] = body
    return out



__all__ = ["REPORT_MODEL", "REPORT_N", "RUBRIC", "RUBRIC_POINTS", "SECTIONS", "RubricItem", "Section", "report_parameters", "sections",
           "template"]
