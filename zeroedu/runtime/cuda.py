"""What the CUDA caching allocator and the device say on one rank, read through torch's public API
(`reports.CudaMemory` says what each figure is). GPU runs only; nothing here runs on CPU."""
from __future__ import annotations

from ..reports import CudaMemory


def cuda_memory(device: str, cublas_workspace: int | None = None) -> CudaMemory:
    """The allocator's peaks and what lies outside it, now. `cublas_workspace`: the bytes of the
    cuBLAS workspaces, where the caller has read them (`references.torch_private`)."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    used = total - free
    return CudaMemory(max_allocated=torch.cuda.max_memory_allocated(device),
                      max_reserved=torch.cuda.max_memory_reserved(device), device_used=used,
                      outside_allocator=used - torch.cuda.memory_reserved(device), cublas_workspace=cublas_workspace)
