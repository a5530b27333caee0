"""``zeroedu memory``: per-rank model-state bytes and communication per step, from the closed forms.

Prints, for each strategy, param / grad / optimizer / total GB on one GPU (after any TP/PP split
and offload), the GB one rank sends per step, and whether the model states fit the GPU; or, with
``--json``, the same in bytes. Every number comes from `zeroedu.theory`.
"""
from __future__ import annotations

import json
import sys

from .. import catalog, recipes, theory
from ..fmt import gb
from .args import parse_psi, positive_float, positive_int

def add_parser(subparsers) -> None:
    p = subparsers.add_parser("memory", help="bytes per GPU and per step for each strategy",
                              description=__doc__.splitlines()[0])
    p.add_argument("--psi", type=parse_psi, required=True, help="parameters: 7e9, 7B, 125M, 1.5T")
    p.add_argument("--n", type=positive_int, default=8, help="ranks on the inner (dp_shard) axis")
    p.add_argument("--m", type=positive_int, default=1,
                   help="outer (dp_outer) replicas; used by hsdp/hfsdp only (default 1)")
    p.add_argument("--recipe", choices=list(recipes.RECIPES), default=None,
                   help="precision recipe (default: each strategy's own)")
    p.add_argument("--strategy", nargs="+", default=None, metavar="NAME",
                   help=f"strategies (default: all): {', '.join(catalog.STRATEGIES)}")
    p.add_argument("--gpu-gb", type=positive_float, default=80.0, help="GPU memory in GB (1e9 B)")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size")
    p.add_argument("--pp", type=positive_int, default=1, help="pipeline-parallel size")
    p.add_argument("--offload", choices=theory.OFFLOAD_MODES, default="none",
                   help="move optimizer state (ZeRO-Offload) and params (ZeRO-Infinity) to host")
    p.add_argument("--json", action="store_true", help="print JSON (bytes) instead of a table")
    p.set_defaults(func=run)


def _names(args) -> list[str]:
    if args.strategy:
        # canonical names, in the order given, each once
        return list(dict.fromkeys(catalog.get_spec(s).name for s in args.strategy))
    names = list(catalog.STRATEGIES)
    if args.offload == "optimizer+params":
        names = [s for s in names if catalog.shards(catalog.STRATEGIES[s].inner)["param"]]
    return names


def _plain(x):
    return int(x) if x == int(x) else float(x)


def report(args) -> dict:
    """Everything the table and the JSON show, in bytes."""
    psi_rank = args.psi / (args.tp * args.pp)  # each DP rank's share after TP and PP
    out = {"psi": args.psi, "n": args.n, "m": args.m, "recipe": args.recipe, "tp": args.tp,
           "pp": args.pp, "offload": args.offload, "gpu_bytes": _plain(args.gpu_gb * 1e9),
           "strategies": {}, "comm": {}}
    for name in _names(args):
        spec, rec = theory.inputs.resolve(name, args.recipe)
        split = theory.offload(name, psi_rank, args.n, args.m, rec.name, args.offload)
        row = split["device"].as_dict()
        row.update(recipe=rec.name, host_total=split["host"].as_dict()["total"],
                   fits=split["device"].total <= args.gpu_gb * 1e9)
        comm = theory.comm_per_rank(name, psi_rank, args.n, args.m, rec.name)
        out["strategies"][name] = row
        out["comm"][name] = _plain(comm.total())
    return out


def _table(rep: dict) -> str:
    head = (f"psi={rep['psi']:.4g} params, N={rep['n']}, M={rep['m']} (hybrid only), "
            f"tp={rep['tp']}, pp={rep['pp']}, offload={rep['offload']}, "
            f"GPU {rep['gpu_bytes'] / 1e9:g} GB")
    cols = (f"{'strategy':<18}{'recipe':<15}{'param GB':>10}{'grad GB':>10}{'optim GB':>10}"
            f"{'total GB':>10}{'host GB':>10}{'comm GB':>10}  fits")
    lines = [head, cols, "-" * len(cols)]
    for name, r in rep["strategies"].items():
        lines.append(f"{name:<18}{r['recipe']:<15}{gb(r['param'])}{gb(r['grad'])}{gb(r['optim'])}"
                     f"{gb(r['total'])}{gb(r['host_total'])}{gb(rep['comm'][name])}  "
                     f"{'yes' if r['fits'] else 'no'}")
    lines.append("comm GB = bytes one rank sends per step (ring model); "
                 "model states only, no activations")
    return "\n".join(lines)


def run(args) -> int:
    rep = report(args)
    if args.json:
        json.dump(rep, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(_table(rep))
    return 0
