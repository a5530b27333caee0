"""The working tree before and after a test run: a test must never write a file git would see.

    python tests/tree_state.py save SNAPSHOT     record every tracked and untracked, not ignored, file
    python tests/tree_state.py check SNAPSHOT    exit 1, naming each file, if any was changed,
                                                 created or removed since `save`

The tree is compared with itself as it was when the run started (not with the last commit), so a
developer's uncommitted edits are fine; only what the run did is reported. Ignored paths
(.venv, caches, test-artifacts/) are outside the check: they are the run's to write.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def files(root: Path = ROOT) -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=root, check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"tree check: {root} is not a git checkout ({e}); the check needs git") from e
    return sorted(set(out.decode().split("\0")) - {""})


def digest(rel: str, root: Path = ROOT) -> str:
    p = root / rel
    if p.is_symlink():
        return "link:" + str(p.readlink())
    if not p.is_file():
        return "missing"
    return hashlib.sha256(p.read_bytes()).hexdigest()


def snapshot(root: Path = ROOT) -> dict[str, str]:
    return {rel: digest(rel, root) for rel in files(root)}


def diff(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """One line per file that differs: 'changed', 'created' or 'removed', then the path."""
    lines = []
    for rel in sorted(set(before) | set(after)):
        a, b = before.get(rel, "missing"), after.get(rel, "missing")
        if a == b:
            continue
        kind = "created" if a == "missing" else "removed" if b == "missing" else "changed"
        lines.append(f"{kind} {rel}")
    return lines


def main(argv: list[str], root: Path = ROOT) -> int:
    if len(argv) != 2 or argv[0] not in ("save", "check"):
        print("\n".join(__doc__.strip().splitlines()[2:4]), file=sys.stderr)
        return 2
    verb, path = argv
    if verb == "save":
        Path(path).write_text(json.dumps(snapshot(root)))
        return 0
    lines = diff(json.loads(Path(path).read_text()), snapshot(root))
    if lines:
        print("the test run changed the working tree (a test must never write a file git sees):",
              file=sys.stderr)
        for line in lines:
            print("  " + line, file=sys.stderr)
        return 1
    print("working tree: unchanged by the test run")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
