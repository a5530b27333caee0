"""Train a strategy for K steps on real ranks, and the single-process reference it must equal.

`train_job` runs on every rank: build the same model, hand it to the strategy with an explicit
`DistState`, train on this rank's slice of each global batch, and return a plain report: the
local losses, the ledger's measurement (model states at the optimizer step, comm of the last
step), the closed-form prediction for this rank, the peak and the timeline.

`reference` trains the same model on the whole global batch in one process with
`torch.optim.Adam`: nothing from zeroedu's strategies or optimizer is involved, which is what
makes it an independent check.

`run` does both and assembles the JSON-shaped report the CLI prints and the notebooks plot.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

import torch

from . import analysis, cluster, theory
from .catalog import get_spec
from .comm import Comm
from .ledger import Ledger
from .models import ModelConfig, local_slice, make_batch, make_model, unit_shapes
from .optim import AdamConfig
from .recipes import get_recipe
from .strategies import build, option_names
from .strategies.base import DistState


@dataclass
class RunConfig:
    strategy: str = "ddp"
    world_size: int = 4
    steps: int = 5
    recipe: str | None = None  # None: the strategy's default recipe (catalog)
    m: int = 1  # dp_outer size, hybrid strategies only
    global_batch: int = 24
    model: ModelConfig = field(default_factory=ModelConfig)
    adam: AdamConfig = field(default_factory=AdamConfig)
    options: dict = field(default_factory=dict)  # strategy options (bucket size, prefetch, ...)
    stream: bool = False  # send ledger events to the parent while running
    return_params: bool = False

    def resolved(self) -> "RunConfig":
        spec = get_spec(self.strategy)
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world size must be an integer >= 1, got {self.world_size!r}")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {self.steps!r}")
        m = self.m if spec.hybrid else 1
        if m < 1 or self.world_size % m:
            raise ValueError(f"M = {self.m} must be >= 1 and divide the world size {self.world_size}")
        n = self.world_size // m
        local_slice(self.global_batch, self.world_size, 0)  # validates divisibility
        recipe = get_recipe(self.recipe or spec.default_recipe).name
        # Unknown options are caught here, in the parent, not as a failure on every rank.
        allowed = option_names(spec.name)
        unknown = sorted(set(self.options) - set(allowed))
        if unknown:
            raise ValueError(f"{spec.name} does not take option(s) {unknown}; it takes "
                             f"{sorted(allowed) or 'none'}")
        return replace(self, strategy=spec.name, recipe=recipe, m=m)

    @property
    def n(self) -> int:
        return self.world_size // self.m


def _dist_state(ctx, cfg: RunConfig, ledger: Ledger) -> DistState:
    comm = Comm(ledger)
    if get_spec(cfg.strategy).hybrid:
        outer, inner = ctx.mesh(cfg.m)
        return DistState(ctx.rank, ctx.world_size, ctx.device, inner, comm, ledger, outer)
    return DistState(ctx.rank, ctx.world_size, ctx.device, ctx.world_axis(), comm, ledger)


def predicted(cfg: RunConfig, rank: int) -> dict[str, Any]:
    """The closed forms, exact mode, for this model and this rank."""
    shapes = unit_shapes(make_model(cfg.model))
    # The closed forms index a rank by its place on the sharding (inner) axis; with the mesh's
    # inner ranks contiguous, that is the global rank mod N.
    ms = theory.exact_model_states(cfg.strategy, shapes, cfg.n, cfg.m, rank=rank % cfg.n, recipe=cfg.recipe)
    comm = theory.exact_comm(cfg.strategy, shapes, cfg.n, cfg.m, recipe=cfg.recipe,
                             **theory_comm_options(cfg))
    d = ms.as_dict()
    d["comm"] = {k: float(v) for k, v in sorted(comm.by_collective().items()) if v}
    d["comm_by_axis"] = {a: {k: float(v) for k, v in sorted(c.items()) if v}
                         for a, c in sorted(comm.items()) if any(c.values())}
    return d


def theory_comm_options(cfg: RunConfig) -> dict:
    opts = {}
    if "reshard_after_forward" in cfg.options:
        opts["reshard_after_forward"] = cfg.options["reshard_after_forward"]
    return opts


def train_job(ctx, cfg: dict) -> dict:
    """Runs on every rank. `cfg` is a RunConfig as a dict (plain data crosses the process boundary)."""
    cfg = config_from_dict(cfg)
    ledger = Ledger(ctx.rank, sink=ctx.emit if cfg.stream else None)
    dist = _dist_state(ctx, cfg, ledger)
    model = make_model(cfg.model)
    strategy = build(cfg.strategy, model, dist, get_recipe(cfg.recipe), cfg.adam, **cfg.options)
    sl = local_slice(cfg.global_batch, ctx.world_size, ctx.rank)
    losses = []
    for step in range(cfg.steps):
        ledger.begin_step(step)
        x, y = make_batch(step, cfg.global_batch, cfg.model)
        losses.append(strategy.forward_backward(x[sl], y[sl]))
        strategy.step()
    ledger.step = cfg.steps - 1
    out = {
        "rank": ctx.rank,
        "measured": ledger.measured(),
        "predicted": predicted(cfg, ctx.rank),
        "peak": ledger.peak,
        "peak_label": ledger.peak_label,
        "losses": losses,
        "timeline": ledger.timeline(),
    }
    if ctx.device.startswith("cuda"):
        import torch

        # The allocator's own count, to set beside the ledger's peak (its peak adds CUDA
        # workspace, the caching allocator's 512-byte rounding and kernel temporaries).
        out["cuda_max_memory_allocated"] = torch.cuda.max_memory_allocated(ctx.device)
    extra = getattr(strategy, "report_extra", None)
    if extra is not None:
        out["extra"] = extra()
    params = strategy.full_parameters()  # a collective for sharded strategies: every rank calls it
    if cfg.return_params:
        out["params"] = params
    return out


def config_to_dict(cfg: RunConfig) -> dict:
    return asdict(cfg)


def config_from_dict(d: dict) -> RunConfig:
    d = dict(d)
    d["model"] = ModelConfig(**d["model"]) if isinstance(d.get("model"), dict) else d.get("model", ModelConfig())
    d["adam"] = AdamConfig(**d["adam"]) if isinstance(d.get("adam"), dict) else d.get("adam", AdamConfig())
    return RunConfig(**d)


def reference(cfg: RunConfig) -> tuple[list[float], list[torch.Tensor]]:
    """Single-process training on the global batch with torch.optim.Adam, in fp32."""
    torch.manual_seed(0)
    model = make_model(cfg.model)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.adam.lr, betas=(cfg.adam.beta1, cfg.adam.beta2),
                           eps=cfg.adam.eps, foreach=False)
    losses = []
    for step in range(cfg.steps):
        x, y = make_batch(step, cfg.global_batch, cfg.model)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


def run(cfg: RunConfig, *, pool: cluster.Pool | None = None, on_event: Callable | None = None,
        warm: bool = True, timeout: float | None = None) -> dict[str, Any]:
    """Train on `cfg.world_size` real ranks; return the report (see README, "JSON report")."""
    cfg = cfg.resolved()
    if on_event is not None:
        cfg = replace(cfg, stream=True)
    payload = {"cfg": config_to_dict(cfg)}
    if pool is not None:
        ranks = pool.run(train_job, payload, on_event=on_event, timeout=timeout)
    else:
        ranks = cluster.run(train_job, cfg.world_size, payload, warm=warm, on_event=on_event, timeout=timeout)
    return assemble(cfg, ranks)


def assemble(cfg: RunConfig, ranks: list[dict]) -> dict[str, Any]:
    ref_losses, ref_params = reference(cfg)
    n = len(ranks)
    for r in ranks:  # share of gradient communication hidden behind backward (a measurement)
        r["overlap"] = analysis.overlap_fraction(r["timeline"])
    losses = [sum(r["losses"][k] for r in ranks) / n for k in range(cfg.steps)]
    report = {
        "strategy": cfg.strategy,
        "world_size": cfg.world_size,
        "n": cfg.n,
        "m": cfg.m,
        "recipe": cfg.recipe,
        "steps": cfg.steps,
        "options": dict(cfg.options),
        "psi": sum(p.numel() for p in ref_params),
        "ranks": ranks,
        "losses": losses,
        "reference_losses": ref_losses,
        "match": {
            "model_states": all(_states_match(r) for r in ranks),
            "comm": all(r["measured"]["comm"] == r["predicted"]["comm"]
                        and r["measured"]["comm_by_axis"] == r["predicted"]["comm_by_axis"] for r in ranks),
        },
    }
    if ranks and "params" in ranks[0]:
        report["params"] = ranks[0]["params"]
        report["reference_params"] = ref_params
        # Every rank ends with the same full parameters (replicas stay identical; sharded
        # strategies gather the same shards): the largest difference from rank 0's.
        report["replica_max_diff"] = max(
            (float((a - b).abs().max()) for r in ranks[1:] for a, b in zip(r.pop("params"), report["params"])),
            default=0.0)
    return report


def _states_match(r: dict) -> bool:
    me, pr = r["measured"], r["predicted"]
    return all(me[k] == pr[k] for k in ("param", "grad", "optim", "total"))
