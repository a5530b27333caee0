"""What every strategy shares: the distributed state it is handed, the training-step skeleton,
and Adam state allocated up front and registered with the ledger.

A strategy owns the model's parameters on this rank and implements

    forward_backward(x, y) -> local loss   (hooks inside launch its communication)
    step()                                 (reduce what is left, update, re-gather)
    full_parameters() -> list[Tensor]      (fp32, unsharded; a collective for sharded strategies)

and never prints, times or plots: it tells the ledger what each tensor is and marks lifecycle
points, and all traffic goes through `dist.comm`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..comm import Axis, Comm
from ..ledger import Ledger
from ..optim import AdamConfig, adam_update
from ..recipes import Recipe, torch_dtype


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

    def __init__(self, model: nn.Module, dist: DistState, recipe: Recipe, adam: AdamConfig = AdamConfig()):
        self.model, self.dist, self.recipe, self.adam = model, dist, recipe, adam
        self.param_dtype = torch_dtype(recipe.param)
        self.grad_dtype = torch_dtype(recipe.grad)

    @property
    def ledger(self) -> Ledger:
        return self.dist.ledger

    @property
    def comm(self) -> Comm:
        return self.dist.comm

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # Mean over the local batch; equal local batches make the mean of rank means the global mean.
        return torch.nn.functional.mse_loss(out.float(), y)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> float:
        with self.ledger.saving_activations():
            out = self.model(x.to(self.dist.device, self.param_dtype))
            loss = self.loss(out, y.to(self.dist.device))
            self.ledger.event("forward end")
            self.ledger.mark("backward begin")
            loss.backward()
        self.ledger.mark("backward end")
        return loss.item()

    def step(self) -> None:
        raise NotImplementedError

    def full_parameters(self) -> list[torch.Tensor]:
        raise NotImplementedError

    # ---------------------------------------------------------------- checkpoints (generic)
    # One mechanism for every strategy, built only from what strategies already hold: the
    # tensors that store parameter values (`param_holders`) and the optimizer's targets, which
    # are views into those holders. Where a target sits inside its holder follows from the
    # storage offsets, so no strategy has to describe its optimizer layout twice.
    # A piece is (param index, start, end, local start): elements [start, end) of parameter
    # `index` flattened (model.parameters() order) sit at [local start, local start + end - start)
    # of the holder or target flattened (its *local* index space). Padding is in no piece.

    def param_holders(self) -> list[tuple[torch.Tensor, list[tuple[int, int, int, int]]]]:
        """Every tensor that stores parameter values on this rank, with the pieces it holds.
        Found from the unit structures the strategies keep (flat buffers, flat shards, dim-0
        shards); without units, the model's own parameters (replicated layout)."""
        from .. import shard

        units = getattr(self, "units", None)
        if units is None:
            return [(p, [(i, 0, p.numel(), 0)]) for i, p in enumerate(self.model.parameters())]
        out, base = [], 0
        for u in units:
            layout = getattr(u, "layout", None)
            if hasattr(u, "param_buffer") and layout is not None:  # whole padded flat buffer
                out.append((u.param_buffer, [(base + i, 0, k, layout.offsets[i])
                                             for i, k in enumerate(layout.numels)]))
                base += len(layout.numels)
            elif hasattr(u, "rows"):  # dim-0: one shard per parameter, rows [start, end)
                for j, (sh, rows, s) in enumerate(zip(u.shards, u.rows, u.shapes)):
                    rest = shard.numel(s[1:])
                    out.append((sh, [(base + j, rows.start * rest, rows.end * rest, 0)] if rows.size else []))
                base += len(u.shapes)
            elif layout is not None:  # flat shard: this rank's chunk `u.range` of the buffer
                pieces = []
                for i in range(len(layout.numels)):
                    b = layout.param_range(i).intersect(u.range)
                    if b.size:
                        pieces.append((base + i, b.start - layout.offsets[i], b.end - layout.offsets[i],
                                       b.start - u.range.start))
                out.append((u.shards[0], pieces))
                base += len(layout.numels)
            else:
                raise TypeError(f"{self.name}: cannot tell how unit {u!r} stores its parameters; "
                                "override param_holders()")
        return out

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
