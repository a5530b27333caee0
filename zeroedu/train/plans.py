"""Plans for a model the suite runs: every shape `zeroedu run` builds for it on N local ranks, each
with the figures its run will report, ranked by a step-time model. `zeroedu plan --model gpt-small`.

The large-job planner (`theory.planner`) sizes Llama-2-70B on H100s with approximate forms (the
embeddings spread over the stages, Korthikanti's 34·s·b·h per layer); a plan here is a
`RunConfig` that runs, and its figures are the exact closed forms its run is checked against:

Candidates: ZeRO level z (0 ddp, 1 zero1, 2 zero2, 3 fsdp2) × tp × pp × cp dividing N (dp the rest)
× micro-batches k × sequence parallelism where tp > 1; a shape `RunConfig.resolved()` refuses is
not a plan (its reason counted, as the large planner counts its refusals).

Figures, per rank r (`launch.predicted`, the forms of `theory.memory`, `theory.comm`,
`theory.activations` and each model axis's): the model states' bytes, one micro-batch's saved
activations, and the bytes r sends per step on each mesh axis, by collective. A run of the plan
measures the same three from tensor storages and the ledger's record of every send
(tests/test_plans.py runs the top three and compares every rank).

Step time (a model, stated; `benchmarks/bench_plans.py` times the top plans against it):
    compute   c · B·/(dp·tp·pp·cp) · max(1, N/cores), c this machine's seconds for one sequence's
              forward, backward and update of the whole model in the recipe, one thread (`calibrate`,
              measured once per process): each rank computes its 1/(tp·pp·cp) share of its B/dp
              sequences, and N ranks share the machine's cores; with a pipeline, at least the
              busiest rank's share over (1 - (pp - 1)/(k + pp - 1)), its 1F1B bubble
    comm      per mesh axis, the rank that takes longest: its calls one after another, each call
              its ring steps (`theory.timing.ring_steps`; a send one; naive DDP a call per
              parameter), each step the longer of the link's time for it, α + its bytes/β on an
              emulated link (`runtime.links`; the link holds a message until then while the
              machine works), and this machine's seconds per step (`ring_latency`, measured on
              the N ranks through the same links: an all-reduce of 1,024 elements per rank in
              the recipe's dtype, every message a real one: on two cores a message costs every
              rank CPU, 2-3 ms a step at N = 8); exposed whole: overlap with backward makes a
              real step shorter than this
Ranked by compute + comm, then by the largest rank's memory.
"""
from __future__ import annotations

import os
import re
import statistics
import time
from dataclasses import dataclass, field
from itertools import product

from ..models import get_model
from ..recipes import get_recipe, torch_dtype
from ..runtime import matmul16
from ..runtime.links import Links, parse_links
from ..runtime import cluster
from ..theory.timing import ring_steps
from .config import ResolvedConfig, RunConfig, config_to_dict
from .jobs import ring_step_job
from .launch import predicted, predicted_comm

# the data-parallel strategy of each ZeRO level, as a run names it (`strategies.catalog`)
ZERO_STRATEGY = {0: "ddp", 1: "zero1", 2: "zero2", 3: "fsdp2"}


@dataclass(frozen=True)
class RankFigures:
    """What one rank of a plan holds and sends, the closed forms its run reports (`Predicted`)."""
    rank: int
    model_states: int  # bytes: parameters, gradients, optimizer states at the optimizer step
    activations: int  # bytes one micro-batch saves for backward
    comm_by_axis: dict[str, dict[str, float]]  # bytes sent per step: mesh axis -> collective -> bytes
    messages: dict[str, int] = field(default_factory=dict)  # ring steps per step on each axis, one after another
    # each call on each axis, in order: (its ring steps, the bytes this rank sends in it)
    calls: dict[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)

    @property
    def memory(self) -> int:
        return self.model_states + self.activations


@dataclass(frozen=True)
class SuitePlan:
    config: ResolvedConfig
    zero: int
    ranks: tuple[RankFigures, ...]
    compute: float  # seconds per step, the model's compute term
    comm: dict[str, float] = field(default_factory=dict)  # seconds per step on each paced axis

    @property
    def step(self) -> float:
        return self.compute + sum(self.comm.values())

    @property
    def memory(self) -> int:
        return max(r.memory for r in self.ranks)

    @property
    def dp(self) -> int:
        c = self.config
        return c.world_size // (c.tp * c.pp * c.cp)

    def __str__(self) -> str:
        c = self.config
        return (f"dp {self.dp} x tp {c.tp}{' + sp' if c.sequence_parallel else ''} x pp {c.pp} x cp {c.cp}, "
                f"ZeRO-{self.zero} ({c.strategy}), k {c.micro_batches}")

    def run_config(self, steps: int | None = None, links=None) -> RunConfig:
        """The `RunConfig` that runs this plan (`train.run`), `steps` and `links` as asked."""
        c = self.config
        return RunConfig(c.strategy, c.world_size, steps=steps or c.steps, recipe=c.recipe, global_batch=c.global_batch,
                         model=c.model, micro_batches=c.micro_batches, tp=c.tp, sequence_parallel=c.sequence_parallel,
                         cp=c.cp, pp=c.pp, links=links)


@dataclass(frozen=True)
class SuitePlanReport:
    model: str
    world_size: int
    global_batch: int
    recipe: str
    links: str | None
    cores: int
    seconds_per_sequence: float  # the calibration: `calibrate`
    ring_step: float  # this machine's seconds per ring step at world_size ranks on the links (`ring_latency`)
    ranked: list[SuitePlan]  # fastest first
    refused: dict[str, int]  # why the other candidates are not shapes a run builds: count


_CALIBRATION: dict[tuple, float] = {}


def calibrate(model, recipe: str, sequences: int = 2, reps: int = 3) -> float:
    """Seconds one thread of this machine takes per sequence for the whole model's forward,
    backward and Adam update in `recipe`'s parameter dtype (the median of `reps` after a warm-up;
    kept per process). The same 16-bit path the ranks take (`runtime.matmul16`)."""
    import torch

    spec = get_model(model)
    key = (spec, recipe)
    if key in _CALIBRATION:
        return _CALIBRATION[key]
    dtype_name = get_recipe(recipe).param
    threads = torch.get_num_threads()
    rng = torch.get_rng_state()
    torch.set_num_threads(1)  # as every rank runs (`runtime.rank`)
    try:
        net = spec.build().to(torch_dtype(dtype_name))
        opt = torch.optim.Adam(net.parameters(), lr=1e-6)
        times = []
        for i in range(reps + 1):
            x, y = spec.batch(i, sequences)
            t0 = time.perf_counter()
            with matmul16.compute(dtype_name):
                loss = net.loss(net(x), y)
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)
    _CALIBRATION[key] = statistics.median(times[1:]) / sequences
    return _CALIBRATION[key]


def _candidates(world_size: int, micro_batches) -> list[tuple[int, int, int, int, int, bool]]:
    divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
    out = []
    for z, tp, pp, cp, k, sp in product(ZERO_STRATEGY, divisors, divisors, divisors, micro_batches, (False, True)):
        if world_size % (tp * pp * cp) or (sp and tp == 1):
            continue
        out.append((z, tp, pp, cp, k, sp))
    return out


def figures(cfg: ResolvedConfig) -> tuple[RankFigures, ...]:
    """Every rank's closed forms for `cfg`, as its run's report will hold them."""
    out = []
    for r in range(cfg.world_size):
        p = predicted(cfg, r)
        messages: dict[str, int] = {}
        calls: dict[str, list[tuple[int, float]]] = {}
        for op in predicted_comm(cfg, r).ops:
            steps = _steps(op.collective, op.group)
            messages[op.axis] = messages.get(op.axis, 0) + steps
            calls.setdefault(op.axis, []).append((steps, float(op.sent)))
        out.append(RankFigures(r, p.total, p.activations, {a: dict(c) for a, c in p.comm_by_axis.items()}, messages,
                               {a: tuple(c) for a, c in calls.items()}))
    return tuple(out)


def _steps(collective: str, group: int) -> int:
    """Messages one call sends one after another: a ring's steps, a send's one, an all-to-all's
    group - 1 (one to each other rank)."""
    if collective == "send":
        return 1
    if collective == "all_to_all":
        return group - 1
    return ring_steps(collective, group)


_LATENCY: dict[tuple, float] = {}
PROBE_ELEMENTS = 1024  # per rank: every message of the probe's ring a real one (one element has 0-1 per chunk)


def ring_latency(world_size: int, links: Links | None = None, recipe: str = "mixed-bf16") -> float:
    """Seconds per ring step on this machine at `world_size` local ranks on `links`
    (`jobs.ring_step_job`: an all-reduce of PROBE_ELEMENTS per rank in the recipe's parameter
    dtype, the slowest rank's median), measured once per process."""
    key = (world_size, None if links is None else str(links), recipe)
    if key not in _LATENCY:
        cfg = config_to_dict(RunConfig("ddp", world_size, model="gpt-tiny", steps=1, recipe=recipe,
                                       links=links).resolved())
        _LATENCY[key] = max(cluster.get_pool(world_size).run(
            ring_step_job, {"cfg": cfg, "numel": PROBE_ELEMENTS * world_size})) if world_size > 1 else 0.0
    return _LATENCY[key]


def _compute(cfg: ResolvedConfig, per_sequence: float, cores: int) -> float:
    dp = cfg.world_size // (cfg.tp * cfg.pp * cfg.cp)
    share = per_sequence * cfg.global_batch / (dp * cfg.tp * cfg.pp * cfg.cp)  # one rank's work
    busy = share * max(1.0, cfg.world_size / cores)  # N ranks on the machine's cores
    if cfg.pp > 1:  # the busiest rank waits out its bubble, whoever uses the cores meanwhile
        bubble = (cfg.pp - 1) / (cfg.micro_batches + cfg.pp - 1)
        busy = max(busy, share / (1 - bubble))
    return busy


def _comm(ranks: tuple[RankFigures, ...], links: Links | None, latency: float) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in ranks:  # the rank that takes longest on an axis sets its time
        for axis, calls in r.calls.items():
            link = None if links is None else links.for_axis(axis)
            t = 0.0
            for steps, sent in calls:  # each step the longer of the link's time and the machine's
                on_link = 0.0 if link is None else link.alpha + sent / steps / link.beta
                t += steps * max(on_link, latency)
            out[axis] = max(out.get(axis, 0.0), t)
    return out


def plan(model: str = "gpt-small", world_size: int = 8, global_batch: int | None = None, recipe: str = "mixed-bf16",
         micro_batches=(1, 2, 4), links=None, cores: int | None = None, steps: int = 2) -> SuitePlanReport:
    """Every shape `zeroedu run` builds for `model` on `world_size` local ranks (on `links`, when
    given: then only those whose axes the links pace), ranked by the module's step-time model."""
    spec = get_model(model)
    if not hasattr(spec, "n_heads"):
        raise ValueError(f"plans split a GPT over dp x tp x pp x cp: {spec.name} is not a gpt-* model")
    global_batch = global_batch or 2 * world_size
    links = parse_links(links)
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    per_sequence = calibrate(spec, recipe)
    latency = ring_latency(world_size, links, recipe)
    ranked, refused = [], {}
    for z, tp, pp, cp, k, sp in _candidates(world_size, micro_batches):
        try:
            cfg = RunConfig(ZERO_STRATEGY[z], world_size, steps=steps, recipe=recipe, global_batch=global_batch,
                            model=spec, micro_batches=k, tp=tp, sequence_parallel=sp, cp=cp, pp=pp,
                            links=links).resolved()
        except ValueError as e:
            why = re.sub(r"\d+", "N", str(e).split(": ")[-1])  # one count per kind of reason
            refused[why] = refused.get(why, 0) + 1
            continue
        ranks = figures(cfg)
        ranked.append(SuitePlan(cfg, z, ranks, _compute(cfg, per_sequence, cores), _comm(ranks, links, latency)))
    ranked.sort(key=lambda p: (p.step, p.memory))
    return SuitePlanReport(spec.name, world_size, global_batch, recipe, None if links is None else str(links), cores,
                           per_sequence, latency, ranked, refused)


__all__ = ["ZERO_STRATEGY", "RankFigures", "SuitePlan", "SuitePlanReport", "calibrate", "figures", "plan"]
