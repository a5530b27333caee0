"""Start N ranks and run jobs on them: the "N GPUs" of the suite.

Two ways to get ranks, one `RankContext` (see `zeroedu.runtime.rank`) for the job either way:

* **Local pool** (default): N processes on this machine, gloo over loopback on CPU, or NCCL with
  one GPU each when CUDA has at least N devices. Processes come from a forkserver that has
  already imported torch, so a rank starts in a fraction of a second instead of 1-2 s. The pool
  stays warm: `Pool.run` sends job after job to the same ranks (what lets a widget trigger a
  real run without start-up cost). Rendezvous goes through a TCPStore the parent owns on an
  ephemeral loopback port, so concurrent pools never collide or cross-talk; its listening
  socket is bound to 127.0.0.1 here (TCPStore alone would listen on every interface).
* **torchrun**: `run_torchrun` uses the environment torchrun sets (RANK, WORLD_SIZE,
  MASTER_ADDR, ...), so the same job runs across GPUs and nodes.

A job is an importable function ``fn(ctx, **kwargs)`` returning plain picklable data.

Failure handling: a rank that raises sends its traceback; a rank that dies is seen through its
exit code; a rank that hangs (say, waiting in a collective for a peer that raised) is caught by a
deadline. In every case the parent kills the whole pool, so no orphan remains, and raises one
`RankError` naming the rank with its traceback and log tail. The next run starts a fresh pool.
An interrupted job (Ctrl-C, a notebook's stop button) kills the pool's ranks at once, since they
are still inside it; ranks ignore SIGINT themselves, so a terminal's Ctrl-C, which reaches the
whole process group, leaves nothing for the next job to mistake for its own failure.
Each rank writes stdout/stderr to its own log file, up to `LOG_CAP` bytes (16 MiB; later output
is dropped, and the log says so); `Pool.logs()` returns them in rank order. The
folder a pool makes for them is removed when the pool closes after jobs that worked (a warm pool
closes with its process) and kept, named in the error, when a rank failed.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import math
import multiprocessing as mp
import os
import queue
import shutil
import signal
import socket
import sys
import tempfile
import time
from typing import Any, Callable

# Re-exported: callers start ranks here and may need the rank side's names.
from .links import create_board
from .rank import (LOG_CAP, JobStopped, Limits, RankContext, choose_backend, loopback_interface,  # noqa: F401
                   RendezvousFailed, stale_torchrun_variables, under_torchrun, worker_main)
from .rank import run_torchrun as _run_torchrun

MAX_LOCAL_RANKS = 16
DEFAULT_TIMEOUT = 60.0


def _start_hint(pool) -> str:
    """Ranks start by forkserver and import the caller's main module again: a script that starts
    runs at import time (no `if __name__ == "__main__":`) makes every rank die while starting."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if not getattr(pool, "_starting", False) or not main_file:
        return ""
    return (f"; the ranks died while starting: if {os.path.basename(main_file)} calls zeroedu at "
            "import time, put that under `if __name__ == \"__main__\":` (each rank imports the "
            "main module again)")


LOG_PREFIX = "zeroedu-ranks-"
OWNER_FILE, KEPT_FILE = ".owner", ".kept"


def _identity(pid: int) -> str:
    """A process's pid and start time (clock ticks since boot, /proc/<pid>/stat field 22): a
    pid reused by another process after a reboot or wrap-around does not match."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f"{pid} {f.read().rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        return f"{pid} ?"


_swept = False
MIN_FREE_BYTES = 64 << 20  # rank logs (up to LOG_CAP each, usually KBs), the board, sockets


def check_temp_dir() -> str:
    """The temporary folder the ranks' logs go to, checked before any rank starts: a TMPDIR
    that cannot take a file is not swapped for /tmp behind the user's back (Python's `tempfile`
    does that), and a folder with under 64 MiB free is refused, instead of a rank that dies
    writing its log ("exited with code 1", an empty log)."""
    given = os.environ.get("TMPDIR")
    if given and not (os.path.isdir(given) and os.access(given, os.W_OK | os.X_OK)):
        raise ValueError(f"TMPDIR={given} is not a folder this process can write (rank logs go there); "
                         "point TMPDIR at one, or unset it")
    root = given or tempfile.gettempdir()
    try:
        st = os.statvfs(root)
    except OSError:
        return root
    free = st.f_bavail * st.f_frsize
    if free < MIN_FREE_BYTES:
        raise ValueError(f"the temporary folder {root} has {free / 2**20:.1f} MiB free; the ranks' logs need at "
                         f"least {MIN_FREE_BYTES >> 20} MiB there: free some space or set TMPDIR to another folder")
    return root


def sweep_stale_log_dirs(root: str | None = None) -> list[str]:
    """Remove the rank-log folders (`zeroedu-ranks-*` in the temporary folder) whose pool's
    process is gone without closing it (SIGTERM, SIGKILL, a crash): nothing names them. A folder
    a failed run kept (named in its error) stays, and so does one whose owner is unknown. Runs
    once per process, at the first pool's start (or on request with `root`); returns what went."""
    global _swept
    if root is None:
        if _swept:
            return []
        _swept = True
    root = root or tempfile.gettempdir()
    gone = []
    try:
        names = [n for n in os.listdir(root) if n.startswith(LOG_PREFIX)]
    except OSError:
        return gone
    for name in names:
        d = os.path.join(root, name)
        try:
            if os.path.exists(os.path.join(d, KEPT_FILE)):
                continue
            with open(os.path.join(d, OWNER_FILE)) as f:
                owner = f.read().strip()
            pid = int(owner.split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if pid != os.getpid() and _identity(pid) != owner:
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
    return gone


def _state(pid: int | None) -> str:
    """A process's state letter from /proc (R, S, D, T stopped, t traced, Z); "" if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError, TypeError):
        return ""


class RankError(RuntimeError):
    """One rank failed; `rank` names it and `detail` carries its traceback or exit reason;
    `type` is the class of the exception it raised ("module.Class"; None if it raised none)."""

    def __init__(self, rank: int | None, kind: str, detail: str, log_tail: str = "", type_: str | None = None):
        self.rank, self.kind, self.detail, self.log_tail, self.type = rank, kind, detail, log_tail, type_
        who = f"rank {rank}" if rank is not None else "ranks"
        msg = f"{who} {kind}:\n{detail.rstrip()}"
        if log_tail.strip():
            msg += f"\n--- log of {who} (tail) ---\n{log_tail.rstrip()}"
        super().__init__(msg)
        self.log_dir: str | None = None  # where every rank's log is kept, when the pool kept them

    def summary(self) -> str:
        """One line: who, what happened, the cause (the exception's own line from the end of
        the traceback, or the first line of the reason) and where the logs are."""
        lines = [ln.strip() for ln in self.detail.strip().splitlines() if ln.strip()]
        tb = [ln for ln in self.detail.splitlines() if ln and not ln[0].isspace() and not ln.startswith("Traceback")]
        cause = (tb[-1] if self.type and tb else lines[0] if lines else "no detail").strip()
        if len(cause) > 400:
            cause = cause[:400] + " ..."
        who = f"rank {self.rank}" if self.rank is not None else "ranks"
        where = f" (logs: {self.log_dir})" if self.log_dir else ""
        return f"{who} {self.kind}: {cause}{where}"


class RunStopped(RankError):
    """A rank ended the job on purpose (`rank.JobStopped`, e.g. a non-finite loss): the message
    says why, with no traceback. `reason` is the job's own message, `type` its class name."""

    def __init__(self, rank: int, reason: str, type_: str = "JobStopped"):
        self.reason = reason
        super().__init__(rank, "stopped the run", reason, type_=type_)


def blame(errors: dict[int, dict], dead: dict[int, int], waiting_for: set[int]) -> tuple[int, str]:
    """The rank that caused a failed job, and how: ("raised") the lowest rank whose own code
    raised, i.e. whose exception is not a collective's (`rank.failure` says which, by the
    exception's type); else ("exited") the lowest rank that died; else ("hung") the lowest rank
    that never reported while its peers' collectives failed; else ("collective") the lowest rank
    whose collective failed."""
    own = sorted(r for r, e in errors.items() if not e["collective"])
    if own:
        return own[0], "raised"
    if dead:
        return min(dead), "exited"
    if waiting_for - set(errors):
        return min(waiting_for - set(errors)), "hung"
    return min(errors), "collective"


def fn_ref(fn: Callable | str) -> str:
    """A function as "module:qualname", the form ranks import it by. A function of a script run
    as ``__main__`` is named by the script's module (``python -m pkg.mod`` or ``python mod.py``
    from the script's folder), which the ranks import afresh; a notebook cell's cannot be."""
    if isinstance(fn, str):
        return fn
    mod = fn.__module__
    if mod == "__main__":
        import sys

        main = sys.modules["__main__"]
        spec = getattr(main, "__spec__", None)
        path = getattr(main, "__file__", None)
        if spec is not None and spec.name and spec.name != "__main__":
            mod = spec.name
        elif path and os.path.dirname(os.path.abspath(path)) in [os.path.abspath(p or ".") for p in sys.path]:
            mod = os.path.splitext(os.path.basename(path))[0]
    if "<locals>" in fn.__qualname__ or mod == "__main__":
        raise ValueError(f"{fn.__qualname__} must be importable (defined at module level in a "
                         "package), not in a notebook cell or __main__: ranks import it by name")
    return f"{mod}:{fn.__qualname__}"


def _loopback_listener() -> int:
    """A listening TCP socket on 127.0.0.1 (a free port), as a file descriptor the store takes
    over: detached, so Python never closes it under the store's feet."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(MAX_LOCAL_RANKS + 1)
    except OSError:
        sock.close()
        raise
    return sock.detach()


def _mp_context():
    ctx = mp.get_context("forkserver")
    # Ranks fork from a server that has torch imported already: ~0.1 s per rank instead of ~1.5 s.
    # torch._dynamo too: a rank's first backward imports it (torch/_compile.py's `_disable_dynamo`
    # wraps autograd's `_make_grads`, torch 2.13), 2.3 s of CPU in every rank of every new pool.
    ctx.set_forkserver_preload(["torch", "torch.distributed", "zeroedu.runtime.rank", "zeroedu.runtime.ledger",
                                "zeroedu.runtime.comm", "zeroedu.train.runner", "torch._dynamo"])
    return ctx


def check_timeout(timeout):
    """A job's time limit: None (the pool's) or a finite number of seconds > 0. Zero, a negative
    number, NaN or infinity is refused: none of them is a limit a run can keep."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) \
            or timeout <= 0:
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
    return timeout


def _exit_kind(code: int, limits: Limits | None) -> str:
    """How a rank process ended, in words: its exit code, or the signal that ended it."""
    if code is None or code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    if name == "SIGXCPU" and limits is not None and limits.cpu_seconds is not None:
        return f"was killed by SIGXCPU: it used more than its {limits.cpu_seconds} s of CPU time"
    return f"was killed by {name}"


class Pool:
    """N warm ranks that run job after job. Use as a context manager or call `close()`."""

    def __init__(self, n: int, backend: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                 log_dir: str | None = None, log_cap: int = LOG_CAP, limits: Limits | None = None):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"world size must be an integer >= 1, got {n!r}")
        if n > MAX_LOCAL_RANKS:
            raise ValueError(f"world size {n} is more than the local rank limit {MAX_LOCAL_RANKS}; "
                             "use torchrun for more ranks")
        self.n, self.timeout = n, check_timeout(timeout) or DEFAULT_TIMEOUT
        self._limit = self.timeout  # the current job's limit (`run(timeout=...)`), for messages
        self.backend = backend or choose_backend(n)
        if self.backend == "gloo":
            loopback_interface()  # none found: one error here, not one from every rank
        # The pool owns a log folder it made: removed when it closes after jobs that worked,
        # kept (and named in the error) when a rank failed, for the reader to look into.
        self._own_logs, self._failed = log_dir is None, False
        if log_dir is None:
            check_temp_dir()
            sweep_stale_log_dirs()
        self.log_dir = log_dir or tempfile.mkdtemp(prefix=LOG_PREFIX)
        if self._own_logs:  # who made it, so a later start can tell a folder whose parent died
            with open(os.path.join(self.log_dir, OWNER_FILE), "w") as f:
                f.write(_identity(os.getpid()))
        self.log_paths = [os.path.join(self.log_dir, f"rank{r}.log") for r in range(n)]
        self.log_cap = log_cap  # bytes each rank's log keeps (`rank.LOG_CAP`); later output is dropped
        self.limits = limits  # CPU and memory limits every rank sets on itself (`rank.Limits`)
        self._job = 0
        self.closed = True
        self.start_seconds = 0.0
        self._start()

    def _start(self):
        import torch.distributed as dist

        t0 = time.perf_counter()
        ctx = _mp_context()
        # The parent owns the rendezvous on a free loopback port. TCPStore's host names where
        # clients connect, not where the server binds (it binds every interface), so the
        # listening socket is made here, bound to 127.0.0.1, and handed over as master_listen_fd.
        self._store = dist.TCPStore("127.0.0.1", 0, self.n + 1, is_master=True,
                                    wait_for_workers=False, master_listen_fd=_loopback_listener(),
                                    timeout=datetime.timedelta(seconds=self.timeout))
        self._results = ctx.Queue()
        self._tasks = [ctx.SimpleQueue() for _ in range(self.n)]
        self.procs = []
        create_board(self.log_dir, self.n)  # emulated links' clock (`links`): a small file
        for r in range(self.n):
            open(self.log_paths[r], "w").close()
            p = ctx.Process(target=worker_main, daemon=True, name=f"zeroedu-rank{r}",
                            args=(r, self.n, self.backend, self._store.port, os.getpid(),
                                  self.log_paths[r], self.timeout, self._tasks[r], self._results,
                                  self.log_cap, self.limits))
            p.start()
            self.procs.append(p)
        self.closed = False
        self._starting = True
        ready = set()
        deadline = time.monotonic() + self.timeout
        try:
            while len(ready) < self.n:
                # a message's kind (ready, result, error, ...): the pool's own protocol, not an EventKind
                message, rank, _, payload = self._next(deadline, waiting_for=set(range(self.n)) - ready)
                if message == "ready":
                    ready.add(rank)
        except RankError:
            raise
        except BaseException:
            self.close(force=True)  # interrupted while the ranks started: none is left behind
            raise
        self._starting = False
        self.start_seconds = time.perf_counter() - t0

    # -------------------------------------------------------------- plumbing
    def _tail(self, rank: int, chars: int = 2000) -> str:
        try:
            with open(self.log_paths[rank]) as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def _next(self, deadline: float, waiting_for: set[int]):
        while True:
            try:
                msg = self._results.get(timeout=0.1)
            except queue.Empty:
                msg = None
            if msg is not None and msg[2] not in (-1, self._job):
                continue  # a message of a job this pool no longer runs (start-up is job -1)
            if msg is not None:
                if msg[0] in ("error", "stopped"):
                    self._diagnose({msg[1]: msg[3]}, waiting_for)
                return msg
            dead = {r for r, p in enumerate(self.procs) if p.exitcode is not None}
            if dead:
                self._diagnose({}, waiting_for)
            if time.monotonic() > deadline:
                hung = sorted(waiting_for)
                stopped = [r for r in hung if _state(self.procs[r].pid) in ("T", "t")]
                if stopped:  # stopped by a signal or a debugger: its peers only wait for it
                    r = stopped[0]
                    self._fail(RankError(r, f"did not finish within {self._limit:g} s",
                                         f"rank {r} (pid {self.procs[r].pid}) is stopped (SIGSTOP, Ctrl-Z or a "
                                         "debugger) and never resumed; the other ranks waited for it",
                                         self._tail(r)))
                first = hung[0] if len(hung) == 1 else None
                self._fail(RankError(first, f"did not finish within {self._limit:g} s",
                                     f"no result from rank(s) {hung}: hung (e.g. waiting in a "
                                     "collective for a peer that never arrived); raise --timeout "
                                     "(timeout=) if the job needs longer",
                                     self._tail(hung[0]) if hung else ""))

    # When one rank fails, its peers soon fail too (a collective whose peer is gone). Collect for
    # a moment, then blame the root cause (`blame`): a rank's own exception first, then a rank
    # that died, and only then a collective's failure seen by a bystander.
    def _diagnose(self, errors: dict[int, dict], waiting_for: set[int], grace: float = 1.0):
        end = time.monotonic() + grace
        while time.monotonic() < end:
            try:
                kind, rank, job_id, payload = self._results.get(timeout=0.05)
            except queue.Empty:
                continue
            if kind in ("error", "stopped") and job_id in (-1, self._job):
                errors.setdefault(rank, payload)
        stopped = {r: p for r, p in errors.items() if "traceback" not in p}
        if stopped:  # a rank stopped the job on purpose: its reason, not its peers' fallout
            r = min(stopped)
            err = RunStopped(r, stopped[r]["message"], stopped[r]["type"])
            err.also = sorted(set(errors) - {r})
            self._fail(err)
        dead = {r: p.exitcode for r, p in enumerate(self.procs)
                if p.exitcode is not None and r not in errors}
        others = lambda r: sorted((set(errors) | set(dead)) - {r})  # noqa: E731
        r, why = blame(errors, dead, waiting_for)
        if why == "raised":
            err = RankError(r, "raised", errors[r]["traceback"], self._tail(r), type_=errors[r]["type"])
        elif why == "exited":
            err = RankError(r, _exit_kind(dead[r], self.limits),
                            "the process ended without reporting a result "
                            "(killed, os._exit, or a crash in native code)" + _start_hint(self), self._tail(r))
        elif why == "hung":
            hung = sorted(waiting_for - set(errors))
            err = RankError(r, f"did not finish within {self._limit:g} s",
                            f"rank(s) {hung} never reached the collective their peers timed out "
                            f"in (hung); the peers reported:\n{errors[min(errors)]['traceback']}",
                            self._tail(r))
        else:  # only collectives failed, and every rank reported: the first one's
            err = RankError(r, "raised", errors[r]["traceback"], self._tail(r), type_=errors[r]["type"])
        err.also = others(r)  # ranks that failed as a consequence
        self._fail(err)

    def _fail(self, err: RankError):
        self._failed = True
        if self._own_logs:
            err.args = (f"{err.args[0]}\n(every rank's log is kept in {self.log_dir})",)
            err.log_dir = self.log_dir
            with contextlib.suppress(OSError):  # named in the error: never swept
                open(os.path.join(self.log_dir, KEPT_FILE), "w").close()
        self.close(force=True)
        raise err

    # -------------------------------------------------------------- public
    def run(self, fn: Callable | str, kwargs: dict | None = None,
            on_event: Callable[[dict], None] | None = None, timeout: float | None = None) -> list[Any]:
        """Run `fn(ctx, **kwargs)` on every rank; return the results in rank order."""
        if self.closed:
            raise RuntimeError("this pool is closed; start a new one (zeroedu.runtime.cluster.get_pool does)")
        limit = self.timeout if check_timeout(timeout) is None else timeout
        self._job += 1
        job = self._job
        ref = fn_ref(fn)
        for q in self._tasks:
            q.put((job, ref, dict(kwargs or {})))
        out: dict[int, Any] = {}
        self._limit = limit
        deadline = time.monotonic() + limit
        try:
            while len(out) < self.n:
                kind, rank, job_id, payload = self._next(deadline, set(range(self.n)) - set(out))
                if job_id != job:
                    continue
                if kind == "event":
                    # A job that streams is alive: its deadline runs from its latest message, so
                    # a long run is not mistaken for a hung one while a silent rank still is.
                    deadline = max(deadline, time.monotonic() + limit)
                    if on_event is not None:
                        on_event(payload)
                elif kind == "result":
                    out[rank] = payload
        except RankError:
            raise  # the pool is closed already, its logs kept
        except BaseException:
            # Interrupted (Ctrl-C, a notebook's stop button) or an on_event callback raised: the
            # ranks are still inside this job, perhaps halfway through a collective, so no later
            # job could trust them. Kill them now (no graceful wait); the next run starts afresh.
            self.close(force=True)
            raise
        return [out[r] for r in range(self.n)]

    def logs(self) -> list[str]:
        """Each rank's log, in rank order (never interleaved)."""
        return [self._tail(r, chars=1 << 30) for r in range(self.n)]

    def close(self, force: bool = False):
        if self.closed:
            return
        self.closed = True
        if not force:
            for q in self._tasks:
                q.put(None)
            for p in self.procs:
                p.join(timeout=5)
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=5)
        self._results.close()
        self._results.cancel_join_thread()
        if self._own_logs and not self._failed:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close(force=True)
        except Exception:
            pass


_POOLS: dict[tuple[int, str, Limits | None], Pool] = {}


def get_pool(n: int, backend: str | None = None, limits: Limits | None = None) -> Pool:
    """A warm pool of `n` ranks, reused across calls (a notebook keeps paying start-up once);
    pools with `limits` (`rank.Limits`) are kept apart from those without."""
    key = (n, backend or choose_backend(n), limits)
    pool = _POOLS.get(key)
    if pool is None or pool.closed:
        pool = _POOLS[key] = Pool(n, backend=key[1], limits=limits)
    return pool


def shutdown_pools(where: Callable[[Limits | None], bool] | None = None) -> None:
    """Close the warm pools (those whose limits `where` accepts, when given)."""
    for key in list(_POOLS):
        if where is None or where(key[2]):
            _POOLS.pop(key).close()


def rank_pids() -> list[int]:
    """The processes of every rank of the warm pools still open."""
    return [p.pid for pool in _POOLS.values() if not pool.closed for p in pool.procs if p.pid]


@atexit.register
def _close_pools_at_exit() -> None:
    # The warm pools end with the process that kept them (a kernel, a script), logs with them.
    for p in list(_POOLS.values()):
        p.close(force=True)


def run_torchrun(fn: Callable | str, kwargs: dict | None = None, timeout: float | None = None) -> list[Any] | None:
    """`rank.run_torchrun`, with a rendezvous that failed (peers that never came within
    `timeout`) raised as a `RankError` naming this rank, like a local rank's failure."""
    try:
        return _run_torchrun(fn, kwargs, timeout=check_timeout(timeout))
    except RendezvousFailed as e:
        raise RankError(e.rank, "could not meet its peers", str(e), type_=e.type) from None


def run(fn: Callable | str, n: int, kwargs: dict | None = None, *, warm: bool = True,
        on_event: Callable[[dict], None] | None = None, timeout: float | None = None) -> list[Any]:
    """Run a job on `n` local ranks (a warm pool by default) and return per-rank results."""
    if warm:
        return get_pool(n).run(fn, kwargs, on_event=on_event, timeout=timeout)
    with Pool(n) as pool:
        return pool.run(fn, kwargs, on_event=on_event, timeout=timeout)


