"""A class's submissions graded together, and the grades as one CSV for a grade book.

A class folder holds one sub-folder per student, named for the student, each holding that
student's lab files as the published tree names them (`labs/student/labN_*.py`, or the files at
the top of the folder). `grade_class` grades every student on the same cases: the visible ones
and `hidden` randomized ones drawn from one seed, so two students are graded alike and the
instructor can grade the class again to the same result. Each student's grade is the same JSON
`checks.grade` returns (`grading.SCHEMA`); `table` turns the class into rows:

    student, points, max_points, lab1, lab1 hidden-1, ..., lab7, lab7 hidden-1, ...

one row per student, a column of points per lab, and for each hidden case a column that is 1 when
the student's code passed every criterion on it (0 otherwise): a lab lost on the hidden cases
only is an answer fitted to the visible ones.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from . import checks
from .grading import safe_text
from .registry import LABS


@dataclass
class StudentGrade:
    student: str
    folder: str
    grade: dict  # checks.grade's JSON (grading.SCHEMA)

    @property
    def points(self) -> int:
        return self.grade["points"]


def _lab_dir(folder: Path) -> Path:
    """Where a student's lab files are: the published layout (labs/student/) or the folder itself.
    A `labs` that is a link counts as the published layout, so the check refuses it by name
    (`paths.link_refusal`) rather than grading the files beside it."""
    nested = folder / "labs" / "student"
    return nested if nested.is_dir() or (folder / "labs").is_symlink() or nested.is_symlink() else folder


def students(directory: str | Path) -> list[Path]:
    """The class folder's student sub-folders, by name (hidden folders are left out)."""
    d = Path(directory)
    if not d.is_dir():
        raise ValueError(f"{d} is not a folder: a class folder holds one sub-folder per student")
    # a link to a folder is listed (and refused by name when graded), never silently graded as its target
    found = sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not found:
        raise ValueError(f"{d} holds no student folder (one sub-folder per student, named for the student)")
    return found


def grade_class(directory: str | Path, labs=None, *, hidden: int = 0, seed: int | None = None,
                n: int = checks.DEFAULT_N, variants: bool = False, course: str = "",
                progress=None) -> list[StudentGrade]:
    """Grade every student of the class folder on the same hidden cases (one seed for all);
    with `variants`, each student's visible cases are the variant of their folder's name."""
    if hidden and seed is None:
        seed = checks.new_seed()
    out = []
    for folder in students(directory):
        if progress is not None:
            progress(folder.name)
        g = checks.grade(labs, directory=_lab_dir(folder), n=n, hidden=hidden, seed=seed,
                         student=folder.name if variants else None, course=course, root=folder)
        out.append(StudentGrade(folder.name, str(folder), g))
    return out


def _num(x):
    """Points as a grade book reads them: 10, not 10.0."""
    return int(x) if float(x).is_integer() else x


def table(grades: list[StudentGrade]) -> tuple[list[str], list[list]]:
    """The class as a header and one row per student (see the module docstring)."""
    if not grades:
        return ["student", "points", "max_points"], []
    first = grades[0].grade
    columns: list[tuple[int, str | None]] = []
    for lab in first["labs"]:
        columns.append((lab["lab"], None))
        hidden = sorted({c["case"] for t in lab["tests"] for c in t["cases"] if c["hidden"]},
                        key=lambda s: int(s.rsplit("-", 1)[1]))
        columns += [(lab["lab"], h) for h in hidden]
    header = ["student", "points", "max_points"] + [f"lab{k}" if h is None else f"lab{k} {h}" for k, h in columns]
    rows = []
    for sg in grades:
        by_lab = {lab["lab"]: lab for lab in sg.grade["labs"]}
        row = [sg.student, _num(sg.grade["points"]), _num(sg.grade["max_points"])]
        for k, h in columns:
            lab = by_lab[k]
            if h is None:
                row.append(_num(lab["points"]))
            else:
                ran = [c for t in lab["tests"] for c in t["cases"] if c["case"] == h]
                row.append(int(bool(ran) and all(c["passed"] for c in ran)))
        rows.append(row)
    return header, rows


FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def cell(value):
    """A grade-book cell as data: text a spreadsheet would read as a formula (a folder named
    `=HYPERLINK(...)` or `@SUM(...)`) gets a leading apostrophe, which spreadsheets show as text
    (OWASP's CSV-injection advice); numbers stay numbers."""
    if isinstance(value, str) and value.lstrip(" ").startswith(FORMULA_START):
        return "'" + value
    return value


def to_csv(grades: list[StudentGrade]) -> str:
    header, rows = table(grades)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([cell(h) for h in header])
    w.writerows([[cell(v) for v in row] for row in rows])
    return buf.getvalue()


def summary(grades: list[StudentGrade]) -> str:
    """One line per student: points of max, and the labs not fully passed."""
    lines = []
    names = [safe_text(g.student) for g in grades]  # a newline in a folder name cannot forge a line
    width = max((len(s) for s in names), default=7)
    for g, name in zip(grades, names):
        short = [f"lab {lab['lab']} {_num(lab['points'])}/{_num(lab['max_points'])}" for lab in g.grade["labs"]
                 if lab["points"] < lab["max_points"]]
        lines.append(f"{name:<{width}}  {_num(g.points):>3}/{_num(g.grade['max_points'])}"
                     + (f"  ({', '.join(short)})" if short else "  (every lab passed)"))
    return "\n".join(lines)


__all__ = ["StudentGrade", "cell", "grade_class", "students", "summary", "table", "to_csv", "LABS"]
