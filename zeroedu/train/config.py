"""What one run is: strategy, world size, steps, recipe, mesh, model, Adam, strategy options.

`RunConfig.resolved()` validates everything in the parent, before any rank starts (unknown
options, M not dividing the world size, a global batch that does not split evenly), so a bad
configuration is one ValueError and never a failure on every rank. A config crosses the
process boundary as a plain dict (`config_to_dict` / `config_from_dict`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from ..catalog import get_spec
from ..models import ModelConfig, local_slice
from ..optim import AdamConfig
from ..recipes import get_recipe


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
        from ..strategies import option_names

        spec = get_spec(self.strategy)
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world size must be an integer >= 1, got {self.world_size!r}")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {self.steps!r}")
        m = self.m if spec.hybrid else 1
        if m < 1 or self.world_size % m:
            raise ValueError(f"M = {self.m} must be >= 1 and divide the world size {self.world_size}")
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


def config_to_dict(cfg: RunConfig) -> dict:
    return asdict(cfg)


def config_from_dict(d: dict) -> RunConfig:
    d = dict(d)
    d["model"] = ModelConfig(**d["model"]) if isinstance(d.get("model"), dict) else d.get("model", ModelConfig())
    d["adam"] = AdamConfig(**d["adam"]) if isinstance(d.get("adam"), dict) else d.get("adam", AdamConfig())
    return RunConfig(**d)
