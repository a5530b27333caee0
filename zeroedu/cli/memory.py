"""``zeroedu memory``: what one GPU holds and sends per step, for each strategy, from the closed forms.

Prints, for each strategy, param / grad / optimizer GB of device model states (after any TP/PP
split and offload), host GB, activation GB, the largest gathered unit (ZeRO-3 family), the
device total of the three, the GB one rank sends per step and whether the device total fits the
GPU; or, with ``--json``, the same in bytes. Every number comes from `zeroedu.theory`.

Activations are Korthikanti et al. 2022's for a Megatron GPT layer (`theory.activations`), in the
recipe's parameter dtype, for a shape given by ``--layers/--hidden/--heads`` or inferred from Ψ
(GPT-3 family, h = 128·L; printed), with ``--seq`` (default 4096), ``--micro-batch`` (1),
``--vocab`` (50257, the GPT-2/GPT-3 tokenizer), ``--recompute`` (default selective: no s²
attention tensors kept) and ``--attention`` (default fused, as FlashAttention, torch's
scaled_dot_product_attention and Transformer Engine's fused attention in Megatron-Core keep no
s² scores but one fp32 log-sum-exp per row; eager is the paper's count). With ``--tp`` they follow Eq. (2), tensor parallelism without sequence
parallelism; with ``--pp`` they are the first stage's, which holds L layers' worth (§4.2.3).

N is the data-parallel degree: the job uses N·tp·pp GPUs, N·M·tp·pp for hsdp/hfsdp ("gpus").
``--offload`` applies to ZeRO stages 1-3 only; other rows carry no figure (JSON null and a
"not_applicable" reason), and naming such a strategy with ``--strategy`` is an error.
"""
from __future__ import annotations

import json
import sys
from fractions import Fraction

from .. import catalog, recipes, theory
from ..fmt import gb
from ..theory import activations
from .args import parse_psi, positive_float, positive_int


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("memory", help="bytes per GPU and per step for each strategy",
                              description=__doc__.splitlines()[0])
    p.add_argument("--psi", type=parse_psi, required=True, help="parameters: 7e9, 7B, 125M, 1.5T")
    p.add_argument("--n", type=positive_int, default=8,
                   help="data-parallel ranks on the inner (dp_shard) axis (default 8)")
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
                   help="ZeRO-Offload: optimizer state, fp32 grads and step on the host (ZeRO 1-3); "
                        "optimizer+params: ZeRO-Infinity (ZeRO-3 only)")
    g = p.add_argument_group("activations (Korthikanti et al. 2022; shape inferred from --psi "
                             "unless given)")
    g.add_argument("--seq", type=positive_int, default=activations.DEFAULT_SEQ,
                   help=f"sequence length S (default {activations.DEFAULT_SEQ})")
    g.add_argument("--micro-batch", type=positive_int, default=activations.DEFAULT_MICRO_BATCH,
                   help=f"sequences per micro-batch B (default {activations.DEFAULT_MICRO_BATCH})")
    g.add_argument("--layers", type=positive_int, default=None, help="transformer layers L")
    g.add_argument("--hidden", type=positive_int, default=None, help="hidden size h")
    g.add_argument("--heads", type=positive_int, default=None, help="attention heads a")
    g.add_argument("--vocab", type=positive_int, default=activations.DEFAULT_VOCAB,
                   help=f"vocabulary V (default {activations.DEFAULT_VOCAB}, GPT-2/GPT-3)")
    g.add_argument("--recompute", choices=activations.RECOMPUTE, default=theory.DEFAULT_RECOMPUTE,
                   help=f"activation recomputation (default {theory.DEFAULT_RECOMPUTE})")
    g.add_argument("--attention", choices=activations.ATTENTION, default=activations.DEFAULT_ATTENTION,
                   help=f"fused (default: FlashAttention, torch's scaled_dot_product_attention, "
                        f"Transformer Engine's fused attention: no s² scores stored) or eager (the "
                        f"scores stored, Korthikanti et al.'s count)")
    p.add_argument("--json", action="store_true", help="print JSON (bytes) instead of a table")
    p.set_defaults(func=run)


def _names(args) -> list[str]:
    if args.strategy:
        # canonical names, in the order given, each once; an offload they cannot take is an error
        names = list(dict.fromkeys(catalog.get_spec(s).name for s in args.strategy))
        for s in names:
            reason = theory.offload_not_applicable(s, args.offload)
            if reason:
                raise ValueError(reason)
        return names
    return list(catalog.STRATEGIES)


def _plain(x):
    """Fraction/float -> int when whole, else float (JSON)."""
    if x is None:
        return None
    x = Fraction(x) if not isinstance(x, Fraction) else x
    return int(x) if x.denominator == 1 else float(x)


def _shape(args) -> activations.TransformerShape:
    return activations.transformer_shape(args.psi, layers=args.layers, hidden=args.hidden,
                                         heads=args.heads, seq=args.seq,
                                         micro_batch=args.micro_batch, vocab=args.vocab)


def _activation_block(act: dict) -> dict:
    sh: activations.TransformerShape = act["shape"]
    return {
        "bytes": _plain(act["total"]), "per_layer": _plain(act["per_layer"]),
        "layers_held": act["layers_held"], "layers_bytes": _plain(act["layers_bytes"]),
        "extra": {k: _plain(v) for k, v in act["extra"].items()},
        "formula": act["formula"], "recompute": act["recompute"], "attention": act["attention"],
        "dtype_bytes": act["dtype_bytes"],
        "inputs": {"s": sh.seq, "b": sh.micro_batch, "h": sh.hidden, "a": sh.heads, "L": sh.layers,
                   "v": sh.vocab, "t": act["tp"], "p": act["pp"]},
        "shape": sh.as_dict(), "shape_params": sh.params,
        "assumptions": [
            "Megatron GPT layer (LayerNorm, 4h MLP, dropout masks of 1 byte), no sequence "
            "parallelism; activations in the recipe's parameter dtype",
            "tensor parallel (t > 1): Eq. (2) of §4.2.1, LayerNorm and matmul inputs whole on "
            "every tensor-parallel rank",
            "pipeline (p > 1): the first stage, non-interleaved 1F1B with >= p micro-batches "
            "per step, holds p micro-batches x L/p layers = L layers' worth (§4.2.3)",
            "the shape only sizes activations and gathered units; model states use --psi",
        ],
    }


def report(args) -> dict:
    """Everything the table and the JSON show, in bytes."""
    shape = _shape(args)
    if args.pp > shape.layers:
        raise ValueError(f"--pp {args.pp}: a pipeline stage holds at least one layer, and the model has "
                         f"{shape.layers} (--layers)")
    if shape.heads % args.tp:
        raise ValueError(f"--tp {args.tp}: tensor parallelism splits the {shape.heads} attention heads "
                         f"evenly, so it must divide them (--heads)")
    gpu = args.gpu_gb * 1e9
    psi_rank = args.psi / (args.tp * args.pp)  # each DP rank's share after TP and PP
    out = {"psi": args.psi, "n": args.n, "m": args.m, "recipe": args.recipe, "tp": args.tp,
           "pp": args.pp, "offload": args.offload, "gpu_bytes": _plain(gpu),
           "gpus": args.n * args.tp * args.pp, "gpus_hybrid": args.n * args.m * args.tp * args.pp,
           "activations": None, "strategies": {}, "comm": {}}
    blocks = {}
    for name in _names(args):
        spec, rec = theory.inputs.resolve(name, args.recipe)
        e = rec.param_bytes
        if e not in blocks:
            blocks[e] = activations.transformer_activation_bytes(shape, args.recompute, e, args.tp, args.pp,
                                                                 args.attention)
        act = blocks[e]["total"]
        row = {"recipe": rec.name, "gpus": theory.gpu_count(name, args.n, args.m, args.tp, args.pp)}
        reason = theory.offload_not_applicable(name, args.offload)
        if reason:
            row.update(dict.fromkeys(("param", "grad", "optim", "total", "optim_detail", "host_total",
                                      "activations", "gathered_unit", "gathered_unit_kind",
                                      "gathered_unit_params", "device_total", "fits")),
                       not_applicable=reason)
            out["strategies"][name] = row
            out["comm"][name] = None
            continue
        unit = theory.gathered_unit_bytes(name, shape, rec.name, args.tp)
        d = theory.device_bytes(name, args.psi, args.n, args.m, rec.name, args.tp, args.pp,
                                args.offload, activation_bytes=act, unit_bytes=unit["bytes"])
        row.update(d["model_states"].as_dict())
        row.update(host_total=_plain(d["host"].total), activations=_plain(d["activations"]),
                   gathered_unit=_plain(d["gathered_unit"]), gathered_unit_kind=unit["unit"],
                   gathered_unit_params=_plain(unit["params"]), device_total=_plain(d["total"]),
                   fits=bool(d["total"] <= gpu))
        out["strategies"][name] = row
        out["comm"][name] = _plain(theory.comm_per_rank(name, psi_rank, args.n, args.m, rec.name).total())
    # one activation block per activation dtype; every recipe so far computes in 2 bytes
    # unless --recipe fp32 makes it 4, so there is one
    first = next(iter(blocks.values()))
    out["activations"] = _activation_block(first)
    if len(blocks) > 1:
        out["activations"]["by_dtype_bytes"] = {str(k): _plain(v["total"]) for k, v in blocks.items()}
    return out


def _cell(x) -> str:
    return gb(x) if x is not None else f"{'n/a':>10}"


def _activation_line(a: dict) -> str:
    sh, i = a["shape"], a["inputs"]
    par = []
    if i["t"] > 1:
        par.append(f"tp={i['t']}: Eq. (2), no sequence parallelism")
    if i["p"] > 1:
        par.append(f"pp={i['p']}: the first stage, {a['layers_held']} layer-equivalents")
    how = (f"  shape: {', '.join(sh['inferred'])} inferred from psi (GPT-3 family: h = 128·L, "
           f"a = h/128; {a['shape_params']:.3g} params by this shape's count)\n") if sh["inferred"] else ""
    return (f"activations: GPT L={i['L']}, h={i['h']}, a={i['a']}, S={i['s']}, B={i['b']}, V={i['v']}; "
            f"recompute={a['recompute']}; attention={a['attention']}; {a['dtype_bytes']} bytes/element; "
            + ("; ".join(par) if par else "no TP/PP") + "\n" + how
            + f"  = {a['per_layer'] / 1e9:.3f} GB/layer x {a['layers_held']} + "
            f"{sum(a['extra'].values()) / 1e9:.3f} GB outside the layers = {a['bytes'] / 1e9:.2f} GB "
            f"per GPU (Korthikanti et al. 2022)")


def _table(rep: dict) -> str:
    head = (f"psi={rep['psi']:.4g} params, N={rep['n']}, M={rep['m']} (hybrid only), "
            f"tp={rep['tp']}, pp={rep['pp']}, offload={rep['offload']}, "
            f"GPU {rep['gpu_bytes'] / 1e9:g} GB")
    gpus = f"GPUs: N·tp·pp = {rep['gpus']}"
    if any(catalog.get_spec(s).hybrid for s in rep["strategies"]):
        gpus += f"; hsdp/hfsdp: N·M·tp·pp = {rep['gpus_hybrid']}"
        if rep["m"] == 1:
            gpus += " (M = 1: one domain, so hsdp/hfsdp are flat ZeRO-3 over N; try --m 2)"
    cols = (f"{'strategy':<18}{'recipe':<15}{'param GB':>10}{'grad GB':>10}{'optim GB':>10}"
            f"{'states GB':>10}{'host GB':>10}{'act GB':>10}{'unit GB':>10}{'device GB':>10}"
            f"{'comm GB':>10}  fits")
    lines = [head, gpus, _activation_line(rep["activations"]), cols, "-" * len(cols)]
    notes = {}
    for name, r in rep["strategies"].items():
        if r.get("not_applicable"):
            notes.setdefault(r["not_applicable"], []).append(name)
        fits = "n/a" if r["fits"] is None else ("yes" if r["fits"] else "no")
        lines.append(f"{name:<18}{r['recipe']:<15}" + "".join(_cell(r[k]) for k in (
            "param", "grad", "optim", "total", "host_total", "activations", "gathered_unit",
            "device_total")) + f"{_cell(rep['comm'][name])}  {fits}")
    kinds = {(r["gathered_unit_kind"], r["gathered_unit_params"]) for r in rep["strategies"].values()
             if r.get("gathered_unit_kind")}
    unit = "; ".join(f"here the {k}, {p:.3g} params per GPU" for k, p in sorted(kinds))
    lines += ["states = model states on the device (after TP/PP and offload); act = activations;",
              "unit = the largest unsharded unit a ZeRO-3-family strategy gathers (one layer or the "
              f"embedding{'; ' + unit if unit else ''});",
              "device = states + act + unit, and fits compares it with the GPU; "
              "comm = bytes one rank sends per step (ring model)"]
    lines += [f"n/a ({', '.join(names)}): {reason}" for reason, names in notes.items()]
    return "\n".join(lines)


def run(args) -> int:
    rep = report(args)
    if args.json:
        json.dump(rep, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(_table(rep))
    return 0
