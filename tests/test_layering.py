"""The package's folders are its layers: imports go down the layers, never up, and never round.

Every import inside `zeroedu` (module level and inside functions, since a cycle through a local
import is still a cycle in the design) is read from the source with `ast`, resolved to the
module it names, and checked against the layer table below (README, "How it is built").
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1] / "zeroedu"

# Lower number = lower layer. A module may import its own package and any lower layer; two
# different packages on the same layer may not import each other.
LAYERS = {
    "zeroedu.kinds": 0,
    "zeroedu.catalog": 1, "zeroedu.recipes": 1, "zeroedu.shard": 1, "zeroedu.fmt": 1, "zeroedu.optim": 1,
    "zeroedu.reports": 1, "zeroedu.answers": 1,
    "zeroedu.theory": 2, "zeroedu.runtime": 2,
    "zeroedu.models": 3,
    "zeroedu.strategies": 4,
    "zeroedu.train": 5,
    "zeroedu.checkpoint": 6, "zeroedu.references": 6,
    "zeroedu.notebook": 7, "zeroedu.quiz": 7, "zeroedu.labs": 7,
    "zeroedu.cli": 8,
}
TOP = {"zeroedu", "zeroedu.__main__"}  # the package's front door: may import anything


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def is_package(mod: str) -> bool:
    return MODULES[mod].name == "__init__.py"


def resolve(mod: str, node: ast.AST) -> list[str]:
    """The zeroedu modules an import statement in `mod` refers to."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "zeroedu"]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = mod.split(".") if is_package(mod) else mod.split(".")[:-1]
        base = base[:len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] != "zeroedu":
        return []
    out = []
    for a in node.names:  # `from pkg import sub` names the submodule when there is one
        sub = f"{target}.{a.name}"
        out.append(sub if sub in MODULES else target)
    return out


def imports() -> dict[str, set[str]]:
    graph = {}
    for mod, path in MODULES.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps.update(d for d in resolve(mod, node) if d != mod)
        graph[mod] = deps
    return graph


def layer_of(mod: str) -> tuple[str, int] | None:
    for prefix, rank in sorted(LAYERS.items(), key=lambda kv: -len(kv[0])):
        if mod == prefix or mod.startswith(prefix + "."):
            return prefix, rank
    return None


def test_every_module_has_a_layer():
    missing = sorted(m for m in MODULES if m not in TOP and layer_of(m) is None)
    assert not missing, f"modules outside the layer table: {missing}"


def test_imports_go_down_the_layers():
    bad = []
    for mod, deps in imports().items():
        if mod in TOP:
            continue
        home, rank = layer_of(mod)
        for d in deps:
            if d in TOP:
                bad.append(f"{mod} imports the package front door {d}")
                continue
            there, r = layer_of(d)
            if there != home and r >= rank:
                bad.append(f"{mod} (layer {rank}) imports {d} (layer {r})")
    assert not bad, "imports that go up or across the layers:\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    graph = imports()
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def _names_tag(node) -> bool:
    return ((isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "tag")
            or (isinstance(node, ast.Attribute) and node.attr == "tag"))


def test_the_vocabulary_is_the_bottom_and_events_are_read_by_kind():
    """`zeroedu.kinds` (the enums the core writes and every layer reads) imports nothing of the
    package; no module records an event as free text or reads one back by parsing it, and no
    module splits a collective's tag (its record carries `unit` and `moves`)."""
    assert imports()["zeroedu.kinds"] == set()
    text_events, parsed = [], []
    for mod, path in MODULES.items():
        src = path.read_text()
        for node in ast.walk(ast.parse(src, str(path))):
            # ledger.event("...") / ledger.mark(f"...") : an event whose kind is prose
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("event", "mark") and node.args
                    and isinstance(node.args[0], (ast.Constant, ast.JoinedStr))):
                text_events.append(f"{mod}:{node.lineno}")
            # c["tag"].split("/") / op.tag.split("/"): the record's unit and moves are fields
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "split" and node.args and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value == "/" and _names_tag(node.func.value)):
                parsed.append(f"{mod}:{node.lineno} (a tag split)")
            # e["label"] compared or split: the label is for people, the kind for code
            if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                    and node.slice.value == "label" and mod not in ("zeroedu.references.bench",)):
                parsed.append(f"{mod}:{node.lineno}")
    assert not text_events, f"events recorded as text (use zeroedu.kinds.EventKind): {text_events}"
    assert not parsed, f"event labels read back (read the kind and unit): {parsed}"
    # the vocabularies are spelled once: memory categories, timeline, collective and recompute modes
    spelled = {'"main_grad", "m", "v"', '("full", "minimal")', '("auto", "ring", "backend")',
               '("none", "selective", "full")'}
    again = sorted(f"{mod}: {t}" for mod, path in MODULES.items() if mod != "zeroedu.kinds"
                   for t in spelled if t in path.read_text())
    assert not again, f"a vocabulary of zeroedu.kinds spelled again: {again}"
    for mod in ("zeroedu.notebook.viz.timelines", "zeroedu.quiz.factcheck"):
        assert "re" not in {a.name for n in ast.walk(ast.parse(MODULES[mod].read_text()))
                            if isinstance(n, ast.Import) for a in n.names}, mod


def test_at_most_ten_top_level_modules():
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= 10, top


@pytest.mark.parametrize("bad,expect", [
    (("zeroedu.theory.memory", "zeroedu.notebook.viz"), "up"),
    (("zeroedu.strategies.zero1", "zeroedu.cli"), "up"),
    (("zeroedu.runtime.comm", "zeroedu.theory"), "across"),
])
def test_the_check_catches_a_bad_import(bad, expect):
    # The rule itself, on imports that must be refused (so the test above can fail).
    src, dst = bad
    home, rank = layer_of(src)
    there, r = layer_of(dst)
    assert there != home and r >= rank


# ------------------------------------------------------------- the report is read by attribute
REPO = ROOT.parent
# Keys only a run report has (`zeroedu.reports`), and keys that are a report's when the next
# subscript is one of its fields (a claim's "match" is a verdict, a report's is a `Match`).
REPORT_KEYS = {"ranks", "measured", "predicted", "reference_losses", "reference_params", "replica_max_diff",
               "timeline_mode", "comm_by_axis", "optim_detail", "by_collective", "by_axis"}
CHAINED = {"match": {"model_states", "comm", "wire", "activations", "losses"},
           "timeline": {"events", "marks", "comm"},
           "wire": {"sent", "messages", "method", "reason", "by_axis", "by_collective"}}
# The JSON that `zeroedu run --json` prints is read by key: the tests of that schema.
JSON_SCHEMA_TESTS = {("tests/test_ddp.py", "test_cli_run_json"),
                     ("tests/test_ddp.py", "test_cli_record_says_what_ranks_keep_and_json_timelines_what_is_printed"),
                     ("tests/test_safe_runs.py", "test_cli_json_is_strict_json")}


def _key(node) -> str | None:
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    return None


def report_keys_read(src: str, where: str, allowed: frozenset = frozenset()) -> list[str]:
    """Subscripts by a report's string key in `src` (outside the functions in `allowed`)."""
    tree = ast.parse(src)
    skip = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name in allowed
            for n in ast.walk(f)}
    out = []
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, ast.Subscript):
            continue
        k, inner = _key(node), _key(node.value)
        if k in REPORT_KEYS or (inner in CHAINED and k in CHAINED[inner]):
            out.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return out


def _code_cells(path: Path):
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "code":
            src = "".join(cell["source"])
            yield i, "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines())


def test_no_reader_indexes_a_report_by_key():
    """Everything above `zeroedu.reports` (the package, the tests, the notebooks, the benchmarks)
    reads a run report's attributes; only the JSON schema's own tests read the JSON by key."""
    found = []
    for path in sorted([*ROOT.rglob("*.py"), *REPO.glob("tests/*.py"), *REPO.glob("benchmarks/*.py"),
                       *REPO.glob("docs/**/*.py"), *REPO.glob("examples/*.py")]):
        rel = str(path.relative_to(REPO))
        if rel == "zeroedu/reports.py":
            continue
        allowed = frozenset(f for p, f in JSON_SCHEMA_TESTS if p == rel)
        found += report_keys_read(path.read_text(), rel, allowed)
    for path in sorted(REPO.glob("notebooks/**/*.ipynb")):
        for i, src in _code_cells(path):
            found += report_keys_read(src, f"{path.relative_to(REPO)} cell {i}")
    assert not found, "reports read by key (read the attribute: zeroedu.reports):\n" + "\n".join(found)
    # the check itself catches each spelling
    assert len(report_keys_read('r["ranks"][0]["measured"]["total"]; x["match"]["wire"]; t["timeline"]["events"]'
                                '; c["match"]; w["wire"]["zero1"]', "x")) == 4


# torch internals that are private (a leading underscore) and version-dependent: read only in
# zeroedu/references/torch_private.py, which says which torch they were read against (README,
# "torch: CPU and GPU installs")
TORCH_PRIVATE = {"_tools", "_WINFO", "_curr_mem_snap", "_update_peak_stats", "_get_zeros_like_grad_buckets",
                 "_cuda_clearCublasWorkspaces"}


def test_torch_private_internals_live_in_one_module():
    import io
    import tokenize

    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.name == "torch_private.py":
            continue
        toks = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
        for prev, tok in zip(toks, toks[1:]):  # code only: strings and comments are other token types
            if prev.string == "." and tok.type == tokenize.NAME and tok.string in TORCH_PRIVATE:
                found.append(f"{path.relative_to(ROOT)}:{tok.start[0]} .{tok.string}")
    assert not found, f"torch internals outside zeroedu/references/torch_private.py: {found}"
    text = (ROOT / "references" / "torch_private.py").read_text()
    assert all(name in text for name in TORCH_PRIVATE) and 'TORCH_READ_AGAINST = "2.13.0"' in text


# Names that hold a value of one of `zeroedu.kinds`'s vocabularies, by the code's convention.
VOCAB_NAMES = {"recompute": "RecomputeMode", "mode": "RecomputeMode", "timeline_mode": "TimelineMode",
               "implementation": "Implementation", "impl": "Implementation", "collectives": "Implementation",
               "layout": "Layout", "kind": "EventKind", "cat": "Category", "category": "Category"}


def test_vocabulary_values_are_compared_with_their_enum_not_a_string():
    """`x.recompute != "none"` reads the vocabulary's value by hand; `RecomputeMode.NONE` names it
    (and a typo in it is an AttributeError, not a comparison that is always False). An AST scan
    of every comparison in the package: a name of `VOCAB_NAMES` against a string literal that is
    one of its enum's values is refused."""
    import ast

    from zeroedu import kinds

    values = {name: {m.value for m in getattr(kinds, name)} for name in set(VOCAB_NAMES.values())}
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            parts = [node.left, *node.comparators]
            names = [p.id if isinstance(p, ast.Name) else p.attr if isinstance(p, ast.Attribute) else None
                     for p in parts]
            enums = {VOCAB_NAMES[n] for n in names if n in VOCAB_NAMES}
            consts = [c.value for p in parts
                      for c in ([p] if isinstance(p, ast.Constant) else getattr(p, "elts", []))
                      if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            if any(v in values[e] for e in enums for v in consts):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)[:80]}")
    assert not found, "vocabulary values compared as strings:\n" + "\n".join(found)
