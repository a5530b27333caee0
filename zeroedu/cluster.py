"""Start N ranks and run jobs on them: the "N GPUs" of the suite.

Three ways to get ranks, one `RankContext` for the job either way:

* **Local pool** (default): N processes on this machine, gloo over loopback on CPU, or NCCL with
  one GPU each when CUDA has at least N devices. Processes come from a forkserver that has
  already imported torch, so a rank starts in a fraction of a second instead of 1-2 s. The pool
  stays warm: `Pool.run` sends job after job to the same ranks (what lets a widget trigger a
  real run without start-up cost). Rendezvous goes through a TCPStore the parent owns on an
  ephemeral loopback port, so concurrent pools never collide or cross-talk.
* **torchrun**: `run_torchrun` uses the environment torchrun sets (RANK, WORLD_SIZE,
  MASTER_ADDR, ...), so the same job runs across GPUs and nodes.

A job is an importable function ``fn(ctx, **kwargs)`` returning plain picklable data.

Failure handling: a rank that raises sends its traceback; a rank that dies is seen through its
exit code; a rank that hangs (say, waiting in a collective for a peer that raised) is caught by a
deadline. In every case the parent kills the whole pool, so no orphan remains, and raises one
`RankError` naming the rank with its traceback and log tail. The next run starts a fresh pool.
Each rank writes stdout/stderr to its own log file; `Pool.logs()` returns them in rank order.
"""
from __future__ import annotations

import datetime
import importlib
import multiprocessing as mp
import os
import queue
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

MAX_LOCAL_RANKS = 16
DEFAULT_TIMEOUT = 60.0


class RankError(RuntimeError):
    """One rank failed; `rank` names it and `detail` carries its traceback or exit reason."""

    def __init__(self, rank: int | None, kind: str, detail: str, log_tail: str = ""):
        self.rank, self.kind, self.detail, self.log_tail = rank, kind, detail, log_tail
        who = f"rank {rank}" if rank is not None else "ranks"
        msg = f"{who} {kind}:\n{detail.rstrip()}"
        if log_tail.strip():
            msg += f"\n--- log of {who} (tail) ---\n{log_tail.rstrip()}"
        super().__init__(msg)


def choose_backend(n: int) -> str:
    forced = os.environ.get("ZEROEDU_BACKEND")
    if forced:
        return forced
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= n else "gloo"


@dataclass
class RankContext:
    """Everything a job needs to know about where it runs; passed in explicitly, never global."""

    rank: int
    world_size: int
    backend: str
    device: str
    job_id: int = 0
    _emit: Callable[[dict], None] | None = None
    _meshes: dict = field(default_factory=dict)

    def emit(self, msg: dict) -> None:
        """Stream a small message (e.g. a ledger event) to the parent while the job runs."""
        if self._emit is not None:
            self._emit(msg)

    def world_axis(self, name: str = "dp_shard"):
        from .comm import Axis

        return Axis(name, None, self.world_size, self.rank, tuple(range(self.world_size)))

    def mesh(self, m: int):
        """(outer, inner) axes of an M x N mesh; inner ranks are contiguous, so under torchrun
        the inner axis falls inside a node. Built once per shape with torch's DeviceMesh."""
        if m < 1 or self.world_size % m:
            raise ValueError(f"M = {m} must be >= 1 and divide the world size {self.world_size}")
        if m not in self._meshes:
            import torch.distributed as dist
            from torch.distributed.device_mesh import init_device_mesh

            from .comm import Axis

            n = self.world_size // m
            dev = "cuda" if self.device.startswith("cuda") else "cpu"
            mesh = init_device_mesh(dev, (m, n), mesh_dim_names=("dp_outer", "dp_shard"))
            axes = []
            for name in ("dp_outer", "dp_shard"):
                g = mesh.get_group(name)
                axes.append(Axis(name, g, mesh.size(mesh.mesh_dim_names.index(name)),
                                 mesh.get_local_rank(name), tuple(dist.get_process_group_ranks(g))))
            self._meshes[m] = (mesh, axes[0], axes[1])
        _, outer, inner = self._meshes[m]
        return outer, inner


def _resolve(fn: Callable | str) -> Callable:
    if callable(fn):
        return fn
    mod, _, name = fn.partition(":")
    obj = importlib.import_module(mod)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _fn_ref(fn: Callable | str) -> str:
    if isinstance(fn, str):
        return fn
    if "<locals>" in fn.__qualname__ or fn.__module__ == "__main__":
        raise ValueError(f"{fn.__qualname__} must be importable (defined at module level in a "
                         "package), not in a notebook cell or __main__: ranks import it by name")
    return f"{fn.__module__}:{fn.__qualname__}"


# ---------------------------------------------------------------------- the rank process
def _watch_parent(ppid: int) -> None:
    while True:
        time.sleep(1.0)
        try:
            os.kill(ppid, 0)
        except OSError:
            os._exit(3)  # parent gone: never linger as an orphan


def _worker(rank, n, backend, store_port, ppid, log_path, timeout, tasks, results):
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    threading.Thread(target=_watch_parent, args=(ppid,), daemon=True).start()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    # N ranks share a few cores: one intra-op thread each avoids oversubscription.
    torch.set_num_threads(1)
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    try:
        store = dist.TCPStore("127.0.0.1", store_port, n + 1, is_master=False,
                              timeout=datetime.timedelta(seconds=timeout))
        # Collectives give up before the parent's deadline, so peers of a hung rank report a
        # timeout and the parent can name the rank that never arrived.
        dist.init_process_group(backend, store=store, rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=max(1.0, 0.75 * timeout)))
    except Exception:
        results.put(("error", rank, -1, traceback.format_exc()))
        return
    results.put(("ready", rank, -1, None))
    ctx = RankContext(rank, n, backend, device)
    while True:
        task = tasks.get()
        if task is None:
            break
        job_id, fn_ref, kwargs = task
        ctx.job_id = job_id
        ctx._emit = lambda msg, j=job_id: results.put(("event", rank, j, msg))
        try:
            out = _resolve(fn_ref)(ctx, **kwargs)
        except BaseException:
            print(f"[job {job_id} failed]", flush=True)
            results.put(("error", rank, job_id, traceback.format_exc()))
            continue
        print(f"[job {job_id} done]", flush=True)  # before the result: the log is complete when the parent reads it
        results.put(("result", rank, job_id, out))
    try:
        dist.destroy_process_group()
    except Exception:
        pass


def _mp_context():
    ctx = mp.get_context("forkserver")
    # Ranks fork from a server that has torch imported already: ~0.1 s per rank instead of ~1.5 s.
    ctx.set_forkserver_preload(["torch", "torch.distributed", "zeroedu.ledger", "zeroedu.comm"])
    return ctx


class Pool:
    """N warm ranks that run job after job. Use as a context manager or call `close()`."""

    def __init__(self, n: int, backend: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                 log_dir: str | None = None):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"world size must be an integer >= 1, got {n!r}")
        if n > MAX_LOCAL_RANKS:
            raise ValueError(f"world size {n} is more than the local rank limit {MAX_LOCAL_RANKS}; "
                             "use torchrun for more ranks")
        self.n, self.timeout = n, timeout
        self.backend = backend or choose_backend(n)
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="zeroedu-ranks-")
        self.log_paths = [os.path.join(self.log_dir, f"rank{r}.log") for r in range(n)]
        self._job = 0
        self.closed = True
        self.start_seconds = 0.0
        self._start()

    def _start(self):
        import torch.distributed as dist

        t0 = time.perf_counter()
        ctx = _mp_context()
        # The parent owns the rendezvous: port 0 asks the kernel for a free loopback port.
        self._store = dist.TCPStore("127.0.0.1", 0, self.n + 1, is_master=True,
                                    wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=self.timeout))
        self._results = ctx.Queue()
        self._tasks = [ctx.SimpleQueue() for _ in range(self.n)]
        self.procs = []
        for r in range(self.n):
            open(self.log_paths[r], "w").close()
            p = ctx.Process(target=_worker, daemon=True, name=f"zeroedu-rank{r}",
                            args=(r, self.n, self.backend, self._store.port, os.getpid(),
                                  self.log_paths[r], self.timeout, self._tasks[r], self._results))
            p.start()
            self.procs.append(p)
        self.closed = False
        ready = set()
        deadline = time.monotonic() + self.timeout
        while len(ready) < self.n:
            kind, rank, _, payload = self._next(deadline, waiting_for=set(range(self.n)) - ready)
            if kind == "ready":
                ready.add(rank)
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
            if msg is not None:
                if msg[0] == "error":
                    self._diagnose({msg[1]: msg[3]}, waiting_for)
                return msg
            dead = {r for r, p in enumerate(self.procs) if p.exitcode is not None}
            if dead:
                self._diagnose({}, waiting_for)
            if time.monotonic() > deadline:
                hung = sorted(waiting_for)
                first = hung[0] if len(hung) == 1 else None
                self._fail(RankError(first, f"did not finish within {self.timeout:.0f} s",
                                     f"no result from rank(s) {hung}: hung (e.g. waiting in a "
                                     "collective for a peer that never arrived)",
                                     self._tail(hung[0]) if hung else ""))

    # When one rank fails, its peers soon fail too ("connection closed by peer" inside gloo).
    # Collect for a moment, then blame the root cause: a rank's own exception first, then a rank
    # that died, and only then a transport error seen by a bystander.
    _TRANSPORT = ("Connection closed by peer", "Connection reset", "Gloo", "gloo", "NCCL",
                  "ProcessGroup", "DistBackendError", "Broken pipe")

    def _diagnose(self, errors: dict[int, str], waiting_for: set[int], grace: float = 1.0):
        end = time.monotonic() + grace
        while time.monotonic() < end:
            try:
                kind, rank, _, payload = self._results.get(timeout=0.05)
            except queue.Empty:
                continue
            if kind == "error":
                errors.setdefault(rank, payload)
        own = {r: tb for r, tb in errors.items() if not any(k in tb for k in self._TRANSPORT)}
        dead = {r: p.exitcode for r, p in enumerate(self.procs)
                if p.exitcode is not None and r not in errors}
        others = lambda r: sorted(set(errors) | set(dead) - {r})  # noqa: E731
        if own:
            r = min(own)
            err = RankError(r, "raised", own[r], self._tail(r))
        elif dead:
            r = min(dead)
            err = RankError(r, f"exited with code {dead[r]}",
                            "the process ended without reporting a result "
                            "(killed, os._exit, or a crash in native code)", self._tail(r))
        elif waiting_for - set(errors):
            # Peers timed out inside a collective while these ranks said nothing: they hung.
            hung = sorted(waiting_for - set(errors))
            r = hung[0]
            err = RankError(r, f"did not finish within {self.timeout:.0f} s",
                            f"rank(s) {hung} never reached the collective their peers timed out "
                            f"in (hung); the peers reported:\n{errors[min(errors)]}", self._tail(r))
        else:
            r = min(errors)
            err = RankError(r, "raised", errors[r], self._tail(r))
        err.also = others(r)  # ranks that failed as a consequence
        self._fail(err)

    def _fail(self, err: RankError):
        self.close(force=True)
        raise err

    # -------------------------------------------------------------- public
    def run(self, fn: Callable | str, kwargs: dict | None = None,
            on_event: Callable[[dict], None] | None = None, timeout: float | None = None) -> list[Any]:
        """Run `fn(ctx, **kwargs)` on every rank; return the results in rank order."""
        if self.closed:
            raise RuntimeError("this pool is closed; start a new one (zeroedu.cluster.get_pool does)")
        self._job += 1
        job = self._job
        ref = _fn_ref(fn)
        for q in self._tasks:
            q.put((job, ref, dict(kwargs or {})))
        out: dict[int, Any] = {}
        deadline = time.monotonic() + (timeout or self.timeout)
        while len(out) < self.n:
            kind, rank, job_id, payload = self._next(deadline, set(range(self.n)) - set(out))
            if job_id != job:
                continue
            if kind == "event":
                if on_event is not None:
                    on_event(payload)
            elif kind == "result":
                out[rank] = payload
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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close(force=True)
        except Exception:
            pass


_POOLS: dict[tuple[int, str], Pool] = {}


def get_pool(n: int, backend: str | None = None) -> Pool:
    """A warm pool of `n` ranks, reused across calls (a notebook keeps paying start-up once)."""
    key = (n, backend or choose_backend(n))
    pool = _POOLS.get(key)
    if pool is None or pool.closed:
        pool = _POOLS[key] = Pool(n, backend=key[1])
    return pool


def shutdown_pools() -> None:
    for p in _POOLS.values():
        p.close()
    _POOLS.clear()


def run(fn: Callable | str, n: int, kwargs: dict | None = None, *, warm: bool = True,
        on_event: Callable[[dict], None] | None = None, timeout: float | None = None) -> list[Any]:
    """Run a job on `n` local ranks (a warm pool by default) and return per-rank results."""
    if warm:
        return get_pool(n).run(fn, kwargs, on_event=on_event, timeout=timeout)
    with Pool(n) as pool:
        return pool.run(fn, kwargs, on_event=on_event, timeout=timeout)


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


def run_torchrun(fn: Callable | str, kwargs: dict | None = None) -> list[Any] | None:
    """Run a job in a process torchrun started; rank 0 gets every rank's result, others None."""
    import torch
    import torch.distributed as dist

    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    backend = os.environ.get("ZEROEDU_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    dist.init_process_group(backend)
    try:
        ctx = RankContext(dist.get_rank(), world, backend, device)
        out = _resolve(fn)(ctx, **(kwargs or {}))
        gathered = [None] * world if ctx.rank == 0 else None
        # Harness plumbing, not training traffic: results travel to rank 0 outside the ledger.
        dist.gather_object(out, gathered, dst=0)
        return gathered
    finally:
        dist.destroy_process_group()
