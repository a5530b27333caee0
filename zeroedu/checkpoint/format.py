"""The checkpoint file format: names, atomic writes, and reading and verifying what was written.

A step directory holds one ``rank-RRRRR-of-WWWWW.pt`` per rank (`torch.save` of plain tensors,
ints, strings and lists, loadable with ``weights_only=True``) and a ``manifest.json`` (sizes and
SHA-256 of every rank file) written after all of them; the root's ``latest`` names the newest
complete step and is replaced last. `FullState` is a checkpoint with the sharding undone.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import stat
import re
import shutil
from dataclasses import dataclass, field

import torch

from ..models import get_model

FORMAT = "zeroedu-checkpoint-1"
MANIFEST, LATEST = "manifest.json", "latest"


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def rank_file_name(rank: int, world: int) -> str:
    return f"rank-{rank:05d}-of-{world:05d}.pt"


def partial_dir_name(step: int) -> str:
    """Where a step is written until it is complete (hidden: no reader lists it)."""
    return f".{step_dir_name(step)}.partial"


# ------------------------------------------------------------------------ atomic writes
def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Temp file in the same directory (same file system, so the rename is atomic), fsync,
    rename over the target, fsync the directory so the rename itself survives a crash."""
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(d)


def _exchange(a: str, b: str) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: this file system cannot exchange
        return False
    raise OSError(err, os.strerror(err), a)


def publish_step_dir(partial: str, final: str) -> None:
    """Move a complete step directory into place. A new step is one rename. An existing one
    (the same step saved again, perhaps the one `latest` names) is exchanged with the new one
    atomically, then the old contents are removed: at every instant `final` is a complete step.
    Where the kernel cannot exchange, the old directory is renamed aside first (a brief window
    with no `final`, never a half-written one)."""
    if not os.path.exists(final):
        os.rename(partial, final)
    elif _exchange(partial, final):
        shutil.rmtree(partial)  # now holds the old step
    else:
        old = final + ".old"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(partial, final)
        shutil.rmtree(old)
    fsync_dir(os.path.dirname(os.path.abspath(final)))


def check_writable(ckpt_dir: str) -> None:
    """Before any training: the checkpoint directory exists or can be made, and a file can be
    written in it (found now, not after the run has trained to its first save)."""
    import tempfile

    try:
        os.makedirs(ckpt_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=ckpt_dir, prefix=".write-check-"):
            pass
    except PermissionError:
        raise ValueError(f"{ckpt_dir}: permission denied: checkpoints cannot be written there") from None
    except FileExistsError:
        raise ValueError(f"{ckpt_dir}: exists and is not a directory: checkpoints need a directory") from None
    except OSError as e:
        raise ValueError(f"{ckpt_dir}: checkpoints cannot be written there ({e.strerror})") from None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def param_shapes(model) -> list[list[int]]:
    return [list(p.shape) for p in get_model(model).build().parameters()]


@dataclass
class FullState:
    """A checkpoint with the sharding undone: full fp32 tensors in model.parameters() order."""

    step: int  # the next step to train (data position)
    adam_step: int
    params: list[torch.Tensor]
    m: list[torch.Tensor]
    v: list[torch.Tensor]
    rng: list[torch.Tensor]
    manifest: dict
    path: str
    # The model's persistent buffers by name (rank 0's; every rank holds the same: models whose
    # forward changes a buffer are refused, `models.check_trainable`). Empty for DCP.
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)


STEP_DIR = re.compile(r"step-\d{8}")


MAX_TEXT_BYTES = {"'latest' pointer": 4096, "manifest": 16 << 20}  # far above any real one


def _regular_file(p: str, what: str) -> int:
    """The size of `p`, a regular file (a link to /dev/zero or a FIFO would be read forever or
    block: refused before a byte is read)."""
    try:
        st = os.stat(p)
    except OSError as e:
        raise ValueError(f"{p}: unreadable {what} ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{p}: the {what} is not a regular file")
    return st.st_size


def _read_bounded(p: str, what: str, limit: int) -> bytes:
    if _regular_file(p, what) > limit:
        raise ValueError(f"{p}: the {what} is over {limit:,} bytes: not one this suite wrote")
    try:
        with open(p, "rb") as f:
            data = f.read(limit + 1)  # the file may have grown since stat
    except PermissionError:
        raise ValueError(f"{p}: permission denied: cannot read the {what}") from None
    except OSError as e:
        raise ValueError(f"{p}: unreadable {what} ({e})") from None
    if len(data) > limit:
        raise ValueError(f"{p}: the {what} is over {limit:,} bytes: not one this suite wrote")
    return data


def _read_text(p: str, what: str) -> str:
    try:
        return _read_bounded(p, what, MAX_TEXT_BYTES.get(what, 16 << 20)).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: unreadable {what} ({e})") from None


def resolve_step_dir(path: str) -> str:
    """A checkpoint root (follow `latest`) or a step directory."""
    if os.path.exists(os.path.join(path, MANIFEST)):
        return path
    latest = os.path.join(path, LATEST)
    if os.path.exists(latest):
        name = _read_text(latest, "'latest' pointer").strip()
        if not STEP_DIR.fullmatch(name):
            raise ValueError(f"{latest}: names {name[:60]!r}, not a step directory (step-NNNNNNNN)")
        if not os.path.isdir(os.path.join(path, name)):
            raise ValueError(f"{latest}: names {name}, which is not in {path}")
        real, root = os.path.realpath(os.path.join(path, name)), os.path.realpath(path)
        if os.path.dirname(real) != root:
            raise ValueError(f"{latest}: names {name}, a link to {real}, outside the checkpoint {path}")
        return os.path.join(path, name)
    if os.path.isdir(path) and os.path.basename(os.path.normpath(path)).startswith("step-"):
        raise ValueError(f"{path}: no {MANIFEST}: the checkpoint is incomplete (a run stopped "
                         "while saving it?); load the previous step or the root's 'latest'")
    raise ValueError(f"{path}: not a zeroedu checkpoint (no {MANIFEST} and no '{LATEST}' pointer)")


def _is_int(x, low: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


def _manifest_problem(man) -> str | None:
    """What is wrong with a parsed manifest, or None: every field a reader uses, typed."""
    if not isinstance(man, dict):
        return f"a JSON {type(man).__name__}, not an object"
    if man.get("format") != FORMAT:
        return f"format {man.get('format')!r}, expected {FORMAT!r}"
    for key, low in (("step", 0), ("world_size", 1)):
        if not _is_int(man.get(key), low):
            return f"{key} must be an integer >= {low}, got {man.get(key)!r}"
    if not isinstance(man.get("strategy"), str):
        return f"strategy must be a string, got {man.get('strategy')!r}"
    shapes = man.get("param_shapes")
    if not (isinstance(shapes, list) and all(isinstance(s, list) and all(_is_int(d, 0) for d in s)
                                             for s in shapes)):
        return "param_shapes must be a list of shapes (lists of integers)"
    files = man.get("files")
    if not isinstance(files, list) or len(files) != man["world_size"]:
        return f"files must list one entry per rank ({man['world_size']})"
    for r, info in enumerate(files):
        if not isinstance(info, dict) or info.get("name") != rank_file_name(r, man["world_size"]):
            return f"files[{r}] must name {rank_file_name(r, man['world_size'])}"
        if not _is_int(info.get("bytes"), 0) or not (isinstance(info.get("sha256"), str)
                                                     and re.fullmatch(r"[0-9a-f]{64}", info["sha256"])):
            return f"files[{r}] must give bytes (an integer) and sha256 (64 hex digits)"
    # Every element is stored at least once in fp32 across the shards (the parameter, then m and
    # v): shapes that need more than the files hold would make a reader allocate for nothing.
    elements = sum(math.prod(s) for s in shapes)
    held = sum(info["bytes"] for info in files)
    if 4 * elements > held:
        return (f"param_shapes describe {elements:,} elements, more than the shard files' {held:,} bytes "
                "can hold at 4 bytes each")
    return None


def read_manifest(d: str) -> dict:
    p = os.path.join(d, MANIFEST)
    if not os.path.exists(p):
        raise ValueError(f"{d}: no {MANIFEST}: the checkpoint is incomplete (a run stopped while "
                         "saving it?); load the previous step or the root's 'latest'")
    try:
        man = json.loads(_read_text(p, "manifest"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: unreadable manifest ({e})") from None
    except RecursionError:  # JSON nested deeper than Python's parser recurses
        raise ValueError(f"{p}: unreadable manifest (nested too deeply)") from None
    problem = _manifest_problem(man)
    if problem:
        raise ValueError(f"{p}: malformed manifest: {problem}")
    return man


def read_rank_file(d: str, info: dict, man: dict, rank: int) -> dict:
    p = os.path.join(d, info["name"])
    if not os.path.exists(p):
        raise ValueError(f"{p}: shard file of rank {rank} is missing (manifest lists "
                         f"{man['world_size']} files)")
    size = _regular_file(p, f"shard file of rank {rank}")
    if size != info["bytes"]:
        raise ValueError(f"{p}: truncated or overwritten: {size} bytes, the manifest says {info['bytes']}")
    data = _read_bounded(p, f"shard file of rank {rank}", info["bytes"])
    if sha256(data) != info["sha256"]:
        raise ValueError(f"{p}: contents do not match the manifest's SHA-256 (corrupt or from another run)")
    try:
        st = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
        # torch's own message advises re-running with weights_only=False, which would run
        # whatever the file's pickle names: not advice to pass on about a file from disk.
        first = str(e).split("\n")[0]
        if "weights_only" in str(e) or "Weights only load failed" in first:
            raise ValueError(f"{p}: not a shard file this suite wrote: it holds objects beyond tensors "
                             "and plain data, which are never unpickled") from None
        raise ValueError(f"{p}: not a readable shard file ({type(e).__name__}: {first[:200]})") from None
    if not isinstance(st, dict):
        raise ValueError(f"{p}: not a shard file this suite wrote (a {type(st).__name__}, not a dict)")
    for key in ("world_size", "step", "strategy", "param_shapes"):
        if st.get(key) != man[key]:
            raise ValueError(f"{p}: mismatched shard file: {key} = {st.get(key)!r}, but the "
                             f"manifest says {man[key]!r}")
    if st.get("rank") != rank:
        raise ValueError(f"{p}: holds rank {st.get('rank')!r}, expected rank {rank}")
    return st


