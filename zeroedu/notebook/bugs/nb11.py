"""Notebook 11 (dashboard): a ZeRO-1 with one plausible mistake.

`MysteryZeRO1` builds its Adam state (fp32 master, m, v) for every rank's chunk of every unit,
not only its own, and steps all of it. Training is unchanged: the chunks a rank does not own
get updated from unreduced local gradients, but the all-gather after the step overwrites them
with their owners' correct values, so the losses equal single-process training and the wire
carries ZeRO-1's bytes. The symptom is in the model states: the optimizer bytes are DDP's 12Ψ,
not ZeRO-1's 12Ψ/N, while parameters and gradients agree with the closed form.
"""
from __future__ import annotations

from ...strategies.base import AdamState
from ...strategies.zero1 import ZeRO1


class MysteryZeRO1(ZeRO1):
    """ZeRO-1 whose optimizer state covers the whole flat buffer of every unit."""

    def __init__(self, model, dist, recipe, adam=None, **options):
        super().__init__(model, dist, recipe, adam, **options)
        # "simpler": one optimizer over the full parameter buffers (the shard-sized one is dropped)
        self.optim = AdamState([u.param_buffer for u in self.units], self.recipe, self.adam, self.ledger)

    def grads_for_optimizer(self):
        return [u.grad_buffer for u in self.units]  # every chunk's gradient, for every chunk's state
