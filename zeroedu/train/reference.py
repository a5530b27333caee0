"""The single-process reference every strategy must equal: the whole global batch, one process,
`torch.optim.Adam` (and `torch.nn.utils.clip_grad_norm_` when the run clips). Nothing from
zeroedu's strategies, comm or optimizer is involved, which is what makes it an independent check.
Micro-batches and activation recompute change neither the mathematics nor, so, the reference.

A preset model's reference depends on nothing but (model, Adam, steps, global batch, clipping),
and is the same whichever strategy, world size or recipe is compared with it: a lesson that
sweeps four strategies over three world sizes trains it once. It is kept per process for the
most recent configurations (a custom model's is always recomputed: its functions can change).
"""
from __future__ import annotations

from collections import OrderedDict

import torch

from ..models import CustomModel
from ..recipes import get_recipe, torch_dtype
from ..runtime import matmul16
from .config import ResolvedConfig, RunConfig, resolve

_KEEP = 8  # configurations kept (a gpt-small entry is 13 MB of parameters)
# key -> (losses, parameters, torch's CPU generator state after training)
_CACHE: OrderedDict[tuple, tuple[list[float], list[torch.Tensor], torch.Tensor]] = OrderedDict()


def reference(cfg: RunConfig | ResolvedConfig) -> tuple[list[float], list[torch.Tensor]]:
    """Single-process training on the global batch with torch.optim.Adam, in fp32."""
    cfg = resolve(cfg)  # a run's is resolved already: taken as it is
    if isinstance(cfg.model, CustomModel):
        return _train(cfg)
    key = (cfg.model, cfg.adam, cfg.steps, cfg.global_batch, cfg.clip_grad_norm)
    if key in _CACHE:
        _CACHE.move_to_end(key)
    else:
        _CACHE[key] = (*_train(cfg), torch.get_rng_state())
        while len(_CACHE) > _KEEP:
            _CACHE.popitem(last=False)
    losses, params, rng = _CACHE[key]
    # Leave the generator where training would have: code that draws random numbers after a
    # run (a notebook cell) sees the same numbers whether or not the reference was kept.
    torch.set_rng_state(rng)
    return list(losses), [p.clone() for p in params]  # the caller's to keep or change


def recipe_losses(cfg: RunConfig | ResolvedConfig) -> list[float]:
    """Single-process training in the run's *recipe*, with torch alone: the model in the recipe's
    parameter dtype, each step's 16-bit gradients copied to fp32 master copies that
    torch.optim.Adam updates, the masters rounded back into the model (Micikevicius et al. 2018,
    §3.1). How far this drifts from fp32 is what the recipe's rounding does to the trajectory by
    itself, measured on this CPU with its kernels; a distributed run in the recipe is held to it
    (`recipes.loss_bound`). fp32: the fp32 reference's losses. Kept per process as `reference`."""
    cfg = resolve(cfg)
    if get_recipe(cfg.recipe).param == "fp32":
        return reference(cfg)[0]
    key = ("recipe", cfg.recipe, cfg.model, cfg.adam, cfg.steps, cfg.global_batch, cfg.clip_grad_norm)
    if isinstance(cfg.model, CustomModel) or key not in _RECIPE_CACHE:
        rng = torch.get_rng_state()
        losses = _train_in_recipe(cfg)
        torch.set_rng_state(rng)  # the generator as the caller left it: this run is an extra
        if isinstance(cfg.model, CustomModel):
            return losses
        _RECIPE_CACHE[key] = losses
        while len(_RECIPE_CACHE) > _KEEP:
            _RECIPE_CACHE.popitem(last=False)
    return list(_RECIPE_CACHE[key])


_RECIPE_CACHE: OrderedDict[tuple, list[float]] = OrderedDict()


def _train_in_recipe(cfg: ResolvedConfig) -> list[float]:
    dtype = torch_dtype(get_recipe(cfg.recipe).param)
    torch.manual_seed(0)
    model = cfg.model.build()
    masters = [p.detach().clone() for p in model.parameters()]  # fp32, built from the same seed
    model = model.to(dtype)
    a = cfg.adam
    opt = torch.optim.Adam(masters, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, foreach=False)
    losses = []
    for step in range(cfg.steps):
        x, y = cfg.model.batch(step, cfg.global_batch)
        x = x.to(dtype) if x.is_floating_point() else x  # as a strategy feeds its model (`Strategy`)
        model.zero_grad(set_to_none=True)
        with matmul16.compute(get_recipe(cfg.recipe).param):  # this CPU's fast path, as the runs take
            loss = model.loss(model(x), y)
            loss.backward()
        for m, p in zip(masters, model.parameters()):
            m.grad = None if p.grad is None else p.grad.float()
        if cfg.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(masters, cfg.clip_grad_norm)
        opt.step()
        with torch.no_grad():
            for m, p in zip(masters, model.parameters()):
                p.copy_(m)  # rounded to the recipe's dtype
        losses.append(loss.item())
    return losses


def _train(cfg: ResolvedConfig) -> tuple[list[float], list[torch.Tensor]]:
    torch.manual_seed(0)
    model = cfg.model.build()
    a = cfg.adam
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, foreach=False)
    losses = []
    for step in range(cfg.steps):
        x, y = cfg.model.batch(step, cfg.global_batch)
        opt.zero_grad()
        loss = model.loss(model(x), y)
        loss.backward()
        if cfg.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad_norm)
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


def parameter_error(trained: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], d_model: int) -> float:
    """The largest per-tensor relative difference (norm of the difference over the reference's norm)
    between trained parameters and one process's, both by name. The key third of each attention
    bias is left out: its true gradient is 0 (softmax ignores a constant added to every key's
    score), so Adam steps on round-off there, up to lr per step of either sign, in one process and
    on ranks alike."""
    worst = 0.0
    for n, q in trained.items():
        want = ref[n]
        if n.endswith("attn.qkv.bias"):
            q, want = torch.cat([q[:d_model], q[2 * d_model:]]), torch.cat([want[:d_model], want[2 * d_model:]])
        worst = max(worst, ((q - want).norm() / want.norm()).item())
    return worst
