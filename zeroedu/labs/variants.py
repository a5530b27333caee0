"""Per-student variants: each student's visible cases of the training labs (5-8) come from their id.

A class of 200 that shares one answer key shares it with each other, so the grader gives each
student their own variant, derived from the student id (and a course name the instructor picks,
so next year's class differs): the world size N (2-4), the MLP's widths and depth (which fix the
FSDP units' boundaries, one unit per Linear layer), its seed, and lab 7's bucket size. The same
id always gives the same variant (`variant`), so the instructor reproduces any grade; the id is
not a secret (a student prints theirs with `python -m zeroedu.labs variant ID`).

A correct algorithm is correct on every variant, so the variant-specific deliverable is a
*prediction*: labs 7 and 8 ask for the variant's numbers worked out by hand before the run
(`predicted()` in the lab file: bytes each rank sends per step, the number of buckets, the most
bytes of parameters gathered at once), and the `predict` criterion compares them with the
closed forms for the variant's first visible case (`closed_form`), never with the student's own
run: a solution that does not prefetch measures a smaller peak than the variant's, and
"predicting" its own run would earn points for the mistake. The grader reads the numbers from the
file's text as plain finite numbers (`read_prediction`) and never calls the function, so a
prediction cannot compute itself from the run. A file written for variant A, graded as variant
B, keeps A's numbers and loses those points; the published tree holds no numbers for any
variant, and a wrong prediction's diagnosis does not print the right one.

`predictions(lab, v)` is the same closed form for variant `v` (the instructor's key:
`build --key DIR --for ID`).
"""
from __future__ import annotations

import ast
import math
import hashlib
import random
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from .. import shard, theory
from ..models import MLPConfig

PREDICTED = {7: ("step_bytes", "buckets"), 8: ("step_bytes", "peak_gathered")}
MAX_PREDICTION = 1e15  # bytes or buckets of a lab's MLP are far below; beyond it a float loses whole bytes
BYTES = 4  # the labs train in fp32


@dataclass(frozen=True)
class Variant:
    student: str
    course: str
    n: int
    model: MLPConfig
    bucket_bytes: int  # lab 7

    @property
    def global_batch(self) -> int:
        return 6 * self.n

    def describe(self) -> str:
        m = self.model
        widths = "→".join(str(w) for w in [m.d_in] + [m.hidden] * (m.depth - 1) + [m.d_out])
        return (f"variant of {self.student!r}" + (f" (course {self.course!r})" if self.course else "")
                + f": N = {self.n} ranks, MLP {widths} ({m.depth} Linear layers = {m.depth} FSDP units, "
                f"seed {m.seed}), fp32, global batch {self.global_batch}; lab 7 buckets of {self.bucket_bytes} "
                "bytes")


def variant(student: str, course: str = "") -> Variant:
    """The variant of `student` in `course`: the same id and course, the same variant."""
    student = str(student).strip()
    if not student:
        raise ValueError("a student id is needed for a variant (any non-empty text, e.g. the folder name)")
    digest = hashlib.sha256(f"zeroedu-labs-variant/{course}/{student}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:16], "little"))
    n = rng.choice((2, 3, 4))
    model = MLPConfig(d_in=rng.randint(6, 16), hidden=rng.randint(9, 24), depth=rng.choice((3, 4)),
                      d_out=rng.randint(3, 9), seed=rng.randint(1, 10**6))
    return Variant(student, course, n, model, rng.choice((256, 512, 768, 1024)))


# ------------------------------------------------------------------ the key's numbers
def _ddp_bucket_count(model: MLPConfig, cap: int) -> int:
    """Buckets closed greedily in reverse parameter order once each holds >= cap bytes."""
    count, cur = 0, 0
    for p in reversed(list(model.build().parameters())):
        cur += p.numel() * BYTES
        if cur >= cap:
            count, cur = count + 1, 0
    return count + (cur > 0)


def predictions(lab: int, v: Variant) -> dict[str, float]:
    """The variant's numbers from the closed forms (what the key of variant `v` holds, and what
    the `predict` criterion grades against)."""
    return closed_form(lab, v.model, v.n, v.bucket_bytes)


def closed_form(lab: int, model: MLPConfig, n: int, bucket_bytes: int | None = None) -> dict[str, float]:
    """Lab 7's or 8's numbers for an MLP on n ranks (lab 7: buckets of `bucket_bytes`), from the
    closed forms alone: bytes each rank sends per step (`theory.exact_comm`), lab 7's bucket
    count (greedy, in reverse parameter order), lab 8's most gathered bytes (two neighbouring
    units' row-padded parameters: the one computing and the one prefetched)."""
    from ..models import unit_shapes

    shapes = unit_shapes(model.build())
    if lab == 7:
        sent = theory.exact_comm("ddp_bucketed", shapes, n, recipe="fp32").total()
        return {"step_bytes": _number(sent), "buckets": _ddp_bucket_count(model, bucket_bytes)}
    if lab == 8:
        sent = theory.exact_comm("fsdp2", shapes, n, recipe="fp32").total()
        per_unit = [sum(n * shard.dim0_chunk_rows(s[0], n) * shard.numel(s[1:]) for s in u) * BYTES
                    for u in shapes]
        peak = max((a + b for a, b in zip(per_unit, per_unit[1:])), default=max(per_unit))
        return {"step_bytes": _number(sent), "peak_gathered": peak}
    raise ValueError(f"lab {lab} asks for no prediction (labs {sorted(PREDICTED)} do)")


def _number(x) -> float:
    x = Fraction(x)
    return int(x) if x.denominator == 1 else round(float(x), 2)


# ------------------------------------------------------------------ reading a submission
def read_prediction(path: str | Path, lab: int) -> tuple[dict | None, str]:
    """The numbers `predicted()` returns in the file at `path`, read from its text (never run):
    (numbers, "") or (None, why not)."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError) as e:
        return None, f"cannot read predicted() ({type(e).__name__})"
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "predicted"), None)
    if fn is None:
        return None, "the file has no predicted() function"
    ret = [n for n in ast.walk(fn) if isinstance(n, ast.Return)]
    if not ret:
        return None, "not yet: predicted() returns nothing (replace its NotImplementedError with your numbers)"
    try:
        value = ast.literal_eval(ret[0].value)
    except (ValueError, TypeError, SyntaxError):
        return None, ("predicted() must return a dict of plain numbers written in the file "
                      "(e.g. {\"step_bytes\": 4962, ...}), not a computation")
    want = PREDICTED[lab]
    if not isinstance(value, dict) or set(value) != set(want) or not all(
            isinstance(value[k], (int, float)) and not isinstance(value[k], bool) for k in want):
        return None, f"predicted() must return {{{', '.join(repr(k) + ': <number>' for k in want)}}}, got {value!r:.200}"
    # 1e999 reads as inf, which no count of bytes is (and which no exact comparison takes)
    bad = [k for k in want if not math.isfinite(value[k]) or abs(value[k]) > MAX_PREDICTION]
    if bad:
        return None, (f"predicted()'s {bad[0]} is {value[bad[0]]!r:.40}: a prediction is a finite count "
                      f"(at most {MAX_PREDICTION:.0e})")
    return value, ""


def with_prediction(text: str, numbers: dict) -> str:
    """`text` (a key's source) with predicted()'s returned dict replaced by `numbers`."""
    tree = ast.parse(text)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "predicted")
    ret = next(n for n in ast.walk(fn) if isinstance(n, ast.Return))
    lines = text.splitlines(keepends=True)
    line = lines[ret.lineno - 1]
    indent = line[:len(line) - len(line.lstrip())]
    body = ", ".join(f"{k!r}: {v!r}" for k, v in numbers.items()).replace("'", '"')
    lines[ret.lineno - 1:ret.end_lineno] = [f"{indent}return {{{body}}}\n"]
    return "".join(lines)


__all__ = ["PREDICTED", "Variant", "closed_form", "predictions", "read_prediction", "variant", "with_prediction"]
