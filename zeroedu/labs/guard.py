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

What this does not defend against: a check on the source text is not a sandbox. A determined
submission can still reach a forbidden module through an object it was handed (a tensor's
class, a module attribute of an allowed import) or build an attribute name at run time
(`getattr(x, "f_" + "back")`). Those run in the ranks, whose results the grader checks against
its own oracles; they cannot change the grader's process (labs 1-3, 5, 6 run on the ranks, lab 4
in a process of its own).
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
}
# What a skeleton itself imports from a forbidden package: (module, names allowed)
ALLOWED_FROM = {6: {"zeroedu.strategies.fsdp_units": {"SHARDED", "UNSHARDED", "UNSHARDING"}}}
RUN_TIME_IMPORT = {"importlib", "runpy"}
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
    return None


def refusal(lab: int, source: str) -> str | None:
    """Why the submission's `source` is refused (one sentence naming the line), or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None  # reported as a syntax error by the grader
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
                    why = _forbidden(lab, module)
                    if why is None:  # `from zeroedu import theory` names the module as an attribute
                        why = next((w for n in names if (w := _forbidden(lab, f"{module}.{n}"))), None)
        elif isinstance(node, ast.Attribute):
            if node.attr in FRAME_ATTRS or (node.attr == "stack" and isinstance(node.value, ast.Name)
                                            and node.value.id == "inspect"):
                why = f"reads the interpreter's frames (.{node.attr}): the grader's state is not an input"
            elif node.attr == "path" and isinstance(node.value, ast.Name) and node.value.id == "sys":
                why = "changes the import path (sys.path)"
            elif node.attr == "modules" and isinstance(node.value, ast.Name) and node.value.id == "sys":
                why = "reaches modules through sys.modules"
        elif isinstance(node, ast.Name) and node.id in CALLS | FRAME_ATTRS:
            why = f"uses {node.id}, which runs or imports code by name at run time"
        if why:
            return f"refused: your file {why} (line {node.lineno})"
    return None


__all__ = ["FORBIDDEN_MODULES", "refusal"]
