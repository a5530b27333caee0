"""The learner's notebooks, generated from the solutions: one source, two editions.

`notebooks/solutions/NN_*.ipynb` are the single source (executed by CI). In a cell tagged
``exercise``, a line that ends in ``# solution`` is the answer: the learner's edition replaces
its right-hand side with ``...`` (the placeholder `check` recognises); lines between
``# solution begin`` and ``# solution end`` are dropped, and a ``# solution begin: NAME`` line
becomes ``NAME = ...``. The exercise cell's output becomes what `check` prints for the
placeholder ("not answered yet", the prompt, the hint), so the learner's notebooks show no
answer anywhere, and look executed. After an exercise that asks for a prediction, the code
cells up to the next exercise lose their outputs (the run that settles the prediction is the
learner's to execute); every other cell is copied with its outputs.

    python -m zeroedu.notebook.exercises generate [--check]
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

SOLUTION_LINE = re.compile(r"^(?P<indent>\s*)(?P<lhs>[^=#]+?)\s*=\s*(?P<rhs>.+?)\s*#\s*solution\s*$")
BEGIN = re.compile(r"^(?P<indent>\s*)#\s*solution begin(?::\s*(?P<name>\w+))?\s*$")
END = re.compile(r"^\s*#\s*solution end\s*$")
CHECK_ID = re.compile(r"""check\(\s*["'](?P<id>\d+\.\d+)["']""")


def default_dirs() -> tuple[Path, Path]:
    root = Path(__file__).resolve().parents[3]
    return root / "notebooks" / "solutions", root / "notebooks"


def learner_source(src: str) -> str:
    out, skipping = [], False
    for line in src.split("\n"):
        if skipping:
            skipping = not END.match(line)
            continue
        m = BEGIN.match(line)
        if m:
            skipping = True
            if m.group("name"):
                out.append(f"{m.group('indent')}{m.group('name')} = ...  # your answer")
            continue
        m = SOLUTION_LINE.match(line)
        if m:
            out.append(f"{m.group('indent')}{m.group('lhs').strip()} = ...  # your answer")
            continue
        out.append(line)
    if skipping:
        raise ValueError("a '# solution begin' without its '# solution end'")
    return "\n".join(out)


PREDICT_NOTE = ("(a prediction: the outputs of the cells below, up to the next exercise, are cleared; "
                "answer first, then run them)")


def _predicts(src: str) -> bool:
    from . import get

    return any(get(ex_id).style == "predict" for ex_id in CHECK_ID.findall(src))


def _placeholder_output(src: str) -> list[dict]:
    from . import get

    outs = []
    for ex_id in CHECK_ID.findall(src):
        ex = get(ex_id)
        text = f"{ex.id}: not answered yet: {ex.prompt}"  # the hint comes after a wrong attempt
        outs.append(text + "\n")
    if outs and _predicts(src):
        outs.append(PREDICT_NOTE + "\n")
    return [{"name": "stdout", "output_type": "stream", "text": outs}] if outs else []


def _is_exercise(c: dict) -> bool:
    return c["cell_type"] == "code" and "exercise" in c.get("metadata", {}).get("tags", [])


# A cell whose output shows an exercise's answer (a comparison that prints the value found):
# its output is cleared in the learner's edition.
SHOWS_ANSWER = "shows-answer"


def learner_notebook(nb: dict) -> dict:
    nb = copy.deepcopy(nb)
    hiding = False  # inside the run that settles a prediction
    for c in nb["cells"]:
        if not _is_exercise(c):
            if c["cell_type"] == "code" and (hiding or SHOWS_ANSWER in c.get("metadata", {}).get("tags", [])):
                c["outputs"], c["execution_count"] = [], None
            continue
        src = learner_source("".join(c["source"]))
        lines = src.split("\n")
        c["source"] = [ln + "\n" for ln in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
        c["outputs"] = _placeholder_output(src)
        hiding = _predicts(src)
    return nb


def _dump(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def generate(solutions: Path | None = None, learner: Path | None = None, check: bool = False) -> list[str]:
    """Write (or, with `check`, compare) every learner notebook; returns the stale ones."""
    sol_dir, out_dir = default_dirs()
    sol_dir, out_dir = Path(solutions or sol_dir), Path(learner or out_dir)
    stale = []
    for p in sorted(sol_dir.glob("*.ipynb")):
        text = _dump(learner_notebook(json.loads(p.read_text())))
        target = out_dir / p.name
        if not target.exists() or target.read_text() != text:
            stale.append(target.name)
            if not check:
                target.write_text(text)
    return stale
