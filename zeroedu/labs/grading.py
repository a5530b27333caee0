"""A lab's grade as plain data: cases, criteria, diagnoses, points; text for people, JSON for autograders.

A *case* is one set of inputs a lab is run on (ranks N, sizes, seeds, strategy options); visible
cases are fixed and documented, hidden ones are drawn from a seed. A *test* is one criterion of
the lab (`registry.Test`); the grader records, per case and test, a list of `Diagnosis` (empty:
the criterion holds on that case). A test earns its points when it holds on every case.

JSON schema (``SCHEMA``; stable, new keys may be added, none removed or renamed)::

    {"schema": "zeroedu-labs-grade/1", "seed": int|null, "hidden": int, "n": int,
     "student": str|null, "course": str,
     "points": float, "max_points": int,
     "labs": [{"lab": int, "name": str, "title": str, "path": str,
               "status": "passed"|"failed"|"not_implemented"|"missing"|"error",
               "points": float, "max_points": int, "minutes": int, "notebook": str,
               "tests": [{"id": str, "title": str, "passed": bool, "points": float, "max_points": int,
                          "cases": [{"case": str, "hidden": bool, "params": {...}, "passed": bool,
                                     "diagnosis": [{"message": str, "rank": int|null,
                                                    "unit": int|null, "shard": [int, int]|null,
                                                    "element": int|[int, ...]|null,
                                                    "expected": float|null, "got": float|null}]}]}],
               "messages": [str]}]}

``student`` is the id the grade was made for (``check --student``: labs 5-8 ran that student's
variant), ``course`` the course name the variant was drawn with; a signed grade is bound to both
(`signing`).

``status`` is ``not_implemented`` when a case stopped at a ``NotImplementedError`` of the
skeleton, ``missing`` when there is no file, ``error`` when the file does not load (syntax
error) or the checker itself failed, else ``passed`` (every test) or ``failed``.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .registry import TOTAL_POINTS, Lab

SCHEMA = "zeroedu-labs-grade/1"


MAX_MESSAGE = 2000  # characters of feedback per diagnosis


def safe_text(text: str) -> str:
    """`text` for a console line: control characters (a newline that would forge the next
    line, an escape sequence that would move the cursor) written as escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] if c in "\n\r\t" else f"\\x{ord(c):02x}"
                   if ord(c) < 256 else f"\\u{ord(c):04x}" for c in str(text))


def cap_message(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text`, or its first `limit` characters and how many were cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters cut)"


@dataclass
class Diagnosis:
    """What is wrong, and where: the rank, the unit or shard, the element, expected vs got."""

    message: str
    rank: int | None = None
    unit: int | None = None
    shard: tuple[int, int] | None = None  # a buffer-wide [start, end) range
    element: int | tuple[int, ...] | None = None
    expected: float | None = None
    got: float | None = None

    def __post_init__(self):
        # The message can carry a submission's own text (an exception it raised): capped, so a
        # 20 MB message cannot make the grade 500 MB.
        self.message = cap_message(str(self.message))

    def plain(self) -> dict:
        d = asdict(self)
        if d["shard"] is not None:
            d["shard"] = list(d["shard"])
        if isinstance(d["element"], tuple):
            d["element"] = list(d["element"])
        return d


@dataclass
class Case:
    id: str  # "visible-1", "hidden-2"
    hidden: bool
    n: int  # ranks
    params: dict  # plain data: what the rank job needs, and what the JSON shows

    def describe(self) -> str:
        parts = [f"N={self.n}"]
        for k, v in self.params.items():
            if k == "seed":
                continue
            if k == "model" and isinstance(v, dict):  # an MLPConfig: d_in→hidden×(depth-1)→d_out
                v = f"MLP {v['d_in']}→{v['hidden']}×{v['depth'] - 1}→{v['d_out']}"
                parts.append(v)
            elif k == "options":
                parts += [f"{o}={x}" for o, x in v.items()]
            else:
                parts.append(f"{k}={v}")
        return f"{self.id}: " + ", ".join(parts)


@dataclass
class CaseResult:
    case: Case
    passed: bool
    diagnosis: list[Diagnosis]


@dataclass
class TestResult:
    id: str
    title: str
    max_points: int
    cases: list[CaseResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases)

    @property
    def points(self) -> float:
        return float(self.max_points) if self.passed else 0.0


class LabResult:
    """Everything the grader found for one lab file. `ok` and `messages` keep the old API."""

    def __init__(self, lab: Lab, path: str):
        self.lab, self.path = lab, path
        self.tests = {t.id: TestResult(t.id, t.title, t.points) for t in lab.tests}
        self.cases: list[Case] = []
        self.status_hint: str | None = None  # not_implemented | missing | error
        self.notes: list[str] = []  # messages that belong to no test (e.g. "hidden cases skipped")

    # ---------------------------------------------------------------- recording
    def add_case(self, case: Case) -> None:
        self.cases.append(case)

    def record(self, case: Case, test: str, diags: list[Diagnosis] | Diagnosis | None = None) -> None:
        """The criterion `test` on `case`: holds when `diags` is empty."""
        diags = [diags] if isinstance(diags, Diagnosis) else list(diags or [])
        tr = self.tests[test]
        tr.cases = [c for c in tr.cases if c.case.id != case.id]
        tr.cases.append(CaseResult(case, not diags, diags))

    def fail_case(self, case: Case, diag: Diagnosis, status: str | None = None) -> None:
        """The case produced no results (not implemented, raised, hung): every test fails on it."""
        for t in self.tests:
            self.record(case, t, diag)
        if status and self.status_hint is None:
            self.status_hint = status

    def fail_all(self, message: str, status: str) -> None:
        """Nothing could run (no file, syntax error, checker bug)."""
        self.status_hint = status
        if not self.cases:
            self.add_case(Case("file", False, 0, {}))
        for case in self.cases:
            self.fail_case(case, Diagnosis(message))

    def finish(self) -> "LabResult":
        """A test never recorded on some case counts as failed there (nothing is passed silently)."""
        for case in self.cases:
            for tr in self.tests.values():
                if all(c.case.id != case.id for c in tr.cases):
                    tr.cases.append(CaseResult(case, False, [Diagnosis("not evaluated on this case")]))
        order = {c.id: i for i, c in enumerate(self.cases)}
        for tr in self.tests.values():
            tr.cases.sort(key=lambda c: order.get(c.case.id, 0))
        return self

    # ---------------------------------------------------------------- reading
    @property
    def points(self) -> float:
        return sum(t.points for t in self.tests.values())

    @property
    def max_points(self) -> int:
        return self.lab.points

    @property
    def ok(self) -> bool:
        return all(t.passed for t in self.tests.values())

    @property
    def status(self) -> str:
        if self.ok:
            return "passed"
        return self.status_hint or "failed"

    @property
    def messages(self) -> list[str]:
        """Distinct diagnosis messages, in test order, then the notes."""
        out: list[str] = []
        for tr in self.tests.values():
            for c in tr.cases:
                for d in c.diagnosis:
                    if d.message not in out:
                        out.append(d.message)
        return out + [n for n in self.notes if n not in out]

    def as_dict(self) -> dict[str, Any]:
        lab = self.lab
        return {
            "lab": lab.number, "name": lab.name, "title": lab.title, "path": self.path,
            "status": self.status, "points": self.points, "max_points": self.max_points,
            "minutes": lab.minutes, "notebook": lab.notebook,
            "tests": [{"id": t.id, "title": t.title, "passed": t.passed, "points": t.points,
                       "max_points": t.max_points,
                       "cases": [{"case": c.case.id, "hidden": c.case.hidden, "params": {"n": c.case.n, **c.case.params},
                                  "passed": c.passed, "diagnosis": [d.plain() for d in c.diagnosis]}
                                 for c in t.cases]}
                      for t in self.tests.values()],
            "messages": self.messages,
        }

    def __str__(self) -> str:
        lab = self.lab
        mark = "PASSED ✓" if self.ok else "not yet ✗"
        lines = [f"lab {lab.number} ({lab.title}): {mark}  {self.points:g}/{self.max_points} points"]
        if self.status in ("not_implemented", "missing", "error"):
            return "\n".join(lines + [f"  - {self.messages[0]}"] + [f"  - {n}" for n in self.notes])
        for t in self.tests.values():
            lines.append(f"  {'✓' if t.passed else '✗'} {t.id} ({t.points:g}/{t.max_points}): {t.title}")
            if t.passed:
                continue
            found = [(c.case, d) for c in t.cases for d in c.diagnosis]
            # Cases that did not run say so elsewhere: show what went wrong where something ran.
            real = [x for x in found if not x[1].message.startswith(("not run", "not evaluated"))]
            shown = real or found[:1]
            for case, d in shown[:3]:
                lines.append(f"      [{case.describe()}] {d.message}")
            if len(shown) > 3:
                lines.append(f"      ... and {len(shown) - 3} more")
        lines += [f"  - {n}" for n in self.notes]
        return "\n".join(lines)

    __repr__ = __str__


def grade_dict(results: list[LabResult], *, seed: int | None, hidden: int, n: int, student: str | None = None,
               course: str = "") -> dict[str, Any]:
    """The whole grade (see the module docstring for the schema). `max_points` is the total of
    every lab graded (all labs: `registry.TOTAL_POINTS`)."""
    labs = [r.as_dict() for r in results]
    return {"schema": SCHEMA, "seed": seed, "hidden": hidden, "n": n, "student": student, "course": course,
            "points": sum(r.points for r in results), "max_points": sum(r.max_points for r in results),
            "labs": labs}


def to_json(grade: dict) -> str:
    return json.dumps(grade, indent=2, ensure_ascii=False, default=float)


__all__ = ["SCHEMA", "safe_text", "Case", "CaseResult", "Diagnosis", "LabResult", "TestResult", "TOTAL_POINTS",
           "grade_dict", "to_json"]
