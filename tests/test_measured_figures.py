"""No figure called measured without its output (teaching truth, #40 item 14).

A figure given as measured is a number in a sentence of the README or of a notebook's markdown
that says it was measured (measured, measures, shows, took, takes, ran in). Each must appear
in what a run wrote down: the notebook's own committed outputs or `benchmarks/results/*.json`
(written by the scripts in `benchmarks/`); for the README, any notebook's outputs, the results
files and the README's own code blocks (printed outputs). Numbers are matched as printed, with
their unit where the sentence gives one (× and x alike); a bare integer with no unit (a count,
N, a step number) is too common to trace and is not checked. What is not a measurement but
reads like one is listed below with its reason.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
VERBS = re.compile(r"\b(measured|measures|shows|showed|took|takes|ran in)\b", re.I)
NUMBER = re.compile(r"(?<![\w.$\\{^_#-])(\d+(?:[.,]\d+)*)(?:\s?(%|×|x\b|ms\b|s\b|MB\b|GB\b|KiB\b|MiB\b|GiB\b|B\b))?")

# (source, number, reason): figures in "measured" sentences that are not this suite's measurements
NOT_MEASURED = {
    ("02_ddp.ipynb", "6.5"): "gpt-small's bf16 gradient bytes, 2Ψ (closed form; the cell below prints S = 6,484,162 B)",
    ("README.md", "1"): "gpu_memory_check's tolerance (within 1 % or it fails), a bound the check applies, not a figure it measured",
    ("07_zero3_fsdp.ipynb", "1.6"): "a block's bf16 weights, from the model's shapes (closed form)",
    ("07_zero3_fsdp.ipynb", "10"): "the ring time of that all-gather on the domain link, (N-1)/N · bytes/β (closed form)",
    ("02_ddp.ipynb", "4"): "K = 4 micro-batches, so 4x the batch: the run's configuration",
    ("09_activations.ipynb", "2.11"): "torch's version on the GPU machine (its table: benchmarks/results/gpu_memory_check_h200.txt)",
    ("09_activations.ipynb", "1"): "1 %: gpu_memory_check.py's tolerance, an input",
    ("README.md", "50"): "the notebook table's run-time column: rounded estimates per notebook, not results",
    ("README.md", "3"): "3 MiB: the message size notebook 01's run was given, an input",
    ("README.md", "15"): "the notebook table's run-time column: rounded estimates per notebook, not results",
    ("README.md", "60"): "the notebook table's run-time column: rounded estimates per notebook, not results",
    ("README.md", "30"): "the notebook table's run-time column: rounded estimates per notebook, not results",
}


def _prose(text: str) -> str:
    """Markdown without code, formulas, inline code and parenthesised source references."""
    for pat in (r"```.*?```", r"\$\$.*?\$\$", r"\$[^$\n]*\$", r"`[^`\n]*`", r"\]\([^)]*\)"):
        text = re.sub(pat, " ", text, flags=re.S)
    return text


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?:;])\s+|\n\s*[*-]\s+|\n\s*\|?\n|\n\n", _prose(text)) if s.strip()]


def _outputs(nb: dict) -> str:
    parts = []
    for c in nb["cells"]:
        for o in c.get("outputs", []):
            parts.append("".join(o.get("text", "")))
            parts.append("".join(o.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def _printed(number: str, unit: str | None, corpus: str) -> bool:
    plain = number.replace(",", "")
    forms = {number, plain}
    f = float(plain)
    if "." in plain:
        decimals = len(plain.split(".")[1])
        forms |= {f"{f:.{decimals}f}", f"{f:,.{decimals}f}"}
    else:
        forms |= {f"{f:,.0f}", f"{f:.0f}"}
    # a ratio is printed with its sign or bare, in a column of ratios
    unit_pat = "" if unit is None else (r"(\s?[×x])?(?![\d])" if unit in ("×", "x") else r"\s?" + re.escape(unit))
    for form in forms:
        if re.search(r"(?<![\d.])" + re.escape(form) + (r"(?![\d])" if unit is None else unit_pat), corpus):
            return True
    return False


def _unmatched(source: str, text: str, corpus: str) -> list[tuple[str, str, str]]:
    out = []
    for s in _sentences(text):
        if not VERBS.search(s):
            continue
        for m in NUMBER.finditer(s):
            number, unit = m.group(1), m.group(2)
            if "." not in number and unit is None:
                continue  # a bare integer: a count or an input
            if (source, number) in NOT_MEASURED:
                continue
            if not _printed(number, unit, corpus):
                out.append((source, number, " ".join(s.split())[:160]))
    return out


def _corpora():
    notebooks = {p.name: json.loads(p.read_text()) for p in sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))}
    results = "\n".join(p.read_text() for p in sorted((ROOT / "benchmarks" / "results").glob("*.json")))
    return notebooks, results


def test_every_figure_called_measured_is_in_an_output():
    notebooks, results = _corpora()
    readme = (ROOT / "README.md").read_text()
    everything = "\n".join([results, *(_outputs(nb) for nb in notebooks.values()),
                            *re.findall(r"```.*?```", readme, flags=re.S)])
    missing = []
    for name, nb in notebooks.items():
        md = "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
        missing += _unmatched(name, md, _outputs(nb) + "\n" + results)
    missing += _unmatched("README.md", re.sub(r"```.*?```", " ", readme, flags=re.S), everything)
    assert not missing, "figures given as measured that no output shows:\n" + "\n".join(map(str, missing))


def test_the_whitelist_holds_only_what_the_scan_would_flag():
    """Every entry is still needed: remove it once its sentence is gone or matched."""
    notebooks, results = _corpora()
    readme = (ROOT / "README.md").read_text()
    texts = {name: "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
             for name, nb in notebooks.items()}
    texts["README.md"] = re.sub(r"```.*?```", " ", readme, flags=re.S)
    for (source, number), why in NOT_MEASURED.items():
        assert why
        flagged = [n for s in _sentences(texts[source]) if VERBS.search(s) for n, _ in
                   ((m.group(1), m.group(2)) for m in NUMBER.finditer(s))]
        assert number in flagged, (source, number)


def test_the_scan_catches_a_figure_no_output_shows():
    text = "The bucketed run measured 0.73 of one bucket's step. It takes 41 % less."
    assert [m[1] for m in _unmatched("x.ipynb", text, "ratio 0.50\n")] == ["0.73", "41"]
    assert _unmatched("x.ipynb", text, "ratio 0.73 and 41%") == []
    assert _unmatched("x.ipynb", "HSDP ran 3.2× faster.", "HSDP 3.2x faster") == []
