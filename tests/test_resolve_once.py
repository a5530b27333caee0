"""A run's configuration is resolved once, in the parent, into a frozen `ResolvedConfig` that the
ranks receive and never resolve again (`zeroedu.train.config`)."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from zeroedu.train import ResolvedConfig, RunConfig, config_from_dict, config_to_dict, resolve, run
from zeroedu.train import config as config_module

ROOT = Path(__file__).resolve().parents[1] / "zeroedu"


@pytest.mark.fast
def test_resolved_is_frozen_concrete_and_resolving_it_again_returns_it():
    r = RunConfig("hsdp", 4, m=2, model="mlp").resolved()
    assert isinstance(r, ResolvedConfig)
    assert resolve(r) is r and r.resolved() is r
    # every default filled in: the catalog's recipe, the model's batch and Adam
    assert None not in (r.recipe, r.global_batch, r.adam) and not isinstance(r.model, str)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.steps = 9
    with pytest.raises(TypeError, match="RunConfig, got dict"):
        resolve({"strategy": "ddp"})


@pytest.mark.fast
def test_only_resolved_configurations_cross_to_the_ranks(monkeypatch):
    calls = []
    real = config_module._validate
    monkeypatch.setattr(config_module, "_validate", lambda c: calls.append(c) or real(c))
    d = config_to_dict(RunConfig("zero2", 2, model="mlp"))  # resolved here, in the parent
    assert len(calls) == 1 and d["recipe"] is not None and d["global_batch"] is not None
    back = config_from_dict(d)  # what a rank does: rebuilt, not resolved again
    assert len(calls) == 1
    assert back == RunConfig("zero2", 2, model="mlp").resolved()
    with pytest.raises(ValueError, match="not a resolved configuration .*recipe"):
        config_from_dict({**d, "recipe": None})
    with pytest.raises(ValueError, match=r"not a resolved configuration \(no timeline\)"):
        config_from_dict({k: v for k, v in d.items() if k != "timeline"})


# --------------------------------------------------------------- no rank resolves a config
def _imports_resolve(tree: ast.Module) -> bool:
    """Whether the module's name `resolve` is the configuration's (`zeroedu.train.config`), not
    another of the same name (`runtime.rank.resolve_ref` finds a function by reference)."""
    return any(isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[-1] in ("config", "train")
               and any(a.name == "resolve" and a.asname is None for a in n.names) for n in ast.walk(tree))


def _resolves(node: ast.AST, config_resolve: bool) -> bool:
    """A call that resolves a configuration: `x.resolved()` or the config's `resolve(x)`."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return ((isinstance(f, ast.Attribute) and f.attr == "resolved")
            or (config_resolve and isinstance(f, ast.Name) and f.id == "resolve"))


def rank_functions_that_resolve(source: str) -> list[str]:
    """Functions run on a rank (they take `ctx`, the rank's context) that resolve a
    configuration themselves or through a function of the same module that does."""
    tree = ast.parse(source)
    funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    config_resolve = _imports_resolve(tree)
    direct = {name for name, f in funcs.items() if any(_resolves(n, config_resolve) for n in ast.walk(f))}
    bad = []
    for name, f in funcs.items():
        if not any(a.arg == "ctx" for a in f.args.args):
            continue
        called = {n.func.id for n in ast.walk(f) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        if name in direct or called & direct:
            bad.append(name)
    return sorted(bad)


@pytest.mark.fast
def test_no_rank_function_resolves_a_configuration():
    offenders = {str(p.relative_to(ROOT)): bad for p in sorted(ROOT.rglob("*.py"))
                 if (bad := rank_functions_that_resolve(p.read_text()))}
    assert offenders == {}, f"these run on ranks and resolve a configuration again: {offenders}"
    # the build every rank job goes through refuses anything but the parent's resolved value
    from zeroedu.train.runner import build_run
    with pytest.raises(TypeError, match="ResolvedConfig"):
        build_run(None, RunConfig("ddp", 1, model="mlp"))


@pytest.mark.fast
def test_the_check_catches_a_rank_that_resolves():
    bad = (
        "def config(n):\n    return RunConfig('ddp', n).resolved()\n"
        "def job(ctx, cfg):\n    return build_run(ctx, config_from_dict(cfg).resolved())\n"
        "def case_job(lab, ctx, case):\n    return config(ctx.world_size)\n"
        "def predicted(cfg):\n    return resolve(cfg)\n"
        "def train_job(ctx, cfg):\n    return predicted(config_from_dict(cfg))\n"
    )
    assert rank_functions_that_resolve(bad) == ["case_job", "job"]  # `resolve` is not imported here
    assert rank_functions_that_resolve("from .config import resolve\n" + bad) == ["case_job", "job", "train_job"]


def test_a_run_resolves_its_configuration_once(monkeypatch):
    """train.run resolves in the parent once; the launcher, the reference, the prediction and
    the report take the ResolvedConfig as it is (before: three validations in the parent and one
    more on every rank)."""
    calls = []
    real = config_module._validate
    monkeypatch.setattr(config_module, "_validate", lambda c: calls.append(c) or real(c))
    report = run(RunConfig("zero1", 1, steps=1, recipe="fp32", model="mlp"))
    assert len(calls) == 1 and report.strategy == "zero1" and report.match.losses
