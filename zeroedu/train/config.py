"""What one run is: strategy, world size, steps, recipe, mesh, model, Adam, strategy options,
micro-batches, activation recompute and gradient clipping.

`RunConfig.resolved()` validates everything in the parent, before any rank starts (unknown
options, M not dividing the world size, a global batch that does not split evenly into ranks
and micro-batches), fills in the model's defaults (its global batch and Adam settings), so a bad
configuration is one ValueError and never a failure on every rank. A config crosses the process
boundary as a plain dict (`config_to_dict` / `config_from_dict`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from ..catalog import get_spec
from ..models import DEFAULT_MODEL, RECOMPUTE_MODES, CustomModel, MLPConfig, ModelSpec, get_model, local_slice
from ..optim import AdamConfig
from ..recipes import get_recipe
from ..runtime.comm import IMPLEMENTATIONS
from ..runtime.ledger import TIMELINE_MODES


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
    clip_grad_norm: float | None = None  # clip the global gradient norm to this value
    collectives: str = "auto"  # ring (zeroedu's ring reduce-scatter/all-gather) | backend | auto
    # What the ledger records: "full" (every lifecycle event, the wire per collective, the first
    # backward op by op) or "minimal" (the report's figures only; cheaper: `runtime.ledger`).
    timeline: str = "full"
    # A variant of the strategy's class ("package.module:Class", a subclass: a lab's or a
    # notebook's deliberately broken one); the catalog's name still says what theory predicts.
    strategy_class: str | None = None
    stream: bool = False  # send ledger events to the parent while running
    return_params: bool = False

    def resolved(self) -> "RunConfig":
        from ..strategies import option_names

        spec = get_spec(self.strategy)
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world size must be an integer >= 1, got {self.world_size!r}")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {self.steps!r}")
        m = self.m if spec.hybrid else 1
        if m < 1 or self.world_size % m:
            raise ValueError(f"M = {self.m} must be >= 1 and divide the world size {self.world_size}")
        model = get_model(self.model)
        batch = self.global_batch if self.global_batch is not None else model.default_global_batch
        local_slice(batch, self.world_size, 0)  # validates divisibility
        k = self.micro_batches
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"micro-batches must be an integer >= 1, got {k!r}")
        if (batch // self.world_size) % k:
            need = self.world_size * k
            raise ValueError(f"the local batch {batch // self.world_size} (global batch {batch} over "
                             f"{self.world_size} ranks) must be divisible by {k} micro-batches: use a "
                             f"global batch that is a multiple of N·K = {need}, e.g. --global-batch "
                             f"{need * -(-batch // need)}")
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, got {self.recompute!r}")
        if self.recompute != "none" and isinstance(model, MLPConfig):
            raise ValueError("activation recompute is a transformer technique: use a gpt-* model")
        if self.recompute not in ("none", "full") and isinstance(model, CustomModel):
            raise ValueError("a custom model re-runs its CustomModel(recompute=...) modules: recompute='full'")
        if self.collectives not in IMPLEMENTATIONS:
            raise ValueError(f"collectives must be one of {', '.join(IMPLEMENTATIONS)}, got {self.collectives!r}")
        if self.timeline not in TIMELINE_MODES:
            raise ValueError(f"timeline must be one of {', '.join(TIMELINE_MODES)}, got {self.timeline!r}")
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ValueError(f"clip-grad-norm must be > 0, got {self.clip_grad_norm!r}")
        recipe = get_recipe(self.recipe or spec.default_recipe).name
        # Unknown options are caught here, in the parent, not as a failure on every rank.
        allowed = option_names(spec.name)
        if self.strategy_class is not None:
            from ..models.custom import resolve as resolve_ref
            from ..strategies import strategy_class

            cls = resolve_ref(self.strategy_class)
            if not (isinstance(cls, type) and issubclass(cls, strategy_class(spec.name))):
                raise ValueError(f"{self.strategy_class} is not a subclass of {spec.name}'s class")
            allowed = tuple(cls.OPTIONS)
        unknown = sorted(set(self.options) - set(allowed))
        if unknown:
            raise ValueError(f"{spec.name} does not take option(s) {unknown}; it takes "
                             f"{sorted(allowed) or 'none'}")
        return replace(self, strategy=spec.name, recipe=recipe, m=m, model=model, global_batch=batch,
                       adam=self.adam if self.adam is not None else model.default_adam())

    @property
    def n(self) -> int:
        return self.world_size // self.m

    @property
    def micro_batch_size(self) -> int:
        """Sequences (samples) in one micro-batch on one rank."""
        return self.global_batch // self.world_size // self.micro_batches


def config_to_dict(cfg: RunConfig) -> dict:
    d = asdict(cfg)
    d["model"] = get_model(cfg.model).as_dict()
    return d


def config_from_dict(d: dict) -> RunConfig:
    d = dict(d)
    d["model"] = get_model(d.get("model", DEFAULT_MODEL))
    adam = d.get("adam")
    d["adam"] = AdamConfig(**adam) if isinstance(adam, dict) else adam
    return RunConfig(**d)
