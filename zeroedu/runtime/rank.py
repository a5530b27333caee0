"""The rank side of the harness: what runs inside each rank process.

`worker_main` is the body of a local rank (started by `zeroedu.runtime.cluster.Pool`): it joins the
process group through the parent's store, then serves jobs until told to stop, sending back
each job's result, or its traceback, and any events the job streams. `RankContext` is the
explicit distributed state a job receives. `run_torchrun` is the same for a process that
torchrun started, on GPUs and across nodes.
"""
from __future__ import annotations

import datetime
import errno
import importlib
import io
import math
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import CollectiveError
from .links import BOARD_NAME


@dataclass(frozen=True)
class Limits:
    """Resource limits a rank process sets on itself before its first job: for ranks that run
    code nobody vetted (a lab submission). `cpu_seconds`: RLIMIT_CPU, the kernel ends the
    process with SIGXCPU once its jobs have used that much CPU time (on top of what starting
    the rank took), however many threads burn it;
    `memory_bytes`: RLIMIT_DATA, the process's writable private memory (the heap, torch's
    tensors) beyond which an allocation fails in the job, as a MemoryError or torch's "can't
    allocate memory", instead of taking the machine's memory from everything else; also
    RLIMIT_AS, the address space, at what the rank had mapped after start-up plus
    `memory_bytes` plus room for threads' stacks, so shared mappings (which RLIMIT_DATA does
    not count) cannot pass it either;
    `confine`: folders the jobs may read besides the interpreter's own (`confine.confine`,
    Landlock): the rank then writes only its log folder and cannot reach other processes.
    None: unconfined. On a kernel without Landlock the rank runs unconfined and says so in
    its log (`Limits.confined` is False in its jobs)."""
    cpu_seconds: int | None = None
    memory_bytes: int | None = None
    confine: tuple[str, ...] | None = None

    STACKS = 1 << 30  # address space a rank's threads (gloo's, the log's, torch's) may still map

    def apply(self, log_dir: str | None = None) -> None:
        import resource

        use = resource.getrusage(resource.RUSAGE_SELF)
        started = math.ceil(use.ru_utime + use.ru_stime)  # CPU seconds the start-up (torch's import) took
        cpu = None if self.cpu_seconds is None else started + self.cpu_seconds
        space = None if self.memory_bytes is None else _mapped_bytes() + self.memory_bytes + self.STACKS
        for which, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_DATA, self.memory_bytes),
                             (resource.RLIMIT_AS, space)):
            if value is not None:
                hard = resource.getrlimit(which)[1]
                value = value if hard == resource.RLIM_INFINITY else min(value, hard)
                resource.setrlimit(which, (value, hard))
        if self.confine is not None:
            from . import confine

            if log_dir:  # jobs' temporary files go under the one folder the rank may write
                _private_temp_dir(log_dir)
            try:
                confine.confine(read=self.confine, write=[log_dir] if log_dir else [])
            except OSError as e:  # no Landlock here: limits still hold, the file system is open
                print(f"[rank not confined] {e}", flush=True)


def _private_temp_dir(log_dir: str) -> str:
    """This rank's temporary files (multiprocessing's folder, where the socket that hands result
    tensors to the parent is bound; `tempfile`'s) go into its pool's log folder, which the pool
    removes when it closes: a rank ends with os._exit or is killed, and a folder in /tmp would
    outlive it with its socket. A folder made under /tmp before the rank started (the
    forkserver's) is not reused."""
    import multiprocessing.process
    import tempfile

    tmp = os.path.join(log_dir, f"tmp-{os.getpid()}")
    os.makedirs(tmp, exist_ok=True)
    os.environ["TMPDIR"] = tempfile.tempdir = tmp
    # multiprocessing binds its sockets there as "listener-xxxxxxxx"; a Unix socket's path has
    # at most 107 bytes, so a log folder too deep for that keeps multiprocessing's default.
    if len(os.fsencode(log_dir)) + len("/listener-xxxxxxxx") < 107:
        multiprocessing.process.current_process()._config["tempdir"] = log_dir
    return tmp


def _mapped_bytes() -> int:
    """This process's address space now (VmSize), in bytes; 0 where /proc is not there."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class JobStopped(Exception):
    """A job ends itself for a reason the user must read, not a crash (e.g. a non-finite loss):
    the parent raises `cluster.RunStopped` with this message alone, naming the rank."""


def failure(exc: BaseException | None) -> dict:
    """What a rank reports of a failed job: the traceback, the exception's class, and whether it
    is a communication failure: a `CollectiveError` (zeroedu's collectives), torch's own
    `DistError`, or any exception raised inside torch.distributed by code that calls it directly
    (the torch references, the harness's plumbing: gloo raises a plain RuntimeError there), read
    from the module of the innermost Python frame, never from the message."""
    import torch.distributed as dist

    tb = exc.__traceback__ if exc is not None else None
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    raised_in = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
    collective = (isinstance(exc, (CollectiveError, getattr(dist, "DistError", CollectiveError)))
                  or raised_in == "torch.distributed" or raised_in.startswith("torch.distributed."))
    return {"traceback": traceback.format_exc(),
            "type": f"{type(exc).__module__}.{type(exc).__qualname__}" if exc is not None else None,
            "collective": collective}


BACKENDS = ("gloo", "nccl")


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"ZEROEDU_BACKEND={name!r}: the backend is one of {', '.join(BACKENDS)}")
    return name


def choose_backend(n: int) -> str:
    import torch

    forced = os.environ.get("ZEROEDU_BACKEND")
    if forced:
        check_backend(forced)
        if forced == "nccl":
            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if gpus < n:
                why = ("this torch has no CUDA" if torch.version.cuda is None else
                       f"this machine shows {gpus} CUDA GPU(s)")
                raise ValueError(f"ZEROEDU_BACKEND=nccl: NCCL needs one CUDA GPU per rank, {n} here, and {why}; "
                                 "unset ZEROEDU_BACKEND (gloo runs the ranks on the CPU)")
        return forced

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
    wire: Any = None  # this rank's WireMeter (zeroedu.runtime.wire), made after the group exists
    board_path: str | None = None  # the pool's clock board for emulated links (`runtime.links`)
    _board: Any = None

    def pacer(self):
        """A fresh `links.Pacer` for one job's Comm, on this rank's map of the pool's clock board.
        Emulated links need the ranks of a local pool, which share the board."""
        if self.board_path is None:
            raise RuntimeError("emulated links pace the ranks of a local pool (they share a clock board); "
                               "under torchrun the links are real: run without --link")
        from .links import Board, Pacer

        if self._board is None:
            self._board = Board(self.board_path, self.world_size)
        return Pacer(self._board, self.rank)

    def __post_init__(self):
        from .wire import WireMeter

        if self.wire is None:
            self.wire = WireMeter(backend=self.backend)
            # gloo opened the world group's pair sockets in init_process_group: label them, so
            # bytes can be told apart per mesh axis once the mesh adds its own groups.
            self.wire.label_new("world")

    def emit(self, msg: dict) -> None:
        """Stream a small message (e.g. a ledger event) to the parent while the job runs."""
        if self._emit is not None:
            self._emit(msg)

    def world_axis(self, name: str = "dp_shard"):
        from .comm import Axis

        return Axis(name, None, self.world_size, self.rank, tuple(range(self.world_size)))

    def axes(self, mesh) -> dict:
        """This rank's `comm.Axis` on every axis of `mesh` (`zeroedu.mesh.Mesh`), by name.

        The axis whose group is the whole world (a flat mesh's dp_shard) runs on the default
        group, whose sockets are labelled `world`; every other axis gets its own groups, made
        once per mesh in the mesh's order, outermost axis first (every rank creates every group,
        as torch requires), and its new sockets are labelled with the axis's name for the wire
        meter, so each byte counts on the axis that sent it."""
        if mesh.world_size != self.world_size:
            raise ValueError(f"a mesh of {mesh.world_size} ranks ({mesh}) on a world of {self.world_size}")
        if mesh not in self._meshes:
            import torch.distributed as dist

            from .comm import Axis

            from ..kinds import DP_SHARD, SHARD_GROUP

            axes = {}
            for name in mesh.names:
                if name == mesh.world_group_axis:
                    axes[name] = self.world_axis(name)
                    continue
                for ranks in mesh.groups(name):
                    g = dist.new_group(list(ranks))
                    if self.rank in ranks:
                        axes[name] = Axis(name, g, len(ranks), ranks.index(self.rank), ranks)
                self.wire.label_new(name)
            if mesh.shard_size != mesh.size(DP_SHARD):
                # The strategy's group spans dp_shard x cp (`kinds.SHARD_AXES`): flattened groups,
                # kept under their own key and named dp_shard (what the strategy's records carry).
                if mesh.shard_size == self.world_size:
                    axes[SHARD_GROUP] = self.world_axis(DP_SHARD)
                else:
                    for ranks in mesh.shard_groups():
                        g = dist.new_group(list(ranks))
                        if self.rank in ranks:
                            axes[SHARD_GROUP] = Axis(DP_SHARD, g, len(ranks), ranks.index(self.rank), ranks)
                    self.wire.label_new(DP_SHARD)
            self._meshes[mesh] = axes
        return dict(self._meshes[mesh])


def resolve_ref(ref: Callable | str) -> Callable:
    """The object a "package.module:qualname" reference names (a callable is returned as it is):
    the one resolver for everything that crosses to the ranks by name (jobs, strategy classes,
    a custom model's functions); `cluster.fn_ref` writes the reference."""
    if callable(ref):
        return ref
    mod, _, name = ref.partition(":")
    if not mod or not name:
        raise ValueError(f"expected 'package.module:function', got {ref!r}")
    obj = importlib.import_module(mod)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _watch_parent(ppid: int) -> None:
    while True:
        time.sleep(1.0)
        try:
            os.kill(ppid, 0)
        except PermissionError:
            pass  # a confined rank may not signal its parent (`confine`): it is there
        except OSError:
            os._exit(3)  # parent gone: never linger as an orphan


def loopback_interface() -> str:
    """The network interface gloo's local ranks talk over: GLOO_SOCKET_IFNAME when set, else
    this machine's loopback, found by name (Linux calls it `lo`, macOS and the BSDs `lo0`)."""
    names = [name for _, name in socket.if_nameindex()]
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        given = os.environ["GLOO_SOCKET_IFNAME"]
        # gloo takes a comma-separated list; every name must be an interface of this machine
        missing = [g for g in given.split(",") if g not in names]
        if missing:
            raise ValueError(f"GLOO_SOCKET_IFNAME={given!r}: this machine has no interface {missing[0]!r} "
                             f"(it has {', '.join(names)}); unset it for local ranks, or name one of those")
        return given
    for name in ("lo", "lo0", *sorted(n for n in names if n.startswith("lo"))):
        if name in names:
            return name
    raise RuntimeError(f"no loopback interface among this machine's {names}: set GLOO_SOCKET_IFNAME "
                       "to the interface that carries 127.0.0.1")


LOG_CAP = 16 << 20  # bytes of output a rank keeps in its log (a lab that prints in a loop)


class _LogCap:
    """A rank's log stops at `cap` bytes, and one line then says so. Python's own output (print,
    tracebacks) is counted as it is written, so it stops at the cap exactly; output written
    straight to the file descriptors (native code: gloo, NCCL) is caught by a watcher four times
    a second, which then points them at /dev/null. A job's failure still reaches the parent
    whole: its traceback travels in the result, not through the log."""

    def __init__(self, log_fd: int, cap: int):
        self.fd, self.cap, self.left, self.full = log_fd, cap, cap - os.fstat(log_fd).st_size, False
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bool:
        """Whether `nbytes` more may be written; the first refusal closes the log."""
        with self._lock:
            if not self.full and nbytes <= self.left:
                self.left -= nbytes
                return True
        self.close()
        return False

    def close(self) -> None:
        with self._lock:
            if self.full:
                return
            self.full = True
        for stream in (sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.write(self.fd, f"\n[zeroedu: this rank's log reached its cap of {self.cap:,} bytes; later "
                          "output is dropped]\n".encode())

    def watch(self) -> None:
        while not self.full:
            if os.fstat(self.fd).st_size >= self.cap:
                self.close()
            time.sleep(0.25)


class _CappedStream(io.TextIOBase):
    """sys.stdout / sys.stderr of a rank: writes through while the log's cap allows."""

    def __init__(self, inner, cap: _LogCap):
        self.inner, self.cap = inner, cap

    def write(self, s: str) -> int:
        if self.cap.take(len(s.encode("utf-8", "replace"))):
            self.inner.write(s)
        return len(s)

    def flush(self) -> None:
        self.inner.flush()

    def fileno(self) -> int:
        return self.inner.fileno()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


def worker_main(rank, n, backend, store_port, ppid, log_path, timeout, tasks, results, log_cap=LOG_CAP,
                limits: Limits | None = None):
    # A terminal's Ctrl-C reaches the whole process group, ranks included. The parent ends its
    # ranks (`Pool.run` kills them when it is interrupted); a rank that raised KeyboardInterrupt
    # on its own would leave a traceback in the queue for the next job to read as its failure.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    threading.Thread(target=_watch_parent, args=(ppid,), daemon=True).start()
    cap = _LogCap(fd, log_cap)
    sys.stdout, sys.stderr = _CappedStream(sys.stdout, cap), _CappedStream(sys.stderr, cap)
    threading.Thread(target=cap.watch, daemon=True).start()
    os.environ["GLOO_SOCKET_IFNAME"] = loopback_interface()
    _private_temp_dir(os.path.dirname(log_path))
    import torch
    import torch.distributed as dist

    # N ranks share a few cores: one intra-op thread each avoids oversubscription.
    torch.set_num_threads(1)
    if limits is not None:  # after torch's import, before any job: the limits are for the jobs
        limits.apply(os.path.dirname(log_path))
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
    except Exception as e:
        # a rank that cannot join is the cause, whatever it raised: reported as its own failure
        results.put(("error", rank, -1, {**failure(e), "collective": False}))
        return
    results.put(("ready", rank, -1, None))
    ctx = RankContext(rank, n, backend, device, board_path=os.path.join(os.path.dirname(log_path), BOARD_NAME))
    while True:
        task = tasks.get()
        if task is None:
            break
        job_id, fn_ref, kwargs = task
        ctx.job_id = job_id
        ctx._emit = lambda msg, j=job_id: results.put(("event", rank, j, msg))
        try:
            out = resolve_ref(fn_ref)(ctx, **kwargs)
        except JobStopped as e:
            print(f"[job {job_id} stopped] {e}", flush=True)
            results.put(("stopped", rank, job_id, {"message": str(e), "type": type(e).__name__}))
            continue
        except BaseException as e:
            print(f"[job {job_id} failed]", flush=True)
            results.put(("error", rank, job_id, failure(e)))
            continue
        print(f"[job {job_id} done]", flush=True)  # before the result: the log is complete when the parent reads it
        results.put(("result", rank, job_id, out))
    try:
        dist.destroy_process_group()
    except Exception:
        pass


TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def _store_bound_to(addr: str, port: int, world: int, timeout):
    """The rendezvous store's server, listening on `addr` only (its socket bound here and handed
    to torch's TCPStore)."""
    import torch.distributed as dist

    family, kind, proto, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(max(16, 2 * world))
    except OSError:
        sock.close()
        raise
    return dist.TCPStore(addr, port, world, is_master=True, timeout=timeout, master_listen_fd=sock.detach(),
                         multi_tenant=True)


class RendezvousFailed(RuntimeError):
    """A torchrun rank could not meet its peers (`run_torchrun`); `rank` and `where` (the
    rendezvous address) name it. `cluster.run_torchrun` turns it into a `RankError`."""

    def __init__(self, rank: int, where: str, e: Exception):
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        self.rank, self.where, self.type = rank, where, type(e).__name__
        super().__init__(f"{type(e).__name__}: {first} (rendezvous at {where}, WORLD_SIZE="
                         f"{os.environ.get('WORLD_SIZE')}; a peer that never started, a wrong MASTER_ADDR, "
                         "or a firewall between the nodes)")


def under_torchrun() -> bool:
    """A process torchrun started: its rank variables, and the run id its elastic agent sets for
    every worker it starts (torch/distributed/elastic/agent/server/local_elastic_agent.py,
    TORCHELASTIC_RUN_ID). The rank variables alone are left over from another launch (a shell
    that exported them, a job script), and following them would wait for peers that never come."""
    return all(k in os.environ for k in TORCHRUN_VARS) and "TORCHELASTIC_RUN_ID" in os.environ


def stale_torchrun_variables() -> list[str]:
    """The launch variables set in a process torchrun did not start (ignored: local ranks run)."""
    if under_torchrun():
        return []
    return [k for k in (*TORCHRUN_VARS, "MASTER_ADDR", "MASTER_PORT") if k in os.environ]


def run_torchrun(fn: Callable | str, kwargs: dict | None = None, timeout: float | None = None) -> list[Any] | None:
    """Run a job in a process torchrun started; rank 0 gets every rank's result, others None.

    `timeout` (seconds) bounds the rendezvous (peers that never arrive) and every collective,
    as it bounds a local run. A MASTER_PORT another process holds is a ValueError naming it;
    peers that never arrived, a RankError naming this rank and how many came."""
    import torch
    import torch.distributed as dist

    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    backend = check_backend(os.environ.get("ZEROEDU_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo"))
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    addr, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ.get("MASTER_PORT", "29500")
    where = f"{addr}:{port}"
    limit = {} if timeout is None else {"timeout": datetime.timedelta(seconds=timeout)}
    rank = int(os.environ["RANK"])
    try:
        if rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
            # This rank hosts the rendezvous store. torch's own TCPStore would listen on every
            # interface (*:port, seen with `ss -ltn`); bound here, it listens where MASTER_ADDR
            # says (127.0.0.1: this machine only). Under torchrun's agent store the agent hosts
            # it (docs/multinode.md).
            store = _store_bound_to(addr, int(port), world, limit.get("timeout", datetime.timedelta(minutes=30)))
            # The prefix the other ranks' env:// rendezvous puts on their keys (torch's
            # init_process_group does so for a store it makes itself, not for one handed to it).
            store = dist.PrefixStore("default_pg", store)
            dist.init_process_group(backend, store=store, rank=0, world_size=world, **limit)
        else:
            dist.init_process_group(backend, **limit)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise ValueError(f"MASTER_PORT: {where} is taken by another process; give torchrun another "
                             "--master-port (or --rdzv-endpoint)") from None
        raise
    except dist.DistNetworkError as e:
        if "EADDRINUSE" in str(e) or "address already in use" in str(e).lower():
            raise ValueError(f"MASTER_PORT: {where} is taken by another process; give torchrun another "
                             "--master-port (or --rdzv-endpoint)") from None
        raise RendezvousFailed(int(os.environ["RANK"]), where, e) from None
    except dist.DistStoreError as e:
        raise RendezvousFailed(int(os.environ["RANK"]), where, e) from None
    try:
        ctx = RankContext(dist.get_rank(), world, backend, device)
        out = resolve_ref(fn)(ctx, **(kwargs or {}))
        gathered = [None] * world if ctx.rank == 0 else None
        # Harness plumbing, not training traffic: results travel to rank 0 outside the ledger.
        dist.gather_object(out, gathered, dst=0)
        return gathered
    finally:
        dist.destroy_process_group()
