"""`make test`: every stage of the suite, timed, then the working tree checked.

Stages, in order (each runs even when an earlier one failed, so one run shows everything):
  1. tests       pytest tests/ but the browser check and LATE: unit, multi-rank, CLI, grading
  2. notebooks   nbval on notebooks/solutions (the learner editions are generated from them;
                 those the browser runs again share one kernel, tests/nbval_shared_kernel.py);
                 every run is real (a configuration asked again runs once), and each report is
                 recorded (tests/notebook_runs.py)
  3. browser     the browser check: the learner editions in JupyterLab, their widgets rendered;
                 a run recorded in stage 2 is replayed, any other runs for real
  4. tests (last) stage 1's files in LATE (the harness: more waiting than computing)
  5. tree        tests/tree_state.py: no file git sees was changed, created or removed

Stage 1 runs beside stages 2, 3 and 4 (which run in order: the browser replays what nbval recorded).
Each stage alone keeps about 1.5 of 2 cores busy, the rest waiting on rank start-ups, timers of
emulated links and the browser's page loads; side by side they fill both cores (1.8 of 2 busy),
and every process of the suite uses one intra-op thread (OMP_NUM_THREADS=1, see `main`): a
fresh clone's `make test` went from 14 minutes (stages in turn) to 12 (side by side) to 9.5
(one thread, bytecode compiled once, a run asked twice made once) on the 2-core machine
(budgets: tests/README.md). Stage 1 writes to test-artifacts/tests.log
and its output is printed when it ends. `--serial` (or ZEROEDU_SUITE_SERIAL=1, or one core) runs
the stages one after another, each printing as it goes. Debian's chromium, when missing, is
installed (`make browser-deps`) while the first stages run.

Extra arguments go to stages 1 and 3 (``make test PYTEST_ARGS="-x -k fsdp"``). Exit status 1
when any stage failed; the summary names the stage and how long each took.
"""
from __future__ import annotations

import compileall
import os
import shutil
import subprocess
import sys
import tempfile
import threading
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


class Stage:
    """One pytest run of the suite, started now; in the background its output goes to `log`."""

    def __init__(self, name: str, cmd: list[str], env: dict | None = None, log: Path | None = None):
        self.name, self.log = name, log
        print(f"\n== {name}: {' '.join(cmd)}" + (f" (beside the others; output: {log.relative_to(ROOT)})"
                                                  if log else ""), flush=True)
        out = None
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            out = open(log, "w")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=None if env is None else {**os.environ, **env},
                                     stdout=out, stderr=subprocess.STDOUT if out else None)
        if out is not None:
            out.close()  # the child holds its own copy
        # a background stage's time is until it ends, not until the suite gets round to asking
        self.t1: float | None = None
        self._watch = threading.Thread(target=self._ended, daemon=True)
        self._watch.start()

    def _ended(self) -> None:
        self.proc.wait()
        self.t1 = time.monotonic()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()

    def wait(self, results: list) -> None:
        rc = self.proc.wait()
        self._watch.join()
        wall = self.t1 - self.t0
        if self.log is not None:
            print(f"\n== {self.name} (ran beside the others), its output:", flush=True)
            sys.stdout.write(self.log.read_text(errors="replace"))
        print(f"== {self.name}: {wall:.0f} s", flush=True)
        results.append((self.name, 0 if rc == NO_TESTS_COLLECTED else rc, wall))


def _browser_deps() -> subprocess.Popen | None:
    """Debian's chromium for stage 3, installed in the background when missing (as root; otherwise
    the browser check fails naming the command to run)."""
    if os.path.exists("/usr/bin/chromium") or os.geteuid() != 0 or not shutil.which("make"):
        return None
    print("== installing Debian's chromium for the browser stage, beside the other stages", flush=True)
    return subprocess.Popen(["make", "-s", "browser-deps"], cwd=ROOT, stdout=subprocess.DEVNULL)


def main(argv: list[str]) -> int:
    serial = "--serial" in argv or os.environ.get("ZEROEDU_SUITE_SERIAL") == "1" or (os.cpu_count() or 1) < 2
    # One intra-op thread per process, for every stage (a value the caller set is kept). The
    # suite keeps many processes busy at once (two stages, their ranks, kernels); with torch's
    # default of one thread per core, a process's threads spin in OpenMP's barriers waiting for a
    # sibling the other processes keep off the cores: 180 of 1,175 core-seconds on 2 cores, and
    # the suite 638 -> 549 s. Ranks already use one thread each (`rank.worker_main`).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # A temporary folder of the suite's own, for every process it starts (ranks' logs, pytest's
    # tmp_path, kernels): checked empty at the end, then removed, so nothing the run made is left
    # in the machine's /tmp (before, about 26 rank-log folders per run stayed there).
    # (A short name: a Unix socket's path, multiprocessing's inside a test's tmp_path, has at most
    # 107 bytes.) Each pytest stage gets a base folder of its own there (BASETEMP), short too.
    tmp = tempfile.mkdtemp(prefix="zs-")
    os.environ["TMPDIR"] = tmp
    tempfile.tempdir = None  # read TMPDIR again
    # torch keeps a compile cache of its own in the temporary folder, made when torch._dynamo is
    # imported (Adam's first step does): the suite's goes with its other artifacts (git ignores them).
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / "test-artifacts" / "torchinductor"))
    # zeroedu's and the tests' bytecode, written once ahead (under __pycache__/, which git
    # ignores). With PYTHONDONTWRITEBYTECODE set, as on the machines this suite was timed on,
    # Python writes none itself, so every process the suite starts (a kernel, a CLI run, each
    # pool's forkserver and every rank importing past its preload) would compile the package's
    # 24,000 lines again: about 0.7 s of CPU each, hundreds of times.
    for folder, depth in ((ROOT / "zeroedu", 10), (ROOT / "tests", 0)):
        compileall.compile_dir(str(folder), maxlevels=depth, quiet=1, workers=0)
    # --no-browser: the unit, multi-rank and notebook stages only (`make test-cpus`, which runs
    # them under other CPUs' kernels; the browser replays what nbval recorded, on any CPU alike)
    browser = "--no-browser" not in argv
    extra = [a for a in argv if a not in ("--serial", "--no-browser")]
    py = sys.executable
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        snap = f.name
    tree_state.main(["save", snap])
    results: list[tuple[str, int, float]] = []
    t_all, c_all = time.monotonic(), _cpu_seconds()
    deps = _browser_deps() if browser else None
    # --durations: the slowest items are printed every time, so a test that breaks the budget
    # (tests/README.md) is named in the run that added it.
    tests = Stage("tests", [py, "-m", "pytest", "-q", "--durations=10", "-m", "not browser", *basetemp("tests"),
                            *(f"--ignore={f}" for f in LATE), "tests", *extra],
                  log=None if serial else ROOT / "test-artifacts" / "tests.log")
    try:
        return _rest(tests, serial, extra, snap, results, t_all, c_all, deps, browser)
    finally:
        tests.stop()  # an interrupted suite leaves no stage running
        shutil.rmtree(tmp, ignore_errors=True)


# Stage 1's files that run last, after the browser, beside the rest of stage 1: with nbval's
# shared kernel the notebook and browser stages end about two minutes before stage 1, which then
# has the machine to itself and keeps only 1.5 of its 2 cores busy. The harness's tests wait
# more than they compute (timeouts, killed ranks, torchrun's ranks starting), which the other
# stage's work fills. (Measured: stage 1 557 s beside the two notebook stages' 432 s.)
LATE = ("tests/test_harness.py",)
BROWSER_TESTS = "tests/test_browser.py"  # where every test marked `browser` lives (a test checks)
BASETEMP = {"tests": "t1", "notebooks": "t2", "browser": "t3", "tests (last)": "t4"}
KERNELS = "kernels"


def kernels_tmp() -> str:
    """The temporary folder of the notebook stages' kernels. nbval ends each notebook's kernel at
    once (`shutdown_kernel(now=True)`, a SIGKILL), and the browser stage's JupyterLab ends its
    kernels with the server, so nothing in a kernel can remove what it made there
    (multiprocessing's `pymp-*` socket folder, a warm pool's rank logs); the suite removes it."""
    path = os.path.join(tempfile.gettempdir(), KERNELS)
    os.makedirs(path, exist_ok=True)
    return path


def basetemp(stage: str) -> list[str]:
    """pytest's base folder for a stage's tmp_path, in the suite's temporary folder: one per stage,
    since pytest empties its base folder when it starts and two stages run side by side."""
    return ["--basetemp", os.path.join(tempfile.gettempdir(), BASETEMP[stage])]


def left_in_tmp(tmp: str) -> list[str]:
    """What the run left in its temporary folder, but the stages' pytest base folders (tmp_path:
    pytest keeps them after a run by design) and the killed kernels' folder (`kernels_tmp`); the
    suite removes them with the folder."""
    return sorted(name for name in os.listdir(tmp) if name not in (*BASETEMP.values(), KERNELS))


def _rest(tests: Stage, serial: bool, extra: list[str], snap: str, results: list, t_all: float, c_all: float,
          deps: subprocess.Popen | None, browser: bool = True) -> int:
    py = sys.executable
    if serial:
        tests.wait(results)
    shared = tempfile.mkdtemp(prefix="zeroedu-notebook-runs-")
    dirs = {mode: notebook_runs.ipython_dir(mode, shared) for mode in notebook_runs.MODES}
    if sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb")):
        # -p tests.nbval_shared_kernel: the notebooks the browser stage runs again in fresh
        # kernels share one kernel here (its docstring)
        Stage("notebooks", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.nbval_shared_kernel", "--nbval",
                            "--nbval-sanitize-with", "notebooks/sanitize.cfg", "--nbval-cell-timeout=300",
                            "--durations=5", *basetemp("notebooks"), "notebooks/solutions"],
              env={"IPYTHONDIR": dirs["record"], "TMPDIR": kernels_tmp()}).wait(results)
    if deps is not None and deps.wait() != 0:
        print("== chromium's install failed: the browser stage will say what is missing", flush=True)
    if browser:
        # its one file, not tests/: collecting every module imports torch and the package for
        # one item (16 core-s against 4 here)
        Stage("browser", [py, "-m", "pytest", "-q", "-m", "browser", *basetemp("browser"), BROWSER_TESTS, *extra],
              env={"IPYTHONDIR": dirs["replay"], "TMPDIR": kernels_tmp()}).wait(results)
    Stage("tests (last)", [py, "-m", "pytest", "-q", "--durations=5", "-m", "not browser", *basetemp("tests (last)"),
                          *LATE, *extra]).wait(results)
    c = notebook_runs.counts(shared)
    print(f"\nruns shared between the notebook stages: {c['recorded']} recorded by nbval "
          f"({c['reused']} asked again there), "
          f"{c['replayed']} replayed and {c['live']} run live in the browser", flush=True)
    if not serial:
        tests.wait(results)
    for d in (shared, *dirs.values()):
        shutil.rmtree(d, ignore_errors=True)
    t0 = time.monotonic()
    print("\n== tree: the working tree against its state before the run", flush=True)
    results.append(("tree", tree_state.main(["check", snap]), time.monotonic() - t0))
    Path(snap).unlink(missing_ok=True)
    left = left_in_tmp(tempfile.gettempdir())
    print(f"\n== tmp: the suite's temporary folder after the run: "
          f"{'empty' if not left else 'holds ' + ', '.join(left)}", flush=True)
    results.append(("tmp", 1 if left else 0, 0.0))
    wall, cpu = time.monotonic() - t_all, _cpu_seconds() - c_all
    # How many cores the run kept busy on average: near the machine's count, only less work makes
    # it faster; well below it, the run waits (start-ups, timers, the browser).
    print("\nmake test:", ", ".join(f"{n} {'ok' if rc == 0 else 'FAILED'} {int(s // 60)} min {int(s % 60):02d} s"
                                   for n, rc, s in results),
          f"(total {wall:.0f} s, {'one stage at a time' if serial else 'tests beside notebooks and browser'}; "
          f"the machine {cpu / max(wall, 1e-9):.2f} of {os.cpu_count()} cores busy)")
    return 0 if all(rc == 0 for _, rc, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
