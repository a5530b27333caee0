"""Exercises the notebooks ask, each checked helpfully, each solvable, none answered in advance.

An `Exercise` says what is asked (`prompt`), how the right answer is computed by the package
(`expected`, from the closed forms, a table or a report the notebook just produced), what kind
of answer it is (a number, a choice, a set of choices, a name) and which plausible wrong
answers it anticipates, each with the diagnosis a learner gets (`Wrong`). `check(id, answer)`:

* the placeholder `...` prints "not answered yet" with the prompt and a hint, so a notebook
  with unanswered exercises still runs from top to bottom;
* a wrong answer raises AssertionError that says what is off: an anticipated mistake by name,
  otherwise by how much (for numbers: the ratio to the right answer) with the hint;
* the right answer prints a short confirmation.

Every exercise is one of four styles: ``formula`` (plug into a closed form), ``predict``
(say what a run will show before running it), ``measure`` (read a figure off a run's report),
``find-the-bug`` (run a deliberately broken strategy on real ranks and say what is wrong).
The learner's notebooks hold `...` where the answer goes; the solutions live in
`notebooks/solutions/`, from which the learner's notebooks are generated (`generate`), and are
what CI executes, so every exercise is proven solvable and every check proven to accept the
right answer; `tests/test_exercises.py` proves each rejects the placeholder and its anticipated
wrong answers. One module per notebook (`nb01` ... `nb13`) defines that notebook's exercises.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from numbers import Number
from typing import Any, Callable

from ...fmt import number
from ...reports import Match, Measured, Predicted, RankReport, RunReport, Timeline, WireReport

KINDS = ("number", "choice", "set", "name")
STYLES = ("formula", "predict", "measure", "find-the-bug")


@dataclass(frozen=True)
class Wrong:
    """An anticipated wrong answer (a value, or a function of the context) and its diagnosis."""

    value: Any
    why: str

    def resolve(self, context: dict):
        return self.value(**context) if callable(self.value) else self.value


@dataclass(frozen=True)
class Exercise:
    id: str  # "03.2": notebook 03, its second exercise
    kind: str
    style: str
    prompt: str
    expected: Callable[..., Any]  # the right answer, computed by zeroedu, from the notebook's context
    hint: str = ""
    wrong: tuple[Wrong, ...] = ()
    rel: float = 1e-3  # numbers: relative tolerance
    options: dict[str, str] = field(default_factory=dict)  # choice/set: letter -> text
    example: Callable[[], dict] | None = None  # a context the tests can check the exercise with

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"{self.id}: kind must be one of {KINDS}")
        if self.style not in STYLES:
            raise ValueError(f"{self.id}: style must be one of {STYLES}")

    @property
    def notebook(self) -> str:
        return self.id.split(".")[0]

    # ---------------------------------------------------------------- grading
    def right(self, answer, context: dict) -> bool:
        return _same(self.kind, answer, self.expected(**context), self.rel)

    def diagnose(self, answer, context: dict) -> str:
        """Why `answer` is wrong: an anticipated mistake, else what is off and by how much."""
        for w in self.wrong:
            if _same(self.kind, answer, w.resolve(context), self.rel):
                return w.why
        want = self.expected(**context)
        if self.kind == "number" and _is_number(answer) and float(want) != 0 and float(answer) != 0:
            ratio = float(answer) / float(want)
            return (f"off by a factor {ratio:.3g}" if abs(math.log(abs(ratio))) > 0.05
                    else f"{100 * (ratio - 1):+.2g} % from the right value")
        if self.kind == "number" and not _is_number(answer):
            return f"expected a number, got {type(answer).__name__}"
        if self.kind in ("choice", "set"):
            return f"options are {', '.join(sorted(self.options))}"
        return "not the expected answer"


def example_report(*ranks: dict, **fields) -> RunReport:
    """A report holding only what an exercise reads, for its `example` context (the tests check
    each exercise against it); every other field empty. Each rank is a dict of the `RankReport`
    fields it needs, its blocks as dicts of their fields: ``{"wire": {"sent": 42}}``."""
    def rank(i: int, d: dict) -> RankReport:
        d = dict(d)
        return RankReport(rank=d.pop("rank", i), measured=Measured(**d.pop("measured", {})),
                          predicted=Predicted(**d.pop("predicted", {})), wire=WireReport(**d.pop("wire", {})),
                          timeline=Timeline(**d.pop("timeline", {})), **d)

    run = dict(strategy="", world_size=len(ranks), n=len(ranks), m=1, recipe="", steps=1, model="",
               global_batch=0, micro_batches=1, recompute="none", clip_grad_norm=None, collectives="ring",
               backend="gloo", options={}, timeline_mode="full", psi=0, losses=[], reference_losses=[],
               match=Match(model_states=True, comm=True, wire=None, activations=None, losses=True))
    run.update(fields)
    return RunReport(ranks=[rank(i, d) for i, d in enumerate(ranks)], **run)


REGISTRY: dict[str, Exercise] = {}


def register(*exercises: Exercise) -> None:
    for ex in exercises:
        if ex.id in REGISTRY:
            raise ValueError(f"exercise {ex.id} registered twice")
        REGISTRY[ex.id] = ex


def get(ex_id: str) -> Exercise:
    _load()
    try:
        return REGISTRY[ex_id]
    except KeyError:
        raise ValueError(f"unknown exercise {ex_id!r}") from None


def check(ex_id: str, answer: Any, **context) -> None:
    """Check a learner's answer to exercise `ex_id` (context: what the notebook computed, e.g.
    `report=r`). Prints "not answered yet" for the placeholder and a confirmation when right
    (returns None either way, so a cell shows only the message); raises AssertionError when
    wrong, saying what is off."""
    ex = get(ex_id)
    if answer is Ellipsis:
        print(f"{ex.id}: not answered yet: {ex.prompt}" + (f" Hint: {ex.hint}" if ex.hint else ""))
        return None
    if ex.right(answer, context):
        want = ex.expected(**context)
        # sets print in sorted order: the same text on every run (nbval compares it)
        shown = number(want) if _is_number(want) else (sorted(want) if isinstance(want, (set, frozenset)) else want)
        print(f"{ex.id}: correct ✓ ({shown})")
        return None
    raise AssertionError(f"{ex.id}: {answer!r} is not right: {ex.diagnose(answer, context)}."
                         + (f" Hint: {ex.hint}" if ex.hint else ""))


def show_options(ex_id: str) -> None:
    """Print a choice exercise's options (a cell before the answer cell calls this)."""
    for k, v in sorted(get(ex_id).options.items()):
        print(f"  ({k}) {v}")


# ---------------------------------------------------------------- comparisons
def _is_number(x) -> bool:
    return isinstance(x, (Number, Fraction)) and not isinstance(x, bool)


def _norm(x) -> str:
    return re.sub(r"[\s_\-]+", "", str(x)).lower()


def _same(kind: str, a, b, rel: float) -> bool:
    if kind == "number":
        if not (_is_number(a) and _is_number(b)):
            return False
        a, b = float(a), float(b)
        return math.isclose(a, b, rel_tol=rel, abs_tol=rel if b == 0 else 0.0)
    if kind == "choice":
        return isinstance(a, str) and _norm(a) == _norm(b)
    if kind == "set":
        if isinstance(a, str):
            a = [c for c in re.split(r"[,\s]+", a) if c]
        try:
            return {_norm(c) for c in a} == {_norm(c) for c in b}
        except TypeError:
            return False
    return isinstance(a, str) and _norm(a) == _norm(b)  # name


_LOADED = False


def _load() -> None:
    """Import every notebook's exercise module (they register themselves)."""
    global _LOADED
    if _LOADED:
        return
    import importlib
    import pkgutil

    for mod in pkgutil.iter_modules(__path__):
        if mod.name.startswith("nb"):
            importlib.import_module(f"{__name__}.{mod.name}")
    _LOADED = True


def all_exercises() -> list[Exercise]:
    _load()
    return sorted(REGISTRY.values(), key=lambda e: [int(p) for p in e.id.split(".")])
