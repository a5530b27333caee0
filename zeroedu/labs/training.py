"""Labs 5 to 8: the student's hooks inside the real ZeRO-2 / FSDP1 / bucketed DDP / FSDP2, trained on real ranks.

Each case is a short training run (a small MLP, fp32, a few steps) through the package's own
runner: `zeroedu.train.runner.dist_state` for the axes, `RankRun` + `train_steps` for the loop
(the strategy is the lab's scaffold around the student's functions, `scaffolds`). The grade is
read from the run and compared with independent oracles:

* gradients (lab 5): each unit's reduced shard at the first optimizer step against the SUM over
  ranks of every rank's local gradient, computed here with plain autograd on the same batches;
* parameters: `zeroedu.train.reference` (one process, the global batch, torch.optim.Adam);
* bytes: the ledger's records of every step against `theory.exact_comm` (per collective, and
  per unit when they differ);
* memory: the ledger's timeline, gradient bytes at each optimizer step against
  `theory.exact_model_states(...).grad` (lab 5), unsharded bytes after forward and at the step
  (lab 6);
* overlap (lab 5): `runtime.analysis.launched_in_backward`, one reduce-scatter per unit per step,
  and `runtime.analysis.overlapped_by_backward`: each but the last still in flight when the
  next unit's gradient arrived (on the timeline, not from how it was issued);
* prefetch (lab 8): in each backward, unit i-1's all-gathers start before unit i's gradients
  are done (its `POST_BACKWARD`) and are first waited for after it; the reduce-scatters of every
  unit but the last in backward are in flight when the next unit's gradients arrive;
* the lifecycle contract: the scaffolds' violations.
"""
from __future__ import annotations

import random
from dataclasses import replace
from fractions import Fraction

import torch

from .. import shard, theory
from ..models import MLPConfig, unit_shapes, units
from ..recipes import get_recipe
from ..runtime import analysis
from ..kinds import EventKind
from ..reports import Event, Timeline
from ..runtime.ledger import Ledger
from ..train.config import ResolvedConfig, RunConfig, config_from_dict, config_to_dict
from ..train.reference import reference
from ..train.runner import RankRun, dist_state, local_micro_batches, train_steps
from .basic import HIDDEN_N, compare
from .grading import Case, Diagnosis, LabResult
from .registry import LABS
from .scaffolds import DDPBucketedLab, FSDP2Lab, FSDPLab, WatchingComm, ZeRO2Lab
from .student import run_cases
from .variants import PREDICTED, Variant, closed_form, read_prediction

STRATEGY = {5: "zero2", 6: "fsdp1", 7: "ddp_bucketed", 8: "fsdp2"}
SCAFFOLD = {5: ZeRO2Lab, 6: FSDPLab, 7: DDPBucketedLab, 8: FSDP2Lab}
RECIPE = "fp32"  # parameters are compared with single-process fp32 training
# fp32 sums in another order (ring vs one process) and Adam's division differ by ~1e-7 relative;
# any real mistake is orders of magnitude larger.
TOL = 1e-4
VISIBLE_STEPS = 3

# Lab 7: the default MLP's 6 parameters in three buckets of 512 bytes and more; then two micro-batches
# per step (the first backward inside no_sync) with two buckets.
LAB7_VISIBLE = [{"options": {"bucket_bytes": 512}}, {"options": {"bucket_bytes": 1200}, "micro_batches": 2}]

# Lab 8: the default MLP (20, 20 and 7 rows: at N = 4 the last layer's shards are 2, 2, 2 and 1 rows)
# with backward prefetch; then forward prefetch too, over two micro-batches.
LAB8_VISIBLE = [{"options": {"forward_prefetch": False}},
                {"options": {"forward_prefetch": True}, "micro_batches": 2}]

LAB6_VISIBLE = [
    {"reshard_after_forward": True, "forward_prefetch": False, "backward_prefetch": True, "limit_all_gathers": None},
    {"reshard_after_forward": False, "forward_prefetch": True, "backward_prefetch": False, "limit_all_gathers": None},
    {"reshard_after_forward": True, "forward_prefetch": True, "backward_prefetch": True, "limit_all_gathers": 1},
]


# ------------------------------------------------------------------ cases
def _model_dict(m: MLPConfig) -> dict:
    d = m.as_dict()
    d.pop("kind")
    return d


def cases(lab: int, n: int, hidden: int, rng: random.Random, variant: Variant | None = None) -> list[Case]:
    """The visible cases (a student's `variant`: its N, MLP and bucket size), then `hidden` drawn from `rng`."""
    default = {"model": _model_dict(MLPConfig()), "steps": VISIBLE_STEPS, "global_batch": 24}
    if 24 % n:
        default["global_batch"] = 6 * n
    if variant is not None:
        n = variant.n
        default = {"model": _model_dict(variant.model), "steps": VISIBLE_STEPS, "global_batch": variant.global_batch}
    out = []
    if lab == 5:
        out.append(Case("visible-1", False, n, dict(default)))
    elif lab in (7, 8):
        visible = [dict(v) for v in (LAB7_VISIBLE if lab == 7 else LAB8_VISIBLE)]
        if variant is not None and lab == 7:
            visible[0]["options"] = {"bucket_bytes": variant.bucket_bytes}
        out += [Case(f"visible-{k + 1}", False, n, {**default, **v}) for k, v in enumerate(visible)]
    else:
        out += [Case(f"visible-{k + 1}", False, n, {**default, "options": dict(o)}) for k, o in enumerate(LAB6_VISIBLE)]
    for k in range(hidden):
        nn = rng.choice(HIDDEN_N)
        model = MLPConfig(d_in=rng.randint(3, 16), hidden=rng.randint(3, 24), depth=rng.randint(2, 4),
                          d_out=rng.randint(1, 9), seed=rng.randint(1, 10**6))
        p = {"model": _model_dict(model), "steps": rng.randint(2, 3), "global_batch": nn * rng.randint(2, 5)}
        if lab in (7, 8):
            mb = rng.choice([1, 1, 2])
            p["micro_batches"], p["global_batch"] = mb, nn * mb * rng.randint(1, 3)
        if lab == 7:
            p["options"] = {"bucket_bytes": rng.choice([64, 200, 512, 1500, 1 << 20])}
        if lab == 8:
            p["options"] = {"forward_prefetch": rng.random() < 0.5}
        if lab == 6:
            p["options"] = {"reshard_after_forward": rng.random() < 0.6, "forward_prefetch": rng.random() < 0.5,
                            "backward_prefetch": rng.random() < 0.7, "limit_all_gathers": rng.choice([None, None, 1, 2])}
        out.append(Case(f"hidden-{k + 1}", True, nn, p))
    return out


def config(lab: int, case_params: dict, n: int) -> ResolvedConfig:
    p = case_params
    # `links` (the benchmarking report, `labs.report`): zeroedu's ring collectives on emulated links
    links = p.get("links")
    return RunConfig(STRATEGY[lab], n, steps=p["steps"], recipe=RECIPE, model=MLPConfig(**p["model"]),
                     global_batch=p["global_batch"], options=dict(p.get("options", {})),
                     micro_batches=p.get("micro_batches", 1), links=links,
                     collectives="ring" if links else "auto").resolved()


# ------------------------------------------------------------------ the rank side
def rank_case(lab: int, case_params: dict, n: int) -> dict:
    """What a rank receives for one case: its parameters and the configuration resolved here,
    in the parent (the ranks never resolve one)."""
    return {**case_params, "cfg": config_to_dict(config(lab, case_params, n))}


def _run_case(lab: int, mod, ctx, case: dict) -> dict:
    cfg = config_from_dict(case["cfg"])
    ledger = Ledger(ctx.rank)
    dist = dist_state(ctx, cfg, ledger)
    dist = replace(dist, comm=WatchingComm(dist.comm))
    strategy = SCAFFOLD[lab](cfg.model.build(), dist, get_recipe(cfg.recipe), cfg.adam, student=mod, **cfg.options)
    run = RankRun(cfg, ctx, ledger, dist, strategy)
    losses = train_steps(run)
    # Read the bytes before full_parameters(), whose all-gathers (FSDP) are not training traffic.
    per_step = [{op: b for op, b in ledger.comm_by_collective(s).items() if b} for s in range(cfg.steps)]
    per_unit = [{} for _ in range(cfg.steps)]
    for r in ledger.comm:
        if 0 <= r.step < cfg.steps:
            key = (r.unit, r.op)
            per_unit[r.step][key] = per_unit[r.step].get(key, Fraction(0)) + r.sent
    timeline = ledger.timeline()
    params = strategy.full_parameters()  # every rank: a collective for FSDP
    per_tag = [{} for _ in range(cfg.steps)]  # lab 7: bytes per bucket, by its collective's tag
    for r in ledger.comm:
        if 0 <= r.step < cfg.steps:
            per_tag[r.step][str(r.tag)] = per_tag[r.step].get(str(r.tag), Fraction(0)) + r.sent
    buckets = [b.buffer.numel() * b.buffer.element_size() for b in getattr(strategy, "buckets", [])]
    # lab 8: the rows this rank keeps of each parameter, unit by unit
    rows = [[(r.start, r.end) for r in u.rows] for u in strategy.units] if lab == 8 else None
    return {"rows": rows, "losses": losses, "per_step": per_step, "per_unit": per_unit, "timeline": timeline,
            "per_tag": per_tag, "buckets": buckets,
            "violations": list(strategy.violations), "params": params if ctx.rank == 0 else None,
            "grad_snapshot": getattr(strategy, "grad_snapshot", None)}


def train_lab_job(ctx, lab: int, path: str, cases: list[dict]) -> list[dict]:
    """Runs on every rank: each case of lab `lab` (5 to 8) with the student's functions."""
    return run_cases(ctx, path, cases, lambda mod, c, case: _run_case(lab, mod, c, case), LABS[lab].functions)


# ------------------------------------------------------------------ the oracles (parent side)
def _param_names(model) -> list[list[str]]:
    names = {id(p): name for name, p in model.named_parameters()}
    return [[names[id(p)] for p in u.parameters()] for u in units(model)]


def summed_local_grads(cfg: ResolvedConfig) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """Step 0: every rank's local gradient (plain autograd on its slice of the global batch, the
    model's mean loss) and their SUM, which is what a SUM reduce-scatter leaves in the shards."""
    n = cfg.world_size
    model = cfg.model.build()
    per_rank = []
    for r in range(n):
        (x, y), = local_micro_batches(cfg, 0, r, n, micro_batches=1)
        grads = torch.autograd.grad(model.loss(model(x), y), list(model.parameters()))
        per_rank.append([g.detach() for g in grads])
    total = [sum(gs) for gs in zip(*per_rank)]
    return total, per_rank


def _flat(grads: list[torch.Tensor], shapes, n: int) -> torch.Tensor:
    layout = shard.FlatLayout(shapes, n)
    out = torch.zeros(layout.padded_numel)
    for i, g in enumerate(grads):
        r = layout.param_range(i)
        out[r.start:r.end] = g.reshape(-1)
    return out


def _where(layout: shard.FlatLayout, names: list[str], pos: int) -> str:
    for i, name in enumerate(names):
        r = layout.param_range(i)
        if r.start <= pos < r.end:
            idx = torch.unravel_index(torch.tensor(pos - r.start), layout.shapes[i])
            return f"{name}[{', '.join(str(int(v)) for v in idx)}]"
    return "padding"


def _grade_grads(res: LabResult, case: Case, cfg: ResolvedConfig, results: list[dict]) -> None:
    n = case.n
    model = cfg.model.build()
    shapes, names = unit_shapes(model), _param_names(model)
    total, per_rank = summed_local_grads(cfg)
    diags = []
    base = 0
    flats = []
    for k, sh in enumerate(shapes):
        cnt = len(sh)
        flats.append((_flat(total[base:base + cnt], sh, n),
                      [_flat(g[base:base + cnt], sh, n) for g in per_rank]))
        base += cnt
    for r, out in enumerate(results):
        snap = out.get("grad_snapshot")
        if snap is None or len(snap) != len(shapes):
            diags.append(Diagnosis(f"rank {r}: no gradient shards reached the optimizer step", rank=r))
            continue
        for k, sh in enumerate(shapes):
            layout = shard.FlatLayout(sh, n)
            rng = layout.shard_range(r)
            full, locals_ = flats[k]
            exp = full[rng.start:rng.end]
            c = layout.shard_numel
            alts = [(exp / n, "looks like the average: the shard must hold the SUM over ranks (the optimizer "
                              "scales by 1/N itself, in fp32)"),
                    (torch.zeros_like(exp), "all zeros: nothing was reduced into unit.grad_shard (reduce-scatter "
                                            "the full buffer into it, and let autograd write into the buffer: "
                                            "alloc_grad() binds every p.grad to it)"),
                    (locals_[r][rng.start:rng.end], "this rank's own gradient, unreduced: reduce-scatter it")]
            alts += [(full[j * c:(j + 1) * c], f"this is rank {j}'s chunk") for j in range(n) if j != r]
            d = compare(f"rank {r}, unit {k} gradient shard [{rng.start}, {rng.end})", snap[k], exp,
                        TOL, alts, rank=r, shard_range=(rng.start, rng.end))
            if d:
                d.unit = k
                if isinstance(d.element, int):
                    d.message += f"; that is {_where(layout, names[k], rng.start + d.element)}"
                diags.append(d)
                break  # one unit per rank is enough to read
    res.record(case, "grads", _violations(results, ("grads",))["grads"] + diags)


def _grade_params(res: LabResult, case: Case, cfg: ResolvedConfig, results: list[dict]) -> None:
    _, ref = reference(cfg)
    got = results[0]["params"]
    names = [n for n, _ in cfg.model.build().named_parameters()]
    diags = []
    for name, g, e in zip(names, got, ref):
        d = compare(f"after {cfg.steps} steps, parameter {name}", g.float(), e, TOL)
        if d is not None:
            d.message += " (single-process training with torch.optim.Adam is the reference)"
            diags.append(d)
            break
    res.record(case, "params", diags)


def _grade_bytes(res: LabResult, case: Case, cfg: ResolvedConfig, results: list[dict], strategy: str, **opts) -> None:
    shapes = unit_shapes(cfg.model.build())
    exp = theory.exact_comm(strategy, shapes, case.n, recipe=cfg.recipe, **opts)
    exp_total = {op: b for op, b in exp.by_collective().items() if b}
    exp_unit: dict = {}
    for op in exp.ops:
        exp_unit[(op.unit, op.collective)] = exp_unit.get((op.unit, op.collective), Fraction(0)) + op.sent
    how = f"theory.exact_comm({strategy!r}" + "".join(f", {k}={v}" for k, v in opts.items()) + ")"
    diags = []
    for r, out in enumerate(results):
        for s, got in enumerate(out["per_step"]):
            if got == exp_total:
                continue
            units_got = out["per_unit"][s]
            for key in sorted(set(exp_unit) | set(units_got), key=lambda k: (k[0] is None, k[0] or 0, k[1])):
                g, e = units_got.get(key, Fraction(0)), exp_unit.get(key, Fraction(0))
                if g != e:
                    where = f"unit {key[0]}" if key[0] is not None else "untagged"
                    times = f" ({float(g / e):g}× the prediction)" if e and g and (g / e).denominator == 1 else ""
                    diags.append(Diagnosis(f"rank {r}, step {s}, {where}: {key[1]} sent {float(g):g} bytes, {how} "
                                           f"predicts {float(e):g}{times}", rank=r, unit=key[0], expected=float(e),
                                           got=float(g)))
                    break
            else:
                diags.append(Diagnosis(f"rank {r}, step {s}: sent {_fmt(got)}, {how} predicts {_fmt(exp_total)}",
                                       rank=r))
            break
        if diags:
            break
    res.record(case, "bytes", diags)


def _fmt(d: dict) -> str:
    return " + ".join(f"{op} {float(b):g}" for op, b in sorted(d.items())) or "nothing"


def _violations(results: list[dict], tests: tuple[str, ...]) -> dict[str, list]:
    out = {t: [] for t in tests}
    for r, o in enumerate(results):
        for v in o["violations"]:
            if v["test"] in out and len(out[v["test"]]) < 3:
                out[v["test"]].append(Diagnosis(f"rank {r}, step {v['step']}: {v['message']}", rank=r, unit=v["unit"]))
    return out


def _events(timeline: Timeline, kind: EventKind) -> list[Event]:
    return [e for e in timeline.events if e.kind == kind and e.step >= 0]


def grade_zero2(res: LabResult, case: Case, results: list[dict]) -> None:
    cfg = config(5, case.params, case.n)
    shapes = unit_shapes(cfg.model.build())
    _grade_grads(res, case, cfg, results)
    _grade_params(res, case, cfg, results)
    _grade_bytes(res, case, cfg, results, "zero2")
    freed, overlap = [], []
    for r, out in enumerate(results):
        want = theory.exact_model_states("zero2", shapes, case.n, rank=r, recipe=cfg.recipe).grad
        for e in _events(out["timeline"], EventKind.OPTIMIZER_STEP):
            if e.bytes["grad"] != want:
                freed.append(Diagnosis(
                    f"rank {r}, step {e.step}: {e.bytes['grad']} bytes of gradients alive at the optimizer "
                    f"step, but ZeRO-2 keeps only the shards, GΨ/N = {want} bytes: free each unit's full "
                    "buffer (unit.free_grad()) once its reduce-scatter has finished", rank=r, expected=want,
                    got=e.bytes["grad"]))
                break
        for s in range(cfg.steps):
            k = analysis.launched_in_backward(out["timeline"], step=s)
            if k != len(shapes):
                overlap.append(Diagnosis(
                    f"rank {r}, step {s}: {k} of {len(shapes)} unit reduce-scatters started during backward; "
                    "launch each unit's as soon as its last gradient is accumulated (post_accumulate), so it "
                    "overlaps the backward of earlier layers", rank=r, expected=len(shapes), got=k))
                break
            # On the timeline: backward went on (the next unit's gradient arrived) while each
            # reduce-scatter but the last was in flight, i.e. it was not waited for at once.
            hid = analysis.overlapped_by_backward(out["timeline"], s, (EventKind.GRAD_ALLOC,))
            if hid < len(shapes) - 1:
                overlap.append(Diagnosis(
                    f"rank {r}, step {s}: only {hid} of {len(shapes)} unit reduce-scatters were still in flight "
                    f"when backward reached the next unit (expected {len(shapes) - 1}: all but the last); a "
                    "reduce-scatter waited for right after its launch hides nothing: wait only in "
                    "free_finished(wait=True), or for the ones already done", rank=r,
                    expected=len(shapes) - 1, got=hid))
                break
        if freed or overlap:
            break  # the first rank that shows it is enough to read
    v = _violations(results, ("no_early_free",))
    res.record(case, "freed", freed[:3])
    res.record(case, "overlap", overlap[:3])
    res.record(case, "no_early_free", v["no_early_free"])
    if v["no_early_free"]:
        # Safety weighs like correctness: a reduce-scatter that read a freed buffer has no result
        # to trust (on NCCL the allocator reuses the memory while the collective reads it; on CPU
        # the run may well come out right), so the reduced shards fail with it, whatever they
        # hold on this run. (Overwriting the freed buffer instead would make the loss NaN and
        # hide the cause behind "training diverged".)
        prior = next((c.diagnosis for c in res.tests["grads"].cases if c.case.id == case.id), [])
        first = v["no_early_free"][0]
        res.record(case, "grads", list(prior) + [Diagnosis(
            f"{first.message.split(':')[0]}: a reduce-scatter read a freed buffer, so its shard cannot be "
            "trusted (with NCCL the allocator would reuse that memory while the collective reads it)",
            rank=first.rank, unit=first.unit)])


def grade_fsdp(res: LabResult, case: Case, results: list[dict]) -> None:
    cfg = config(6, case.params, case.n)
    raf = bool(cfg.options.get("reshard_after_forward", True))
    _grade_params(res, case, cfg, results)
    _grade_bytes(res, case, cfg, results, "fsdp1", reshard_after_forward=raf)
    v = _violations(results, ("lifecycle", "prefetch", "memory"))
    memory = v["memory"]
    for r, out in enumerate(results):
        checks = [(EventKind.OPTIMIZER_STEP, "at the optimizer step: every unit must be resharded by its post_backward")]
        if raf:
            checks.append((EventKind.FORWARD_END, "at the end of forward: with reshard_after_forward=True each unit frees "
                                        "its parameters right after its forward"))
        for label, why in checks:
            bad = next((e for e in _events(out["timeline"], label) if e.bytes["gathered"]), None)
            if bad is not None and len(memory) < 3:
                memory.append(Diagnosis(f"rank {r}, step {bad.step}: {bad.bytes['gathered']} bytes of "
                                        f"unsharded parameters {why}", rank=r, expected=0,
                                        got=bad.bytes["gathered"]))
    res.record(case, "lifecycle", v["lifecycle"])
    res.record(case, "prefetch", v["prefetch"])
    res.record(case, "memory", memory)


def grade_ddp(res: LabResult, case: Case, results: list[dict]) -> None:
    cfg = config(7, case.params, case.n)
    n = case.n
    _grade_params(res, case, cfg, results)
    _grade_bytes(res, case, cfg, results, "ddp_bucketed")
    v = _violations(results, ("bytes", "order", "waited"))
    per_bucket = []
    for r, out in enumerate(results):
        for s, got in enumerate(out["per_tag"]):
            for k, nbytes in enumerate(out["buckets"]):
                tag = f"ddp_bucketed/bucket{k}/grads"
                want = theory.sent_bytes("all_reduce", nbytes, n)
                g = got.get(tag, Fraction(0))
                if g != want:
                    times = f" ({float(g / want):g} all-reduces of it)" if want and g else ""
                    per_bucket.append(Diagnosis(
                        f"rank {r}, step {s}, bucket {k} ({nbytes} bytes): sent {float(g):g} bytes, one ring "
                        f"all-reduce of it sends 2(N-1)/N x {nbytes} = {float(want):g}{times}", rank=r, unit=k,
                        expected=float(want), got=float(g)))
                    break
            if per_bucket:
                break
        if per_bucket:
            break
    prior = next((c.diagnosis for c in res.tests["bytes"].cases if c.case.id == case.id), [])
    res.record(case, "bytes", list(prior) + per_bucket + v["bytes"])
    overlap = []
    for r, out in enumerate(results):
        b = len(out["buckets"])
        for s in range(cfg.steps):
            k = analysis.launched_in_backward(out["timeline"], step=s)
            if k != b:
                overlap.append(Diagnosis(
                    f"rank {r}, step {s}: {k} of {b} bucket all-reduces started during backward; launch each "
                    "bucket as soon as its last gradient is accumulated (post_accumulate), so it overlaps the "
                    "backward of earlier layers", rank=r, expected=b, got=k))
                break
            hid = analysis.overlapped_by_backward(out["timeline"], s, (EventKind.GRADS_READY,))
            if hid < b - 1:
                overlap.append(Diagnosis(
                    f"rank {r}, step {s}: only {hid} of {b} bucket all-reduces were still in flight when backward "
                    f"completed the next bucket (expected {b - 1}: all but the last); one waited for right after "
                    "its launch hides nothing: wait only in finish", rank=r, expected=b - 1, got=hid))
                break
        if overlap:
            break
    res.record(case, "overlap", overlap[:3])
    res.record(case, "order", v["order"])
    res.record(case, "waited", v["waited"])
    _grade_prediction(res, case)


def _gathered_bound(shapes, n: int, itemsize: int) -> tuple[int, list[int]]:
    """Bytes of each unit's gathered (row-padded) parameters, and the most two neighbouring
    units hold together: the one computing and the one prefetched."""
    per_unit = [sum(n * shard.dim0_chunk_rows(s[0], n) * shard.numel(s[1:]) for s in u) * itemsize for u in shapes]
    pairs = [a + b for a, b in zip(per_unit, per_unit[1:])] or per_unit
    return max(pairs), per_unit


def _grade_shards(res: LabResult, case: Case, cfg: ResolvedConfig, results: list[dict], shapes) -> list:
    n, diags = case.n, []
    model = cfg.model.build()
    names = _param_names(model)
    for r, out in enumerate(results):
        for k, (unit_rows, unit_shapes_) in enumerate(zip(out["rows"] or [], shapes)):
            for j, ((a, b), s) in enumerate(zip(unit_rows, unit_shapes_)):
                want = shard.dim0_rows(s[0], n, r)
                if (a, b) != (want.start, want.end):
                    c = shard.dim0_chunk_rows(s[0], n)
                    diags.append(Diagnosis(
                        f"rank {r}, unit {k}, {names[k][j]} ({s[0]} rows): this rank keeps rows [{a}, {b}); FSDP2's "
                        f"chunks of ceil({s[0]}/{n}) = {c} rows give rank {r} rows [{want.start}, {want.end})",
                        rank=r, unit=k, shard=(want.start, want.end)))
                    break
            if diags:
                break
        want_bytes = theory.exact_model_states("fsdp2", shapes, n, rank=r, recipe=cfg.recipe).param
        e = next(iter(_events(out["timeline"], EventKind.OPTIMIZER_STEP)), None)
        if not diags and e is not None and e.bytes["param"] != want_bytes:
            diags.append(Diagnosis(f"rank {r}: {e.bytes['param']} bytes of parameter shards at the optimizer step, "
                                   f"theory.exact_model_states('fsdp2', rank={r}) predicts {want_bytes}", rank=r,
                                   expected=want_bytes, got=e.bytes["param"]))
        if diags:
            break
    return diags


def _unsharded_at(timeline: Timeline, event: Event) -> list[int]:
    """The units the timeline's UNSHARD / RESHARD events say are gathered at `event`, with the
    unshards recorded right after it (one call can gather several units: its events follow
    each other, each measuring the bytes of all of them)."""
    held: set[int] = set()
    seen = False
    for e in timeline.events:
        seen = seen or e is event
        if seen and e is not event and e.kind != EventKind.UNSHARD:
            break
        if e.kind == EventKind.UNSHARD:
            held.add(e.unit)
        elif e.kind == EventKind.RESHARD:
            held.discard(e.unit)
    return sorted(held)


def _grade_prefetch(timeline: Timeline, r: int, step: int, n_units: int, n_params: list[int]) -> Diagnosis | None:
    """Backward prefetch and the reduce-scatter behind backward, read from the timeline."""
    posts = [e for e in _events(timeline, EventKind.POST_BACKWARD) if e.step == step]
    for lo, hi in analysis.backward_windows(timeline, step):
        done = {e.unit: e.t for e in posts if lo <= e.t <= hi}
        gathers = [c for c in timeline.comm if c.op == "all_gather" and c.step == step and lo <= c.t_start <= hi]
        for i in range(n_units - 1, 0, -1):
            if i not in done:
                continue
            mine = [c for c in gathers if c.unit == i - 1]
            if not mine:
                # (the records carry the unit whose leaves they wrote, whatever the tag said:
                # `scaffolds.WatchingComm`) so a unit without one was not gathered in this backward
                return Diagnosis(f"rank {r}, step {step}: no all-gather into unit {i - 1}'s leaves started during "
                                 f"this backward pass: forward resharded it, so backward gathers it again; prefetch "
                                 f"it (async) in unit {i}'s pre_backward", rank=r, unit=i - 1)
            late = [c for c in mine if c.t_start > done[i]]
            if late:
                return Diagnosis(f"rank {r}, step {step}: unit {i - 1}'s all-gather for backward started after unit "
                                 f"{i}'s gradients were done, so nothing computed while it travelled: prefetch unit "
                                 f"{i - 1} (async) in unit {i}'s pre_backward", rank=r, unit=i - 1)
            waited = [c for c in mine if (c.waited if c.waited is not None else c.t_end or 0) < done[i]]
            if waited:
                return Diagnosis(f"rank {r}, step {step}: unit {i - 1}'s all-gather was issued during unit {i}'s "
                                 f"backward but waited for before unit {i}'s gradients were done: a prefetch "
                                 f"waited for at once hides nothing (unshard(unit, async_op=True), waited for in "
                                 f"unit {i - 1}'s own pre_backward)", rank=r, unit=i - 1)
    # Each unit's reduce-scatters but the first unit's (the last in backward) should still be in
    # flight when the next unit's gradients arrive.
    want = len(analysis.backward_windows(timeline, step)) * sum(n_params[1:])
    hid = analysis.overlapped_by_backward(timeline, step, (EventKind.POST_BACKWARD,), ops=("reduce_scatter",))
    if hid < want:
        return Diagnosis(f"rank {r}, step {step}: only {hid} of {want} reduce-scatters of units 1 and up were still "
                         "in flight when backward finished the next unit; a reduce-scatter waited for in the "
                         "post_backward that launched it hides nothing: finish it in the next unit's post_backward",
                         rank=r, expected=want, got=hid)
    return None


def grade_fsdp2(res: LabResult, case: Case, results: list[dict]) -> None:
    cfg = config(8, case.params, case.n)
    n, k = case.n, cfg.micro_batches
    shapes = unit_shapes(cfg.model.build())
    _grade_params(res, case, cfg, results)
    _grade_bytes(res, case, cfg, results, "fsdp2", micro_batches=k)
    v = _violations(results, ("shards", "memory", "no_early_free", "lifecycle", "waited"))
    res.record(case, "shards", v["shards"] + _grade_shards(res, case, cfg, results, shapes))
    bound, per_unit = _gathered_bound(shapes, n, 4)
    memory, prefetch = list(v["memory"]), []
    for r, out in enumerate(results):
        tl = out["timeline"]
        for e in tl.events:
            if e.step < 0 or e.bytes is None:
                continue
            over = e.bytes["gathered"] > bound or (e.kind == EventKind.OPTIMIZER_STEP and e.bytes["gathered"])
            if over and len(memory) < 3:
                held = _unsharded_at(tl, e)
                what = (f"at the optimizer step: every unit must be resharded by then" if e.kind == EventKind.OPTIMIZER_STEP
                        else f"more than two neighbouring units hold ({bound} bytes at most): prefetch one unit "
                             "ahead, not all of them")
                memory.append(Diagnosis(f"rank {r}, step {e.step}, {e.label}: {e.bytes['gathered']} bytes of gathered "
                                        f"parameters (units {held}), {what}", rank=r, expected=bound,
                                        got=e.bytes["gathered"]))
                break
        if not prefetch and cfg.options.get("backward_prefetch", True):
            for s in range(cfg.steps):
                d = _grade_prefetch(tl, r, s, len(shapes), [len(u) for u in shapes])
                if d is not None:
                    prefetch.append(d)
                    break
    res.record(case, "memory", memory + v["waited"])
    res.record(case, "prefetch", prefetch + v["lifecycle"])
    res.record(case, "no_early_free", v["no_early_free"])
    _grade_prediction(res, case)


def _grade_prediction(res: LabResult, case: Case) -> None:
    """Labs 7 and 8: the numbers the file's predicted() returns (read from its text) against the
    closed forms for the first visible case (`variants.closed_form`), each to the nearest byte.
    The student's own run is not the yardstick: a run with the lab's mistake measures the
    mistake's numbers."""
    if case.id != "visible-1":
        res.record(case, "predict")  # the prediction is about the first visible case only
        return
    lab = res.lab.number
    got, why = read_prediction(res.path, lab)
    if got is None:
        res.record(case, "predict", Diagnosis(why))
        return
    cfg = config(lab, case.params, case.n)
    want = closed_form(lab, cfg.model, case.n, cfg.options.get("bucket_bytes"))
    diags = []
    for key in PREDICTED[lab]:
        if abs(Fraction(got[key]) - Fraction(want[key])) > Fraction(1, 2):
            diags.append(Diagnosis(f"predicted {key} = {got[key]:g}, which is not what the closed forms give for "
                                   f"this case (N = {case.n}, the MLP and bucket size of your variant): work it "
                                   "out by hand (`python -m zeroedu.labs variant YOUR_ID`)", rank=0,
                                   got=float(got[key])))
    res.record(case, "predict", diags)


GRADE = {5: grade_zero2, 6: grade_fsdp, 7: grade_ddp, 8: grade_fsdp2}

__all__ = ["GRADE", "LAB6_VISIBLE", "cases", "config", "summed_local_grads", "train_lab_job"]
