"""`make test`: every stage of the suite, timed, then the working tree checked.

Stages, in order (each runs even when an earlier one failed, so one run shows everything):
  1. tests       pytest tests/ but the browser check: unit, multi-rank, CLI, grading
  2. notebooks   nbval on notebooks/solutions (the learner editions are generated from them);
                 every run is real, and each report is recorded (tests/notebook_runs.py)
  3. browser     the browser check: the learner editions in JupyterLab, their widgets rendered;
                 a run recorded in stage 2 is replayed, any other runs for real
  4. tree        tests/tree_state.py: no file git sees was changed, created or removed

Extra arguments go to stages 1 and 3 (``make test PYTEST_ARGS="-x -k fsdp"``). Exit status 1
when any stage failed; the summary names the stage and how long each took.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import notebook_runs  # noqa: E402
import tree_state  # noqa: E402

NO_TESTS_COLLECTED = 5  # pytest's status when -k/-m arguments select nothing in a stage


def _cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy (Linux's /proc/stat; 0 elsewhere). The
    machine's, not our descendants': rank pools outlive the pytest process that started them,
    so getrusage would miss them; the suite is meant to run alone."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _stage(name: str, cmd: list[str], results: list, env: dict | None = None) -> None:
    print(f"\n== {name}: {' '.join(cmd)}", flush=True)
    t0, c0 = time.monotonic(), _cpu_seconds()
    rc = subprocess.run(cmd, cwd=ROOT, env=None if env is None else {**os.environ, **env}).returncode
    wall, cpu = time.monotonic() - t0, _cpu_seconds() - c0
    # How many cores the stage kept busy on average: near the machine's count, only less work
    # makes it faster; well below it, the stage waits (start-ups, timers, the browser).
    print(f"== {name}: {wall:.0f} s, the machine {cpu / max(wall, 1e-9):.2f} of {os.cpu_count()} cores busy",
          flush=True)
    results.append((name, 0 if rc == NO_TESTS_COLLECTED else rc, wall))


def main(extra: list[str]) -> int:
    py = sys.executable
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        snap = f.name
    tree_state.main(["save", snap])
    results: list[tuple[str, int, float]] = []
    t_all = time.monotonic()
    # --durations: the slowest items are printed every time, so a test that breaks the budget
    # (tests/README.md) is named in the run that added it.
    _stage("tests", [py, "-m", "pytest", "-q", "--durations=10", "-m", "not browser", "tests", *extra], results)
    shared = tempfile.mkdtemp(prefix="zeroedu-notebook-runs-")
    dirs = {mode: notebook_runs.ipython_dir(mode, shared) for mode in notebook_runs.MODES}
    if sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb")):
        _stage("notebooks", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval",
                             "--nbval-sanitize-with", "notebooks/sanitize.cfg", "--nbval-cell-timeout=300", "--durations=5",
                             "notebooks/solutions"], results, env={"IPYTHONDIR": dirs["record"]})
    _stage("browser", [py, "-m", "pytest", "-q", "-m", "browser", "tests", *extra], results,
           env={"IPYTHONDIR": dirs["replay"]})
    c = notebook_runs.counts(shared)
    print(f"\nruns shared between the notebook stages: {c['recorded']} recorded by nbval, "
          f"{c['replayed']} replayed and {c['live']} run live in the browser", flush=True)
    for d in (shared, *dirs.values()):
        shutil.rmtree(d, ignore_errors=True)
    t0 = time.monotonic()
    print("\n== tree: the working tree against its state before the run", flush=True)
    results.append(("tree", tree_state.main(["check", snap]), time.monotonic() - t0))
    Path(snap).unlink(missing_ok=True)
    print("\nmake test:", ", ".join(f"{n} {'ok' if rc == 0 else 'FAILED'} {int(s // 60)} min {int(s % 60):02d} s"
                                   for n, rc, s in results), f"(total {time.monotonic() - t_all:.0f} s)")
    return 0 if all(rc == 0 for _, rc, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
