"""The ``zeroedu`` command line: one subcommand per module, registered in `SUBCOMMANDS`.

A subcommand module defines ``add_parser(subparsers)``, which adds its parser and sets
``func=callable(args) -> int``. To add a subcommand, write ``zeroedu/cli/<name>.py`` and append
its name below; nothing else changes. A subcommand signals bad input by raising `ValueError`,
which becomes argparse's usual ``zeroedu: error: ...`` line and exit status 2.

Output piped into a reader that stops early (``zeroedu quiz --list | head``) ends quietly with
status 0: Python ignores SIGPIPE, so the write raises `BrokenPipeError`; `main` catches it and,
as the Python docs recommend (library/signal.html, "Note on SIGPIPE"), points stdout at devnull
so the interpreter's final flush cannot raise again.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from ..runtime.cluster import RankError, RunStopped

SUBCOMMANDS = ["memory", "run", "tour", "pipeline", "context", "experts", "plan", "quiz"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zeroedu",
        description="Data-parallel training memory and bandwidth, predicted and measured.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in SUBCOMMANDS:
        importlib.import_module(f"{__name__}.{name}").add_parser(subparsers)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = int(args.func(args) or 0)
        sys.stdout.flush()  # a broken pipe surfaces here, inside the try, not at exit
        return rc
    except BrokenPipeError:
        # The reader has gone (`| head`): nothing more can be shown, so it is not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except ValueError as e:
        parser.error(str(e))  # prints "zeroedu: error: ..." and exits with status 2
    except RunStopped as e:
        # The run ended itself (a non-finite loss): one line that names rank and step, status 1.
        print(f"zeroedu: error: rank {e.rank} stopped the run: {e.reason}", file=sys.stderr)
        return 1
    except RankError as e:
        # A rank failed: one line naming it, the cause and where its log is (the whole
        # traceback is in that log and in `RankError.detail` for the API), status 1.
        print(f"zeroedu: error: {e.summary()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Ctrl-C: the pool has killed its ranks already (`Pool.run`); one line, and the shell's
        # status for a command ended by SIGINT, 128 + 2.
        print("\nzeroedu: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
