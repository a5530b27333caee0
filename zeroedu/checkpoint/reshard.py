"""Undo the sharding: read and verify every rank file, rebuild full fp32 per-parameter tensors
(master, m, v) from the pieces, checking every element is covered. The target strategy then
takes its own shards (`Strategy.load_full_state`). This is what DCP does with its global-offset
metadata, minus the planner: at this model size every rank can read all."""
from __future__ import annotations

import os

import torch

from ..models import ModelSpec
from ..train.config import RunConfig
from .dcp import is_dcp, load_dcp
from .format import FullState, param_shapes, read_manifest, read_rank_file, resolve_step_dir

def load_checkpoint(path: str) -> FullState:
    """Read and verify every rank file, undo the sharding: full fp32 params, m, v."""
    d = resolve_step_dir(path)
    man = read_manifest(d)
    if len(man["files"]) != man["world_size"]:
        raise ValueError(f"{d}: manifest lists {len(man['files'])} files for world size {man['world_size']}")
    shapes = [tuple(s) for s in man["param_shapes"]]
    full = {k: [torch.zeros(s) for s in shapes] for k in ("params", "m", "v")}
    covered = [torch.zeros(s, dtype=torch.bool) for s in shapes]
    rng, adam, buffers = [], set(), {}
    frozen: set[int] = set()  # parameters no optimizer target covers: values from the holders
    for r, info in enumerate(man["files"]):
        st = read_rank_file(d, info, man, r)
        rng.append(st["rng"])
        if r == 0:
            buffers = st.get("buffers", {})
            if not (isinstance(buffers, dict) and all(isinstance(b, torch.Tensor) for b in buffers.values())):
                raise ValueError(f"{os.path.join(d, info['name'])}: buffers must map names to tensors")
        adam.add(st["adam_step"])
        mine = st.get("frozen", [])
        if not (isinstance(mine, list) and all(isinstance(i, int) and 0 <= i < len(shapes) for i in mine)):
            raise ValueError(f"{os.path.join(d, info['name'])}: frozen must list parameter indices")
        if r > 0 and set(mine) != frozen:
            raise ValueError(f"{os.path.join(d, info['name'])}: ranks disagree on the frozen parameters")
        frozen = set(mine)
        for h in st["holders"]:
            for i, ps, pe, ls in h["pieces"]:
                if i not in frozen:
                    continue  # trainable: the fp32 master in the targets is the value to keep
                if not (0 <= ps <= pe <= full["params"][i].numel() and 0 <= ls
                        and ls + pe - ps <= h["values"].numel()):
                    raise ValueError(f"{os.path.join(d, info['name'])}: piece {(i, ps, pe, ls)} out of range")
                full["params"][i].view(-1)[ps:pe] = h["values"].view(-1)[ls:ls + pe - ps].float()
                covered[i].view(-1)[ps:pe] = True
        for t in st["targets"]:
            for i, ps, pe, ls in t["pieces"]:
                if i in frozen:
                    raise ValueError(f"{os.path.join(d, info['name'])}: parameter {i} is frozen but has optimizer state")
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
    return FullState(man["step"], adam.pop(), full["params"], full["m"], full["v"], rng, man, d, buffers)


FORMATS = ("zeroedu", "dcp")


def load_any(path: str, model: ModelSpec, format: str = "zeroedu") -> FullState:
    """A zeroedu checkpoint (root or step directory), or a DCP directory when the caller says so.

    The format is the caller's word, never guessed from the files: DCP's ``.metadata`` is a
    pickle, which can run code when read, so only ``format="dcp"`` reads it (a directory from a
    source you trust). zeroedu's own files are JSON and ``torch.load(weights_only=True)``."""
    if format not in FORMATS:
        raise ValueError(f"checkpoint format must be one of {', '.join(FORMATS)}, got {format!r}")
    if format == "dcp":
        return load_dcp(path, model)
    try:
        return load_checkpoint(path)
    except ValueError as e:
        if is_dcp(path) and "not a zeroedu checkpoint" in str(e):
            raise ValueError(f"{path}: not a zeroedu checkpoint, but it holds a DCP .metadata file; "
                             "DCP metadata is a pickle that can run code when read: if you trust where "
                             "the directory came from, load it with format='dcp'") from None
        raise


def check_compatible(state: FullState, cfg: RunConfig) -> None:
    """The run must build the model the checkpoint was saved from."""
    want = param_shapes(cfg.model)
    if [list(s) for s in state.manifest["param_shapes"]] != want:
        raise ValueError(f"{state.path}: checkpoint holds parameter shapes {state.manifest['param_shapes']}, "
                         f"but this run's model has {want}")
    if state.step > cfg.steps:
        raise ValueError(f"{state.path}: checkpoint is at step {state.step}, beyond the run's {cfg.steps} steps")


