"""What every strategy shares: the distributed state it is handed, the training-step skeleton,
and Adam state allocated up front and registered with the ledger.

A strategy owns the model's parameters on this rank and implements

    forward_backward(x, y) -> local loss   (hooks inside launch its communication)
    step()                                 (reduce what is left, update, re-gather)
    full_parameters() -> list[Tensor]      (fp32, unsharded; a collective for sharded strategies)

and never prints, times or plots: it tells the ledger what each tensor is and marks lifecycle
points, and all traffic goes through `dist.comm`.

Construction is the same for every strategy: ``Strategy(model, dist, recipe, adam=None,
**options)``. Each class lists the options it takes with their defaults in `OPTIONS`; anything
else is a ValueError before any tensor moves. Sharded strategies keep their units in
`self.units` (flat buffers, FSDP units), and every unit type says which parameter elements it
holds through one method, `param_pieces()`; checkpoints are built from that alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..models import units as model_units
from ..optim import AdamConfig, adam_update
from ..recipes import Recipe, get_recipe, torch_dtype
from ..runtime import ledger as L
from ..runtime.comm import Axis, Comm, tag
from ..runtime.ledger import Ledger


@dataclass
class DistState:
    """The explicit distributed state a strategy runs in (never a module global)."""

    rank: int
    world_size: int
    device: str
    inner: Axis  # dp_shard: the ranks that shard (all ranks, for flat strategies)
    comm: Comm
    ledger: Ledger
    outer: Axis | None = None  # dp_outer: replicas / domains, for hybrid strategies


class AdamState:
    """fp32 Adam state for a list of target tensors (whole parameters or flat shards).

    Allocates, per target, what the recipe lists: an fp32 master copy (unless the target is
    already fp32 and *is* the master), an fp32 main-grad copy (Megatron's fp16 recipe), m and v.
    Everything is allocated now, not at the first step, so the ledger sees the optimizer's real
    footprint at the first optimizer step.
    """

    def __init__(self, targets: list[torch.Tensor], recipe: Recipe, cfg: AdamConfig, ledger: Ledger):
        self.targets, self.recipe, self.cfg, self.t = targets, recipe, cfg, 0
        self.masters, self.main_grads, self.m, self.v = [], [], [], []
        for x in targets:
            if recipe.master:
                self.masters.append(ledger.track(x.detach().float().clone(), "master"))
            elif x.dtype != torch.float32:
                raise ValueError(f"recipe {recipe.name} has no master copy but the target is {x.dtype}")
            if recipe.main_grad:
                self.main_grads.append(ledger.track(torch.zeros_like(x, dtype=torch.float32), "main_grad"))
            self.m.append(ledger.track(torch.zeros_like(x, dtype=torch.float32), "m"))
            self.v.append(ledger.track(torch.zeros_like(x, dtype=torch.float32), "v"))

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor], scale: float = 1.0) -> None:
        """Update every target from its gradient times `scale` (e.g. 1/N after a SUM)."""
        self.t += 1
        for i, (x, g) in enumerate(zip(self.targets, grads)):
            if self.main_grads:
                g32 = self.main_grads[i].copy_(g)
            else:
                g32 = g if g.dtype == torch.float32 else g.float()
            if scale != 1.0:
                # Scale in fp32, after the SUM: dividing low-precision grads first rounds twice.
                g32 = g32 * scale if g32 is g else g32.mul_(scale)
            p = self.masters[i] if self.masters else x
            adam_update(p, g32, self.m[i], self.v[i], self.t, self.cfg)
            if self.masters:
                x.copy_(p)  # cast the updated master back into the model's precision


class Strategy:
    name = "base"
    OPTIONS: dict = {}  # option name -> default; the only options the class accepts
    # DDP and ZeRO-1/2 reduce gradients in the parameter's own dtype; a recipe with another
    # grad dtype (fp32 grads for bf16 params) is Megatron's distributed optimizer's.
    GRADS_IN_PARAM_DTYPE = False

    def __init__(self, model: nn.Module, dist: DistState, recipe: Recipe | str, adam: AdamConfig | None = None,
                 **options):
        unknown = sorted(set(options) - set(self.OPTIONS))
        if unknown:
            raise ValueError(f"{self.name} does not take option(s) {unknown}; it takes "
                             f"{sorted(self.OPTIONS) or 'none'}")
        self.options = {**self.OPTIONS, **options}
        self.model, self.dist, self.recipe = model, dist, get_recipe(recipe)
        self.adam = adam if adam is not None else AdamConfig()
        self.param_dtype = torch_dtype(self.recipe.param)
        self.grad_dtype = torch_dtype(self.recipe.grad)
        if self.GRADS_IN_PARAM_DTYPE and self.grad_dtype != self.param_dtype:
            raise ValueError(f"{self.name} reduces gradients in the parameter's dtype; recipe "
                             f"{self.recipe.name} wants {self.recipe.grad} grads for {self.recipe.param} "
                             "params (fp32 grads are megatron_distopt's recipe)")
        self.units: list = []  # sharded strategies: one entry per unit, in unit order

    @property
    def ledger(self) -> Ledger:
        return self.dist.ledger

    @property
    def comm(self) -> Comm:
        return self.dist.comm

    def unit_modules(self) -> list[nn.Module]:
        """The modules communicated as one unit (one FSDP unit / ZeRO bucket each)."""
        return model_units(self.model)

    def tag(self, where: str, payload: str, *detail: str) -> str:
        """A collective's tag, in the package's one format (`zeroedu.runtime.comm.tag`)."""
        return tag(self.name, where, payload, *detail)

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # Mean over the local batch; equal local batches make the mean of rank means the global mean.
        return torch.nn.functional.mse_loss(out.float(), y)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> float:
        with self.ledger.saving_activations():
            out = self.model(x.to(self.dist.device, self.param_dtype))
            loss = self.loss(out, y.to(self.dist.device))
            self.ledger.event(L.FORWARD_END)
            self.ledger.mark(L.BACKWARD_BEGIN)
            loss.backward()
        self.ledger.mark(L.BACKWARD_END)
        return loss.item()

    def step(self) -> None:
        raise NotImplementedError

    def full_parameters(self) -> list[torch.Tensor]:
        raise NotImplementedError

    def report_extra(self) -> dict | list | None:
        """Strategy-specific plain data for the report (buckets, index spaces); None: nothing."""
        return None

    # ---------------------------------------------------------------- checkpoints (generic)
    # One mechanism for every strategy, built only from what strategies already hold: the
    # tensors that store parameter values (`param_holders`) and the optimizer's targets, which
    # are views into those holders. Where a target sits inside its holder follows from the
    # storage offsets, so no strategy has to describe its optimizer layout twice.
    # A piece is (param index, start, end, local start): elements [start, end) of parameter
    # `index` flattened (model.parameters() order) sit at [local start, local start + end - start)
    # of the holder or target flattened (its *local* index space). Padding is in no piece.

    def param_holders(self) -> list[tuple[torch.Tensor, list[tuple[int, int, int, int]]]]:
        """Every tensor that stores parameter values on this rank, with the pieces it holds:
        each unit's own `param_pieces()`, parameter indices shifted to model order; without
        units (replicated layout), the model's parameters, whole."""
        if not self.units:
            return [(p, [(i, 0, p.numel(), 0)]) for i, p in enumerate(self.model.parameters())]
        out, base = [], 0
        for u in self.units:
            for t, pieces in u.param_pieces():
                out.append((t, [(base + i, s, e, ls) for i, s, e, ls in pieces]))
            base += u.num_params
        return out

    def describe_units(self) -> list[dict]:
        """Plain description of each unit's layout (for checkpoint files and notebooks)."""
        return [u.describe() for u in self.units]

    def target_pieces(self) -> list[list[tuple[int, int, int, int]]]:
        """For each optimizer target (`self.optim.targets`), the parameter pieces it covers:
        the holder's pieces re-expressed in the target's local index space."""
        holders = self.param_holders()
        out = []
        for t in self.optim.targets:
            if t.numel() == 0:
                out.append([])
                continue
            for h, pieces in holders:
                if (h.numel() and h.dtype == t.dtype
                        and h.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()):
                    off = t.storage_offset() - h.storage_offset()
                    if 0 <= off and off + t.numel() <= h.numel():
                        break
            else:
                raise TypeError(f"{self.name}: an optimizer target is not a view of any parameter holder")
            mine = []
            for i, ps, pe, ls in pieces:  # intersect [ls, ls+len) with the target's [off, off+numel)
                s, e = max(ls, off), min(ls + pe - ps, off + t.numel())
                if e > s:
                    mine.append((i, ps + s - ls, ps + e - ls, s - off))
            out.append(mine)
        return out

    @torch.no_grad()
    def load_full_state(self, params: list[torch.Tensor], m: list[torch.Tensor],
                        v: list[torch.Tensor], step: int) -> None:
        """Take this rank's shards of full fp32 parameters and Adam m/v (model.parameters()
        order) after `step` optimizer steps: how a checkpoint is resharded into any strategy.
        Call right after construction, on every rank; no communication is needed because
        every rank is handed the full tensors."""
        def copy(dst, src, pieces):
            flat = dst.view(-1)
            for i, ps, pe, ls in pieces:
                flat[ls:ls + pe - ps].copy_(src[i].reshape(-1)[ps:pe])

        for h, pieces in self.param_holders():
            copy(h, params, pieces)
        opt = self.optim
        for k, (t, pieces) in enumerate(zip(opt.targets, self.target_pieces())):
            copy(opt.masters[k] if opt.masters else t, params, pieces)
            copy(opt.m[k], m, pieces)
            copy(opt.v[k], v, pieces)
        opt.t = int(step)
