"""On CUDA: the ledger's measurement beside `torch.cuda.max_memory_allocated`, per strategy.

Runs every strategy on as many GPUs as are visible (NCCL, one GPU per rank; hybrids need an
even count), with a model large enough that rounding in the caching allocator is small, and
prints per rank: model-state bytes measured vs predicted, the ledger's peak, and the CUDA
allocator's peak. The allocator's peak is expected a little higher (CUDA workspaces, 512-byte
block rounding, kernel temporaries the ledger does not track); model states must match exactly.

    .venv/bin/python benchmarks/gpu_memory_check.py [--hidden 1024] [--depth 4]
"""
import argparse
import sys

import torch

from zeroedu import catalog
from zeroedu.runtime import cluster
from zeroedu.models import MLPConfig
from zeroedu.train import RunConfig, run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device visible: this check needs a GPU (the CPU path is covered by make test)")
        return 2
    n = torch.cuda.device_count()
    model = MLPConfig(d_in=a.hidden, hidden=a.hidden, depth=a.depth, d_out=a.hidden)
    print(f"{n} GPU(s), backend {cluster.choose_backend(n)}, MLP hidden {a.hidden} depth {a.depth}")
    print(f"{'strategy':18s} {'rank':>4s} {'measured':>12s} {'predicted':>12s} {'ledger peak':>12s} "
          f"{'cuda max alloc':>15s} {'ratio':>6s}")
    ok = True
    for name, spec in catalog.STRATEGIES.items():
        m = 2 if spec.hybrid and n % 2 == 0 and n > 1 else 1
        r = run(RunConfig(name, n, steps=3, m=m, model=model, global_batch=8 * n), warm=False)
        ok &= r.match.model_states and r.match.comm
        for rk in r.ranks:
            cuda = rk.cuda_max_memory_allocated or 0
            print(f"{name:18s} {rk.rank:4d} {rk.measured.total:12,d} {rk.predicted.total:12,d} "
                  f"{rk.peak:12,d} {cuda:15,d} {cuda / rk.peak:6.3f}")
    print(f"model states predicted vs measured on CUDA — match: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
