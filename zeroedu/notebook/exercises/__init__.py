"""Exercises the notebooks ask, each checked helpfully, each solvable, none answered in advance.

An `Exercise` says what is asked (`prompt`), how the right answer is computed by the package
(`expected`, from the closed forms, a table or a report the notebook just produced), what kind
of answer it is (a number, a choice, a set of choices, a name, or a design: a plan with many
right forms, judged condition by condition) and which plausible wrong answers it anticipates, each with the diagnosis a learner gets (`Wrong`). `check(id, answer)`:

* the placeholder `...` prints "not answered yet" with the prompt (no hint: the hint is shown
  after a wrong attempt), so a notebook with unanswered exercises still runs from top to bottom;
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
wrong answers. One module per notebook (`nb01` ... `nb14`) defines that notebook's exercises.
"""
from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from ...answers import LETTERS, is_number, learner_seed, normalize_term, read_choice, read_number
from ...fmt import number
from ...reports import CommRecord, Match, Measured, Predicted, RankReport, RunReport, Timeline, WireReport, made_here

KINDS = ("number", "choice", "set", "name", "design")
STYLES = ("formula", "predict", "measure", "find-the-bug")


@dataclass(frozen=True)
class Wrong:
    """An anticipated wrong answer (a value, or a function of the context) and its diagnosis;
    `mistake`: the named closed form of the misconception that computes it (`theory.mistakes`)."""

    value: Any
    why: str
    mistake: str = ""

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
    # design: an answer with many right forms (a plan), judged by `grade` (answer -> (right, why));
    # `canon` reads an answer into the form anticipated wrong answers are compared in
    grade: Callable[[Any], tuple[bool, str]] | None = None
    canon: Callable[[Any], Any] | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"{self.id}: kind must be one of {KINDS}")
        if self.style not in STYLES:
            raise ValueError(f"{self.id}: style must be one of {STYLES}")
        if (self.kind == "design") != (self.grade is not None and self.canon is not None):
            raise ValueError(f"{self.id}: a design exercise, and only one, is judged by grade and canon")

    @property
    def notebook(self) -> str:
        return self.id.split(".")[0]

    # ---------------------------------------------------------------- grading
    def right(self, answer, context: dict) -> bool:
        if self.kind == "design":
            return self.grade(answer)[0]
        return _same(self.kind, answer, self.expected(**context), self.rel, self.options)

    def diagnose(self, answer, context: dict) -> str:
        """Why `answer` is wrong: an anticipated mistake, else what is off and by how much."""
        if self.kind == "design":
            got = self.canon(answer)
            known = next((w.why for w in self.wrong if got is not None and got == self.canon(w.resolve(context))), None)
            return f"{known} ({self.grade(answer)[1]})" if known else self.grade(answer)[1]
        for w in self.wrong:
            if _same(self.kind, answer, w.resolve(context), self.rel, self.options):
                return w.why
        want = self.expected(**context)
        got = read_number(answer) if self.kind == "number" else None  # "36.75 GB", "3/2" read as numbers
        if got is not None and float(want) != 0 and got != 0:
            ratio = got / float(want)
            return (f"off by a factor {ratio:.3g}" if abs(math.log(abs(ratio))) > 0.05
                    else f"{100 * (ratio - 1):+.2g} % from the right value")
        if self.kind == "number" and got is None:
            return f"expected a number (a figure, with its unit if you like), got {answer!r}"
        if self.kind in ("choice", "set"):
            return f"options are {', '.join(sorted(self.options))}"
        return "not the expected answer"


def mistaken(m, why: str | None = None, *, of: Callable[..., Any] | None = None,
             given: Callable[..., tuple] | None = None) -> Wrong:
    """The wrong answer a known misconception computes (`theory.mistakes`), diagnosed by its own
    message or by `why`.

    `m` is a `Mistake`; or, where the wrong figure depends on the notebook's run (a measure
    exercise) or is solved for (the smallest N under a mistaken form), the mistake *function* and
    `of`, a function of the exercise's context that computes the figure through it, with `why`:
    ``mistaken(mistakes.sign_flipped, "...", of=lambda report: mistakes.sign_flipped(d(report)).value)``;
    `given` (the context -> the function's arguments) is short for an `of` that calls it on them:
    ``mistaken(mistakes.sign_flipped, "...", given=lambda report: (d(report),))``."""
    if given is not None:
        of = lambda **ctx: m(*given(**ctx)).value  # noqa: E731
    if of is None:
        return Wrong(m.value, why or m.why, m.name)
    if not callable(m) or why is None:
        raise TypeError("mistaken(function, why, of=...): the mistake function and the diagnosis")
    return Wrong(of, why, m.__name__)


def example_records(*ops: str, steps: int = 2) -> list[CommRecord]:
    """Collective records an exercise counts: `ops` issued in each of `steps` steps, nothing else
    filled in (payloads and times are 0)."""
    return [CommRecord(op, "example", "dp_shard", 4, 0, 0.0, s, 0.0) for s in range(steps) for op in ops]


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
               backend="gloo", matmul16=None, options={}, timeline_mode="full", psi=0, losses=[],
               reference_losses=[],
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
        # no hint yet: it is the help a wrong attempt earns, not a way round the question
        print(f"{ex.id}: not answered yet: {ex.prompt}")
        return None
    if ex.style in ("measure", "find-the-bug"):
        _check_runs(ex, context)
    if ex.style == "formula":
        _check_derived(ex, sys._getframe(1))
    given = answer
    if shuffled(ex):  # the letters the learner saw: this learner's order (`shown_order`)
        answer = canonical(ex, answer)
    if ex.right(answer, context):
        want = ex.expected(**context)
        # sets print in sorted order, a shuffled choice its option's text: the same text on every
        # run and for every learner (nbval compares it)
        shown = (ex.grade(answer)[1] if ex.kind == "design" else number(want) if _is_number(want)
                 else sorted(want) if isinstance(want, (set, frozenset)) else ex.options[want] if shuffled(ex) else want)
        print(f"{ex.id}: correct ✓ ({shown})")
        return None
    raise AssertionError(f"{ex.id}: {given!r} is not right: {ex.diagnose(answer, context)}."
                         + (f" Hint: {ex.hint}" if ex.hint else ""))


# ---------------------------------------------------------------- options in each learner's order
def shuffled(ex: Exercise) -> bool:
    """A single-answer choice lettered a, b, c, ...: shown in each learner's own order."""
    return ex.kind == "choice" and bool(ex.options) and all(k in LETTERS for k in ex.options)


_SHUFFLED_INDEX: dict[str, int] = {}


def shown_order(ex: Exercise, seed: int | None = None) -> list[str]:
    """The option keys of a shuffled choice in the order this learner sees them (letters a, b,
    ... in turn). Balanced as the deck's (`quiz.deck.for_learner`): the i-th shuffled choice of
    the course puts its right option at position (i + seed) mod k, the others in an order drawn
    from the seed; so for every learner the right answer sits at each letter about equally often."""
    import random

    seed = learner_seed() if seed is None else seed
    if not _SHUFFLED_INDEX:
        _SHUFFLED_INDEX.update({e.id: i for i, e in enumerate(e for e in all_exercises() if shuffled(e))})
    keys = sorted(ex.options)
    right = ex.expected(**(ex.example() if ex.example is not None else {}))
    rest = [k for k in keys if k != right]
    random.Random(f"{seed}:{ex.id}").shuffle(rest)
    at = (_SHUFFLED_INDEX[ex.id] + seed) % len(keys)
    return rest[:at] + [right] + rest[at:]


def canonical(ex: Exercise, answer, seed: int | None = None):
    """A learner's answer to a shuffled choice as the option's key: a letter they saw, or the
    option's text; anything else is returned as it is (and graded wrong)."""
    order = shown_order(ex, seed)
    got = read_choice(answer, [ex.options[k] for k in order])
    return order[next(iter(got))] if got is not None and len(got) == 1 else answer


def displayed(ex: Exercise, key: str, seed: int | None = None) -> str:
    """The letter under which this learner sees option `key`."""
    return LETTERS[shown_order(ex, seed).index(key)]


def _package_calls() -> re.Pattern:
    """A call into zeroedu's closed forms: `theory.x(`, `shard.x(`, or a public name of either
    called bare (imported from it)."""
    from ... import shard, theory

    names = set(theory.__all__) | {n for n in dir(shard) if not n.startswith("_") and callable(getattr(shard, n))
                                   and getattr(getattr(shard, n), "__module__", "") == shard.__name__}
    return re.compile(r"\b(?:theory|shard)\s*\.\s*\w+\s*\(|\bzeroedu\.(?:theory|shard)\b|"
                      r"from\s+zeroedu(?:\.\w+)*\s+import\s+[^\n]*\b(?:theory|shard)\b|"
                      r"(?<![\w.])(?:" + "|".join(sorted(map(re.escape, names))) + r")\s*\(")


def _check_derived(ex: Exercise, frame) -> None:
    """A formula exercise asks for a derivation: an answer the cell computed by calling the
    package's closed forms is the package's answer, refused. The cell's source is read where
    Python keeps it (`linecache`: IPython registers each cell there); a caller without a
    readable source is not judged."""
    import linecache

    if frame is None or frame.f_code.co_name != "<module>":
        return  # called from a function (a test, a helper): not a cell
    source = "".join(linecache.getlines(frame.f_code.co_filename, frame.f_globals))
    if source and _package_calls().search(source):
        raise AssertionError(
            f"{ex.id} asks you to derive the figure: an answer computed with zeroedu.theory or zeroedu.shard is "
            "the package's, not yours. Write the arithmetic from the formula (numbers and + - * /).")


def _reports_in(value) -> list | None:
    """The run reports a context value is made of (a report, or a list or dict of them), else None."""
    if isinstance(value, RunReport):
        return [value]
    items = list(value.values()) if isinstance(value, dict) else list(value) if isinstance(value, (list, tuple)) else []
    return items if items and all(isinstance(v, RunReport) for v in items) else None


def _check_runs(ex: Exercise, context: dict) -> None:
    """A figure read off a run is graded against that run's report, so where the exercise reads
    a report (its example context holds one there) the value must be a report a run produced
    (`reports.made_here`): not a dict or a report typed by hand, which could say anything."""
    shape = ex.example() if ex.example is not None else {}
    for name, proto in shape.items():
        if _reports_in(proto) is None or name not in context:
            continue
        value = context[name]
        got = _reports_in(value)
        if got is None or not all(made_here(r) for r in got) or (
                isinstance(proto, RunReport) and not isinstance(value, RunReport)):
            what = "a dict" if isinstance(value, dict) and got is None else "a report built by hand"
            raise AssertionError(
                f"{ex.id}: `{name}` must be what a run returned (run(RunConfig(...)) in this notebook), not "
                f"{what}: the check reads the figure off the run that measured it")


def show_options(ex_id: str) -> None:
    """Print a choice exercise's options (a cell before the answer cell calls this), lettered in
    this learner's order (`shown_order`)."""
    ex = get(ex_id)
    if shuffled(ex):
        for letter, k in zip(LETTERS, shown_order(ex)):
            print(f"  ({letter}) {ex.options[k]}")
        return
    for k, v in sorted(ex.options.items()):
        print(f"  ({k}) {v}")


# ---------------------------------------------------------------- comparisons
def _is_number(x) -> bool:
    return is_number(x)


def _picked(answer, options: dict) -> frozenset[str] | None:
    """The keys a choice or set answer names (`answers.read_choice`: keys, or an option's text);
    without options, the answer's own items."""
    if not options:
        items = answer if isinstance(answer, (list, tuple, set, frozenset)) else [answer]
        return frozenset(normalize_term(x) for x in items)
    keys = list(options)
    got = read_choice(answer, [str(v) for v in options.values()], keys)
    return None if got is None else frozenset(normalize_term(keys[i]) for i in got)


def _same(kind: str, a, b, rel: float, options: dict[str, str] | None = None) -> bool:
    if kind == "number":
        got, want = read_number(a), read_number(b)
        return got is not None and want is not None and (
            math.isclose(got, want, rel_tol=rel, abs_tol=rel if want == 0 else 0.0))
    if kind in ("choice", "set"):
        got, want = _picked(a, options or {}), _picked(b, options or {})
        return got is not None and got == want and (kind == "set" or len(got) == 1)
    return isinstance(a, str) and normalize_term(a) == normalize_term(b)  # name


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
