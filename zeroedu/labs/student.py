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


# The grader's side inside a rank: the scaffolds the student's functions are plugged into, the
# strategies they extend, and the measuring core whose records the grade reads.
_GUARDED_MODULES = ("zeroedu.labs.scaffolds", "zeroedu.labs.student", "zeroedu.strategies.base",
                    "zeroedu.strategies.zero2", "zeroedu.strategies.fsdp1", "zeroedu.strategies.fsdp_units",
                    "zeroedu.strategies.fsdp2", "zeroedu.strategies.ddp_bucketed",
                    "zeroedu.runtime.comm", "zeroedu.runtime.ledger", "zeroedu.runtime.ring", "zeroedu.shard")


def _code(v) -> bool:  # what a patch would replace: functions, classes, methods, properties
    return callable(v) or isinstance(v, (staticmethod, classmethod, property))


def grader_fingerprint() -> dict[str, int]:
    """Every function and class of the grader's modules in this process, and each class's own
    methods, by identity, so a submission that replaced one (patched a scaffold's method, a
    ledger's record) is found before its results are read. Plain data (a module's cache, a
    lazily created stream) is left out: it changes by design."""
    import sys as _sys

    out = {}
    for name in _GUARDED_MODULES:
        mod = _sys.modules.get(name)
        if mod is None:
            continue
        for attr, v in list(vars(mod).items()):
            if not _code(v):
                continue
            out[f"{name}:{attr}"] = id(v)
            if isinstance(v, type) and v.__module__ == name:
                for a, w in list(vars(v).items()):
                    if _code(w):
                        out[f"{name}:{attr}.{a}"] = id(w)
    return out


def changed(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """What was replaced or removed, and methods added to a class that existed before."""
    out = [k for k in before if after.get(k) != before[k]]
    out += [k for k in after if k not in before and "." in k.split(":")[1] and k.rsplit(".", 1)[0] in before]
    return sorted(out)


def missing_functions(mod, names) -> list[str]:
    return [f for f in names if not callable(getattr(mod, f, None))]


def run_cases(ctx, path: str, cases: list[dict], run_one, functions=()) -> list[dict]:
    """On one rank: load the file once, then `run_one(mod, ctx, case)` for each case; a case that
    raised (on any rank) ends the job for every rank, the later cases come back as skipped."""
    import torch
    import torch.distributed as dist

    before = grader_fingerprint()
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
        touched = changed(before, grader_fingerprint())
        if touched:  # results of a patched grader are not read
            res = {"error": "raised", "message": "your code replaced part of the grader ("
                   + ", ".join(touched[:3]) + "): its results are not graded", "where": ""}
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
