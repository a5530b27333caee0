"""Runs shared between the two notebook stages of `make test`: the solutions record, the learner
editions in the browser replay.

Both stages execute the same notebooks (a learner's edition is its solution with the exercise
answers taken out, `tests/test_exercises.py`), so without sharing every lesson's run happens
twice in one `make test`. The nbval stage runs every solution for real and records each report
of `zeroedu.train.run`, keyed by the run's resolved configuration (a configuration a later cell or
notebook asks again is handed the same report: it runs once per stage); the browser stage, which
checks that the learner's editions run without an error and that their widgets render, is handed
the recorded report for a configuration it has seen and runs everything else for real; the same
for a rank job started with `zeroedu.runtime.cluster.run` (a collective, torch's DDP or
`fully_shard`), keyed by job, world size and arguments. What is never replayed:

* a run with a live stream (`on_event`: the run panel's button, whose live plot the browser
  check screenshots) or on a caller's pool;
* a run whose configuration names code in the notebook itself (`__main__:...`: a custom model, a
  job or a strategy variant the learner may have edited), or holds an object without a stable
  text;
* a run on a pool the notebook holds (`Pool.run`);
* a run that raised (only returned reports are recorded).

Under the suite a time lesson's live run (`time_lessons.run_lesson`, an output nbval ignores: times
vary with the machine) runs quick: the configurations of `time_lessons.QUICK`, the fewest that
still show the lesson's effect, a warm-up and one measured step each. Those cells otherwise take 15-35 s each on
a quiet machine and over nbval's 300-s cell limit on a busy one; the asserting cells read the
committed results either way, and `benchmarks/bench_lessons.py` runs every configuration.

Outside `make test` nothing is installed: `make lab`, nbval and the browser check on their own
run every cell for real. `tests/run_suite.py` installs it into each stage's kernels through an
IPython start-up file (a temporary IPYTHONDIR), so the package itself holds no test hook.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

MODES = ("record", "replay")
STARTUP = """\
import importlib.util as _u
_s = _u.spec_from_file_location("zeroedu_notebook_runs", {path!r})
_m = _u.module_from_spec(_s)
_s.loader.exec_module(_m)
_m.install({mode!r}, {folder!r})
del _u, _s, _m
"""


def key(cfg) -> str | None:
    """A training run's identity: its resolved configuration (None: never shared, see above)."""
    from zeroedu.train import config_to_dict

    return _digest(config_to_dict(cfg.resolved()))


def job_key(fn, n: int, kwargs: dict | None) -> str | None:
    """A rank job's identity (`cluster.run`): the job by name, the world size, its arguments."""
    name = fn if isinstance(fn, str) else f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', '?')}"
    return _digest({"job": name, "n": n, "kwargs": kwargs or {}})


def _digest(what: dict) -> str | None:
    text = json.dumps(what, sort_keys=True, default=repr)
    # code in the notebook itself, or an object without a stable text (its repr names an address)
    if "__main__" in text or " at 0x" in text:
        return None
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def install(mode: str, folder: str) -> None:
    """Wrap `zeroedu.train.run` and `zeroedu.runtime.cluster.run` in this process to record into
    or replay from `folder`."""
    import torch

    import zeroedu.train
    import zeroedu.train.launch as launch
    from zeroedu.notebook import time_lessons
    from zeroedu.reports import RunReport, vouch
    from zeroedu.runtime import cluster

    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    store = Path(folder)
    depth = [0]  # a training run's own rank job is part of that run, not a second record

    def _count(what: str) -> None:
        with open(store / f"{what}.count", "a") as f:  # one line per run, from any kernel
            f.write(f"{os.getpid()}\n")

    def shared(real, k, call):
        outer = depth[0] == 0
        path = store / f"{k}.pt" if (k and outer) else None
        if path is not None and path.exists():
            # replay: nbval made this run; record: an earlier cell or notebook of this stage made the
            # same run (the same resolved configuration gives the same report), so it runs once
            _count("replayed" if mode == "replay" else "reused")
            out = torch.load(path, weights_only=False)
            if isinstance(out, RunReport):  # a run of this suite made it: the exercises' checks trust it
                vouch(out)
            return out
        depth[0] += 1
        try:
            out = call()
        finally:
            depth[0] -= 1
        if mode == "record" and path is not None:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            torch.save(out, tmp)
            tmp.replace(path)  # a whole record or none
            _count("recorded")
        elif mode == "replay" and outer:
            _count("live")
        return out

    real_run, real_job = launch.run, cluster.run

    def run(cfg, *, pool=None, on_event=None, warm=True, timeout=None, predict=False):
        k = None if (pool is not None or on_event is not None) else key(cfg)
        if k is not None and predict:  # a predicted run holds its calibration too: another record
            k = _digest({"run": k, "predict": True})
        return shared(real_run, k, lambda: real_run(cfg, pool=pool, on_event=on_event, warm=warm, timeout=timeout,
                                                    predict=predict))

    def run_job(fn, n, kwargs=None, *, warm=True, on_event=None, timeout=None):
        k = None if on_event is not None else job_key(fn, n, kwargs)
        return shared(real_job, k, lambda: real_job(fn, n, kwargs, warm=warm, on_event=on_event, timeout=timeout))

    real_lesson = time_lessons.run_lesson

    def run_lesson(name, **kw):
        return real_lesson(name, **{**kw, "quick": True})

    run_lesson.__doc__, run_lesson.__wrapped__ = real_lesson.__doc__, real_lesson
    time_lessons.run_lesson = run_lesson
    run.__doc__, run.__wrapped__ = real_run.__doc__, real_run
    run_job.__doc__, run_job.__wrapped__ = real_job.__doc__, real_job
    launch.run = zeroedu.train.run = run
    cluster.run = run_job


def ipython_dir(mode: str, folder: str) -> str:
    """A temporary IPYTHONDIR whose start-up file installs `mode` into every kernel started with it."""
    d = Path(tempfile.mkdtemp(prefix=f"zeroedu-ipython-{mode}-"))
    startup = d / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-zeroedu-notebook-runs.py").write_text(
        STARTUP.format(path=str(Path(__file__).resolve()), mode=mode, folder=str(folder)))
    return str(d)


def counts(folder: str) -> dict[str, int]:
    """Runs recorded, replayed and run live so far (lines of each count file)."""
    out = {}
    for what in ("recorded", "reused", "replayed", "live"):
        p = Path(folder, f"{what}.count")
        out[what] = len(p.read_text().splitlines()) if p.exists() else 0
    return out


if __name__ == "__main__":
    print(counts(sys.argv[1]))
