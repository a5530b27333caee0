"""Fact-check: claims common in study material, each settled by a measurement or a primary source.

Every function runs real ranks (`zeroedu.train.run`, torch's own `fully_shard` under torch's
memory tracker, a torch optimizer in this process) or the closed forms (`zeroedu.theory`), or
quotes the framework's own source at a named file and line, and returns a plain dict:

    claim     the claim as study notes state it
    verdict   "false" | "half right"          (no claim here survives unqualified)
    holds     does the claim hold as stated? (False for every claim)
    correct   the figure or behaviour that is right
    match     the run's measurements equal the closed forms (where a run is involved)

plus what was measured. Notebook 13 shows one claim per section and ends each with an asserting
verdict; tests/test_factcheck.py checks the same dicts against closed forms written out by hand.

Two measurement set-ups:

* `FACT_MODEL`, the suite's MLP with d_out = 8 (Ψ = 848): every unit and every dim-0 row count
  divides N = 4, so no padding blurs a ratio of model-state bytes, and runs take a fraction of a
  second. Its messages are a few hundred bytes, so on the wire gloo's framing (144 B per message)
  would dominate: for bytes on the wire,
* `WIRE_MODEL` = gpt-small (Ψ = 3,242,081) on `WIRE_N` = 4 ranks: messages of megabytes, framing
  under 1 %, read from the kernel's byte counters of each rank's sockets (`report.ranks[r].wire`).
"""
from __future__ import annotations

from fractions import Fraction

import torch

from .. import recipes, theory
from ..models import MLPConfig, param_count
from ..kinds import EventKind as Ev
from ..runtime import cluster
from ..kinds import EventKind
from ..strategies.zero1 import ZeRO1
from ..train import RunConfig, run
from ..train.config import config_to_dict

FACT_MODEL = MLPConfig(d_out=8)
N = 4
STEPS = 2
WIRE_MODEL = "gpt-small"
WIRE_N = 4
WIRE_STEPS = 2

DS = "deepspeedai/DeepSpeed v0.19.6, the same in v0.16.4"

# Claim 6: DeepSpeed's pipeline engine refuses ZeRO stages 2 and 3.
DEEPSPEED_PIPE_SOURCE = {
    "url": "https://github.com/deepspeedai/DeepSpeed/blob/master/deepspeed/runtime/pipe/engine.py",
    "where": f"PipelineEngine.__init__, deepspeed/runtime/pipe/engine.py ({DS})",
    "statement": "assert self.zero_optimization_stage() < ZeroStageEnum.gradients, "
                 "\"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism\"",
    # deepspeed/runtime/zero/config.py: ZeroStageEnum disabled=0, optimizer_states=1, gradients=2, weights=3
    "stages": {"disabled": 0, "optimizer_states": 1, "gradients": 2, "weights": 3},
    "also": "DeepSpeed PR #1042 (ZeRO stage 1 refresh): 'Pipeline parallelism + zero stage 1 now "
            "supports optimizer state offload to CPU'",
}

# Claim 14: what ZeRO-Offload moves to the CPU, and with which stages.
DEEPSPEED_OFFLOAD_SOURCES = [
    {"where": f"docs/_pages/config-json.md, key zero_optimization.offload_optimizer ({DS})",
     "statement": "Enable offloading of optimizer state to CPU or NVMe, and optimizer computation to "
                  "CPU. ... Valid for ZeRO stage 1, 2, 3."},
    {"where": f"docs/_pages/config-json.md, key zero_optimization.offload_param ({DS})",
     "statement": "Enable offloading of model parameters to CPU or NVMe. ... Valid only with stage 3."},
    {"where": f"docs/_tutorials/zero.md, section ZeRO-Offload ({DS})",
     "statement": "ZeRO-Offload, a system for offloading optimizer and gradient states to CPU memory "
                  "within ZeRO-2"},
    {"where": "deepspeed/runtime/zero/stage_1_and_2.py, DeepSpeedZeroOptimizer: __init__ (cpu_offload), "
              f"async_inplace_copy_grad_to_fp32_buffer_from_gpu, step ({DS})",
     "statement": "with cpu_offload the fp32 master partition and its fp32 gradient partition live on "
                  "'cpu'; each reduced gradient slice is copied there as fp32; _optimizer_step runs "
                  "there and the result is copied back into the 16-bit partition on the GPU (since "
                  "v0.17.0 cast first into a pinned 16-bit host buffer, so 16 bits cross PCIe; v0.16.4 "
                  "copied the fp32 partition)"},
    {"where": f"deepspeed/runtime/zero/stage_1_and_2.py, estimate_zero2_model_states_mem_needs ({DS})",
     "statement": "if cpu_offload: gpu_mem = 2 * total_params"},
]

# Claim 3: where torch.optim.Adam creates its moments.
TORCH_ADAM_SOURCE = {
    "where": "torch/optim/adam.py, Adam._init_group (torch 2.13.0)",
    "statement": "state['exp_avg'] = torch.zeros_like(p, memory_format=torch.preserve_format); "
                 "the same for state['exp_avg_sq']",
}

# Claim 5: what torch's FSDP2 says it shards.
TORCH_FSDP_SOURCE = {
    "where": "torch/distributed/fsdp/_fully_shard/_fully_shard.py, fully_shard docstring (torch 2.13.0)",
    "statement": "FSDP shards module parameters, gradients, and optimizer states across data "
                 "parallel workers",
}

_RUNS: dict = {}


def measure(strategy: str, n: int = N, recipe: str | None = None, **cfg) -> dict:
    """One real run on FACT_MODEL (cached per process): the report of `zeroedu.train.run`."""
    key = (strategy, n, recipe, tuple(sorted(cfg.items())))
    if key not in _RUNS:
        _RUNS[key] = run(RunConfig(strategy, n, steps=STEPS, recipe=recipe, model=FACT_MODEL,
                                   global_batch=24, **cfg))
    return _RUNS[key]


def wire_run(strategy: str, collectives: str = "auto") -> dict:
    """One real run on WIRE_MODEL (gpt-small) on WIRE_N ranks (cached): for bytes on the wire."""
    key = ("wire", strategy, collectives)
    if key not in _RUNS:
        _RUNS[key] = run(RunConfig(strategy, WIRE_N, steps=WIRE_STEPS, model=WIRE_MODEL,
                                   collectives=collectives))
    return _RUNS[key]


def psi() -> int:
    return param_count(FACT_MODEL)


def _ring(report: dict, rank: int = 0) -> float:
    """Bytes one rank sends per step under the ring model (the ledger's payloads)."""
    return sum(report.ranks[rank].measured.comm.values())


def _wire(report: dict, rank: int = 0) -> int:
    """Bytes one rank wrote to its sockets in one step (kernel counters; gloo framing included)."""
    return report.ranks[rank].wire.sent


def _verdict(holds: bool, half: bool = False) -> str:
    return "true" if holds else ("half right" if half else "false")


# ---------------------------------------------------------------------------------- claims
def zero3_doubles_comm() -> dict:
    """Claim 1: "ZeRO-3 doubles the communication of DDP" (ZeRO paper §7.2.2: 3Ψ vs 2Ψ)."""
    ddp, z3 = measure("ddp"), measure("fsdp1")
    ring_ratio = Fraction(_ring(z3)) / Fraction(_ring(ddp))
    wddp, wz3 = wire_run("ddp"), wire_run("fsdp1")
    asym = theory.comm_per_rank("fsdp1", 7e9, 8).total() / theory.comm_per_rank("ddp", 7e9, 8).total()
    return {"claim": "ZeRO-3 doubles communication", "ddp_sent": _ring(ddp), "zero3_sent": _ring(z3),
            "zero3_by_collective": z3.ranks[0].measured.comm,
            "ring_ratio": ring_ratio, "theory_ratio": asym,
            "wire": {"ddp": _wire(wddp), "zero3": _wire(wz3),
                     "zero3_by_collective": wz3.ranks[0].wire.by_collective},
            "wire_ratio": _wire(wz3) / _wire(wddp),
            "match": ddp.match.comm and z3.match.comm and wddp.match.wire and wz3.match.wire,
            "holds": ring_ratio == 2, "verdict": _verdict(ring_ratio == 2),
            "correct": "1.5x: all-gather (forward) + all-gather (backward) + reduce-scatter = 3Ψ vs 2Ψ"}


def dp_needs_7x() -> dict:
    """Claim 2: "standard data parallelism needs about 7x the model size"."""
    ddp = measure("ddp")
    me = ddp.ranks[0].measured
    per_param = Fraction(me.total, psi())
    weights = Fraction(me.param, psi())  # bf16 weights: the "model size"
    holds = per_param / weights == 7
    return {"claim": "standard DP needs ~7x model size", "bytes_per_param": per_param,
            "weight_bytes_per_param": weights, "times_model_size": per_param / weights,
            "theory_bytes_per_param": recipes.get_recipe("mixed-bf16").total_bytes,
            "match": ddp.match.model_states, "holds": holds, "verdict": _verdict(holds),
            "correct": "16 bytes/param = 8x the bf16 weights, before activations"}


def torch_adam_bf16(numel: int = 1000) -> dict:
    """torch.optim.Adam on one bf16 parameter, one step, in this process: the dtypes and bytes
    of the state it creates (read from the tensors themselves)."""
    p = torch.nn.Parameter(torch.zeros(numel, dtype=torch.bfloat16))
    opt = torch.optim.Adam([p], lr=1e-3)
    p.grad = torch.ones_like(p)
    opt.step()
    st = opt.state[p]
    tensors = {k: v for k, v in st.items() if torch.is_tensor(v)}
    nbytes = lambda t: t.numel() * t.element_size()
    moments = nbytes(st["exp_avg"]) + nbytes(st["exp_avg_sq"])
    return {"param_dtype": str(p.dtype), "param_bytes": nbytes(p),
            "state_dtypes": {k: str(v.dtype) for k, v in tensors.items()},
            "state_bytes": {k: nbytes(v) for k, v in tensors.items()},
            "moment_bytes": moments, "moments_over_params": Fraction(moments, nbytes(p))}


def adam_state_2x() -> dict:
    """Claim 3: "Adam's state is 2x the parameters": half right. torch's Adam on bf16 parameters
    keeps bf16 moments, exactly 2x; mixed-precision accounting (ZeRO §3.1, K = 12) counts an fp32
    master and fp32 moments, 12 bytes per parameter = 6x the bf16 weights."""
    ddp = measure("ddp")
    me = ddp.ranks[0].measured
    detail = {k: Fraction(v, psi()) for k, v in me.optim_detail.items() if v}
    per_param = Fraction(me.optim, psi())
    rec = recipes.get_recipe("mixed-bf16")
    t = torch_adam_bf16()
    return {"claim": "Adam state is 2x parameters", "torch": t, "torch_source": TORCH_ADAM_SOURCE,
            "optim_bytes_per_param": per_param, "detail_bytes_per_param": detail,
            "theory": rec.optim_bytes, "times_bf16_weights": per_param / rec.param_bytes,
            "match": ddp.match.model_states,
            "holds": False, "verdict": _verdict(False, half=t["moments_over_params"] == 2),
            "correct": "torch.optim.Adam on bf16 params: m and v in bf16, exactly 2x; mixed precision "
                       "(ZeRO's K = 12): fp32 master 4 + m 4 + v 4 = 12 bytes/param, 6x the bf16 weights"}


def zero2_gathers_grads() -> dict:
    """Claim 4: "ZeRO-2 all-gathers the gradients before the next forward"."""
    z2 = measure("zero2")
    rk = z2.ranks[0]
    last = z2.steps - 1
    records = [c for c in rk.timeline.comm if c.step == last]
    step_t = [e.t for e in rk.timeline.events if e.step == last and e.kind == EventKind.OPTIMIZER_STEP][0]
    rec = recipes.get_recipe(z2.recipe)
    rows = [{"op": c.op, "tag": c.tag, "moves": c.moves, "payload": c.payload,
             "after_optimizer_step": c.t_start >= step_t} for c in records]
    gathers = [r for r in rows if r["op"] == "all_gather"]
    holds = any(r["moves"] == "grads" for r in gathers)
    return {"claim": "ZeRO-2 all-gathers gradients before the next forward", "records": rows,
            "gather_tags": sorted({r["moves"] for r in gathers}),
            "gathers_after_step": all(r["after_optimizer_step"] for r in gathers),
            "gathered_bytes": sum(r["payload"] for r in gathers),
            "param_bytes_full": psi() * rec.param_bytes,
            "grad_bytes_per_rank": rk.measured.grad, "grad_bytes_theory": rec.grad_bytes * psi() // z2.n,
            "match": z2.match.comm and z2.match.model_states,
            "holds": holds, "verdict": _verdict(holds),
            "correct": "it all-gathers the UPDATED PARAMETERS after the step; gradients stay sharded"}


def torch_fully_shard_memory(n: int = N) -> list[dict]:
    """torch's own FSDP2 (`fully_shard`) on FACT_MODEL, mixed-bf16, on n ranks, under torch's
    `FSDPMemTracker`: its peak bytes per category, per rank (nothing of zeroedu's strategies,
    comm or ledger is involved)."""
    from ..references.torch_fsdp2 import fully_shard_job

    key = ("torch_fully_shard", n)
    if key not in _RUNS:
        cfg = RunConfig("fsdp2", n, steps=STEPS, model=FACT_MODEL, global_batch=24).resolved()
        _RUNS[key] = cluster.run(fully_shard_job, n, {"cfg": config_to_dict(cfg)})
    return [{"rank": r["rank"], **{k.replace("_FSDPRefType.", ""): v for k, v in r["peak_by_category"].items()}}
            for r in _RUNS[key]]


def fsdp_shards_only_params_grads() -> dict:
    """Claim 5: "PyTorch FSDP shards only parameters and gradients". Evidence: torch's own
    FSDPMemTracker on torch's own `fully_shard`: the optimizer state it counts per rank is the
    rank's shard's (m, v in fp32: 8Ψ/N, plus one 4-byte step counter per parameter tensor)."""
    rows = torch_fully_shard_memory()
    n_tensors = sum(1 for _ in FACT_MODEL.build().parameters())
    sharded_mv = Fraction(8 * psi(), N)  # fp32 m and v of this rank's shard
    step_counters = 4 * n_tensors  # torch keeps a 0-d fp32 `step` per parameter tensor
    per_rank = [{"rank": r["rank"], "OPT": r["OPT"], "SHARDED_PARAM": r["SHARDED_PARAM"]} for r in rows]
    sharded = all(r["OPT"] == sharded_mv + step_counters for r in per_rank)
    return {"claim": "PyTorch FSDP shards only params and grads", "per_rank": per_rank,
            "tracker": rows, "source": TORCH_FSDP_SOURCE,
            "unsharded_mv": 8 * psi(), "sharded_mv": sharded_mv, "step_counters": step_counters,
            "master_shard": Fraction(4 * psi(), N),
            "match": sharded and all(r["SHARDED_PARAM"] == 4 * psi() // N for r in per_rank),
            "holds": not sharded, "verdict": _verdict(not sharded),
            "correct": "torch's fully_shard shards the optimizer state too: Adam is built on the sharded "
                       "parameters, so m and v exist for this rank's 1/N only"}


def deepspeed_pp_zero3() -> dict:
    """Claim 6: "DeepSpeed runs ZeRO-3 together with its pipeline parallelism" (seed: TP = 8,
    PP = 4, ZeRO-3)."""
    s = DEEPSPEED_PIPE_SOURCE
    allowed = {name: stage < s["stages"]["gradients"] for name, stage in s["stages"].items()}
    return {"claim": "DeepSpeed runs ZeRO-3 with pipeline parallelism", "source": s,
            "allowed_with_pipeline": allowed, "holds": allowed["weights"], "verdict": _verdict(allowed["weights"]),
            "gpus_tp8_pp4": {dp: theory.gpu_count("zero1", dp, tp=8, pp=4) for dp in (1, 2, 8)},
            "correct": "its PipelineEngine accepts ZeRO stage 0 or 1 only (asserts stage < 2)"}


def zero1_4x_at_8() -> dict:
    """Claim 7: "ZeRO-1 cuts memory 4x at N = 8"."""
    rec = recipes.get_recipe("mixed-bf16")
    at8 = theory.model_states("ddp", 7e9, 8).total / theory.model_states("zero1", 7e9, 8).total
    limit = Fraction(rec.total_bytes, rec.param_bytes + rec.grad_bytes)
    ddp8, z18 = measure("ddp", 8), measure("zero1", 8)
    measured8 = Fraction(ddp8.ranks[0].measured.total, z18.ranks[0].measured.total)
    exact8 = Fraction(ddp8.ranks[0].predicted.total, z18.ranks[0].predicted.total)
    return {"claim": "ZeRO-1 cuts memory 4x at N = 8", "ratio_7b_n8": at8, "limit": limit,
            "measured_ratio_n8": measured8, "exact_theory_n8": exact8,
            "match": ddp8.match.model_states and z18.match.model_states,
            "holds": at8 == 4, "verdict": _verdict(at8 == 4),
            "correct": "16/(4 + 12/8) = 2.9x at N = 8; 4x only as N -> infinity"}


def zero1_sends_like_ddp() -> dict:
    """Claim 8: "ZeRO-1 sends 2Ψ, like DDP". True of the ring model (reduce-scatter Ψ +
    all-gather Ψ, ZeRO §7.2.1) and of zeroedu's ring collectives on the wire; false for gloo's
    own reduce-scatter, which sends an all-reduce's bytes (3Ψ in all), and for DeepSpeed's default
    ZeRO-1/2 gradient path since v0.12.4, which all-reduces each bucket and keeps its own slice
    (deepspeed/runtime/zero/stage_1_and_2.py, average_tensor; use_multi_rank_bucket_allreduce=True)."""
    ddp, ring, gloo = wire_run("ddp"), wire_run("zero1", "ring"), wire_run("zero1", "backend")
    w = {"ddp": _wire(ddp), "zero1_ring": _wire(ring), "zero1_gloo": _wire(gloo)}
    by = {k: r.ranks[0].wire.by_collective for k, r in
          (("ddp", ddp), ("zero1_ring", ring), ("zero1_gloo", gloo))}
    model = {"ddp": _ring(ddp), "zero1_ring": _ring(ring), "zero1_gloo": _ring(gloo)}
    ratio_ring, ratio_gloo = w["zero1_ring"] / w["ddp"], w["zero1_gloo"] / w["ddp"]
    return {"claim": "ZeRO-1 sends 2Ψ, like DDP", "psi": ddp.psi, "n": WIRE_N, "wire": w,
            "wire_by_collective": by, "ring_model": model,
            "ratio_ring": ratio_ring, "ratio_gloo": ratio_gloo,
            "gloo_rs_over_ring_rs": by["zero1_gloo"]["reduce_scatter"] / by["zero1_ring"]["reduce_scatter"],
            "match": all(r.match.wire and r.match.comm for r in (ddp, ring, gloo)),
            "holds": False, "verdict": _verdict(False, half=abs(ratio_ring - 1) < 0.02),
            "correct": "2Ψ only if the gradients are reduce-scattered on the ring bound; gloo's reduce-scatter "
                       "(and DeepSpeed's default all-reduce + keep own slice) make it 3Ψ, 1.5x DDP"}


def zero2_8x_at_8() -> dict:
    """Claim 9: "ZeRO-2 cuts memory about 8x at N = 8" (with stage 1)."""
    at8 = theory.model_states("ddp", 7e9, 8).total / theory.model_states("zero2", 7e9, 8).total
    rec = recipes.get_recipe("mixed-bf16")
    limit = Fraction(rec.total_bytes, rec.param_bytes)
    ddp8, z28 = measure("ddp", 8), measure("zero2", 8)
    measured8 = Fraction(ddp8.ranks[0].measured.total, z28.ranks[0].measured.total)
    exact8 = Fraction(ddp8.ranks[0].predicted.total, z28.ranks[0].predicted.total)
    return {"claim": "ZeRO-2 cuts memory ~8x at N = 8", "ratio_7b_n8": at8, "limit": limit,
            "measured_ratio_n8": measured8, "exact_theory_n8": exact8,
            "match": ddp8.match.model_states and z28.match.model_states,
            "holds": abs(at8 - 8) < 1, "verdict": _verdict(abs(at8 - 8) < 1),
            "correct": "16/(2 + 14/8) = 4.27x at N = 8; 8x only as N -> infinity"}


def allreduce_volume_is_psi() -> dict:
    """Claim 10: "a gradient all-reduce moves as many elements as there are parameters"."""
    ddp = wire_run("ddp")
    rec = recipes.get_recipe(ddp.recipe)
    psi_, n = ddp.psi, ddp.n
    per_param = Fraction(_wire(ddp), psi_ * rec.grad_bytes)  # elements sent per rank, per parameter
    ring = Fraction(2 * (n - 1), n)
    return {"claim": "all-reduce volume = parameter count", "psi": psi_, "n": n, "wire": _wire(ddp),
            "ring_model": _ring(ddp), "elements_per_param": per_param, "ring_factor": ring,
            "factor_by_n": {k: Fraction(2 * (k - 1), k) for k in (2, 4, 8, 64, 1024)},
            "match": ddp.match.wire, "holds": False, "verdict": _verdict(False),
            "correct": "each rank sends 2(N-1)/N·Ψ elements (and receives as many): 1.5Ψ at N = 4, "
                       "-> 2Ψ for large N (ZeRO §7.1)"}


class ZeRO1WithoutGather(ZeRO1):
    """ZeRO-1 with its all-gather of the updated parameters left out ("optional", say some
    notes): each rank's parameter buffer gets only its own chunk updated."""

    def unshard(self) -> None:
        self.ledger.event(Ev.PARAMS_NOT_GATHERED)


def zero1_gather_optional() -> dict:
    """Claim 11: "ZeRO-1's all-gather of the parameters is optional". Rank r's optimizer holds
    state for chunk r only (12Ψ/N), so after the step rank r has updated chunk r and nothing else;
    without the all-gather the other N-1 chunks of its replica stay stale. Run both, in fp32
    (whose losses equal single-process training to 1e-6 when the algorithm is right)."""
    ok = measure("zero1", recipe="fp32")
    broken = measure("zero1", recipe="fp32", strategy_class=f"{__name__}:ZeRO1WithoutGather")
    rel = lambda r: max(abs(a - b) / abs(b) for a, b in zip(r.losses, r.reference_losses))
    gathers = [c for c in ok.ranks[0].timeline.comm if c.op == "all_gather" and c.step == 0]
    return {"claim": "ZeRO-1's parameter all-gather is optional",
            "optim_per_rank": ok.ranks[0].measured.optim,
            "optim_full": recipes.get_recipe("fp32").optim_bytes * psi(),  # m, v: fp32 is its own master
            "gathered_bytes": sum(c.payload for c in gathers),
            "loss_rel_diff": {"zero1": rel(ok), "without_gather": rel(broken)},
            "losses": {"reference": ok.reference_losses, "zero1": ok.losses, "without_gather": broken.losses},
            "match": ok.match.model_states and ok.match.comm,
            "holds": rel(broken) <= 1e-6, "verdict": _verdict(rel(broken) <= 1e-6),
            "correct": "required: each rank updates only its own 1/N; the all-gather brings the other "
                       "N-1 updated chunks, or the replicas drift apart"}


def zero3_fetches_neighbours() -> dict:
    """Claim 12: "ZeRO-3 computes on its local shard and fetches the neighbours' parameters when
    it needs them" (that is tensor parallelism). ZeRO-3 all-gathers a unit's full parameters
    before the unit computes, and frees them after: read from the timeline of an fsdp1 run."""
    z3 = measure("fsdp1")
    rk = z3.ranks[0]
    rec = recipes.get_recipe(z3.recipe)
    last = z3.steps - 1
    events = [e for e in rk.timeline.events if e.step == last]
    fwd_end = next(i for i, e in enumerate(events) if e.kind == Ev.FORWARD_END)
    units = [{"unit": e.unit, "gathered_bytes": e.bytes["gathered"]}
             for e in events[:fwd_end] if e.kind == Ev.UNSHARD]
    unit_params = [sum(p.numel() for p in m.parameters()) for m in _fact_units()]
    for u in units:
        u["full_unit_bytes"] = unit_params[u["unit"]] * rec.param_bytes
        u["shard_bytes"] = unit_params[u["unit"]] * rec.param_bytes // z3.n
    full = all(u["gathered_bytes"] == u["full_unit_bytes"] for u in units)
    return {"claim": "ZeRO-3 computes on shards, fetching neighbours' params", "units": units,
            "param_bytes_per_rank": rk.measured.param, "model_param_bytes": psi() * rec.param_bytes,
            "match": z3.match.model_states and z3.match.comm,
            "holds": not full, "verdict": _verdict(not full),
            "correct": "ZeRO-3 all-gathers each unit's FULL parameters before its forward (and again before "
                       "its backward) and computes as DDP would; computing on shards is tensor parallelism"}


def _fact_units():
    from ..models import units

    return units(FACT_MODEL.build())


def zero3_model_size_over_n() -> dict:
    """Claim 13: "ZeRO-3 needs about model size / N per GPU" (plus activations)."""
    z3 = measure("fsdp1")
    me = z3.ranks[0].measured
    rec = recipes.get_recipe(z3.recipe)
    model_over_n = Fraction(rec.param_bytes * psi(), z3.n)
    ratio = Fraction(me.total) / model_over_n
    return {"claim": "ZeRO-3 needs ~ model size / N per GPU", "total_per_rank": me.total,
            "predicted_per_rank": z3.ranks[0].predicted.total, "model_size_over_n": model_over_n,
            "times": ratio, "gb_7b_n8": {"model_over_n": Fraction(2 * 7 * 10**9, 8),
                                         "zero3": theory.model_states("fsdp1", 7e9, 8).total},
            "match": z3.match.model_states, "holds": ratio == 1, "verdict": _verdict(ratio == 1),
            "correct": "16Ψ/N of model states (8x 'model size / N' with bf16 weights), plus activations "
                       "and the unit being gathered"}


def offload_optimizer_only_stage2() -> dict:
    """Claim 14: "ZeRO-Offload moves only the optimizer state to the CPU, and works with stage 2"."""
    rows = {}
    for s in ("ddp", "zero1", "zero2", "fsdp1"):
        reason = theory.offload_not_applicable(s, "optimizer")
        if reason:
            rows[s] = {"applicable": False, "reason": reason}
            continue
        part = theory.offload(s, 7e9, 8, what="optimizer")
        rows[s] = {"applicable": True, "device": part["device"].total, "host": part["host"].total,
                   "host_grad": part["host"].grad}
    return {"claim": "ZeRO-Offload: optimizer state only, with stage 2", "sources": DEEPSPEED_OFFLOAD_SOURCES,
            "by_strategy_7b_n8": rows, "holds": False, "verdict": _verdict(False),
            "correct": "offload_optimizer moves the optimizer state, the fp32 gradient partition and the "
                       "optimizer step to the CPU, with ZeRO stage 1, 2 or 3 (parameters too: offload_param, "
                       "stage 3 only)"}


CLAIMS = [zero3_doubles_comm, dp_needs_7x, adam_state_2x, zero2_gathers_grads,
          fsdp_shards_only_params_grads, deepspeed_pp_zero3, zero1_4x_at_8, zero1_sends_like_ddp,
          zero2_8x_at_8, allreduce_volume_is_psi, zero1_gather_optional, zero3_fetches_neighbours,
          zero3_model_size_over_n, offload_optimizer_only_stage2]

__all__ = ["CLAIMS", "FACT_MODEL", "WIRE_MODEL", "DEEPSPEED_PIPE_SOURCE", "DEEPSPEED_OFFLOAD_SOURCES",
           "TORCH_ADAM_SOURCE", "TORCH_FSDP_SOURCE", "ZeRO1WithoutGather", "measure", "wire_run", "psi",
           "torch_adam_bf16", "torch_fully_shard_memory"] + [f.__name__ for f in CLAIMS]
