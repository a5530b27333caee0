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
    monkeypatch.setattr(zeroedu.train, "run", lambda cfg: started.append(cfg) or {"rows": [{"x": 1}]})
    runs = SharedRuns()
    a = runs(RunConfig("zero2", 2, steps=5, model="mlp"))
    a["rows"][0]["x"] = 99
    b = runs(RunConfig("zero2", 2, steps=5, model="mlp", return_params=True, recipe=None))
    c = runs(RunConfig("zero2", 2, steps=4, model="mlp"))
    assert len(started) == runs.started == 2 and all(cfg.return_params for cfg in started)
    assert b == {"rows": [{"x": 1}]} and c is not b


def test_notebook_runs_are_recorded_by_one_stage_and_replayed_by_the_next(monkeypatch, tmp_path):
    """tests/notebook_runs.py: what nbval's kernels record, the browser's kernels get back, equal
    and their own (and a later nbval kernel asking the same run); live streams, a caller's pool, code in `__main__` and unseen configurations run."""
    import torch

    import zeroedu.train
    import zeroedu.train.launch as launch
    from zeroedu.models import CustomModel
    from zeroedu.reports import RunReport, made_here
    from zeroedu.notebook import time_lessons
    from zeroedu.runtime import cluster
    from zeroedu.train import RunConfig

    from . import notebook_runs

    real = []

    def fake(cfg, *, pool=None, on_event=None, warm=True, timeout=None, predict=False):
        real.append(cfg)
        return {"losses": [float(len(real))], "params": [torch.full((2,), float(len(real)))]}

    jobs = []

    def fake_job(fn, n, kwargs=None, *, warm=True, on_event=None, timeout=None):
        jobs.append(fn)
        return [{"rank": r, "call": len(jobs)} for r in range(n)]

    for mode in notebook_runs.MODES:  # as two kernels would: each installs over the real run
        monkeypatch.setattr(launch, "run", fake)
        monkeypatch.setattr(zeroedu.train, "run", fake)
        monkeypatch.setattr(cluster, "run", fake_job)
        monkeypatch.setattr(time_lessons, "run_lesson", lambda name, **kw: (name, kw))
        notebook_runs.install(mode, str(tmp_path))
        # a time lesson's live run is the quick one, whatever the cell asks
        assert time_lessons.run_lesson("hybrid", steps=3) == ("hybrid", {"steps": 3, "quick": True})
        assert cluster.run("zeroedu.references.bench:loopback_job", 2) == [{"rank": 0, "call": 1},
                                                                          {"rank": 1, "call": 1}]
        cluster.run("__main__:my_job", 2)  # the notebook's own code: always run
        assert len(jobs) == (2 if mode == "record" else 3)
        cfg = RunConfig("zero2", 2, steps=2, model="mlp")
        first = zeroedu.train.run(cfg)
        if mode == "record":
            assert first["losses"] == [1.0] and len(real) == 1
            # the same run asked again in this stage (another cell or notebook) runs once, and a
            # report handed back counts as a run's for the exercises' checks (`reports.made_here`)
            assert zeroedu.train.run(cfg)["losses"] == [1.0] and len(real) == 1
            monkeypatch.setattr(launch, "run", lambda cfg, **kw: real.append(cfg) or RunReport.__new__(RunReport))
            notebook_runs.install(mode, str(tmp_path))
            made = zeroedu.train.run(RunConfig("zero1", 2, steps=2, model="mlp"))
            assert not made_here(made)  # the fake is no run; the report handed back next is
            again = zeroedu.train.run(RunConfig("zero1", 2, steps=2, model="mlp"))
            assert again is not made and made_here(again) and len(real) == 2
            real.pop()
            monkeypatch.setattr(launch, "run", fake)
            notebook_runs.install(mode, str(tmp_path))
            # with its prediction (a calibration run inside) the same configuration is another record
            assert zeroedu.train.run(cfg, predict=True)["losses"] == [2.0]
            zeroedu.train.run(cfg, on_event=print)  # a live run is never recorded
            continue
        assert len(real) == 3 and first["losses"] == [1.0]  # replayed, not run
        assert zeroedu.train.run(cfg, predict=True)["losses"] == [2.0] and len(real) == 3
        first["params"][0].add_(5)
        again = launch.run(RunConfig("zero2", 2, steps=2, model="mlp", recipe=cfg.resolved().recipe))
        assert torch.equal(again["params"][0], torch.ones(2))
        zeroedu.train.run(cfg, on_event=print)
        zeroedu.train.run(RunConfig("zero2", 2, steps=3, model="mlp"))
        custom = CustomModel("__main__:build", "__main__:batch")
        assert notebook_runs.key(RunConfig("ddp", 2, steps=2, model=custom)) is None
        assert len(real) == 5
    assert notebook_runs.counts(str(tmp_path)) == {"recorded": 4, "reused": 2, "replayed": 4, "live": 3}


def test_the_browser_stage_collects_every_browser_test():
    """`make test`'s browser stage collects one file (tests/run_suite.BROWSER_TESTS), not tests/:
    a test marked `browser` anywhere else would run in neither stage (stage 1 deselects it)."""
    import re
    from pathlib import Path

    from . import run_suite

    here = Path(__file__).resolve().parent
    marked = sorted(p.relative_to(here.parent).as_posix() for p in here.glob("test_*.py")
                    if re.search(r"pytest\.mark\.browser\b", p.read_text()))
    assert marked == [run_suite.BROWSER_TESTS]
