"""Checks for the classroom labs: run the student's file on real ranks, compare with a reference.

`check(lab, path)` loads the student's file *inside each rank* (so an edit is picked up without
restarting anything), runs the lab's function on N ranks of `zeroedu.runtime.cluster`, and compares the
results with values computed independently here, in the parent process, from the same inputs
(sums and matrix products in plain torch; the HFSDP lab against `zeroedu.theory`). It also
compares the bytes the student's code sent, read from the ledger, with the ring-model figure
from `zeroedu.theory.sent_bytes`.

It never lets a raw traceback escape. It says what is wrong and where: "not implemented yet:
write ...", "rank 2, element 5 of its chunk: expected 12, got 4", "looks like the SUM: divide by
N", the line of the student's file that raised, or which ranks hung in a send/recv.
"""
from __future__ import annotations

import importlib.util
import itertools
import traceback
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import torch

from .. import shard, theory
from ..runtime import cluster
from ..runtime.comm import Comm
from ..runtime.ledger import Ledger
from .generate import default_out

DEFAULT_N = 4
TIMEOUT = 30.0  # seconds before a silent rank counts as hung (a recv nobody sends to)
_load_counter = itertools.count()


@dataclass
class Lab:
    number: int
    file: str
    title: str
    function: str


LABS = {
    1: Lab(1, "lab1_ring_reduce_scatter.py", "ring reduce-scatter from send/recv", "ring_reduce_scatter"),
    2: Lab(2, "lab2_zero2_grad_shard.py", "ZeRO-2 gradient sharding", "shard_gradients"),
    3: Lab(3, "lab3_fsdp_linear.py", "FSDP linear backward", "fsdp_linear_backward"),
    4: Lab(4, "lab4_hfsdp_memory.py", "HFSDP memory estimate", "hfsdp_bytes_per_gpu"),
}


@dataclass
class CheckResult:
    lab: int
    title: str
    path: str
    ok: bool = True
    messages: list[str] = field(default_factory=list)

    def fail(self, msg: str) -> "CheckResult":
        self.ok = False
        self.messages.append(msg)
        return self

    def __str__(self) -> str:
        head = f"lab {self.lab} ({self.title}): " + ("PASSED ✓" if self.ok else "not yet ✗")
        return "\n".join([head] + [f"  - {m}" for m in self.messages])

    __repr__ = __str__


def lab_path(lab: int, version: str = "student", root: Path | None = None) -> Path:
    """labs/<version>/<file>: under `root`, else ./labs if it exists, else the repository's."""
    info = _lab(lab)
    for base in ([Path(root)] if root else [Path.cwd() / "labs", default_out()]):
        p = base / version / info.file
        if p.exists() or root:
            return p
    return default_out() / version / info.file


def _lab(lab) -> Lab:
    try:
        return LABS[int(lab)]
    except (KeyError, ValueError, TypeError):
        raise ValueError(f"unknown lab {lab!r}; labs are {', '.join(map(str, LABS))}") from None


# ------------------------------------------------------------------ inputs (rank and parent)
def lab1_input(rank: int, numel: int) -> torch.Tensor:
    # small integers: sums are exact in fp32, so any difference is a real mistake
    return (torch.arange(numel, dtype=torch.float32) % 7) * (rank + 1) + 10 * rank


def lab2_input(rank: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(100 + rank))


def lab3_inputs(rank: int, case: dict):
    g = torch.Generator().manual_seed(7)
    w = torch.randn(case["out"], case["in"], generator=g)
    gr = torch.Generator().manual_seed(200 + rank)
    x = torch.randn(case["batch"], case["in"], generator=gr)
    dy = torch.randn(case["batch"], case["out"], generator=gr)
    return w, x, dy


# ------------------------------------------------------------------ the rank side
def _load(path: str):
    # A fresh module name per load: a warm rank must see the student's latest edit.
    spec = importlib.util.spec_from_file_location(f"zeroedu_lab_{next(_load_counter)}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _student_line(tb, path: str) -> str:
    """' (your file, line 31: `chunks[i] += x`)' for the deepest frame in the student's file."""
    frames = [f for f in traceback.extract_tb(tb) if Path(f.filename).resolve() == Path(path).resolve()]
    if not frames:
        return ""
    f = frames[-1]
    return f" (your file, line {f.lineno}: `{(f.line or '').strip()}`)"


def _error(e: BaseException, path: str) -> dict:
    if isinstance(e, NotImplementedError):
        return {"error": "not_implemented", "message": str(e) or "the missing code"}
    return {"error": "raised", "message": f"{type(e).__name__}: {e}", "where": _student_line(e.__traceback__, path)}


def _tensor_or_repr(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().clone()
    return {"not_a_tensor": repr(x)[:200]}


def _rank_lab1(mod, ctx, axis, comm, case):
    x = lab1_input(ctx.rank, case["numel"])
    before = x.clone()
    handles = []

    def send(t, dst):
        if not isinstance(dst, int) or not 0 <= dst < ctx.world_size or dst == ctx.rank:
            raise ValueError(f"send(t, dst={dst!r}) from rank {ctx.rank}: dst must be another rank, "
                             f"0..{ctx.world_size - 1}")
        # A copy goes out, so the caller may reuse its buffer at once (like MPI_Bsend).
        handles.append(comm.isend(t.detach().clone().contiguous(), dst, axis, "lab1/ring"))

    def recv(t, src):
        if not isinstance(src, int) or not 0 <= src < ctx.world_size or src == ctx.rank:
            raise ValueError(f"recv(t, src={src!r}) on rank {ctx.rank}: src must be another rank, "
                             f"0..{ctx.world_size - 1}")
        comm.irecv(t, src, axis, "lab1/ring").wait()

    got = getattr(mod, LABS[1].function)(x, ctx.rank, ctx.world_size, send, recv)
    for h in handles:
        h.wait()
    return {"got": _tensor_or_repr(got), "x_modified": not torch.equal(x, before)}


def _rank_lab2(mod, ctx, axis, comm, case):
    g = lab2_input(ctx.rank, case["numel"])
    rng, got = getattr(mod, LABS[2].function)(g.clone(), case["numel"], axis, comm)
    rng = (rng.start, rng.end) if isinstance(rng, shard.Range) else {"not_a_tensor": repr(rng)[:200]}
    return {"range": rng, "got": _tensor_or_repr(got)}


def _rank_lab3(mod, ctx, axis, comm, case):
    w, x, dy = lab3_inputs(ctx.rank, case)
    rows = shard.dim0_rows(case["out"], ctx.world_size, ctx.rank)
    w_shard = w[rows.start:rows.end].clone()
    out = getattr(mod, LABS[3].function)(x, dy, w_shard, case["out"], axis, comm)
    if not (isinstance(out, tuple) and len(out) == 2):
        return {"bad_return": repr(out)[:200]}
    return {"dx": _tensor_or_repr(out[0]), "dw": _tensor_or_repr(out[1])}


_RANK = {1: _rank_lab1, 2: _rank_lab2, 3: _rank_lab3}


def lab_job(ctx, lab: int, path: str, case: dict) -> dict:
    """Runs on every rank: load the student's file, run the lab, return results + comm records.
    Exceptions become data, so one student error never turns into a raw traceback."""
    ledger = Ledger(ctx.rank)
    comm = Comm(ledger)
    axis = ctx.world_axis()
    try:
        out = _RANK[lab](_load(path), ctx, axis, comm, case)
    except BaseException as e:  # noqa: BLE001 - reported to the student, never re-raised
        return _error(e, path)
    out["comm"] = [{"op": r.op, "tag": r.tag, "payload": r.payload, "sent": r.sent} for r in ledger.comm]
    return out


# ------------------------------------------------------------------ the parent side
def _run_ranks(res: CheckResult, lab: int, path: Path, n: int, case: dict) -> list[dict] | None:
    try:
        results = cluster.run(lab_job, n, {"lab": lab, "path": str(path), "case": case}, timeout=TIMEOUT)
    except cluster.RankError as e:
        hung = "did not finish" in e.kind
        res.fail(f"rank {e.rank if e.rank is not None else '?'} {e.kind}" +
                 (": the ranks hung, most likely in recv() waiting for a message nobody sent. Each "
                  "step, every rank must send exactly once to (rank + 1) % world and receive once "
                  "from (rank - 1) % world." if hung else f": {e.detail.strip().splitlines()[-1]}"))
        return None
    errs = [(r, x) for r, x in enumerate(results) if "error" in x]
    if errs:
        ni = [x for _, x in errs if x["error"] == "not_implemented"]
        if ni:
            res.fail(f"not implemented yet: {ni[0]['message']}")
        for r, x in errs:
            if x["error"] == "raised":
                res.fail(f"rank {r} raised {x['message']}{x.get('where', '')}")
        return None
    return results


def _same(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), rtol=tol, atol=tol)


def _compare(res: CheckResult, what: str, got, exp: torch.Tensor, tol: float,
             alternatives: list[tuple[torch.Tensor, str]] = ()) -> bool:
    """True when equal; otherwise one precise message (shape, a known mistake, or the first
    differing element)."""
    if isinstance(got, dict) and "not_a_tensor" in got:
        res.fail(f"{what}: returned {got['not_a_tensor']}, expected a tensor of shape {tuple(exp.shape)}")
        return False
    if tuple(got.shape) != tuple(exp.shape):
        res.fail(f"{what}: shape {tuple(got.shape)}, expected {tuple(exp.shape)}")
        return False
    if _same(got, exp, tol):
        return True
    for alt, msg in alternatives:
        if _same(got, alt, tol):
            res.fail(f"{what}: {msg}")
            return False
    diff = ~torch.isclose(got.float(), exp.float(), rtol=tol, atol=tol)
    idx = tuple(int(i) for i in diff.nonzero()[0])
    where = idx[0] if len(idx) == 1 else idx
    res.fail(f"{what}, element {where}: expected {float(exp[idx]):.6g}, got {float(got[idx]):.6g} "
             f"({int(diff.sum())} of {exp.numel()} elements differ)")
    return False


def _check_bytes(res: CheckResult, rank: int, records: list[dict], expected: Fraction, how: str) -> None:
    sent = sum((Fraction(r["sent"]) for r in records), Fraction(0))
    if sent != expected:
        ops = ", ".join(sorted({r["op"] for r in records})) or "nothing"
        res.fail(f"rank {rank} sent {float(sent):g} bytes ({ops}); {how} sends {float(expected):g}")


def _check_lab1(res: CheckResult, path: Path, n: int) -> None:
    numel = 3 * n
    results = _run_ranks(res, 1, path, n, {"numel": numel})
    if results is None:
        return
    inputs = [lab1_input(k, numel) for k in range(n)]
    total = sum(inputs)
    for r, out in enumerate(results):
        exp = total.chunk(n)[r]
        alts = [(inputs[r].chunk(n)[r], "this is your own chunk r, unreduced: add what you receive")]
        alts += [(total.chunk(n)[j], f"this is the full sum of chunk {j}; rank {r} must end with "
                  f"chunk {r} (shift which chunk you send in step s)") for j in range(n) if j != r]
        if isinstance(out["got"], torch.Tensor) and tuple(out["got"].shape) == tuple(total.shape):
            res.fail(f"rank {r}: returned the whole tensor ({numel} elements); return only chunk {r} "
                     f"({numel // n} elements)")
            continue
        if not _compare(res, f"rank {r}", out["got"], exp, 0.0, alts):
            continue
        if out["x_modified"]:
            res.fail(f"rank {r}: modified its input x; work on copies (x.clone()) of the chunks")
        _check_bytes(res, r, out["comm"], theory.sent_bytes("reduce_scatter", numel * 4, n),
                     f"a ring reduce-scatter ((N-1)/N · S = {n - 1}/{n} · {numel * 4})")


def _check_lab2(res: CheckResult, path: Path, n: int) -> None:
    numel = 4 * n + 3  # not a multiple of N: the padding must be handled
    results = _run_ranks(res, 2, path, n, {"numel": numel})
    if results is None:
        return
    grads = [lab2_input(k, numel) for k in range(n)]
    padded = shard.padded_numel(numel, n)
    mean = torch.zeros(padded)
    mean[:numel] = sum(grads) / n
    for r, out in enumerate(results):
        rng = shard.shard_range(numel, n, r)
        if isinstance(out["range"], dict):
            res.fail(f"rank {r}: the range is {out['range']['not_a_tensor']}; return a zeroedu.shard.Range")
        elif tuple(out["range"]) != (rng.start, rng.end):
            res.fail(f"rank {r}: range [{out['range'][0]}, {out['range'][1]}) but this rank owns "
                     f"zeroedu.shard.shard_range({numel}, {n}, {r}) = [{rng.start}, {rng.end})")
        exp = mean[rng.start:rng.end]
        own = torch.zeros(padded)
        own[:numel] = grads[r]
        alts = [(exp * n, "looks like the SUM over ranks: divide by N for the average"),
                (own[rng.start:rng.end], "this is your own gradient, unreduced: reduce-scatter it")]
        alts += [(mean[j * (padded // n):(j + 1) * (padded // n)], f"this is rank {j}'s chunk")
                 for j in range(n) if j != r]
        if not _compare(res, f"rank {r}, gradient shard", out["got"], exp, 1e-6, alts):
            continue
        ops = [c["op"] for c in out["comm"]]
        if "all_reduce" in ops:
            res.fail(f"rank {r} used all_reduce: it sends 2(N-1)/N · S, twice a reduce-scatter's "
                     "bytes, and ZeRO-2 needs only this rank's chunk: reduce-scatter instead")
            continue
        _check_bytes(res, r, out["comm"], theory.sent_bytes("reduce_scatter", padded * 4, n),
                     f"one reduce-scatter of the padded buffer ({n - 1}/{n} · {padded} × 4 bytes)")


LAB3_CASE = {"out": 7, "in": 5, "batch": 3}


def _check_lab3(res: CheckResult, path: Path, n: int) -> None:
    case = dict(LAB3_CASE)
    results = _run_ranks(res, 3, path, n, case)
    if results is None:
        return
    ins = [lab3_inputs(k, case) for k in range(n)]
    w = ins[0][0]
    dw_sum = sum(dy.t() @ x for _, x, dy in ins)
    rows_c = shard.dim0_chunk_rows(case["out"], n)
    for r, out in enumerate(results):
        if "bad_return" in out:
            res.fail(f"rank {r}: returned {out['bad_return']}; return a tuple (dx, dw_shard)")
            continue
        _, x, dy = ins[r]
        rows = shard.dim0_rows(case["out"], n, r)
        _compare(res, f"rank {r}, dx", out["dx"], dy @ w, 1e-5,
                 [(dy @ w * n, "dx was multiplied by N: dX = dY W needs no reduction")])
        exp = dw_sum[rows.start:rows.end] / n
        got = out["dw"]
        if isinstance(got, torch.Tensor) and got.shape[0] != rows.size and got.shape[1:] == exp.shape[1:]:
            res.fail(f"rank {r}, dw_shard: {got.shape[0]} row(s), but this rank owns {rows.size} "
                     f"(zeroedu.shard.dim0_rows({case['out']}, {n}, {r}) = rows {rows.start}..{rows.end}; "
                     f"chunks are {rows_c} rows, the padding rows are not returned)")
            continue
        local = (dy.t() @ x)[rows.start:rows.end]
        ok = _compare(res, f"rank {r}, dw_shard", got, exp, 1e-5,
                      [(exp * n, "looks like the SUM over ranks: divide by N for the mean"),
                       (local, "this is your own rows of dYᵀX, not reduced across ranks: reduce-scatter"),
                       (local / n, "your own dYᵀX divided by N: the reduce-scatter is missing")])
        if not ok:
            continue
        s = rows_c * n * case["in"] * 4
        _check_bytes(res, r, out["comm"],
                     theory.sent_bytes("all_gather", s, n) + theory.sent_bytes("reduce_scatter", s, n),
                     "one all-gather of W plus one reduce-scatter of dW (padded rows)")


LAB4_CASES = [(7e9, 8, 2, "mixed-bf16"), (13e9, 4, 4, "megatron-bf16"), (1.3e9, 16, 2, "fp16"),
              (827, 3, 2, "fp32"), (70e9, 8, 1, "mixed-bf16")]


def _check_lab4(res: CheckResult, path: Path, n: int) -> None:
    from .. import recipes

    try:
        fn = getattr(_load(str(path)), LABS[4].function)
    except BaseException as e:  # noqa: BLE001
        res.fail(f"your file does not load: {type(e).__name__}: {e}")
        return
    for psi, nn, m, recipe in LAB4_CASES:
        where = f"Ψ={psi:g}, N={nn}, M={m}, {recipe}"
        try:
            got = fn(psi, nn, m, recipe)
        except BaseException as e:  # noqa: BLE001
            err = _error(e, str(path))
            res.fail(f"not implemented yet: {err['message']}" if err["error"] == "not_implemented"
                     else f"{where}: raised {err['message']}{err.get('where', '')}")
            return
        exp = theory.model_states("hfsdp", psi, nn, m, recipe)
        if not isinstance(got, dict) or not {"param", "grad", "optim", "total"} <= set(got):
            res.fail(f"{where}: returned {got!r:.120}; return a dict with keys param, grad, optim, total")
            return
        rec = recipes.get_recipe(recipe)
        P, G, K = rec.param_bytes, rec.grad_bytes, rec.optim_bytes
        psi_f = Fraction(psi)
        hints = {
            "param": {P * psi_f: "params are ZeRO-3-sharded inside a domain: PΨ/N",
                      P * psi_f / (nn * m): "params are replicated across domains: PΨ/N, not /(N·M)"},
            "grad": {G * psi_f: "gradients are ZeRO-3-sharded inside a domain: GΨ/N",
                     G * psi_f / (nn * m): "gradients are replicated across domains: GΨ/N, not /(N·M)",
                     2 * psi_f / nn: "use the recipe's gradient bytes (recipes.get_recipe(recipe).grad_bytes)"},
            "optim": {K * psi_f / nn: "the optimizer state is also cut across the M domains (ZeRO-1 on "
                                      "dp_outer): KΨ/(N·M)",
                      K * psi_f: "the optimizer state is sharded: KΨ/(N·M)",
                      12 * psi_f / (nn * m): "use the recipe's optimizer bytes (recipes.get_recipe(recipe).optim_bytes)"},
        }
        for key in ("param", "grad", "optim", "total"):
            g, e = got[key], getattr(exp, key)
            try:
                close = abs(float(g) - float(e)) <= 1e-9 * max(1.0, abs(float(e)))
            except (TypeError, ValueError):
                res.fail(f"{where}: {key} = {g!r} is not a number")
                return
            if not close:
                hint = next((h for v, h in hints.get(key, {}).items()
                             if abs(float(g) - float(v)) <= 1e-9 * max(1.0, float(v)) and v != e), "")
                if key == "total" and not hint:
                    hint = "total must be param + grad + optim"
                res.fail(f"{where}: {key} = {float(g):g} bytes, expected {float(e):g}" + (f" — {hint}" if hint else ""))
                return


_CHECKS = {1: _check_lab1, 2: _check_lab2, 3: _check_lab3, 4: _check_lab4}


def check(lab, path: str | Path | None = None, version: str = "student", n: int = DEFAULT_N,
          quiet: bool = False) -> CheckResult:
    """Check lab `lab` (1-4) in `path` (default labs/<version>/<file>); print and return the result."""
    info = _lab(lab)
    p = Path(path) if path is not None else lab_path(info.number, version)
    res = CheckResult(info.number, info.title, str(p))
    if not p.exists():
        res.fail(f"no file at {p}; generate the labs with `python -m zeroedu.labs build`")
    else:
        try:
            compile(p.read_text(), str(p), "exec")
        except SyntaxError as e:
            res.fail(f"your file has a syntax error, line {e.lineno}: {e.msg}")
        else:
            try:
                _CHECKS[info.number](res, p, n)
            except Exception as e:  # noqa: BLE001 - a checker bug must still not look like the student's crash
                res.fail(f"the checker itself failed ({type(e).__name__}: {e}); please report it")
    if res.ok:
        res.messages.append(f"matches zeroedu.theory on {len(LAB4_CASES)} cases" if info.number == 4 else
                            f"matches the reference on {n} ranks, and the bytes sent match the ring model")
    if not quiet:
        print(res)
    return res


def check_all(version: str = "student", n: int = DEFAULT_N, quiet: bool = False) -> list[CheckResult]:
    return [check(k, version=version, n=n, quiet=quiet) for k in LABS]


__all__ = ["LABS", "Lab", "CheckResult", "check", "check_all", "lab_job", "lab_path"]
