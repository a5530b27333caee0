"""What a lab submission may not use, checked on its source before any of it runs.

A submission that imports what the lab asks the student to write, or reads the grader's own
frames, is refused with the reason and scores 0 (`refusal`). Per lab, the package's own
implementation of the exercise:

    lab 1   the ring (`zeroedu.runtime.ring`, `zeroedu.runtime.comm`)
    lab 2   `zeroedu.strategies` (ZeRO-2 is there)
    lab 3   `zeroedu.strategies` (the FSDP linear layer is there)
    lab 4   `zeroedu.theory` (the closed forms the grader compares with)
    lab 5   `zeroedu.strategies` (ZeRO-2's hooks)
    lab 6   `zeroedu.strategies`, except the three state names the skeleton imports from
            `zeroedu.strategies.fsdp_units`

and for every lab: the grader and its scaffolds (`zeroedu.labs`), the answer key (a module
named like a lab file, `lab3_fsdp_linear`, or anything under `labs/source`), changing the
import path (`sys.path`), importing by name at run time (`__import__`, `importlib`, `runpy`,
`exec`, `eval`, `compile`), and reading the caller's frames (`sys._getframe`,
`inspect.currentframe`, `inspect.stack`, `f_back`, `f_locals`, `f_globals`, `gc.get_referrers`).

Outside the package, a lab may import torch (not its distributed, private or code-loading parts),
numpy and the standard library's computing modules (`ALLOWED_MODULES`): not `sys`, `os`, `gc`,
`ctypes`, `inspect`, `operator`, `threading`, which reach the process and the objects in it.
Of the package, a lab may import only what its skeleton does (`ALLOWED_ZEROEDU`): a module that
re-exports the closed forms or a strategy (`zeroedu.quiz.figures`, the front door `zeroedu`) is
refused like the module itself. Also refused in every lab: `torch.distributed` (a lab's traffic
goes through the primitives it is handed, which the grader counts; raw collectives would move
bytes the grade never sees), and reaching past the objects a lab hands over to the classes and
state behind them: dunder attributes (`__mro__`, `__class__`, `__dict__`, `__globals__`), private
ones (`._prefetch`), the builtins that do the same by name or by class (`type`, `super`,
`getattr`, `setattr`, `delattr`, `vars`, `dir`, `globals`, `locals`), and the grader's own
state on those objects (`ledger`, `violations`, `launched`, ...).

What this does not defend against: a check on the source text is not a sandbox. A submission
can still build a name at run time through an object it is handed. Those run in the ranks,
which are confined (`zeroedu.runtime.confine`) and whose results the grader checks against its
own oracles; bytes on the wire are read from the rank's sockets, not from the submission.
"""
from __future__ import annotations

import ast
import re

_EVERY_LAB = ("zeroedu.labs",)
FORBIDDEN_MODULES = {
    1: _EVERY_LAB + ("zeroedu.runtime.ring", "zeroedu.runtime.comm"),
    2: _EVERY_LAB + ("zeroedu.strategies",),
    3: _EVERY_LAB + ("zeroedu.strategies",),
    4: _EVERY_LAB + ("zeroedu.theory",),
    5: _EVERY_LAB + ("zeroedu.strategies",),
    6: _EVERY_LAB + ("zeroedu.strategies",),
    7: _EVERY_LAB + ("zeroedu.strategies",),
    8: _EVERY_LAB + ("zeroedu.strategies",),
}
# What a skeleton itself imports from a forbidden package: (module, names allowed)
ALLOWED_FROM = {lab: {"zeroedu.strategies.fsdp_units": {"SHARDED", "UNSHARDED", "UNSHARDING"}} for lab in (6, 8)}
# Of the package, what each lab's skeleton imports (module -> names; None: the module itself).
ALLOWED_ZEROEDU = {1: set(), 2: {"zeroedu.shard"}, 3: {"zeroedu.shard"}, 4: {"zeroedu.recipes"}, 5: set(),
                   6: {"zeroedu.strategies.fsdp_units"}, 7: set(), 8: {"zeroedu.strategies.fsdp_units"}}
RUN_TIME_IMPORT = {"importlib", "runpy"}
# Outside zeroedu, what a lab may import (top-level names): computing, not reaching the process
# (sys, os, gc, ctypes, inspect, operator's attrgetter, threading, subprocess are not here).
ALLOWED_MODULES = {"torch", "numpy", "__future__", "math", "cmath", "numbers", "fractions", "decimal",
                   "statistics", "random", "itertools", "functools", "collections", "dataclasses", "typing",
                   "enum", "abc", "copy", "heapq", "bisect", "string", "re", "textwrap", "time", "warnings"}
# Of torch, what runs or fetches code, or starts processes.
TORCH_REFUSED = ("torch.utils.cpp_extension", "torch.hub", "torch.package", "torch.multiprocessing",
                 "torch.testing")
BY_NAME = {"type", "super", "getattr", "setattr", "delattr", "vars", "dir", "globals", "locals"}
# The grader's bookkeeping on the objects a lab hands over (scaffolds, comm, handles).
GRADER_STATE = {"ledger", "violations", "launched", "seen_done", "handle", "grad_snapshot", "student",
                "sink", "timeline", "events", "marks"}
CALLS = {"__import__", "exec", "eval", "compile"}
FRAME_ATTRS = {"_getframe", "currentframe", "f_back", "f_locals", "f_globals", "get_referrers",
               "getouterframes", "getframeinfo", "getinnerframes", "tb_frame"}
KEY_MODULE = re.compile(r"^lab\d+_\w+$")  # a lab file's stem: the answer key's module name


def _forbidden(lab: int, module: str) -> str | None:
    if module in RUN_TIME_IMPORT or module.split(".")[0] in RUN_TIME_IMPORT:
        return f"imports {module} (modules are imported by name at run time with it)"
    if KEY_MODULE.match(module.split(".")[-1]) or "labs.source" in module:
        return f"imports {module}, a lab's answer key"
    for bad in FORBIDDEN_MODULES.get(lab, _EVERY_LAB):
        if module == bad or module.startswith(bad + "."):
            what = "the grader" if bad == "zeroedu.labs" else f"zeroedu's own implementation ({bad})"
            return f"imports {module}: {what}, which this lab asks you to write yourself"
    parts = module.split(".")
    if any(p.startswith("_") for p in parts) and module != "__future__":
        return f"imports {module}, a private module: the lab's objects offer what you need publicly"
    if any("distributed" in p or "c10d" in p for p in parts):
        return (f"imports {module}: send and reduce through what the lab hands you (the grader counts "
                "those bytes), not raw torch.distributed")
    if module == "zeroedu" or module.startswith("zeroedu."):
        allowed = sorted(ALLOWED_ZEROEDU.get(lab, ()))
        if module not in allowed:
            return (f"imports {module}: of zeroedu, lab {lab} may import only "
                    f"{', '.join(allowed) if allowed else 'nothing'} (other modules re-export what it asks you to write)")
        return None
    if parts[0] not in ALLOWED_MODULES or any(module == m or module.startswith(m + ".") for m in TORCH_REFUSED):
        return (f"imports {module}: besides zeroedu a lab may import torch, numpy and the standard library's "
                "computing modules (math, itertools, collections, ...: zeroedu.labs.guard.ALLOWED_MODULES), "
                "nothing that reaches the process or the objects in it")
    return None


def refusal(lab: int, source: str) -> str | None:
    """Why the submission's `source` is refused (each reason naming its line, up to three), or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None  # reported as a syntax error by the grader
    found: dict[str, int] = {}  # reason -> first line, in the order of the lines
    for node in ast.walk(tree):
        why = None
        if isinstance(node, ast.Import):
            why = next((w for a in node.names if (w := _forbidden(lab, a.name))), None)
        elif isinstance(node, ast.ImportFrom):
            module = ("." * node.level) + (node.module or "")
            if node.level:
                why = f"imports {module or '.'} relative to the grader's package"
            else:
                allowed = ALLOWED_FROM.get(lab, {}).get(module)
                names = {a.name for a in node.names}
                if allowed is None or not names <= allowed:
                    if module in ("zeroedu", "torch"):
                        # `from zeroedu import theory` names the module as an attribute
                        why = next((w for n in names if (w := _forbidden(lab, f"{module}.{n}"))), None)
                    else:
                        why = _forbidden(lab, module)
        elif isinstance(node, ast.Attribute):
            if node.attr in FRAME_ATTRS or (node.attr == "stack" and isinstance(node.value, ast.Name)
                                            and node.value.id == "inspect"):
                why = f"reads the interpreter's frames (.{node.attr}): the grader's state is not an input"
            elif node.attr == "path" and isinstance(node.value, ast.Name) and node.value.id == "sys":
                why = "changes the import path (sys.path)"
            elif node.attr == "modules" and isinstance(node.value, ast.Name) and node.value.id == "sys":
                why = "reaches modules through sys.modules"
            elif "distributed" in node.attr or "c10d" in node.attr:
                why = (f"uses .{node.attr}: send and reduce through what the lab hands you (the grader "
                       "counts those bytes), not raw collectives")
            elif node.attr.startswith("__") and node.attr.endswith("__"):
                why = f"reaches behind an object to its class or internals (.{node.attr})"
            elif node.attr.startswith("_"):
                why = f"uses a private attribute (.{node.attr}): the lab's objects offer what you need publicly"
            elif node.attr in GRADER_STATE:
                why = f"touches the grader's own bookkeeping (.{node.attr})"
        elif isinstance(node, ast.Name) and node.id in CALLS | FRAME_ATTRS:
            why = f"uses {node.id}, which runs or imports code by name at run time"
        elif isinstance(node, ast.Name) and node.id in BY_NAME:
            why = f"uses {node.id}, which reaches attributes or classes by name, behind the objects you are handed"
        elif isinstance(node, ast.Name) and node.id.startswith("__") and node.id not in ("__name__", "__doc__"):
            why = f"uses {node.id}, the interpreter's internals"
        if why and why not in found:
            found[why] = node.lineno
    if not found:
        return None
    # Every reason at once (the first three by line), so a student fixes them in one go.
    reasons = sorted(found.items(), key=lambda kv: kv[1])[:3]
    return "refused: your file " + "; ".join(f"{w} (line {ln})" for w, ln in reasons)


__all__ = ["ALLOWED_MODULES", "ALLOWED_ZEROEDU", "FORBIDDEN_MODULES", "refusal"]
