"""What the grader reads from a student's folder, and the links it refuses.

A submission is files, so every path the grader reads (a lab file, the `labs/` tree above it, a
`report.md`) must be a plain file or folder inside the student's own folder. A symbolic link
there is how a student would hand in someone else's work as their own: a lab file linked to the
answer key, `labs/student` linked to a classmate's folder, a `report.md` linked to a classmate's
report or to any file the instructor can read. Followed, the link's target is graded (and the
ranks are confined to the target's folder, so the target's code runs freely); so each component
of the path from the student's folder down is checked with `lstat` (never followed), the resolved
path must still lie inside the folder, and files are opened with `O_NOFOLLOW`, so a link swapped
in after the check is not followed either.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path


def link_refusal(root: str | Path, path: str | Path, *, root_too: bool = False) -> str | None:
    """Why `path` (root / some parts) may not be read as the student's: one line naming the
    link, or the resolved location outside `root`; None when it may. `root_too`: `root` itself
    must not be a link either (a class folder's student entry)."""
    root, path = Path(root), Path(path)
    try:
        rel = path.relative_to(root)
    except ValueError:
        return f"refused: {path} is not inside {root}"
    cur = root
    for part in ([] if not root_too else [None]) + list(rel.parts):
        cur = cur if part is None else cur / part
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            return None  # nothing there: the caller reports it missing
        except OSError as e:
            return f"refused: cannot read {cur} ({e.strerror})"
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(cur)
            except OSError:
                target = "?"
            return (f"refused: {cur} is a link (to {target}); hand in your own files, not links: the grader "
                    "never follows one")
    real_root, real = os.path.realpath(root), os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root:
        return f"refused: {path} resolves to {real}, outside {root}"
    return None


def read_text(path: str | Path, limit: int) -> tuple[str, bool]:
    """The first `limit` bytes of the regular file at `path` as text (undecodable bytes
    replaced), and whether there was more; opened without following a link (OSError if it is
    one, or not a regular file)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(limit + 1)
    finally:
        os.close(fd)
    return raw[:limit].decode("utf-8", errors="replace"), len(raw) > limit


__all__ = ["link_refusal", "read_text"]
