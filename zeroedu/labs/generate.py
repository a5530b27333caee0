"""One source per lab, two generated artefacts: the student's skeleton and the instructor's key.

The single sources live in the repository at ``labs/source/labN_*.py``, *outside* the `zeroedu`
package, so they are never installed with it (``pyproject.toml`` packages ``zeroedu*`` only) and
nothing the learner imports can print them. A source is ordinary, runnable Python whose solution
regions are marked::

    # BEGIN SOLUTION write the ring: world - 1 steps, ...
    ...the solution...
    # END SOLUTION

The **student** version replaces each region with one line at the same indentation,
``raise NotImplementedError("write the ring: ...")``, so the skeleton imports and the grader can
say "not implemented yet: write the ring ...". The **key** keeps the code and drops the two marker
lines. Both get a header naming the source and the command that made them.

    python -m zeroedu.labs build                    # labs/student/ (committed, handed out)
    python -m zeroedu.labs build --student DIR      # the student tree somewhere else
    python -m zeroedu.labs build --key DIR          # the answer key, only into DIR

The key is written only where asked, never into the package nor into the student tree. The
grader does not read it: it grades against independent oracles (`zeroedu.labs.checks`).
`stale()` lists student files that differ from what the sources produce now (a test keeps the
committed tree up to date).
"""
from __future__ import annotations

import re
from pathlib import Path

BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION\s*(?P<hint>.*)$")
END = re.compile(r"^\s*# END SOLUTION\s*$")
VERSIONS = ("student", "key")
PACKAGE = Path(__file__).resolve().parents[1]  # the zeroedu package: keys never go in here


def repo_labs() -> Path:
    """The repository's top-level labs/ folder (next to the zeroedu package in a checkout)."""
    return PACKAGE.parent / "labs"


def default_source() -> Path:
    return repo_labs() / "source"


def source_files(source: str | Path | None = None) -> list[Path]:
    src = Path(source) if source is not None else default_source()
    files = sorted(src.glob("lab[0-9]*.py")) if src.is_dir() else []
    if not files:
        raise ValueError(f"no lab sources (lab[0-9]*.py) in {src}: the sources are not installed with the "
                         "package; run from a checkout of the repository, or pass --source DIR")
    return files


def header(src: Path, version: str) -> str:
    if version == "student":
        return (f"# GENERATED from labs/source/{src.name} (student skeleton: replace each NotImplementedError).\n"
                "# Regenerate with `python -m zeroedu.labs build`; check with the command in the docstring.\n")
    return (f"# ANSWER KEY generated from labs/source/{src.name}: for instructors, do not hand out.\n"
            "# Regenerate with `python -m zeroedu.labs build --key DIR`.\n")


def strip(text: str, version: str, name: str = "<lab>") -> str:
    """The student or key text of one lab source."""
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
        if not inside or version == "key":
            out.append(line)
    if inside:
        raise ValueError(f"{name}: BEGIN SOLUTION is never closed")
    if regions == 0:
        raise ValueError(f"{name}: no solution region")
    return "".join(out)


def solution_regions(text: str) -> list[str]:
    """The code inside each solution region (what must never ship)."""
    out, cur = [], None
    for line in text.splitlines(keepends=True):
        if BEGIN.match(line.rstrip("\n")):
            cur = []
        elif END.match(line.rstrip("\n")):
            out.append("".join(cur))
            cur = None
        elif cur is not None:
            cur.append(line)
    return out


def render(src: Path, version: str) -> str:
    return header(src, version) + strip(src.read_text(), version, src.name)


def _inside(path: Path, folder: Path) -> bool:
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def _write(version: str, out: Path, source) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for src in source_files(source):
        dst = out / src.name
        dst.write_text(render(src, version))
        written.append(dst)
    return written


def build_student(out: str | Path | None = None, source: str | Path | None = None) -> list[Path]:
    """Write every lab's student skeleton into `out` (default: the repository's labs/student)."""
    out = Path(out) if out is not None else repo_labs() / "student"
    if _inside(out, PACKAGE):
        raise ValueError(f"{out} is inside the zeroedu package; write the student tree elsewhere")
    return _write("student", out, source)


def build_key(out: str | Path, source: str | Path | None = None) -> list[Path]:
    """Write every lab's answer key into `out`, which must be outside the package, the sources and
    the student tree (so the key is always a separate artefact)."""
    check_key_dir(out, source)
    return _write("key", Path(out), source)


def publish(out: str | Path, source: str | Path | None = None) -> list[Path]:
    """What to hand a class, in `out`: `labs/student/` (the skeletons) and `labs/README.md`, and
    nothing of `labs/source/` or the key. `out` must be outside the package, the repository's
    labs folder and the sources, and hold no lab files yet."""
    out = Path(out)
    src = Path(source) if source is not None else default_source()
    for folder, what in ((PACKAGE, "the zeroedu package"), (repo_labs(), "the repository's labs folder"),
                         (src, "the lab sources")):
        if _inside(out, folder):
            raise ValueError(f"refusing to publish into {out}: it is inside {what} ({folder})")
    if (out / "labs").exists():
        raise ValueError(f"{out / 'labs'} exists: publish into a fresh folder")
    written = build_student(out / "labs" / "student", source)
    readme = out / "labs" / "README.md"
    readme.write_text((repo_labs() / "README.md").read_text())
    from .rubric import template  # the benchmarking report's blank page, beside the skeletons

    blank = out / "labs" / "student" / "report.md"
    blank.write_text(template(), encoding="utf-8")
    return written + [readme, blank]


def check_key_dir(out: str | Path, source: str | Path | None = None) -> None:
    """ValueError unless `out` is a place for the key: outside the package, the student tree and
    the sources."""
    if out is None or not str(out).strip():
        raise ValueError("say where the key goes: build --key DIR (an empty path would put the key in the "
                         "current folder)")
    out = Path(out)
    src = Path(source) if source is not None else default_source()
    # Any student tree, not only the repository's: a copy handed out, or a folder that holds one.
    # A lab file there that is not this key's own (an earlier `build --key` into the same folder)
    # is a skeleton or a student's work, which the key must never overwrite.
    keys = {f.name: f for f in source_files(source)}
    if out.is_dir():
        for folder in (out, *(d for d in out.iterdir() if d.is_dir())):
            for name in sorted(keys.keys() & {f.name for f in folder.iterdir()}):
                if (folder / name).read_text(errors="replace") != render(keys[name], "key"):
                    raise ValueError(f"refusing to write the answer key into {out}: {folder} holds a student "
                                     f"tree ({name}); the key goes into a folder of its own")
    for folder, what in ((PACKAGE, "the zeroedu package"), (repo_labs() / "student", "the student tree"),
                         (src, "the lab sources")):
        if _inside(out, folder):
            raise ValueError(f"refusing to write the answer key into {out}: it is inside {what} ({folder})")


def stale(out: str | Path | None = None, source: str | Path | None = None) -> list[str]:
    """Student files missing or differing from the sources (empty when up to date)."""
    out = Path(out) if out is not None else repo_labs() / "student"
    bad = []
    for src in source_files(source):
        dst = out / src.name
        if not dst.exists() or dst.read_text() != render(src, "student"):
            bad.append(str(dst))
    return bad


__all__ = ["VERSIONS", "build_key", "build_student", "check_key_dir", "default_source", "render", "repo_labs", "solution_regions",
           "source_files", "stale", "strip"]
