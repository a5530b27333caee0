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
import os
from dataclasses import dataclass

import torch

from ..models import get_model

FORMAT = "zeroedu-checkpoint-1"
MANIFEST, LATEST = "manifest.json", "latest"


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def rank_file_name(rank: int, world: int) -> str:
    return f"rank-{rank:05d}-of-{world:05d}.pt"


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


def resolve_step_dir(path: str) -> str:
    """A checkpoint root (follow `latest`) or a step directory."""
    if os.path.exists(os.path.join(path, MANIFEST)):
        return path
    latest = os.path.join(path, LATEST)
    if os.path.exists(latest):
        with open(latest) as f:
            return os.path.join(path, f.read().strip())
    if os.path.isdir(path) and os.path.basename(os.path.normpath(path)).startswith("step-"):
        raise ValueError(f"{path}: no {MANIFEST}: the checkpoint is incomplete (a run stopped "
                         "while saving it?); load the previous step or the root's 'latest'")
    raise ValueError(f"{path}: not a zeroedu checkpoint (no {MANIFEST} and no '{LATEST}' pointer)")


def read_manifest(d: str) -> dict:
    p = os.path.join(d, MANIFEST)
    if not os.path.exists(p):
        raise ValueError(f"{d}: no {MANIFEST}: the checkpoint is incomplete (a run stopped while "
                         "saving it?); load the previous step or the root's 'latest'")
    try:
        with open(p) as f:
            man = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{p}: unreadable manifest ({e})") from None
    if man.get("format") != FORMAT:
        raise ValueError(f"{p}: format {man.get('format')!r}, expected {FORMAT!r}")
    return man


def read_rank_file(d: str, info: dict, man: dict, rank: int) -> dict:
    p = os.path.join(d, info["name"])
    if not os.path.exists(p):
        raise ValueError(f"{p}: shard file of rank {rank} is missing (manifest lists "
                         f"{man['world_size']} files)")
    size = os.path.getsize(p)
    if size != info["bytes"]:
        raise ValueError(f"{p}: truncated or overwritten: {size} bytes, the manifest says {info['bytes']}")
    with open(p, "rb") as f:
        data = f.read()
    if sha256(data) != info["sha256"]:
        raise ValueError(f"{p}: contents do not match the manifest's SHA-256 (corrupt or from another run)")
    try:
        st = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
        raise ValueError(f"{p}: not a readable shard file ({type(e).__name__}: {e})") from None
    for key in ("world_size", "step", "strategy", "param_shapes"):
        if st.get(key) != man[key]:
            raise ValueError(f"{p}: mismatched shard file: {key} = {st.get(key)!r}, but the "
                             f"manifest says {man[key]!r}")
    if st.get("rank") != rank:
        raise ValueError(f"{p}: holds rank {st.get('rank')!r}, expected rank {rank}")
    return st


