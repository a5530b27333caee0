"""Every private torch internal zeroedu reads, in one module, read against torch 2.13.0: the only
build CI installs (README, "torch: CPU and GPU installs"). Under another torch these are the
first things to check; nothing else in the package touches a torch name that starts with an
underscore (tests/test_layering.py holds it to that).

* `torch.distributed._tools.mem_tracker.MemTracker`, subclassed by `itemizing_mem_tracker`,
  overriding its private `_track` and `_update_peak_stats` and reading `_WINFO` (storage ->
  its accounting) and `_curr_mem_snap` (per device totals): the independent check of the
  ledger's peak (`torch_memory`).
* The same `MemTracker` unchanged (`mem_tracker`), its public `track_external` and
  `get_tracker_snapshot`: the temporaries of torch's own Adam steps (`torch_memory`).
* `torch._C._cuda_clearCublasWorkspaces` (`cublas_workspace_bytes`): frees the cuBLAS workspaces,
  so what they held is read from the allocator (`benchmarks/gpu_memory_check.py`).
* `torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker` (`fsdp2_mem_tracker`): the peak of
  torch's `fully_shard` by its own categories (`torch_fsdp2`).
* `DistributedDataParallel.reducer._get_zeros_like_grad_buckets()` (`ddp_grad_buckets`): the
  bucket sizes torch's DDP chose (`torch_ddp`).
"""
from __future__ import annotations

from ..kinds import CATEGORIES

TORCH_READ_AGAINST = "2.13.0"


def fsdp2_mem_tracker():
    """torch's FSDPMemTracker class (`torch.distributed._tools.fsdp2_mem_tracker`)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    return FSDPMemTracker


def ddp_grad_buckets(ddp) -> list:
    """torch DDP's gradient buckets as they are now (the reducer's bucket-shaped tensors)."""
    return list(ddp.reducer._get_zeros_like_grad_buckets())


def cublas_workspace_bytes(device) -> int:
    """Bytes the cuBLAS and cuBLASLt workspaces hold in the caching allocator now, read by freeing
    them (`torch._C._cuda_clearCublasWorkspaces`, which torch's own tests call between tests): the
    allocator's allocated bytes before less after. The next matmul allocates them again. Raises
    where this torch has no such function: the term is then unread, and says so."""
    import torch

    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is None:
        raise RuntimeError(f"torch {torch.__version__} has no torch._C._cuda_clearCublasWorkspaces: the cuBLAS "
                           "workspace cannot be read (zeroedu.references.torch_private, read against "
                           f"torch {TORCH_READ_AGAINST})")
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    clear()
    torch.cuda.synchronize(device)
    return before - torch.cuda.memory_allocated(device)


def mem_tracker():
    """torch's MemTracker class (`torch.distributed._tools.mem_tracker`), as torch ships it."""
    from torch.distributed._tools.mem_tracker import MemTracker

    return MemTracker


def itemizing_mem_tracker():
    from torch.distributed._tools.mem_tracker import MemTracker

    class ItemizingMemTracker(MemTracker):
        """MemTracker that remembers which operation made each storage, and what was alive at
        its peak (a list of (storage key, bytes, origin))."""

        def __init__(self):
            super().__init__()
            self._op = "?"
            self.origin: dict[int, str] = {}
            self.ledger = None
            self.at_peak = None
            self.peak_total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self._op = getattr(func, "__name__", str(func))
            return super().__torch_dispatch__(func, types, args, kwargs)

        def _track(self, reftype, t):
            super()._track(reftype, t)
            for st in (t.untyped_storage(),):
                winfo = self._WINFO.get(st, (None, None))[0]
                if winfo is not None and id(winfo) not in self.origin:
                    self.origin[id(winfo)] = f"{str(reftype).split('.')[-1]}: {self._op}"

        def _update_peak_stats(self, peak_state):
            super()._update_peak_stats(peak_state)
            for snap in self._curr_mem_snap.values():
                if snap["Total"] > self.peak_total:
                    self.peak_total = snap["Total"]
                    live = [(st._cdata, w.mem_consumed, self.origin.get(id(w), "before the tracker"))
                            for st, (w, _) in list(self._WINFO.items()) if w.mem_consumed]
                    led = self.ledger
                    self.at_peak = (live, dict(zip(CATEGORIES, led._totals)) if led else {},
                                    set(led._storages) if led else set(), self._op)

    return ItemizingMemTracker
