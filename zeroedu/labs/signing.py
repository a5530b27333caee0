"""Grades an aggregation can trust: an HMAC-SHA256 of the grade, keyed by a file only the
instructor's grader reads.

`check --student ID --out FILE --sign KEYFILE` writes the grade with a `"signature"`: the hex
HMAC-SHA256, under the key in KEYFILE, of the grade's canonical JSON (sorted keys, no spaces, the
signature left out). The signed body names the student, the course, the seed and the number of
hidden cases, so a signature proves *whose* grade it is and on which cases, not only that the
grader wrote it: a byte copy of a classmate's grade still verifies as the classmate's.
`verify --key KEYFILE FILE...` recomputes the signature and checks the binding (`binding_error`):
the student against the one the instructor expects (`--student`, a roster, or else the file's
name, `ID.json`), the course, and the seed and hidden-case count when given. A grade edited after
it was written, written by anything that does not hold the key, made for another student or
course, or holding a key twice (JSON readers disagree on which one counts) fails. The key never reaches a submission: the
ranks that run it are confined to its own folder (`zeroedu.runtime.confine`), so keep KEYFILE
outside every submission folder; `check` refuses a key file inside the one it grades.

Make a key once: `python -c "import secrets; print(secrets.token_hex(32))" > ~/private/labs.key`.
"""
from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

MIN_KEY_BYTES = 16
MAX_KEY_BYTES = 4096


def read_key(path: str | Path) -> bytes:
    """The key's bytes (surrounding whitespace dropped); ValueError naming the file when it is
    missing, not a regular file, shorter than 16 bytes or longer than 4 KiB."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--sign/--key {path}: no such file (make one: python -c \"import secrets; "
                         "print(secrets.token_hex(32))\" > FILE)")
    with open(p, "rb") as f:
        key = f.read(MAX_KEY_BYTES + 1).strip()
    if len(key) > MAX_KEY_BYTES:
        raise ValueError(f"--sign/--key {path}: over {MAX_KEY_BYTES} bytes; a key is a short secret")
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"--sign/--key {path}: {len(key)} bytes; a key needs at least {MIN_KEY_BYTES}")
    return key


def _canonical(grade: dict) -> bytes:
    body = {k: v for k, v in grade.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=float).encode()


def _mac(grade: dict, key: bytes) -> str:
    return hmac.new(key, _canonical(grade), hashlib.sha256).hexdigest()


def sign(grade: dict, key: bytes) -> dict:
    """`grade`, as its JSON reads back (so the reader computes over the same values), with its
    signature added."""
    grade = json.loads(json.dumps(grade, ensure_ascii=False, default=float))
    return {**grade, "signature": _mac(grade, key)}


class DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise DuplicateKey(f"the key {k!r} appears twice")
        seen[k] = v
    return seen


def load(text: str) -> dict:
    """A grade file's JSON, refusing duplicate keys (json keeps the last, other readers the first:
    the signature would cover a number the grade book does not read)."""
    g = json.loads(text, object_pairs_hook=_no_duplicates)
    if not isinstance(g, dict):
        raise ValueError("not a JSON object")
    return g


def binding_error(grade: dict, *, student: str, course: str = "", seed: int | None = None,
                  hidden: int | None = None) -> str | None:
    """Why a (verified) grade is not the expected student's on the expected cases, or None."""
    if grade.get("student") is None:
        return "signed for no student (sign with check --student ID)"
    if grade.get("student") != student:
        return f"signed for student {grade.get('student')!r}, not {student!r}"
    if grade.get("course", "") != course:
        return f"signed for course {grade.get('course')!r}, not {course!r}"
    if seed is not None and grade.get("seed") != seed:
        return f"graded with seed {grade.get('seed')!r}, not {seed}"
    if hidden is not None and grade.get("hidden") != hidden:
        return f"graded with {grade.get('hidden')!r} hidden cases per lab, not {hidden}"
    return None


def verified(grade: dict, key: bytes) -> bool:
    """True when `grade` (as read from its file) carries the signature `key` gives its content."""
    sig = grade.get("signature") if isinstance(grade, dict) else None
    return isinstance(sig, str) and hmac.compare_digest(sig, _mac(grade, key))


__all__ = ["DuplicateKey", "binding_error", "load", "read_key", "sign", "verified"]
