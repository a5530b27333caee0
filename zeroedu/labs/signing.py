"""Grades an aggregation can trust: an HMAC-SHA256 of the grade, keyed by a file only the
instructor's grader reads.

`check --out FILE --sign KEYFILE` writes the grade with a `"signature"`: the hex HMAC-SHA256,
under the key in KEYFILE, of the grade's canonical JSON (sorted keys, no spaces, the signature
left out). `verify --key KEYFILE FILE...` recomputes it: a grade edited after it was written, or
written by anything that does not hold the key, fails. The key never reaches a submission: the
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


def verified(grade: dict, key: bytes) -> bool:
    """True when `grade` (as read from its file) carries the signature `key` gives its content."""
    sig = grade.get("signature") if isinstance(grade, dict) else None
    return isinstance(sig, str) and hmac.compare_digest(sig, _mac(grade, key))


__all__ = ["read_key", "sign", "verified"]
