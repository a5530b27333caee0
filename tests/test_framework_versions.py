"""Every framework statement names the version it was read in, and cites files and functions,
never line numbers (issue: teaching truth against today's frameworks).

A line number is true of one version only and silently wrong after the next release; a function
or key name survives most of them, and the version says where to look when it does not. Checked
here: the notebooks (solutions and learner editions), the README, the deck's cards, the package's
docstrings and strings, docs/ and labs/. A notebook or card that cites a framework's file names
that framework's version at least once."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.fast
ROOT = Path(__file__).resolve().parents[1]

# `l.123`, `l.77-78`: a line reference into some framework's source
LINE_REF = re.compile(r"(?<![\w.])l\.\d+")
# framework: (how its files are cited, how its version is named)
FRAMEWORKS = {
    "DeepSpeed": (re.compile(r"\bdeepspeed/[\w/]+\.py|docs/_(?:pages|tutorials)/"), re.compile(r"DeepSpeed v?0\.\d+")),
    "Megatron": (re.compile(r"\bmegatron/(?:core|training)/[\w/]+\.py"),
                 re.compile(r"Megatron-(?:Core|LM) (?:v?0\.\d+|main)")),
    "torchtitan": (re.compile(r"\btorchtitan/[\w/]+\.py"), re.compile(r"torchtitan (?:main|v?\d)")),
    "torch": (re.compile(r"(?<![\w/])torch/[\w/]+\.py"), re.compile(r"torch \d\.\d+|PyTorch \d\.\d+|\(\d\.\d+\)")),
}


def _texts() -> dict[str, str]:
    out = {}
    for p in sorted((ROOT / "notebooks").rglob("*.ipynb")):
        nb = json.loads(p.read_text())
        out[str(p.relative_to(ROOT))] = "\n".join(
            "".join(c["source"]) + "\n" + "".join("".join(o.get("text", "")) for o in c.get("outputs", []))
            for c in nb["cells"])
    for pattern in ("README.md", "docs/**/*.md", "labs/**/*.md", "zeroedu/**/*.py", "zeroedu/**/*.yaml",
                    "zeroedu/**/*.md"):
        for p in sorted(ROOT.glob(pattern)):
            out[str(p.relative_to(ROOT))] = p.read_text()
    return out


def test_no_line_numbers_into_framework_sources():
    found = [f"{name}: {m.group(0)} in '...{text[max(0, m.start() - 60):m.end() + 20]}...'"
             for name, text in _texts().items() for m in LINE_REF.finditer(text)]
    assert not found, "cite the function or key, not the line:\n" + "\n".join(found[:20])


@pytest.mark.parametrize("edition", ["notebooks/solutions", "notebooks"])
def test_each_notebook_names_the_version_of_each_framework_it_cites(edition):
    missing = []
    for p in sorted((ROOT / edition).glob("*.ipynb")):
        nb = json.loads(p.read_text())
        prose = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
        for fw, (cites, version) in FRAMEWORKS.items():
            if cites.search(prose) and not version.search(prose):
                missing.append(f"{p.name}: cites {fw} ({cites.search(prose).group(0)}) without its version")
    assert not missing, "\n".join(missing)


def test_each_card_names_the_version_of_each_framework_it_cites():
    missing = []
    for f in sorted((ROOT / "zeroedu/quiz/cards").glob("*.yaml")):
        for card in yaml.safe_load(f.read_text())["cards"]:
            text = json.dumps(card, ensure_ascii=False)
            for fw, (cites, version) in FRAMEWORKS.items():
                if cites.search(text) and not version.search(text):
                    missing.append(f"{f.name} {card['id']}: cites {fw} ({cites.search(text).group(0)}) "
                                   "without its version")
    assert not missing, "\n".join(missing)


def test_the_checks_bite():
    assert LINE_REF.search("average_tensor (l.1051)") and not LINE_REF.search("torch 2.13, Eq. (1)")
    cites, version = FRAMEWORKS["DeepSpeed"]
    assert cites.search("deepspeed/runtime/engine.py") and not version.search("DeepSpeed's engine")
    assert version.search("DeepSpeed v0.19.6")
