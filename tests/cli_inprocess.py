"""`zeroedu ...` called in the test's own process, returning what `subprocess.run` would.

A subprocess pays for importing torch and starting its own forkserver and ranks (seconds each on
2 cores); in-process, a command runs on the session's warm pools. The entry point itself
(`python -m zeroedu`, its exit status, no traceback, a closed pipe) keeps one subprocess test per
command: tests/test_bad_input.py (`run`), tests/test_cli_memory.py (`memory`, and `quiz` into a
closed pipe).
"""
from __future__ import annotations

import contextlib
import io
import subprocess
import sys


def zeroedu(*argv: str, stdin: str = "") -> subprocess.CompletedProcess:
    """Run `zeroedu argv...` with `stdin` as its input; status, stdout and stderr as text."""
    from zeroedu.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_stdin, sys.stdin = sys.stdin, io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(argv))
            except SystemExit as e:  # argparse's errors and `parser.error`: status 2
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.stdin = saved_stdin
    return subprocess.CompletedProcess(["zeroedu", *argv], rc, out.getvalue(), err.getvalue())
