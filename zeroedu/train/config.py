"""What one run is: strategy, world size, steps, recipe, mesh, model, Adam, strategy options,
micro-batches, activation recompute, gradient clipping and tensor parallelism.

Two types, one step between them. `RunConfig` is what a user writes: names, `None` for "the
model's default", a model given by preset name. `resolve()` is the one place that validates it
(unknown options, M not dividing the world size, a global batch that does not split evenly into
ranks and micro-batches, a strategy class that is not a subclass of the strategy's) and fills in
the defaults (the strategy's recipe, the model's global batch and Adam settings), so a bad
configuration is one ValueError in the parent and never a failure on every rank. Its result is
a `ResolvedConfig`: frozen, every field concrete. It is made once in the parent, and what runs
downstream (the launcher, the ranks' runner and jobs, the references, the report) takes it as it
is; `resolve()` of a `ResolvedConfig` returns it unchanged, without checking it again.

A resolved configuration crosses the process boundary as a plain dict (`config_to_dict`, which
resolves first, so only resolved values cross; `config_from_dict` on the rank rebuilds the
`ResolvedConfig` without resolving again).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import asdict, dataclass, field, fields

from ..kinds import CP, EP, PP, TP, Implementation, Mesh, RecomputeMode
from ..catalog import get_spec
from ..models import (DEFAULT_MODEL, RECOMPUTE_MODES, CustomModel, GPTConfig, MLPConfig, ModelSpec, MoEGPTConfig,
                      get_model, local_slice)
from ..optim import AdamConfig
from ..recipes import get_recipe
from ..runtime.comm import IMPLEMENTATIONS
from ..kinds import TIMELINE_MODES
from ..runtime.links import Links, parse_links
from ..strategies import splits


@dataclass
class RunConfig:
    strategy: str = "ddp"
    world_size: int = 4
    steps: int = 5
    recipe: str | None = None  # None: the strategy's default recipe (catalog)
    m: int = 1  # dp_outer size, hybrid strategies only
    global_batch: int | None = None  # sequences (samples) per optimizer step; None: the model's
    model: ModelSpec | str = DEFAULT_MODEL  # a preset name ("mlp", "gpt-tiny", "gpt-small") or a config
    adam: AdamConfig | None = None  # None: the model's own settings (its learning rate)
    options: dict = field(default_factory=dict)  # strategy options (bucket size, prefetch, ...)
    micro_batches: int = 1  # gradient accumulation: forward/backward passes per optimizer step
    recompute: str = "none"  # activation recompute: none | selective | full
    # A GPT's attention, "eager" | "fused" (`models.gpt.GPTConfig.attention`); None: the model's own
    attention: str | None = None
    clip_grad_norm: float | None = None  # clip the global gradient norm to this value
    collectives: str = "auto"  # ring (zeroedu's ring reduce-scatter/all-gather) | backend | auto
    # Emulated links (`runtime.links`): a preset name, a bare link for every axis
    # ("200MB/s,50us"), per-axis links (["dp_shard=...", "dp_outer=..."]) or a Links. None: none.
    links: object = None
    # What the ledger records: "full" (every lifecycle event, the wire per collective, the first
    # backward op by op) or "minimal" (the report's figures only; cheaper: `runtime.ledger`).
    timeline: str = "full"
    # A variant of the strategy's class ("package.module:Class", a subclass: a lab's or a
    # notebook's deliberately broken one); the catalog's name still says what theory predicts.
    strategy_class: str | None = None
    stream: bool = False  # send ledger events to the parent while running
    return_params: bool = False
    # Tensor parallelism (`strategies.tensor_parallel`, a GPT only): every block split over tp
    # contiguous ranks, the strategy data-parallel over the world / tp groups across them (a
    # (dp, tp) mesh, tp inner); `sequence_parallel`: Korthikanti's SP inside tp.
    tp: int = 1
    sequence_parallel: bool = False
    # Context parallelism (`strategies.context_parallel`, a GPT with eager attention): every
    # sequence split over cp contiguous ranks, keys and values passed around a ring (`zigzag`:
    # the balanced split); the strategy reduces and shards over dp_shard x cp (`kinds.SHARD_AXES`).
    cp: int = 1
    zigzag: bool = False
    # A variant of the ring ("package.module:Class", a subclass of `RingContext`: a notebook's
    # find-the-bug ring); the closed forms stay the algorithm's.
    ring_class: str | None = None
    # Pipeline parallelism (`strategies.pipeline`, a GPT): its blocks cut into pp stages on the
    # outermost axis, each step's micro-batches run by `schedule` ("gpipe" or "1f1b") through the
    # strategy's forward_only / backward_only; the strategy is data-parallel over each stage's ranks.
    pp: int = 1
    schedule: str = "1f1b"
    # With pp: an emulated device (forward, backward seconds per micro-batch on every stage,
    # `strategies.pipeline.EmulatedCompute`), so the bubble shows on two cores; None: real compute.
    emulate: tuple[float, float] | None = None
    # A mixture of experts (`models.moe`, a GPT): `experts` > 0 makes every block's MLP that many
    # experts behind a top-`top_k` router; expert parallelism places them over `ep` ranks
    # (`strategies.expert_parallel`), each ep rank training on its own share of the batch.
    experts: int = 0
    top_k: int = 1
    capacity_factor: float | None = None  # None: `models.moe.MoESpec`'s 1.25
    ep: int = 1

    def resolved(self) -> "ResolvedConfig":
        """This configuration validated and with its defaults filled in (`resolve`)."""
        return resolve(self)


@dataclass(frozen=True)
class ResolvedConfig:
    """A `RunConfig` after `resolve()`: validated, every default filled in, frozen.

    The fields are RunConfig's, each concrete: the catalog's strategy name, the recipe's name,
    the model as a `ModelSpec`, the global batch, Adam's settings, M = 1 on a flat strategy.
    Made once in the parent; the launcher, the ranks and the references read it as it is.
    (`dataclasses.replace` on one skips validation: use it for what `resolve` does not check,
    `stream`, `return_params`, `timeline`, `links=None`, or go back through `RunConfig`.)"""
    strategy: str
    world_size: int
    steps: int
    recipe: str
    m: int
    global_batch: int
    model: ModelSpec
    adam: AdamConfig
    options: dict
    micro_batches: int
    recompute: str
    clip_grad_norm: float | None
    collectives: str
    links: Links | None
    timeline: str
    strategy_class: str | None
    stream: bool
    return_params: bool
    tp: int = 1
    sequence_parallel: bool = False
    cp: int = 1
    zigzag: bool = False
    pp: int = 1
    schedule: str = "1f1b"
    ep: int = 1
    ring_class: str | None = None
    emulate: tuple[float, float] | None = None

    def resolved(self) -> "ResolvedConfig":
        """Already resolved: itself, not checked again."""
        return self

    @property
    def mesh(self) -> Mesh:
        """The run's ranks as named axes (`kinds.Mesh`): dp_outer = M for a hybrid strategy,
        dp_shard, and each model axis (cp, tp) of size > 1."""
        return Mesh.build(self.world_size, dp_outer=self.m if get_spec(self.strategy).hybrid else None,
                          pp=self.pp, ep=self.ep, cp=self.cp, tp=self.tp)

    @property
    def dp(self) -> int:
        """Shares the global batch is split into (the data axes of the mesh, ep's included)."""
        return self.mesh.data_parallel

    @property
    def n(self) -> int:
        """Ranks in the strategy's inner group: dp_shard, with cp flattened in (`Mesh.shard_size`)."""
        return self.mesh.shard_size

    def shard_rank(self, rank: int) -> int:
        """Rank `rank`'s place in the strategy's inner group (`Mesh.shard_coord`)."""
        return self.mesh.shard_coord(rank)

    @property
    def micro_batch_size(self) -> int:
        """Sequences (samples) in one micro-batch on one rank (the tp ranks of a replica share it)."""
        return self.global_batch // self.dp // self.micro_batches


def resolve(cfg: RunConfig | ResolvedConfig) -> ResolvedConfig:
    """The one validation of a run's configuration, in the parent (see the module docstring).
    A `ResolvedConfig` is returned as it is: resolving is done once, whoever asks again."""
    if isinstance(cfg, ResolvedConfig):
        return cfg
    if not isinstance(cfg, RunConfig):
        raise TypeError(f"a run's configuration is a RunConfig, got {type(cfg).__name__}")
    return _validate(cfg)


def _validate(cfg: RunConfig) -> ResolvedConfig:
    from ..strategies import option_names

    spec = get_spec(cfg.strategy)
    if not isinstance(cfg.world_size, int) or cfg.world_size < 1:
        raise ValueError(f"world size must be an integer >= 1, got {cfg.world_size!r}")
    if not isinstance(cfg.steps, int) or cfg.steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {cfg.steps!r}")
    m = cfg.m if spec.hybrid else 1
    if m < 1 or cfg.world_size % m:
        raise ValueError(f"M = {cfg.m} must be >= 1 and divide the world size {cfg.world_size}")
    model = get_model(cfg.model)
    if cfg.attention is not None:
        if not isinstance(model, GPTConfig):
            raise ValueError(f"--attention is a GPT's: {model.name} has no attention")
        model = dataclasses.replace(model, attention=cfg.attention)  # validated by GPTConfig
    if isinstance(cfg.experts, bool) or not isinstance(cfg.experts, int) or cfg.experts < 0:
        raise ValueError(f"experts must be an integer >= 0, got {cfg.experts!r}")
    if not cfg.experts and (cfg.top_k != 1 or cfg.capacity_factor is not None):
        raise ValueError("--top-k and --capacity-factor set a mixture of experts' router: add --experts E")
    if cfg.experts:
        if not isinstance(model, GPTConfig) or isinstance(model, MoEGPTConfig):
            raise ValueError(f"--experts makes a GPT's MLPs mixtures of experts: {model.name} is not a dense gpt-* model")
        kw = {} if cfg.capacity_factor is None else {"capacity_factor": cfg.capacity_factor}
        model = MoEGPTConfig.of(model, cfg.experts, cfg.top_k, **kw)  # top-k and capacity validated there
    sizes = splits.check(cfg, spec, model)  # each model axis's size, checked by its split
    tp, cp, pp, ep = sizes[TP], sizes[CP], sizes[PP], sizes[EP]
    dp = Mesh.build(cfg.world_size, dp_outer=m if spec.hybrid else None, pp=pp, ep=ep, cp=cp, tp=tp).data_parallel
    batch = cfg.global_batch if cfg.global_batch is not None else model.default_global_batch
    local_slice(batch, dp, 0)  # validates divisibility
    _check_fits(model, cfg.world_size, batch // dp)
    k = cfg.micro_batches
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"micro-batches must be an integer >= 1, got {k!r}")
    if (batch // dp) % k:
        need = dp * k
        raise ValueError(f"the local batch {batch // dp} (global batch {batch} over "
                         f"{dp} data-parallel ranks) must be divisible by {k} micro-batches: use a "
                         f"global batch that is a multiple of N·K = {need}, e.g. --global-batch "
                         f"{need * -(-batch // need)}")
    if cfg.recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, got {cfg.recompute!r}")
    if cfg.recompute != RecomputeMode.NONE and isinstance(model, MLPConfig):
        raise ValueError("activation recompute is a transformer technique: use a gpt-* model")
    if cfg.recompute not in (RecomputeMode.NONE, RecomputeMode.FULL) and isinstance(model, CustomModel):
        raise ValueError("a custom model re-runs its CustomModel(recompute=...) modules: recompute='full'")
    if cfg.collectives not in IMPLEMENTATIONS:
        raise ValueError(f"collectives must be one of {', '.join(IMPLEMENTATIONS)}, got {cfg.collectives!r}")
    if cfg.timeline not in TIMELINE_MODES:
        raise ValueError(f"timeline must be one of {', '.join(TIMELINE_MODES)}, got {cfg.timeline!r}")
    links = parse_links(cfg.links)
    if links is not None:
        if cfg.collectives == Implementation.BACKEND:
            raise ValueError("emulated links pace zeroedu's ring collectives; gloo's own (--collectives "
                             "backend) cannot be paced: use --collectives ring or auto")
        if links.dp_outer is not None and links.dp_shard is not None and not spec.hybrid \
                and links.dp_outer != links.dp_shard:
            raise ValueError(f"{spec.name} has one axis, dp_shard; dp_outer is a hybrid strategy's: "
                             "give --link dp_shard=... or one link for every axis")
        if links.dp_shard is None and not spec.hybrid:
            raise ValueError(f"{spec.name} has one axis, dp_shard: give it a link (dp_shard=...)")
    if cfg.clip_grad_norm is not None and not cfg.clip_grad_norm > 0:
        raise ValueError(f"clip-grad-norm must be > 0, got {cfg.clip_grad_norm!r}")
    recipe = get_recipe(cfg.recipe or spec.default_recipe).name
    # Unknown options are caught here, in the parent, not as a failure on every rank.
    allowed = option_names(spec.name)
    if cfg.strategy_class is not None:
        from ..runtime.rank import resolve_ref
        from ..strategies import strategy_class

        cls = resolve_ref(cfg.strategy_class)
        if not (isinstance(cls, type) and issubclass(cls, strategy_class(spec.name))):
            raise ValueError(f"{cfg.strategy_class} is not a subclass of {spec.name}'s class")
        allowed = tuple(cls.OPTIONS)
    unknown = sorted(set(cfg.options) - set(allowed))
    if unknown:
        raise ValueError(f"{spec.name} does not take option(s) {unknown}; it takes "
                         f"{sorted(allowed) or 'none'}")
    from ..strategies import strategy_class as _strategy_class

    cls = _strategy_class(spec.name)
    cls.check_options({**cls.OPTIONS, **cfg.options})  # combinations the strategy refuses, in the parent too
    return ResolvedConfig(
        strategy=spec.name, world_size=cfg.world_size, steps=cfg.steps, recipe=recipe, m=m,
        global_batch=batch, model=model, adam=cfg.adam if cfg.adam is not None else model.default_adam(),
        options=dict(cfg.options), micro_batches=k, recompute=cfg.recompute,
        clip_grad_norm=cfg.clip_grad_norm, collectives=cfg.collectives, links=links, timeline=cfg.timeline,
        strategy_class=cfg.strategy_class, stream=cfg.stream, return_params=cfg.return_params,
        tp=tp, sequence_parallel=bool(cfg.sequence_parallel), cp=cp, zigzag=bool(cfg.zigzag), pp=pp, schedule=cfg.schedule,
        ep=ep, ring_class=cfg.ring_class if cp > 1 else None,
        emulate=None if cfg.emulate is None else tuple(float(t) for t in cfg.emulate))


MAX_MLP_DEPTH = 1024  # Linear layers: each is a unit with its own hooks and collectives


def machine_memory() -> int | None:
    """Bytes of memory this process may use: the machine's RAM, or its cgroup's limit when lower
    (a container); None where neither can be read."""
    total = None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit.isdigit():
            total = min(total or int(limit), int(limit))
    except OSError:
        pass
    return total


def _check_fits(model, world_size: int, local_batch: int) -> None:
    """A run that cannot fit this machine is refused here, before anything is built: each rank
    builds the whole model before sharding it and the parent builds the reference, so the
    floor is (ranks + 1) x 16 bytes per parameter (fp32 weights, gradients, Adam's two moments)
    plus each rank's activations for its batch (the closed forms; a custom model is the user's)."""
    if isinstance(model, CustomModel):
        return
    if isinstance(model, MLPConfig) and model.depth > MAX_MLP_DEPTH:
        raise ValueError(f"--depth {model.depth}: an mlp has at most {MAX_MLP_DEPTH:,} Linear layers here (each "
                         "is a unit with its own hooks and collectives; deeper builds for minutes and teaches "
                         "nothing more)")
    memory = machine_memory()
    if memory is None:
        return
    psi = model.param_count()
    states = (world_size + 1) * 16 * psi
    acts = world_size * (model.activation_bytes(local_batch, 4) or 0)  # (a mixture of experts has no closed form)
    if states + acts > memory:
        gb = lambda b: f"{b / 1e9:,.1f} GB"  # noqa: E731
        raise ValueError(f"this run needs at least {gb(states + acts)} and this machine has {gb(memory)}: "
                         f"Ψ = {psi:,} parameters x 16 bytes of model states on each of the {world_size} ranks "
                         f"and the reference ({gb(states)}), plus {gb(acts)} of activations for a local batch "
                         f"of {local_batch}; use a smaller model (--hidden, --depth), batch or world size")


def config_to_dict(cfg: RunConfig | ResolvedConfig) -> dict:
    """The resolved configuration as plain data, for the ranks (resolved here, in the parent)."""
    cfg = resolve(cfg)
    d = asdict(cfg)
    d["model"] = get_model(cfg.model).as_dict()
    return d


def config_from_dict(d: dict) -> ResolvedConfig:
    """The `ResolvedConfig` a dict of `config_to_dict` holds (on a rank: it is not resolved again)."""
    missing = sorted({f.name for f in fields(ResolvedConfig)} - set(d)) + [
        k for k in ("recipe", "global_batch", "adam") if d.get(k) is None]
    if missing:
        raise ValueError(f"not a resolved configuration (no {', '.join(missing)}): send config_to_dict(cfg)")
    d = dict(d)
    d["model"] = get_model(d.get("model", DEFAULT_MODEL))
    adam = d.get("adam")
    d["adam"] = AdamConfig(**adam) if isinstance(adam, dict) else adam
    d["links"] = Links.from_plain(d["links"])
    if d.get("emulate") is not None:
        d["emulate"] = tuple(d["emulate"])
    return ResolvedConfig(**d)
