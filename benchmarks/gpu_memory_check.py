"""On CUDA: the ledger's peak plus every named term against `torch.cuda.max_memory_allocated`.

Runs every strategy on as many GPUs as are visible (NCCL, one GPU per rank; the hybrids take
M = 2 where the count is even, else M = 1) on an MLP large enough that the allocator's 512-byte
rounding is small, and prints per rank:

    ledger peak      what the ledger holds at its peak (model states, activations, gathered units,
                     communication buffers, autograd's and Adam's temporaries), from the storages
    + cuBLAS         the cuBLAS / cuBLASLt workspaces in the allocator, read by freeing them
    = named          the two together: must be within 1 % of the allocator's peak
    max allocated    `torch.cuda.max_memory_allocated`
    reserved - alloc the caching allocator's own share at its peak (cached free blocks)
    outside          device used (`mem_get_info`) less what the allocator reserved: the CUDA
                     context, kernel modules, NCCL's buffers; what nvidia-smi adds on top

First, the caching allocator alone (`theory.allocator`): one tensor of 600,000, 5,000,000,
30,000,000 and 21 MiB + 1 bytes, each on an empty cache, must grow `memory_allocated` by the
closed form's block (or whole segment) and `memory_reserved` by its segment, to the byte.

It fails (exit 1) where the allocator's growth differs, where a rank's named total is off by more than 1 %, where model states do not
equal the closed form, or where a term cannot be read (the error says which). Without a GPU it
says so and exits 2: the CPU path is covered by `make test`.

    .venv/bin/python benchmarks/gpu_memory_check.py [--hidden 1024] [--depth 4] [--batch 8]
"""
import argparse
import sys

import torch

from zeroedu import catalog
from zeroedu.models import MLPConfig, unit_shapes
from zeroedu.references.torch_memory import cuda_memory_job
from zeroedu.reports import CudaMemory
from zeroedu.runtime import cluster
from zeroedu.kinds import MODEL_STATE
from zeroedu.theory import allocator
from zeroedu.theory.memory import exact_model_states
from zeroedu.train import RunConfig, config_to_dict

TOLERANCE = 0.01
ALLOCATOR_REQUESTS = (600_000, 5_000_000, 30_000_000, 21 * 2**20 + 1)


def allocator_check() -> list[str]:
    """Each request on an empty cache: what memory_allocated and memory_reserved grow by, measured,
    against `theory.allocator`'s allocated_bytes and segment_bytes."""
    failures = []
    print(f"{'request':>12s} {'allocated +':>12s} {'closed form':>12s} {'reserved +':>12s} {'closed form':>12s}")
    for nbytes in ALLOCATOR_REQUESTS:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        a0, r0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        da, dr = torch.cuda.memory_allocated() - a0, torch.cuda.memory_reserved() - r0
        del x
        want_a, want_r = allocator.allocated_bytes(nbytes), allocator.segment_bytes(nbytes)
        print(f"{nbytes:12,d} {da:12,d} {want_a:12,d} {dr:12,d} {want_r:12,d}")
        if (da, dr) != (want_a, want_r):
            failures.append(f"allocator, {nbytes:,d} bytes: allocated +{da:,d} reserved +{dr:,d}, "
                            f"closed form +{want_a:,d} +{want_r:,d}")
    torch.cuda.empty_cache()
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8, help="samples per rank")
    ap.add_argument("--recipe", default="fp32")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device visible: this check needs a GPU (the CPU path is covered by make test)")
        return 2
    n = torch.cuda.device_count()
    model = MLPConfig(d_in=a.hidden, hidden=a.hidden, depth=a.depth, d_out=a.hidden)
    shapes = unit_shapes(model.build())
    print(f"{n} GPU(s) ({torch.cuda.get_device_name(0)}), torch {torch.__version__}, backend "
          f"{cluster.choose_backend(n)}, MLP hidden {a.hidden} depth {a.depth}, {a.batch} samples per rank, {a.recipe}")
    head = (f"{'strategy':17s} {'rank':>4s} {'ledger peak':>12s} {'+ cuBLAS':>11s} {'= named':>12s} "
            f"{'max allocated':>14s} {'named/alloc':>11s} {'reserved-alloc':>14s} {'outside':>12s}  ledger peak at")
    failures = allocator_check()
    print(head)
    for name, spec in catalog.STRATEGIES.items():
        m = 2 if spec.hybrid and n % 2 == 0 and n > 1 else 1
        recipe = "megatron-bf16" if name == "megatron_distopt" and a.recipe == "mixed-bf16" else a.recipe
        cfg = RunConfig(name, n, steps=3, m=m, model=model, global_batch=a.batch * n, recipe=recipe).resolved()
        try:
            ranks = cluster.run(cuda_memory_job, n, {"cfg": config_to_dict(cfg)})
        except cluster.RankError as e:
            print(f"{name:17s} could not be read: {e.summary}")
            failures.append(f"{name}: {e.summary}")
            continue
        for r in ranks:
            cuda = CudaMemory.from_plain(r["cuda"])
            named = cuda.named(r["peak"])
            ratio = named / cuda.max_allocated
            want = exact_model_states(name, shapes, n // m, m, rank=r["rank"], recipe=recipe).total
            states = sum(r["model_states"][c] for c in MODEL_STATE)
            print(f"{name:17s} {r['rank']:4d} {r['peak']:12,d} {cuda.cublas_workspace:11,d} {named:12,d} "
                  f"{cuda.max_allocated:14,d} {ratio:11.4f} {cuda.max_reserved - cuda.max_allocated:14,d} "
                  f"{cuda.outside_allocator:12,d}  {r['peak_label']}")
            if abs(ratio - 1) > TOLERANCE:
                failures.append(f"{name} rank {r['rank']}: named {named:,d} vs allocated {cuda.max_allocated:,d}")
            if states != want:
                failures.append(f"{name} rank {r['rank']}: model states {states:,d}, closed form {want:,d}")
    for f in failures:
        print("FAIL", f)
    print("every rank's ledger + named terms within 1 % of max_memory_allocated, model states exact: "
          f"{'yes' if not failures else 'NO'}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
