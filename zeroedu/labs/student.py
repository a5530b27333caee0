"""Running the student's code: load a file afresh, turn its exceptions into data, run cases on ranks.

Rank jobs never let a student's exception escape as a traceback: it becomes a dict
(``{"error": "not_implemented" | "raised" | "violation", "message": ..., "where": ...}``) naming
the line of the student's file that raised. Cases run one after another inside one rank job
(a warm pool runs them in a fraction of a second each); after every case the ranks agree whether
any of them failed, and stop together, so a failure on one rank never leaves the others waiting
in a collective of the next case.
"""
from __future__ import annotations

import importlib.util
import itertools
import traceback
from pathlib import Path

_load_counter = itertools.count()


class LabViolation(Exception):
    """Raised by a lab's scaffold when the student's code broke the algorithm's contract in a way
    that makes the rest of the run meaningless (e.g. forward would read parameters that were never
    gathered). `test` names the criterion it is charged to."""

    def __init__(self, test: str, message: str, **where):
        super().__init__(message)
        self.test, self.where = test, where


def load(path: str):
    """Import the student's file under a fresh module name: a warm rank sees the latest edit."""
    spec = importlib.util.spec_from_file_location(f"zeroedu_lab_{next(_load_counter)}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def student_line(tb, path: str) -> str:
    """' (your file, line 31: `chunks[i] += x`)' for the deepest frame in the student's file."""
    frames = [f for f in traceback.extract_tb(tb) if Path(f.filename).resolve() == Path(path).resolve()]
    if not frames:
        return ""
    f = frames[-1]
    return f" (your file, line {f.lineno}: `{(f.line or '').strip()}`)"


def error(e: BaseException, path: str) -> dict:
    if isinstance(e, LabViolation):
        return {"error": "violation", "test": e.test, "message": str(e), "where": e.where}
    if isinstance(e, NotImplementedError):
        return {"error": "not_implemented", "message": str(e) or "the missing code"}
    return {"error": "raised", "message": f"{type(e).__name__}: {e}", "where": student_line(e.__traceback__, path)}


def missing_functions(mod, names) -> list[str]:
    return [f for f in names if not callable(getattr(mod, f, None))]


def run_cases(ctx, path: str, cases: list[dict], run_one, functions=()) -> list[dict]:
    """On one rank: load the file once, then `run_one(mod, ctx, case)` for each case; a case that
    raised (on any rank) ends the job for every rank, the later cases come back as skipped."""
    import torch
    import torch.distributed as dist

    try:
        mod = load(path)
        gone = missing_functions(mod, functions)
        if gone:
            raise AttributeError(f"your file defines no function {', '.join(gone)}")
    except BaseException as e:  # noqa: BLE001 - reported to the student, never re-raised
        return [error(e, path)] * len(cases)
    out = []
    for case in cases:
        try:
            res = run_one(mod, ctx, case)
        except BaseException as e:  # noqa: BLE001
            res = error(e, path)
        out.append(res)
        # Harness plumbing, not training traffic: not recorded in any ledger.
        flag = torch.tensor([1.0 if "error" in res else 0.0])
        if dist.is_initialized() and ctx.world_size > 1:
            dist.all_reduce(flag)
        if flag.item() > 0:
            out += [{"error": "skipped"}] * (len(cases) - len(out))
            break
    return out


__all__ = ["LabViolation", "error", "load", "missing_functions", "run_cases", "student_line"]
