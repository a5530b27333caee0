"""Small helpers the notebooks use, so a lesson cell stays one line and never re-implements an
algorithm: show the package's own code, diff two strategies, and assert that
a run's measurement equals its prediction.

Rendering uses IPython's rich display objects (Markdown, HTML) when IPython is importable and
falls back to plain strings, so the helpers also work from a script or a test.
"""
from __future__ import annotations

import difflib
import html
import inspect

from ..fmt import number as _fmt
from ..recipes import TOLERANCE
from .report import all_match, match_rows, max_rel_diff, rel_diff_text  # noqa: F401 (re-exported)
from ..reports import RunReport


class _Rich:
    """A value that shows as Markdown/HTML in Jupyter and as plain text elsewhere.

    The plain-text form is what nbval compares, so it is deterministic for deterministic input."""

    def __init__(self, text: str, markdown: str | None = None, html_: str | None = None):
        self.text, self.markdown, self.html = text, markdown, html_

    def __repr__(self) -> str:
        return self.text

    def __str__(self) -> str:
        return self.text

    def _repr_markdown_(self):
        return self.markdown

    def _repr_html_(self):
        return self.html


def source(obj) -> str:
    """The source code of a function, class or method (as `inspect.getsource` finds it)."""
    try:
        return inspect.getsource(obj)
    except (TypeError, OSError) as e:
        raise ValueError(f"no source available for {obj!r}: {e}") from None


def show_source(obj) -> _Rich:
    """Display `obj`'s source as a highlighted Python block (the lesson's code, from the package)."""
    code = source(obj)
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
    mod = getattr(obj, "__module__", "")
    return _Rich(code, f"`{mod}.{name}`\n```python\n{code}```\n")


def show_diff(a, b, context: int = 3) -> _Rich:
    """A unified diff from the source of `a` to the source of `b` (e.g. two strategy classes):
    one strategy shown as a patch on the previous one."""
    la, lb = source(a).splitlines(keepends=True), source(b).splitlines(keepends=True)
    name = lambda o: f"{getattr(o, '__module__', '')}.{getattr(o, '__qualname__', repr(o))}"
    diff = "".join(difflib.unified_diff(la, lb, name(a), name(b), n=context))
    if not diff:
        diff = "(identical)\n"
    return _Rich(diff, f"```diff\n{diff}```\n")


def match_table(report: RunReport, ranks: list[int] | None = None) -> _Rich:
    """Predicted (closed form) vs measured (ledger) bytes, per rank: a table with a match column."""
    rows = [row for row in match_rows(report) if ranks is None or row[0] in ranks]
    head = ("rank", "bytes", "predicted", "measured", "match")
    body = [(str(a), b, _fmt(c), _fmt(d), str(e)) for a, b, c, d, e in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))
    text = "\n".join([line(head)] + [line(r) for r in body])
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body)
    htm = ("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
           + cells + "</tbody></table>")
    return _Rich(text, None, htm)


def loss_rel_diff(report: RunReport) -> float:
    """Largest relative difference between the run's losses and the single-process reference."""
    return max_rel_diff(report.losses, report.reference_losses)


LOSS_TOLERANCE = TOLERANCE  # relative, per recipe (zeroedu.recipes.TOLERANCE)


def assert_match(report: RunReport) -> None:
    """Print "predicted vs measured — match: True" and assert it: every rank's model-state bytes,
    activations and bytes sent equal the closed forms, and the losses equal single-process
    training within the recipe's tolerance."""
    m = report.match
    diff = loss_rel_diff(report)
    tol = LOSS_TOLERANCE.get(report.recipe, 1e-2)
    ok_loss = diff <= tol
    ok = bool(all_match(report) and ok_loss)
    parts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in m.plain().items() if v is not None and k != "losses")
    print(f"{report.strategy} on N={report.n}" + (f", M={report.m}" if report.m > 1 else "")
          + f", {report.recipe}: {parts}, losses vs single process {ok_loss} (rel. diff < {tol:g})")
    print(f"predicted vs measured — match: {ok}")
    if not ok:
        raise AssertionError(f"prediction and measurement disagree:\n{match_table(report).text}\n"
                             f"loss rel. diff {diff:.3g} (tolerance {tol:g})")


def cached_result(name: str) -> dict:
    """A result the benchmarks committed (`benchmarks/results/<name>.json`) that a notebook reads
    instead of rerunning minutes of training: `benchmarks/bench_<name>.py` regenerates it."""
    import json
    import os

    from ..references.bench import RESULTS_DIR

    with open(os.path.join(RESULTS_DIR, f"{name}.json")) as f:
        return json.load(f)
