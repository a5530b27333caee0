"""Naive DDP: every rank a full replica; all-reduce each gradient after backward.

Algorithm (PyTorch DDP paper, Li et al. 2020, "Gradient Reduction: A Naive Solution"):
  1. forward and backward on this rank's micro-batch; gradients land in `p.grad`;
  2. after backward, all-reduce (SUM) every gradient over the N ranks;
  3. Adam on every parameter with the summed gradient times 1/N.
Gradient accumulation comes for free: K backward passes sum into `p.grad`, one all-reduce at
the step (times 1/(N·K)).
Every rank ends the step with identical parameters, because they start identical and apply
the same averaged gradient.

Memory per rank: 16Ψ with `mixed-bf16` (2 param + 2 grad + 12 fp32 master/m/v), nothing shared.
Communication per rank: one all-reduce of Ψ gradient elements, 2(N-1)/N · Ψ under the ring.

Frozen parameters (``requires_grad=False``) are handled as torch's DDP handles them: no
gradient, no optimizer state, no all-reduce, no update. With Ψ_t trainable of Ψ, a rank holds
2Ψ + 14Ψ_t (mixed-bf16) and sends 2(N-1)/N · 2Ψ_t.
Bucketing and overlap with backward come in `ddp_bucketed`; this version waits for backward to
finish, so none of its communication is hidden.
"""
from __future__ import annotations

import torch

from ..kinds import EventKind as Ev
from .base import AdamState, Strategy


class DDP(Strategy):
    name = "ddp"
    GRADS_IN_PARAM_DTYPE = True
    TRAINS_FROZEN = True

    def __init__(self, model, dist, recipe, adam=None, **options):
        super().__init__(model, dist, recipe, adam, **options)
        self.model.to(dist.device, self.param_dtype)
        self.all_params = list(self.model.parameters())
        self.params = [p for p in self.all_params if p.requires_grad]  # what is trained
        for p in self.all_params:
            self.ledger.track(p, "param")
        for p in self.params:
            # Keep one gradient buffer for the whole run: autograd accumulates into an existing
            # `.grad` in place, so the storage the ledger tracks is the one actually used.
            p.grad = self.ledger.track(torch.zeros_like(p, dtype=self.grad_dtype), "grad")
        # each parameter's group: dp_shard (x ep x cp), a layer's experts their own (`axis_of`)
        group = {} if dist.expert is None else {
            id(p): self.axis_of(m) for m in self.unit_modules() for p in m.parameters()}
        self.axes = [group.get(id(p), dist.inner) for p in self.params]
        self.optim = AdamState(self.params, self.recipe, self.adam, self.ledger)
        self.ledger.event(Ev.BUILT, note="replicas")

    def finish_grad_sync(self):
        # After the last micro-batch only: K backward passes have summed into p.grad.
        for i, (p, axis) in enumerate(zip(self.params, self.axes)):
            self.comm.all_reduce(p.grad, axis, self.tag(f"param{i}", "grads"))

    def grads_for_optimizer(self):
        return [p.grad for p in self.params]

    def after_update(self):
        for p in self.params:
            p.grad.zero_()

    def norm_axes(self):
        return []  # every rank holds the whole summed gradient: its norm needs no communication

    def full_parameters(self):
        return [p.detach().float().cpu().clone() for p in self.all_params]
