"""Confining a rank that runs code nobody vetted (a lab submission), with Linux's Landlock.

A rank process calls `confine` on itself once, after torch's import and before its first job;
the kernel then holds it and every process it starts to these rules for good:

* **reads** only the interpreter and its packages (the prefixes, site-packages, zeroedu's own
  package folder), the system's libraries and configuration (`/usr`, `/lib*`, `/etc`), the
  kernel's views (`/sys`, `/dev`, and of `/proc` its own folder and the machine's figures) and
  the folders it was handed (the submission's);
  nothing else: not the repository around the package (the labs' answer key), not other
  students' folders, not a home directory's secrets;
* **writes** only its own log folder (the rank logs, the emulated links' board, its temporary
  files), `/dev/null` and `/dev/shm` (where torch puts the result tensors it hands the parent): not the installed package, not the grader's outputs, not another student's file;
* **cannot ptrace or open another process's `/proc/<pid>/fd`** outside its own domain (Landlock
  does this for every confined process) and, from ABI 6, **cannot signal** a process outside it
  (the grader, the other ranks).

Files already open stay usable (the rank's log, its pipes and sockets to the parent). Landlock
needs Linux 5.13 or later; `abi()` says which version the kernel offers (0: none). Errors from
the kernel are raised as OSError naming the call.
"""
from __future__ import annotations

import ctypes
import os
import site
import sys
from collections.abc import Iterable

# Syscall numbers (the same on x86_64 and aarch64: the generic table).
_CREATE, _ADD_RULE, _RESTRICT = 444, 445, 446
_VERSION = 1 << 0  # landlock_create_ruleset flag: ask for the ABI version
_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# Filesystem access rights (include/uapi/linux/landlock.h), by the ABI that added them.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
SCOPE_SIGNAL = 1 << 1

_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # the rights a rule on a file may hold
READ = EXECUTE | READ_FILE | READ_DIR
SYSTEM_READ = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/etc", "/sys", "/dev",
               "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/sys")


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def abi() -> int:
    """The Landlock ABI version this kernel offers; 0 when none (not Linux, too old, disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    v = _libc().syscall(_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION))
    return max(int(v), 0)


def interpreter_paths() -> list[str]:
    """What a rank must keep reading to run Python, torch and zeroedu: the prefixes, every
    site-packages and zeroedu's package folder (not the folder around it: in a checkout that
    is the repository, with the labs' sources)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # zeroedu/, above runtime/
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, package}
    try:
        paths.update(site.getsitepackages())
        paths.add(site.getusersitepackages())
    except AttributeError:  # a virtualenv's old `site` module
        pass
    return sorted(p for p in paths if p)


def _add(libc, ruleset: int, path: str, access: int, handled: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path this machine does not have grants nothing
    try:
        if not os.path.isdir(path):
            access &= FILE_RIGHTS
        rule = _PathBeneath(access & handled, fd)
        if libc.syscall(_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_PATH_BENEATH),
                        ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"landlock_add_rule({path}): {os.strerror(e)}")
    finally:
        os.close(fd)


def confine(read: Iterable[str] = (), write: Iterable[str] = ()) -> int:
    """Hold this process (and all it starts) to reading `read` plus the interpreter's and the
    system's paths, and writing `write` plus /dev/null. Returns the ABI used; raises OSError
    when the kernel has no Landlock (callers decide whether to run unconfined)."""
    version = abi()
    if version < 1:
        raise OSError(38, "Landlock is not available on this kernel (Linux 5.13 or later)")
    libc = _libc()
    handled = _FS_BY_ABI.get(version, _FS_BY_ABI[5])
    # struct landlock_ruleset_attr grew with the ABI: fs rights (v1), net rights (v4), scopes (v6).
    scoped = SCOPE_SIGNAL if version >= 6 else 0
    attr = (ctypes.c_uint64 * 3)(handled, 0, scoped)
    size = 24 if version >= 6 else 8
    ruleset = libc.syscall(_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"landlock_create_ruleset: {os.strerror(e)}")
    try:
        # /proc: this process's own folder only (its status, its sockets' counters), not the
        # others' (a grader's command line, another rank's memory).
        for p in [*SYSTEM_READ, f"/proc/{os.getpid()}", *interpreter_paths(), *read]:
            _add(libc, ruleset, os.path.realpath(p), READ, handled)
        # /dev/shm: torch hands a job's result tensors to the parent as shared-memory files.
        for p in [*write, "/dev/shm"]:
            _add(libc, ruleset, os.path.realpath(p), handled, handled)
        _add(libc, ruleset, "/dev/null", READ_FILE | WRITE_FILE, handled)
        # Without no_new_privs an unprivileged process may not restrict itself (and a setuid
        # program it ran would shed the rules).
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(e)}")
        if libc.syscall(_RESTRICT, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"landlock_restrict_self: {os.strerror(e)}")
    finally:
        os.close(ruleset)
    return version


__all__ = ["abi", "confine", "interpreter_paths"]
