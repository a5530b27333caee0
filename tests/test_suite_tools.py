"""The suite's own tools: `make test`'s last stage (tests/tree_state.py) names every file a run
changed, created or removed, in a real git checkout, and ignores what .gitignore leaves to the
run; the shared multi-rank runs (tests/shared_runs.py) start each configuration once."""
import subprocess

import pytest

from . import tree_state

pytestmark = pytest.mark.fast


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def test_every_kind_of_change_is_named_and_ignored_paths_are_not(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("cache/\n")
    (tmp_path / "a.ipynb").write_text("{}")
    (tmp_path / "b.py").write_text("x = 1\n")
    (tmp_path / "draft.md").write_text("uncommitted, and fine: it was there before the run\n")
    _git(tmp_path, "add", ".gitignore", "a.ipynb", "b.py")
    before = tree_state.snapshot(tmp_path)
    assert tree_state.diff(before, tree_state.snapshot(tmp_path)) == []

    (tmp_path / "a.ipynb").write_text('{"autosaved": true}')  # what JupyterLab's autosave did
    (tmp_path / "b.py").unlink()
    (tmp_path / "new.txt").write_text("left behind")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "x").write_text("ignored: the run's to write")
    assert tree_state.diff(before, tree_state.snapshot(tmp_path)) == [
        "changed a.ipynb", "removed b.py", "created new.txt"]


def test_check_fails_naming_the_file(tmp_path, capsys):
    _git(tmp_path, "init", "-q")
    (tmp_path / "nb.ipynb").write_text("{}")
    snap = tmp_path.parent / f"{tmp_path.name}-snap.json"
    assert tree_state.main(["save", str(snap)], root=tmp_path) == 0
    assert tree_state.main(["check", str(snap)], root=tmp_path) == 0
    (tmp_path / "nb.ipynb").write_text('{"cells": []}')
    assert tree_state.main(["check", str(snap)], root=tmp_path) == 1
    assert "changed nb.ipynb" in capsys.readouterr().err


def test_shared_runs_start_each_configuration_once_and_hand_out_copies(monkeypatch):
    """tests/shared_runs.py: two asks for one resolved configuration (with or without
    `return_params`, default recipe spelled out or not) start one run; edits stay with the caller."""
    import zeroedu.train
    from zeroedu.train import RunConfig

    from .shared_runs import SharedRuns

    started = []
    monkeypatch.setattr(zeroedu.train, "run", lambda cfg: started.append(cfg) or {"ranks": [{"x": 1}]})
    runs = SharedRuns()
    a = runs(RunConfig("zero2", 2, steps=5, model="mlp"))
    a["ranks"][0]["x"] = 99
    b = runs(RunConfig("zero2", 2, steps=5, model="mlp", return_params=True, recipe=None))
    c = runs(RunConfig("zero2", 2, steps=4, model="mlp"))
    assert len(started) == runs.started == 2 and all(cfg.return_params for cfg in started)
    assert b == {"ranks": [{"x": 1}]} and c is not b
