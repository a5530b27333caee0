"""Sharded checkpoints: save from any strategy, load into any other strategy and world size.

On disk, one directory per saved step, and a pointer to the newest complete one::

    ckpt/
      latest                        "step-00000003"   (replaced atomically, last of all)
      step-00000003/
        rank-00000-of-00004.pt      what rank 0 holds: its shards + the index math for them
        ...
        manifest.json               written by rank 0 after every rank's file is on disk

Each rank writes only what it owns (its parameter holders, and its optimizer targets' fp32
master, Adam m and v), with *pieces* that say where every element comes from: (parameter,
range in the flattened parameter, range in the local tensor), computed by the strategy itself
(`Strategy.param_holders` / `target_pieces`, from the `zeroedu.shard` layouts). Padding is in
no piece, so it is never read back as data. A rank file also records the layout kind
(replicated / flat / dim0), per-unit padded sizes and this rank's buffer-wide ranges, N, M,
strategy, recipe, model config, the data position (next step) and the RNG state.

Every file is written to a temporary name in the same directory, fsynced, then `os.replace`d:
a reader sees the old file or the new one, never half of one. The manifest (sizes and
SHA-256 of every rank file) comes after all rank files, and `latest` after the manifest, so a
run killed mid-checkpoint leaves `latest` on the previous, complete checkpoint.

Resharding: `load_checkpoint` reads every rank file and rebuilds full fp32 per-parameter
tensors (master, m, v) from the pieces, checking every element is covered; the target
strategy then takes its own shards (`Strategy.load_full_state`). This is what DCP does with
its global-offset metadata, minus the planner: at this model size every rank can read all.

Jobs: `train_and_save_job` / `resume_job` run on ranks (through `train_and_save` / `resume`),
reusing `zeroedu.train`'s config and set-up.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from . import cluster
from .catalog import get_spec
from .ledger import Ledger
from .models import ModelConfig, local_slice, make_batch, make_model
from .recipes import get_recipe
from .strategies import build
from .train import RunConfig, _dist_state, config_from_dict, config_to_dict

FORMAT = "zeroedu-checkpoint-1"
MANIFEST, LATEST = "manifest.json", "latest"


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def rank_file_name(rank: int, world: int) -> str:
    return f"rank-{rank:05d}-of-{world:05d}.pt"


# ------------------------------------------------------------------------ atomic writes
def _fsync_dir(path: str) -> None:
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
    _fsync_dir(d)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def param_shapes(cfg: ModelConfig) -> list[list[int]]:
    return [list(p.shape) for p in make_model(cfg).parameters()]


# ------------------------------------------------------------------------ save (on a rank)
def _units_info(strategy) -> list[dict]:
    """Per-unit padded sizes and this rank's buffer-wide range, for readers of the file."""
    out = []
    for u in getattr(strategy, "units", None) or []:
        lay = getattr(u, "layout", None)
        if lay is not None:
            rng = getattr(u, "range", None) or getattr(u, "shard_range", None) or getattr(u, "local", None)
            out.append({"numel": lay.numel, "padded_numel": lay.padded_numel,
                        "param_offsets": list(lay.offsets), "param_numels": list(lay.numels),
                        "buffer_range": [rng.start, rng.end] if rng is not None else None})
        elif hasattr(u, "rows"):
            out.append({"shapes": [list(s) for s in u.shapes],
                        "rows": [[r.start, r.end] for r in u.rows]})
    return out


def shard_state(strategy, cfg: RunConfig, rank: int, world: int, next_step: int) -> dict:
    """What this rank writes: plain tensors, ints, strings and lists (loadable with
    torch.load(weights_only=True))."""
    opt = strategy.optim
    holders = [{"values": h.detach().cpu().clone(), "pieces": [list(p) for p in pieces]}
               for h, pieces in strategy.param_holders()]
    targets = []
    for k, (t, pieces) in enumerate(zip(opt.targets, strategy.target_pieces())):
        master = opt.masters[k] if opt.masters else t
        targets.append({"master": master.detach().float().cpu().clone(),
                        "m": opt.m[k].detach().cpu().clone(), "v": opt.v[k].detach().cpu().clone(),
                        "pieces": [list(p) for p in pieces]})
    return {
        "format": FORMAT, "rank": rank, "world_size": world, "strategy": cfg.strategy,
        "recipe": cfg.recipe, "n": cfg.n, "m": cfg.m, "layout": get_spec(cfg.strategy).layout,
        "model": cfg.model.as_dict(), "param_shapes": param_shapes(cfg.model),
        "step": next_step, "adam_step": opt.t, "rng": torch.get_rng_state(),
        "units": _units_info(strategy), "holders": holders, "targets": targets,
    }


def save_sharded(strategy, cfg: RunConfig, ctx, ckpt_dir: str, next_step: int, fault: dict | None = None) -> str:
    """Collective: every rank writes its file; rank 0 writes the manifest, then `latest`."""
    import torch.distributed as dist

    d = os.path.join(ckpt_dir, step_dir_name(next_step))
    os.makedirs(d, exist_ok=True)
    if ctx.rank == 0 and os.path.exists(os.path.join(d, MANIFEST)):
        os.remove(os.path.join(d, MANIFEST))  # this step is being rewritten: not complete until the end
    # Checkpoint coordination is not training traffic: it goes to torch.distributed directly,
    # outside the ledger, so the measured bytes per step stay the strategy's own.
    dist.barrier()
    import io

    buf = io.BytesIO()
    torch.save(shard_state(strategy, cfg, ctx.rank, ctx.world_size, next_step), buf)
    data = buf.getvalue()
    name = rank_file_name(ctx.rank, ctx.world_size)
    atomic_write_bytes(os.path.join(d, name), data)
    _maybe_fault(fault, ctx.rank, "save", next_step)  # a rank dying here: no manifest, old `latest`
    infos = [None] * ctx.world_size
    dist.all_gather_object(infos, {"name": name, "bytes": len(data), "sha256": _sha256(data)})
    if ctx.rank == 0:
        manifest = {"format": FORMAT, "step": next_step, "world_size": ctx.world_size,
                    "strategy": cfg.strategy, "recipe": cfg.recipe, "n": cfg.n, "m": cfg.m,
                    "layout": get_spec(cfg.strategy).layout, "model": cfg.model.as_dict(),
                    "param_shapes": param_shapes(cfg.model), "files": infos,
                    "saved_at": time.time()}
        atomic_write_bytes(os.path.join(d, MANIFEST), json.dumps(manifest, indent=1).encode())
        atomic_write_bytes(os.path.join(ckpt_dir, LATEST), step_dir_name(next_step).encode())
    dist.barrier()
    return d


# ------------------------------------------------------------------------ load (anywhere)
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


def _read_manifest(d: str) -> dict:
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


def _read_rank_file(d: str, info: dict, man: dict, rank: int) -> dict:
    p = os.path.join(d, info["name"])
    if not os.path.exists(p):
        raise ValueError(f"{p}: shard file of rank {rank} is missing (manifest lists "
                         f"{man['world_size']} files)")
    size = os.path.getsize(p)
    if size != info["bytes"]:
        raise ValueError(f"{p}: truncated or overwritten: {size} bytes, the manifest says {info['bytes']}")
    with open(p, "rb") as f:
        data = f.read()
    if _sha256(data) != info["sha256"]:
        raise ValueError(f"{p}: contents do not match the manifest's SHA-256 (corrupt or from another run)")
    import io

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


def load_checkpoint(path: str) -> FullState:
    """Read and verify every rank file, undo the sharding: full fp32 params, m, v."""
    d = resolve_step_dir(path)
    man = _read_manifest(d)
    if len(man["files"]) != man["world_size"]:
        raise ValueError(f"{d}: manifest lists {len(man['files'])} files for world size {man['world_size']}")
    shapes = [tuple(s) for s in man["param_shapes"]]
    full = {k: [torch.zeros(s) for s in shapes] for k in ("params", "m", "v")}
    covered = [torch.zeros(s, dtype=torch.bool) for s in shapes]
    rng, adam = [], set()
    for r, info in enumerate(man["files"]):
        st = _read_rank_file(d, info, man, r)
        rng.append(st["rng"])
        adam.add(st["adam_step"])
        for t in st["targets"]:
            for i, ps, pe, ls in t["pieces"]:
                if not (0 <= i < len(shapes) and 0 <= ps <= pe <= full["params"][i].numel()
                        and 0 <= ls and ls + pe - ps <= t["master"].numel()):
                    raise ValueError(f"{os.path.join(d, info['name'])}: piece {(i, ps, pe, ls)} out of range")
                for key, src in (("params", "master"), ("m", "m"), ("v", "v")):
                    full[key][i].view(-1)[ps:pe] = t[src].view(-1)[ls:ls + pe - ps].float()
                covered[i].view(-1)[ps:pe] = True
    missing = [i for i, c in enumerate(covered) if not bool(c.all())]
    if missing:
        raise ValueError(f"{d}: parameters {missing} are not fully covered by the shard files")
    if len(adam) != 1:
        raise ValueError(f"{d}: ranks disagree on the optimizer step: {sorted(adam)}")
    return FullState(man["step"], adam.pop(), full["params"], full["m"], full["v"], rng, man, d)


def load_any(path: str, model: ModelConfig) -> FullState:
    """A zeroedu checkpoint (root or step directory) or a DCP checkpoint directory."""
    from .checkpoint_dcp import is_dcp, load_dcp

    return load_dcp(path, model) if is_dcp(path) else load_checkpoint(path)


def check_compatible(state: FullState, cfg: RunConfig) -> None:
    """The run must build the model the checkpoint was saved from."""
    want = param_shapes(cfg.model)
    if [list(s) for s in state.manifest["param_shapes"]] != want:
        raise ValueError(f"{state.path}: checkpoint holds parameter shapes {state.manifest['param_shapes']}, "
                         f"but this run's model has {want}")
    if state.step > cfg.steps:
        raise ValueError(f"{state.path}: checkpoint is at step {state.step}, beyond the run's {cfg.steps} steps")


# ------------------------------------------------------------------------ jobs (on ranks)
def _maybe_fault(fault: dict | None, rank: int, where: str, step: int) -> None:
    """Misbehave on purpose (tests): fault = {rank, kind: raise|exit|hang, where: step|save, at}."""
    if not fault or fault.get("rank") != rank or fault.get("where", "step") != where or fault.get("at") != step:
        return
    kind = fault["kind"]
    if kind == "raise":
        raise RuntimeError(f"deliberate failure on rank {rank} at {where} {step}")
    if kind == "exit":
        os._exit(fault.get("code", 9))
    if kind == "hang":
        time.sleep(fault.get("seconds", 3600))


def _train(ctx, cfg: dict, ckpt_dir: str | None, save_at, resume_from: str | None,
           fault: dict | None) -> dict:
    cfg = config_from_dict(cfg)
    ledger = Ledger(ctx.rank)
    strategy = build(cfg.strategy, make_model(cfg.model), _dist_state(ctx, cfg, ledger),
                     get_recipe(cfg.recipe), cfg.adam, **cfg.options)
    start = 0
    if resume_from is not None:
        state = load_any(resume_from, cfg.model)
        check_compatible(state, cfg)
        strategy.load_full_state(state.params, state.m, state.v, state.adam_step)
        start = state.step
        # Same rank count: each rank gets its own generator state back; otherwise rank 0's.
        if state.rng:
            torch.set_rng_state(state.rng[ctx.rank] if len(state.rng) == ctx.world_size else state.rng[0])
    sl = local_slice(cfg.global_batch, ctx.world_size, ctx.rank)
    losses = []
    for step in range(start, cfg.steps):
        _maybe_fault(fault, ctx.rank, "step", step)
        ledger.begin_step(step)
        x, y = make_batch(step, cfg.global_batch, cfg.model)
        losses.append(strategy.forward_backward(x[sl], y[sl]))
        strategy.step()
        if ckpt_dir is not None and step + 1 in save_at:
            save_sharded(strategy, cfg, ctx, ckpt_dir, step + 1, fault)
    params = strategy.full_parameters()  # a collective for sharded strategies
    return {"rank": ctx.rank, "start": start, "losses": losses, "pid": os.getpid(),
            **({"params": params} if ctx.rank == 0 else {})}


def train_and_save_job(ctx, cfg: dict, ckpt_dir: str, save_at: list[int], fault: dict | None = None) -> dict:
    """Train from step 0, saving a sharded checkpoint after each step number in `save_at`."""
    return _train(ctx, cfg, ckpt_dir, set(save_at), None, fault)


def resume_job(ctx, cfg: dict, resume_from: str, ckpt_dir: str | None = None,
               save_at: list[int] = (), fault: dict | None = None) -> dict:
    """Load `resume_from` (any strategy, any world size) and train on to cfg.steps."""
    return _train(ctx, cfg, ckpt_dir, set(save_at), resume_from, fault)


# ------------------------------------------------------------------------ parent side
def _launch(job, cfg: RunConfig, kwargs: dict, pool, timeout) -> dict[str, Any]:
    cfg = cfg.resolved()
    payload = {"cfg": config_to_dict(cfg), **kwargs}
    if pool is not None:
        ranks = pool.run(job, payload, timeout=timeout)
    else:
        ranks = cluster.run(job, cfg.world_size, payload, timeout=timeout)
    n = len(ranks)
    k = len(ranks[0]["losses"])
    return {"strategy": cfg.strategy, "world_size": cfg.world_size, "m": cfg.m, "recipe": cfg.recipe,
            "start": ranks[0]["start"], "losses": [sum(r["losses"][s] for r in ranks) / n for s in range(k)],
            "params": ranks[0]["params"], "pids": [r["pid"] for r in ranks]}


def train_and_save(cfg: RunConfig, ckpt_dir: str, save_at, *, pool=None, timeout=None,
                   fault: dict | None = None) -> dict[str, Any]:
    """Train `cfg` from scratch on real ranks, checkpointing after the steps in `save_at`.
    Returns the global losses (mean over ranks) of every step and the final parameters."""
    return _launch(train_and_save_job, cfg, {"ckpt_dir": os.path.abspath(ckpt_dir),
                                             "save_at": sorted(save_at), "fault": fault}, pool, timeout)


def resume(cfg: RunConfig, resume_from: str, *, ckpt_dir: str | None = None, save_at=(), pool=None,
           timeout=None, fault: dict | None = None) -> dict[str, Any]:
    """Load a checkpoint (zeroedu's, or DCP) into `cfg`'s strategy and world size (validated here, in the parent,
    so a bad checkpoint is a ValueError rather than a rank failure) and train to cfg.steps."""
    cfg = cfg.resolved()
    check_compatible(load_any(resume_from, cfg.model), cfg)
    return _launch(resume_job, cfg, {"resume_from": os.path.abspath(resume_from),
                                     "ckpt_dir": ckpt_dir and os.path.abspath(ckpt_dir),
                                     "save_at": sorted(save_at), "fault": fault}, pool, timeout)
