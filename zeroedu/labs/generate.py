"""One source per lab, two generated versions: the student's skeleton and the instructor's key.

A lab source (`zeroedu/labs/sources/labN_*.py`) is ordinary, runnable Python whose solution
regions are marked::

    # BEGIN SOLUTION write the ring: world - 1 steps, ...
    ...the reference code...
    # END SOLUTION

The **student** version replaces each region with one line at the same indentation,
``raise NotImplementedError("write the ring: ...")``, so the skeleton imports and `check()` can
say "not implemented yet: write the ring ...". The **instructor** version keeps the code and
drops the two marker lines. Both get a header naming the source and the regeneration command.

``python -m zeroedu.labs build`` writes ``labs/student/`` and ``labs/instructor/``;
`stale()` lists generated files that differ from what the sources produce now (a test keeps the
committed copies up to date).
"""
from __future__ import annotations

import re
from pathlib import Path

SOURCES = Path(__file__).parent / "sources"
BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION\s*(?P<hint>.*)$")
END = re.compile(r"^\s*# END SOLUTION\s*$")
VERSIONS = ("student", "instructor")


def default_out() -> Path:
    """The repository's top-level labs/ folder (next to the zeroedu package)."""
    return Path(__file__).resolve().parents[2] / "labs"


def source_files() -> list[Path]:
    return sorted(SOURCES.glob("lab[0-9]*.py"))


def header(src: Path, version: str) -> str:
    what = "student skeleton: replace each NotImplementedError" if version == "student" else \
        "instructor key, with solutions"
    return (f"# GENERATED from zeroedu/labs/sources/{src.name} ({what}).\n"
            f"# Regenerate with `python -m zeroedu.labs build`; edit the source, not this copy.\n")


def strip(text: str, version: str, name: str = "<lab>") -> str:
    """The student or instructor text of one lab source."""
    if version not in VERSIONS:
        raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
    out, inside, regions = [], False, 0
    for lineno, line in enumerate(text.splitlines(keepends=True), 1):
        b = BEGIN.match(line.rstrip("\n"))
        if b:
            if inside:
                raise ValueError(f"{name}:{lineno}: BEGIN SOLUTION inside another solution region")
            inside, regions = True, regions + 1
            if version == "student":
                hint = b.group("hint").strip() or "the missing code"
                out.append(f'{b.group("indent")}raise NotImplementedError({hint!r})\n')
            continue
        if END.match(line.rstrip("\n")):
            if not inside:
                raise ValueError(f"{name}:{lineno}: END SOLUTION without BEGIN SOLUTION")
            inside = False
            continue
        if not inside or version == "instructor":
            out.append(line)
    if inside:
        raise ValueError(f"{name}: BEGIN SOLUTION is never closed")
    if regions == 0:
        raise ValueError(f"{name}: no solution region")
    return "".join(out)


def render(src: Path, version: str) -> str:
    return header(src, version) + strip(src.read_text(), version, src.name)


def build(out: Path | None = None) -> list[Path]:
    """Write every lab's student and instructor version under `out`; return the paths written."""
    out = Path(out) if out is not None else default_out()
    written = []
    for version in VERSIONS:
        (out / version).mkdir(parents=True, exist_ok=True)
        for src in source_files():
            dst = out / version / src.name
            dst.write_text(render(src, version))
            written.append(dst)
    return written


def stale(out: Path | None = None) -> list[str]:
    """Generated files missing or differing from the sources (empty when up to date)."""
    out = Path(out) if out is not None else default_out()
    bad = []
    for version in VERSIONS:
        for src in source_files():
            dst = out / version / src.name
            if not dst.exists() or dst.read_text() != render(src, version):
                bad.append(str(dst))
    return bad


__all__ = ["build", "stale", "strip", "render", "source_files", "default_out", "VERSIONS"]
