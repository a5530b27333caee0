"""Labs 1-4: one function each, run on real ranks (lab 4: in this process), graded against
values computed independently here from the same inputs.

Expected values never come from a key: lab 1 and 2 from plain torch sums of every rank's input,
lab 3 from plain matrix products, lab 4 from `zeroedu.theory.model_states`; the bytes from
`zeroedu.theory.sent_bytes` (the ring model). Inputs are integers where sums must be exact
(lab 1), seeded random numbers elsewhere; hidden cases draw new sizes, N and seeds.
"""
from __future__ import annotations

import contextlib

import random
from fractions import Fraction

import torch

from .. import recipes, shard, theory
from .grading import Case, Diagnosis, LabResult
from .registry import LABS
from .student import run_cases

# Hidden world sizes: more than the visible cases' N (and odd ones, where chunk arithmetic breaks).
HIDDEN_N = (2, 3, 4, 5, 6)
# Hidden inputs' seeds: 62 random bits each (drawn from the check's seed), so a submission cannot
# search for the seed that made its own input and compute the other ranks' from it.
SEED_BITS = 62


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed % (1 << 63))


# ------------------------------------------------------------------ inputs (rank and parent)
def lab1_input(rank: int, numel: int, seed: int = 0) -> torch.Tensor:
    # small integers: sums are exact in fp32, so any difference is a real mistake
    if seed == 0:
        return (torch.arange(numel, dtype=torch.float32) % 7) * (rank + 1) + 10 * rank
    g = _gen(seed * 1009 + rank)
    return torch.randint(-9, 10, (numel,), generator=g).float()


def lab2_input(rank: int, numel: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(numel, generator=_gen(100 + rank + 1009 * seed))


def lab3_inputs(rank: int, case: dict):
    seed = case.get("seed", 0)
    g = _gen(7 + 1009 * seed)
    w = torch.randn(case["out"], case["in"], generator=g)
    gr = _gen(200 + rank + 1009 * seed)
    x = torch.randn(case["batch"], case["in"], generator=gr)
    dy = torch.randn(case["batch"], case["out"], generator=gr)
    return w, x, dy


# ------------------------------------------------------------------ cases
def cases(lab: int, n: int, hidden: int, rng: random.Random) -> list[Case]:
    out = []
    if lab == 1:
        out.append(Case("visible-1", False, n, {"numel": 3 * n, "seed": 0}))
        for k in range(hidden):
            nn = rng.choice(HIDDEN_N)
            out.append(Case(f"hidden-{k + 1}", True, nn, {"numel": nn * rng.randint(1, 6),
                                                         "seed": rng.getrandbits(SEED_BITS)}))
    elif lab == 2:
        out.append(Case("visible-1", False, n, {"numel": 4 * n + 3, "seed": 0}))
        for k in range(hidden):
            out.append(Case(f"hidden-{k + 1}", True, rng.choice(HIDDEN_N),
                            {"numel": rng.randint(1, 40), "seed": rng.getrandbits(SEED_BITS)}))
    elif lab == 3:
        out.append(Case("visible-1", False, n, {"out": 7, "in": 5, "batch": 3, "seed": 0}))
        for k in range(hidden):
            out.append(Case(f"hidden-{k + 1}", True, rng.choice(HIDDEN_N),
                            {"out": rng.randint(1, 11), "in": rng.randint(1, 7), "batch": rng.randint(1, 4),
                             "seed": rng.getrandbits(SEED_BITS)}))
    elif lab == 4:
        for k, (psi, nn, m, recipe) in enumerate(LAB4_CASES):
            out.append(Case(f"visible-{k + 1}", False, nn, {"psi": psi, "m": m, "recipe": recipe}))
        for k in range(hidden):
            psi = float(f"{rng.uniform(1, 999):.3g}e{rng.randint(3, 11)}")
            out.append(Case(f"hidden-{k + 1}", True, rng.randint(1, 16),
                            {"psi": psi, "m": rng.randint(1, 4), "recipe": rng.choice(sorted(recipes.RECIPES))}))
    return out


LAB4_CASES = [(7e9, 8, 2, "mixed-bf16"), (13e9, 4, 4, "megatron-bf16"), (1.3e9, 16, 2, "fp16"),
              (827, 3, 2, "fp32"), (70e9, 8, 1, "mixed-bf16")]


# ------------------------------------------------------------------ the rank side
def _tensor_or_repr(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().clone()
    return {"not_a_tensor": repr(x)[:200]}


def _comm(ledger) -> list[dict]:
    return [{"op": r.op, "tag": r.tag, "payload": r.payload, "sent": r.sent, "messages": r.messages}
            for r in ledger.comm]


_METER = []  # one meter per rank process, made at its first case (after the group exists)


@contextlib.contextmanager
def on_the_wire(out: dict):
    """Bytes this rank's sockets took while the body ran, read from the kernel
    (`runtime.wire.WireMeter`), into `out["wire"]` (None where not measurable): what the
    submission really sent, whatever it says or records."""
    from ..runtime.wire import WireMeter

    if not _METER:
        _METER.append(WireMeter())
    meter = _METER[0]
    snap = meter.snapshot()
    yield
    d = meter.sent_since(snap)
    out["wire"] = None if d is None or not d.complete else d.sent


def _rank_lab1(mod, ctx, case):
    from ..runtime.comm import Comm
    from ..runtime.ledger import Ledger

    ledger = Ledger(ctx.rank)
    comm, axis = Comm(ledger), ctx.world_axis()
    x = lab1_input(ctx.rank, case["numel"], case["seed"])
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

    wire: dict = {}
    with on_the_wire(wire):
        got = mod.ring_reduce_scatter(x, ctx.rank, ctx.world_size, send, recv)
        for h in handles:
            h.wait()
    return {"got": _tensor_or_repr(got), "x_modified": not torch.equal(x, before), "comm": _comm(ledger), **wire}


def _rank_lab2(mod, ctx, case):
    from ..runtime.comm import Comm
    from ..runtime.ledger import Ledger

    ledger = Ledger(ctx.rank)
    comm, axis = Comm(ledger), ctx.world_axis()
    g = lab2_input(ctx.rank, case["numel"], case["seed"])
    wire: dict = {}
    with on_the_wire(wire):
        out = mod.shard_gradients(g.clone(), case["numel"], axis, comm)
    if not (isinstance(out, tuple) and len(out) == 2):
        return {"bad_return": repr(out)[:200], "comm": _comm(ledger), **wire}
    rng, got = out
    rng = (rng.start, rng.end) if isinstance(rng, shard.Range) else {"not_a_tensor": repr(rng)[:200]}
    return {"range": rng, "got": _tensor_or_repr(got), "comm": _comm(ledger), **wire}


def _rank_lab3(mod, ctx, case):
    from ..runtime.comm import Comm
    from ..runtime.ledger import Ledger

    ledger = Ledger(ctx.rank)
    comm, axis = Comm(ledger), ctx.world_axis()
    w, x, dy = lab3_inputs(ctx.rank, case)
    rows = shard.dim0_rows(case["out"], ctx.world_size, ctx.rank)
    w_shard = w[rows.start:rows.end].clone()
    wire: dict = {}
    with on_the_wire(wire):
        out = mod.fsdp_linear_backward(x, dy, w_shard, case["out"], axis, comm)
    if not (isinstance(out, tuple) and len(out) == 2):
        return {"bad_return": repr(out)[:200], "comm": _comm(ledger), **wire}
    return {"dx": _tensor_or_repr(out[0]), "dw": _tensor_or_repr(out[1]), "comm": _comm(ledger), **wire}


_RANK = {1: _rank_lab1, 2: _rank_lab2, 3: _rank_lab3}


@contextlib.contextmanager
def filled_uninitialized_memory():
    """torch.empty and its kin return NaN (floats) or the largest integer while this is on
    (torch's deterministic mode with `torch.utils.deterministic.fill_uninitialized_memory`), so
    a buffer the student left uninitialised gives the same wrong answer on every run instead of
    whatever the allocator's page held."""
    was, fill = torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory
    warn = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def lab_job(ctx, lab: int, path: str, cases: list[dict]) -> list[dict]:
    """Runs on every rank: each case of lab `lab` (1-3) on the student's file at `path`, with
    uninitialised memory filled (`filled_uninitialized_memory`)."""
    with filled_uninitialized_memory():
        return run_cases(ctx, path, cases, lambda mod, c, case: _RANK[lab](mod, c, case), LABS[lab].functions)


# ------------------------------------------------------------------ comparing (parent side)
def compare(what: str, got, exp: torch.Tensor, tol: float, alternatives=(), rank=None,
            shard_range=None) -> Diagnosis | None:
    """None when equal; otherwise one precise diagnosis (a known mistake, the shape, or the
    first differing element with expected and got)."""
    base = {"rank": rank, "shard": shard_range}
    if isinstance(got, dict) and "not_a_tensor" in got:
        return Diagnosis(f"{what}: returned {got['not_a_tensor']}, expected a tensor of shape "
                         f"{tuple(exp.shape)}", **base)
    if tuple(got.shape) != tuple(exp.shape):
        return Diagnosis(f"{what}: shape {tuple(got.shape)}, expected {tuple(exp.shape)}", **base)

    def same(a, b):
        return torch.allclose(a.float(), b.float(), rtol=tol, atol=tol)

    if same(got, exp):
        return None
    for alt, msg in alternatives:
        if alt.shape == exp.shape and same(got, alt):
            return Diagnosis(f"{what}: {msg}", **base)
    diff = ~torch.isclose(got.float(), exp.float(), rtol=tol, atol=tol)
    idx = tuple(int(i) for i in diff.nonzero()[0])
    where = idx[0] if len(idx) == 1 else idx
    e, g = float(exp[idx]), float(got[idx])
    return Diagnosis(f"{what}, element {where}: expected {e:.6g}, got {g:.6g} "
                     f"({int(diff.sum())} of {exp.numel()} elements differ)", element=where, expected=e, got=g,
                     **base)


def check_sent(rank: int, out: dict, expected: Fraction, how: str) -> Diagnosis | None:
    """The bytes rank `rank` sent through the primitives it was handed (`out["comm"]`, the
    ledger's records) against `expected`; then what its sockets really took while the
    submission ran (`out["wire"]`, from the kernel) against those records plus gloo's framing
    (`wire.framing`), exactly: traffic that went around the handed primitives shows there."""
    from ..runtime.wire import framing

    records = out["comm"]
    sent = sum((Fraction(r["sent"]) for r in records), Fraction(0))
    ops = ", ".join(sorted({r["op"] for r in records})) or "nothing"
    if sent != expected:
        return Diagnosis(f"rank {rank} sent {float(sent):g} bytes ({ops}); {how} sends {float(expected):g}",
                         rank=rank, expected=float(expected), got=float(sent))
    wire = out.get("wire")
    if wire is None:  # not measurable here (not Linux TCP): the records stand
        return None
    counted = sent + sum(framing(r["op"], r.get("messages", 0)) for r in records)
    if wire != counted:
        return Diagnosis(f"rank {rank}'s sockets took {wire:g} bytes while your function ran, but what it sent "
                         f"through the primitives it was handed ({ops}) accounts for {float(counted):g} "
                         f"({float(sent):g} of data and gloo's framing): {wire - float(counted):g} bytes went "
                         "another way; send only through what the lab hands you",
                         rank=rank, expected=float(counted), got=float(wire))
    return None


def _grade_lab1(res: LabResult, case: Case, results: list[dict]) -> None:
    n, numel = case.n, case.params["numel"]
    inputs = [lab1_input(k, numel, case.params["seed"]) for k in range(n)]
    total = sum(inputs)
    c = numel // n
    values, sent, untouched = [], [], []
    for r, out in enumerate(results):
        exp = total.chunk(n)[r]
        got = out["got"]
        if isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(total.shape) and n > 1:
            values.append(Diagnosis(f"rank {r}: returned the whole tensor ({numel} elements); return only "
                                    f"chunk {r} ({c} elements)", rank=r))
        else:
            alts = [(inputs[r].chunk(n)[r], "this is your own chunk r, unreduced: add what you receive")]
            alts += [(total.chunk(n)[j], f"this is the full sum of chunk {j}; rank {r} must end with chunk {r} "
                      "(shift which chunk you send in step s)") for j in range(n) if j != r]
            d = compare(f"rank {r}", got, exp, 0.0, alts, rank=r, shard_range=(r * c, (r + 1) * c))
            if d:
                values.append(d)
        if out["x_modified"]:
            untouched.append(Diagnosis(f"rank {r}: modified its input x; work on copies (x.clone()) of the chunks",
                                       rank=r))
        d = check_sent(r, out, theory.sent_bytes("reduce_scatter", numel * 4, n),
                       f"a ring reduce-scatter ((N-1)/N · S = {n - 1}/{n} · {numel * 4})")
        if d:
            sent.append(d)
    res.record(case, "values", values)
    res.record(case, "bytes", sent)
    res.record(case, "input", untouched)


def _grade_lab2(res: LabResult, case: Case, results: list[dict]) -> None:
    n, numel, seed = case.n, case.params["numel"], case.params["seed"]
    grads = [lab2_input(k, numel, seed) for k in range(n)]
    padded = shard.padded_numel(numel, n)
    c = padded // n
    mean = torch.zeros(padded)
    mean[:numel] = sum(grads) / n
    ranges, values, sent = [], [], []
    for r, out in enumerate(results):
        if "bad_return" in out:
            values.append(Diagnosis(f"rank {r}: returned {out['bad_return']}; return a tuple (rng, grad_shard)",
                                    rank=r))
            ranges.append(values[-1])
            continue
        rng = shard.shard_range(numel, n, r)
        if isinstance(out["range"], dict):
            ranges.append(Diagnosis(f"rank {r}: the range is {out['range']['not_a_tensor']}; return a "
                                    "zeroedu.shard.Range", rank=r))
        elif tuple(out["range"]) != (rng.start, rng.end):
            ranges.append(Diagnosis(f"rank {r}: range [{out['range'][0]}, {out['range'][1]}) but this rank owns "
                                    f"zeroedu.shard.shard_range({numel}, {n}, {r}) = [{rng.start}, {rng.end})",
                                    rank=r, shard=(rng.start, rng.end)))
        exp = mean[rng.start:rng.end]
        own = torch.zeros(padded)
        own[:numel] = grads[r]
        alts = [(exp * n, "looks like the SUM over ranks: divide by N for the average"),
                (own[rng.start:rng.end], "this is your own gradient, unreduced: reduce-scatter it")]
        alts += [(mean[j * c:(j + 1) * c], f"this is rank {j}'s chunk") for j in range(n) if j != r]
        d = compare(f"rank {r}, gradient shard", out["got"], exp, 1e-6, alts, rank=r,
                    shard_range=(rng.start, rng.end))
        real = max(0, min(rng.end, numel) - rng.start)  # this shard's positions inside the gradient
        if d is not None and real < exp.numel() and not isinstance(out["got"], dict) \
                and tuple(out["got"].shape) == tuple(exp.shape) \
                and torch.allclose(out["got"][:real].float(), exp[:real].float(), rtol=1e-6, atol=1e-6):
            d = Diagnosis(f"rank {r}, gradient shard: the padding [{rng.start + real}, {rng.end}) is not zero "
                          f"(got {out['got'][real].item():g}): pad with torch.zeros; torch.empty leaves whatever "
                          "was in memory", rank=r, shard=(rng.start, rng.end), element=rng.start + real,
                          expected=0.0, got=float(out["got"][real].item()))
        if d:
            values.append(d)
        ops = [x["op"] for x in out["comm"]]
        if "all_reduce" in ops:
            sent.append(Diagnosis(f"rank {r} used all_reduce: it sends 2(N-1)/N · S, twice a reduce-scatter's "
                                  "bytes, and ZeRO-2 needs only this rank's chunk: reduce-scatter instead", rank=r))
            continue
        d = check_sent(r, out, theory.sent_bytes("reduce_scatter", padded * 4, n),
                       f"one reduce-scatter of the padded buffer ({n - 1}/{n} · {padded} × 4 bytes)")
        if d:
            sent.append(d)
    res.record(case, "range", ranges)
    res.record(case, "values", values)
    res.record(case, "bytes", sent)


def _grade_lab3(res: LabResult, case: Case, results: list[dict]) -> None:
    n, p = case.n, case.params
    ins = [lab3_inputs(k, p) for k in range(n)]
    w = ins[0][0]
    dw_sum = sum(dy.t() @ x for _, x, dy in ins)
    rows_c = shard.dim0_chunk_rows(p["out"], n)
    dxs, dws, sent = [], [], []
    for r, out in enumerate(results):
        if "bad_return" in out:
            dxs.append(Diagnosis(f"rank {r}: returned {out['bad_return']}; return a tuple (dx, dw_shard)", rank=r))
            dws.append(dxs[-1])
            continue
        _, x, dy = ins[r]
        rows = shard.dim0_rows(p["out"], n, r)
        d = compare(f"rank {r}, dx", out["dx"], dy @ w, 1e-5,
                    [(dy @ w * n, "dx was multiplied by N: dX = dY W needs no reduction")], rank=r)
        if d:
            dxs.append(d)
        exp = dw_sum[rows.start:rows.end] / n
        got = out["dw"]
        if isinstance(got, torch.Tensor) and got.dim() == 2 and got.shape[0] != rows.size \
                and got.shape[1:] == exp.shape[1:]:
            dws.append(Diagnosis(f"rank {r}, dw_shard: {got.shape[0]} row(s), but this rank owns {rows.size} "
                                 f"(zeroedu.shard.dim0_rows({p['out']}, {n}, {r}) = rows {rows.start}..{rows.end}; "
                                 f"chunks are {rows_c} rows, the padding rows are not returned)",
                                 rank=r, shard=(rows.start, rows.end)))
        else:
            local = (dy.t() @ x)[rows.start:rows.end]
            d = compare(f"rank {r}, dw_shard", got, exp, 1e-5,
                        [(exp * n, "looks like the SUM over ranks: divide by N for the mean"),
                         (local, "this is your own rows of dYᵀX, not reduced across ranks: reduce-scatter"),
                         (local / n, "your own dYᵀX divided by N: the reduce-scatter is missing")],
                        rank=r, shard_range=(rows.start, rows.end))
            if d:
                dws.append(d)
        s = rows_c * n * p["in"] * 4
        d = check_sent(r, out, theory.sent_bytes("all_gather", s, n) + theory.sent_bytes("reduce_scatter", s, n),
                       "one all-gather of W plus one reduce-scatter of dW (padded rows)")
        if d:
            sent.append(d)
    res.record(case, "dx", dxs)
    res.record(case, "dw", dws)
    res.record(case, "bytes", sent)


GRADE = {1: _grade_lab1, 2: _grade_lab2, 3: _grade_lab3}


# ------------------------------------------------------------------ lab 4: a pure function
def lab4_job(ctx, path: str, cases: list[dict]) -> list[dict]:
    """In a process of its own (never the grader's): the student's function on every case, each
    result as plain numbers ({"value": {key: float | str}}) or the error it raised."""
    from .student import error, load

    try:
        mod = load(path)
        fn = mod.hfsdp_bytes_per_gpu
    except BaseException as e:  # noqa: BLE001 - reported to the student, never re-raised
        return [{"load_error": error(e, path)}] * len(cases)
    out = []
    for c in cases:
        try:
            got = fn(c["psi"], c["n"], c["m"], c["recipe"])
        except BaseException as e:  # noqa: BLE001
            out.append({"error": error(e, path)})
            continue
        if not isinstance(got, dict):
            out.append({"not_a_dict": repr(got)[:120]})
            continue
        plain = {}
        for k, v in got.items():
            try:
                plain[str(k)] = float(v)
            except (TypeError, ValueError):
                plain[str(k)] = repr(v)[:60]
        out.append({"value": plain})
    return out


def grade_lab4(res: LabResult, results: list[dict], cases_: list[Case]) -> None:
    """Compare what the student's function returned (`lab4_job`, per case) with theory."""
    for case, r in zip(cases_, results):
        psi, nn, m, recipe = case.params["psi"], case.n, case.params["m"], case.params["recipe"]
        where = f"Ψ={psi:g}, N={nn}, M={m}, {recipe}"
        if "error" in r:
            err = r["error"]
            if err["error"] == "not_implemented":
                res.fail_case(case, Diagnosis(f"not implemented yet: {err['message']}"), "not_implemented")
            else:
                res.fail_case(case, Diagnosis(f"{where}: raised {err['message']}{err.get('where', '')}"))
            continue
        got = r.get("value")
        if got is None or not {"param", "grad", "optim", "total"} <= set(got):
            shown = r.get("not_a_dict") or repr(got)[:120]
            res.fail_case(case, Diagnosis(f"{where}: returned {shown}; return a dict with keys param, grad, "
                                          "optim, total"))
            continue
        exp = theory.model_states("hfsdp", psi, nn, m, recipe)
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
                      12 * psi_f / (nn * m): "use the recipe's optimizer bytes "
                                             "(recipes.get_recipe(recipe).optim_bytes)"},
        }
        for key in ("param", "grad", "optim", "total"):
            g, e = got[key], getattr(exp, key)
            if isinstance(g, str):
                res.record(case, key, Diagnosis(f"{where}: {key} = {g} is not a number"))
                continue
            close = abs(float(g) - float(e)) <= 1e-9 * max(1.0, abs(float(e)))
            if close:
                res.record(case, key)
                continue
            hint = next((h for v, h in hints.get(key, {}).items()
                         if v != e and abs(float(g) - float(v)) <= 1e-9 * max(1.0, float(v))), "")
            if key == "total" and not hint:
                hint = "total must be param + grad + optim"
            res.record(case, key, Diagnosis(f"{where}: {key} = {float(g):g} bytes, expected {float(e):g}"
                                            + (f" — {hint}" if hint else ""), expected=float(e), got=float(g)))


__all__ = ["LAB4_CASES", "cases", "compare", "check_sent", "lab1_input", "lab2_input", "lab3_inputs",
           "lab_job", "lab4_job", "grade_lab4", "GRADE"]
