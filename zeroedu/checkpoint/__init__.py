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
strategy, recipe, model config, the data position (next step) and the RNG state. Frozen
parameters (``requires_grad=False``, listed as ``frozen``) have no optimizer target: their
values are read back from the parameter holders, and their m and v are zero.

A step is written into a hidden ``.step-NNNNNNNN.partial`` directory (every file to a temporary
name, fsynced, then `os.replace`d); the manifest (sizes and SHA-256 of every rank file) comes
after all rank files; then the complete directory is moved into place (a rename, or, for a step
saved again, an atomic exchange with the old one), and `latest` is replaced after that. So a
step directory is only ever complete, and a run killed mid-checkpoint leaves `latest` on a
complete checkpoint, even when it was re-saving the very step `latest` names. Manifests are
validated field by field on load; a malformed one is a `ValueError` naming the file.

Resharding: `load_checkpoint` reads every rank file and rebuilds full fp32 per-parameter
tensors (master, m, v) from the pieces, checking every element is covered; the target
strategy then takes its own shards (`Strategy.load_full_state`). This is what DCP does with
its global-offset metadata, minus the planner: at this model size every rank can read all.

Modules: `format` (names, atomic writes, reading and verifying files), `save` (what a rank
writes), `reshard` (undo the sharding: full fp32 tensors), `dcp` (torch.distributed.checkpoint
interop), `jobs` (train-and-save / resume on real ranks, through `zeroedu.train.runner`).
"""
from .dcp import export_dcp, is_dcp, load_dcp
from .format import (FORMAT, LATEST, MANIFEST, FullState, atomic_write_bytes, param_shapes,
                     rank_file_name, resolve_step_dir, step_dir_name)
from .jobs import resume, resume_job, train_and_save, train_and_save_job
from .reshard import check_compatible, load_any, load_checkpoint
from .save import save_sharded, shard_state

__all__ = ["export_dcp", "is_dcp", "load_dcp", "FORMAT", "LATEST", "MANIFEST", "FullState",
           "atomic_write_bytes", "param_shapes", "rank_file_name", "resolve_step_dir", "step_dir_name",
           "resume", "resume_job", "train_and_save", "train_and_save_job", "check_compatible", "load_any",
           "load_checkpoint", "save_sharded", "shard_state"]
