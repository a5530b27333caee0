"""Processes a job left behind: found and ended before the caller goes on (Linux).

Code nobody vetted (a lab submission) can start processes from its rank: a `fork()` child that
sleeps, a daemon that detaches with `setsid()` and a second fork. Ending the ranks does not end
those. `no_strays()` makes this process a *child subreaper* (prctl PR_SET_CHILD_SUBREAPER) for
its duration, so an orphan anywhere below it is re-parented here instead of to init, and when
the block ends it kills (SIGKILL) and reaps every process below this one that was not there
before the block, except the harness's own: the multiprocessing fork server and resource
tracker, and the ranks of pools still open (`cluster.rank_pids`). A process that keeps forking
is swept until none is left. Elsewhere than Linux the block only yields.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process /proc shows, but zombies (ended, not yet reaped)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # ended meanwhile
        # The command name (field 2) may hold spaces and parentheses: fields follow the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        if fields[0] != b"Z":
            out[int(name)] = int(fields[1])
    return out


def descendants(root: int | None = None) -> set[int]:
    """Every process below `root` (default: this one)."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def _harness_pids() -> set[int]:
    from multiprocessing import forkserver, resource_tracker

    from . import cluster

    keep = set(cluster.rank_pids())
    for pid in (getattr(forkserver._forkserver, "_forkserver_pid", None),
                getattr(resource_tracker._resource_tracker, "_pid", None)):
        if pid:
            keep.add(pid)
    return keep


def end_strays(before: set[int]) -> list[int]:
    """Kill and reap every process below this one that is not in `before` nor the harness's;
    return their pids."""
    ended: list[int] = []
    for _ in range(50):  # a process that forks as fast as it is killed is swept again
        strays = descendants() - before - _harness_pids()
        if not strays:
            break
        for pid in strays:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        ended += sorted(strays)
        time.sleep(0.02)
        _reap_ours(strays)
    _reap_until_gone(set(ended))
    return ended


def _reap_until_gone(pids: set[int], timeout: float = 1.0) -> None:
    """A killed stray is a zombie until its parent reaps it; one orphaned while the sweep ran is
    re-parented here a moment later. Reap each as it arrives, so none is left when the caller goes
    on (a zombie still shows its name in /proc), for at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        for pid in list(pids):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    pids.discard(pid)
            except ChildProcessError:  # not ours (yet), or reaped already
                if not os.path.exists(f"/proc/{pid}"):
                    pids.discard(pid)
        if pids:
            time.sleep(0.01)


def _reap_ours(pids: set[int]) -> None:
    # Only the strays re-parented here are waited for: the harness's own children (the fork
    # server) are multiprocessing's to reap.
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


@contextlib.contextmanager
def no_strays():
    """Within the block, orphans come here; when it ends, whatever the block started and left
    running is killed and reaped (see the module docstring)."""
    if not sys.platform.startswith("linux"):
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    was = ctypes.c_int(0)
    libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
    before = descendants()
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield
    finally:
        try:
            end_strays(before)
        finally:
            libc.prctl(_PR_SET_CHILD_SUBREAPER, was.value, 0, 0, 0)


__all__ = ["descendants", "end_strays", "no_strays"]
