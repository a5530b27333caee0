"""The FSDP unit lifecycle, shared by FSDP1 (flat units) and FSDP2 (per-parameter dim-0 shards).

A *unit* is a module whose parameters are gathered and freed together (`zeroedu.models.units`:
for the GPT the embeddings, each block and the final LayerNorm with the head, as `fully_shard`
is applied per block; for the MLP each Linear layer). Between uses a rank keeps only its shard of the unit's
parameters; around each use the unit goes through (FSDP paper, Zhao et al. 2023, §3.2):

    pre_forward    unshard: all-gather the full parameters; bind the module's weights to them
                   (forward_prefetch: also start the next unit's all-gather, async)
    post_forward   reshard: free the full parameters again (reshard_after_forward=True), and
                   hang a hook on the unit's output so backward can find the unit
    pre_backward   unshard again (the output's gradient has arrived, the unit's backward is next)
                   (backward_prefetch: also start the previous unit's all-gather, async, so it
                   runs while this unit computes and reduce-scatters)
    post_backward  reduce-scatter the full gradient (SUM, in the recipe's grad dtype) into this
                   rank's grad shard; free the full gradient and reshard

Time (`theory.schedule.fsdp`): a unit's all-gather is waited for before its compute; with
prefetch the next unit's all-gather is issued as this one starts computing and rides beside it;
each unit's reduce-scatter is issued after its backward; all of them share the axis's link in
issue order; the optimizer waits for every reduce-scatter.

The root unit reshards after forward too, although backward gathers it again at once: the
closed forms (`theory.exact_comm`) count two all-gathers per unit and so do we. Real FSDP keeps
the root's parameters (FSDP2 sets reshard_after_forward=False for the root's own group).
`reshard_after_forward=False` keeps every unit gathered from forward to backward: one
all-gather per unit less (2Ψ instead of 3Ψ), all full parameters alive at the forward/backward
boundary (ZeRO-2's memory for parameters).

Gradient accumulation: every micro-batch goes through the whole lifecycle (all-gathers and a
reduce-scatter per unit: K times the bytes per optimizer step); from the second micro-batch on
the reduced chunks are added to the grad shards instead of overwriting them.

Activation recompute (`zeroedu.models.recompute`) re-runs a unit's forward inside its own
backward, after pre_backward has gathered its parameters again: the re-run needs no extra
all-gather (with reshard_after_forward=True the backward all-gather is already in the 3Ψ).

`limit_all_gathers=k` caps how many units may be unsharded (all-gather issued and not yet
freed) at once; a prefetch that would exceed it is skipped and that unit gathers when it is
needed. It bounds the "+ prefetched unit" on top of the current one (FSDP1's rate limiter).

Subclasses say how a unit stores its parameters (`Unit`: `_all_gather`, `_copy_out`,
`_reduce_scatter`, `_views`, `param_pieces`): FSDP1 gathers straight into its flat parameter;
FSDP2 batched gathers into one buffer per unit and copies out to the parameters once the
all-gather has finished (`wait_unshard`), so the parameters get their bytes only then, as in
torch's `foreach_all_gather_copy_out` and how to shard the strategy (`FSDPStrategy.make_unit`,
`shard_axis`, `pad_multiple`). Hybrid strategies override `post_backward` (it returns the
reduced grad shards, ready to be all-reduced or reduce-scattered over dp_outer) and
`build_optimizer` / `data_parallel_size`.
"""
from __future__ import annotations

import enum

import torch

from ..kinds import EventKind as Ev
from ..runtime.comm import UnitName
from .base import AdamState, Strategy


def _grad_tensors(xs) -> list[torch.Tensor]:
    """The tensors among a module's inputs or outputs that autograd will send a gradient to."""
    return [t for t in (xs if isinstance(xs, (tuple, list)) else (xs,))
            if isinstance(t, torch.Tensor) and t.requires_grad]


class UnitState(enum.Enum):
    """Where a unit is in its lifecycle."""

    SHARDED = "sharded"  # only this rank's shard has storage
    UNSHARDING = "unsharding"  # all-gather issued, not yet waited for
    UNSHARDED = "unsharded"  # full parameters present


SHARDED, UNSHARDING, UNSHARDED = UnitState.SHARDED, UnitState.UNSHARDING, UnitState.UNSHARDED


class Unit:
    """One FSDP unit on one rank. Subclasses fill `leaves` (the unsharded tensors autograd sees,
    one or more, each a leaf with requires_grad), `shards` (this rank's parameter shards, what
    the optimizer updates) and `grad_shards` (same shapes, grad dtype)."""

    def __init__(self, index, module, axis, comm, ledger, param_dtype, grad_dtype, tag):
        self.index, self.module, self.axis = index, module, axis
        self.name = UnitName(index)
        self.comm, self.ledger = comm, ledger
        self.tag = tag  # the strategy's tag builder: tag(where, payload, *detail)
        self.param_dtype, self.grad_dtype = param_dtype, grad_dtype
        self.params = list(module.named_parameters())  # original (fp32) parameters, for sharding
        # Which parameters train: a frozen one (requires_grad=False) is gathered like any other
        # (forward needs it) but has no gradient, grad shard, optimizer state or reduction, as in
        # `fully_shard`. Only units that can shard such a parameter on its own accept one
        # (`FSDPStrategy.TRAINS_FROZEN`); a flat unit of mixed flags is refused before this.
        self.trainable = [p.requires_grad for _, p in self.params]
        self.device = self.params[0][1].device
        # Where each parameter lives in the module tree, so pre_forward can rebind it.
        self.slots = []
        for name, _ in self.params:
            owner, _, attr = name.rpartition(".")
            self.slots.append((module.get_submodule(owner) if owner else module, attr))
        self.state, self.handles, self.ready = SHARDED, [], 0
        self.in_backward = True  # False once a forward showed backward will not reach the unit
        self.leaves: list[torch.Tensor] = []
        self.shards: list[torch.Tensor] = []
        self.grad_shards: list[torch.Tensor] = []

    def _detach_module_params(self):
        """Take the original parameters out of the module: from now on it only sees views of
        the unsharded leaves, bound in pre_forward. Dropping them frees the full fp32 copies."""
        for mod, attr in self.slots:
            del mod._parameters[attr]
            setattr(mod, attr, None)
        self.params = [(n, None) for n, _ in self.params]

    def _new_leaf(self, shape, requires_grad: bool = True) -> torch.Tensor:
        """An unsharded buffer with no storage yet; unshard gives it bytes, reshard takes them."""
        leaf = torch.empty(shape, dtype=self.param_dtype, device=self.device, requires_grad=requires_grad)
        leaf.untyped_storage().resize_(0)
        self.ledger.track(leaf, "gathered")
        return leaf

    @property
    def num_params(self) -> int:
        return len(self.params)

    @property
    def train_leaves(self) -> list[torch.Tensor]:
        """The unsharded leaves that get gradients (all of them unless some parameter is frozen)."""
        return [leaf for leaf in self.leaves if leaf.requires_grad]

    @property
    def train_shards(self) -> list[torch.Tensor]:
        """The parameter shards the optimizer updates, one per grad shard, in the same order."""
        if len(self.shards) != len(self.trainable):  # one flat shard for the whole unit
            return self.shards
        return [sh for sh, t in zip(self.shards, self.trainable) if t]

    # ---------------------------------------------------------------- subclass hooks
    def param_pieces(self) -> list:
        """(tensor, pieces) for every tensor holding this rank's parameter values (see
        `Strategy.param_holders`)."""
        raise NotImplementedError

    def describe(self) -> dict:
        raise NotImplementedError

    def _all_gather(self) -> list:
        """Start the all-gather(s); return their handles. A unit that gathers straight into its
        leaves gives them their bytes first (`_alloc_leaves`); one that gathers into a buffer
        of its own gives them bytes in `_copy_out`."""
        raise NotImplementedError

    def _copy_out(self) -> None:
        """After the all-gather(s) finished: move what arrived into the leaves (batched units;
        a no-op for units that gather into the leaves directly)."""

    def _reduce_scatter(self, full_grads: list[torch.Tensor], accumulate: bool) -> None:
        """SUM-reduce-scatter the full gradients (grad dtype) into `grad_shards`, or, with
        `accumulate` (a later micro-batch of the step), add the reduced chunks to them."""
        raise NotImplementedError

    def _views(self) -> list[torch.Tensor]:
        """The module's parameters as autograd views of the leaves (original shapes)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- lifecycle
    def _alloc_leaves(self) -> None:
        """Give every unsharded leaf its bytes back (reshard took them)."""
        for leaf in self.leaves:
            leaf.untyped_storage().resize_(leaf.numel() * leaf.element_size())

    def unshard(self, async_op: bool = False) -> None:
        if self.state == SHARDED:
            self.handles = self._all_gather()
            self.state = UNSHARDING
            self.ledger.event(Ev.UNSHARD, self.index)
        if not async_op:
            self.wait_unshard()

    def wait_unshard(self) -> None:
        for h in self.handles:
            h.wait()
        self.handles = []
        if self.state == UNSHARDING:
            self._copy_out()
            self.state = UNSHARDED

    def reshard(self) -> None:
        if self.state == SHARDED:
            return
        self.wait_unshard()
        # Autograd still holds the weight views Linear saved for backward, and they share this
        # storage: dropping our own reference would free nothing. Resizing the storage to 0
        # bytes really releases the memory while every tensor object stays valid; pre_backward
        # resizes it back and all-gathers into it before autograd reads those saved views.
        for leaf in self.leaves:
            leaf.untyped_storage().resize_(0)
        self.state = SHARDED
        self.ledger.event(Ev.RESHARD, self.index)

    def bind(self) -> None:
        """Point the module's parameter attributes at fresh views of the unsharded leaves.
        Made under grad mode, so autograd routes each weight's gradient into its leaf."""
        for (mod, attr), view in zip(self.slots, self._views()):
            setattr(mod, attr, view)

    def reduce_grads(self, accumulate: bool = False) -> list[torch.Tensor]:
        if not self.grad_shards:  # every parameter frozen: nothing to reduce
            return self.grad_shards
        full = []
        for leaf in self.train_leaves:
            # Reduce in the recipe's grad dtype (e.g. fp32 grads for megatron-bf16).
            full.append(self.ledger.track(leaf.grad if leaf.grad.dtype == self.grad_dtype
                                          else leaf.grad.to(self.grad_dtype), "comm_buffer"))
            leaf.grad = None  # `full` holds the only reference now: the grads go when it does
        # The unit's full gradients are all alive: its largest moment in backward.
        self.ledger.event(Ev.POST_BACKWARD, self.index)
        self._reduce_scatter(full, accumulate)
        return self.grad_shards

    def full_parameters(self) -> list[torch.Tensor]:
        """Gather this unit and copy its parameters out as fp32 (a collective)."""
        with torch.no_grad():
            self.unshard()
            out = [v.detach().float().cpu().clone() for v in self._views()]
            self.reshard()
        return out


class FSDPStrategy(Strategy):
    """Hooks that drive `Unit`s through the lifecycle, and the sharded optimizer step."""

    name = "fsdp"
    OPTIONS = {"reshard_after_forward": True, "forward_prefetch": False,
               "backward_prefetch": True, "limit_all_gathers": None}

    def __init__(self, model, dist, recipe, adam=None, **options):
        super().__init__(model, dist, recipe, adam, **options)
        o = self.options
        self.reshard_after_forward = bool(o["reshard_after_forward"])
        self.forward_prefetch, self.backward_prefetch = bool(o["forward_prefetch"]), bool(o["backward_prefetch"])
        self.limit_all_gathers = o["limit_all_gathers"]
        if self.limit_all_gathers is not None and int(self.limit_all_gathers) < 1:
            raise ValueError(f"limit_all_gathers must be >= 1 or None, got {self.limit_all_gathers}")
        self.axis = self.shard_axis()
        self.model.to(dist.device)
        self.units = [self.make_unit(i, m) for i, m in enumerate(self.unit_modules())]
        for u in self.units:
            u.module.register_forward_pre_hook(lambda _m, _a, u=u: self.pre_forward(u))
            u.module.register_forward_hook(lambda _m, args, out, u=u: self.post_forward(u, out, args))
            for leaf in u.train_leaves:
                leaf.register_post_accumulate_grad_hook(lambda _t, u=u: self._leaf_grad_ready(u))
        self.optim = self.build_optimizer()
        self._reduced: set[int] = set()  # units whose post_backward ran this micro-batch
        self._shards_hold_sum = False  # True once a micro-batch of this step has been reduced
        self.ledger.event(Ev.BUILT, note="sharded units")

    # ---------------------------------------------------------------- what subclasses choose
    def shard_axis(self):
        return self.dist.inner

    def pad_multiple(self) -> int:
        return self.shard_axis().size

    def make_unit(self, index, module) -> Unit:
        raise NotImplementedError

    def build_optimizer(self) -> AdamState:
        return AdamState([s for u in self.units for s in u.train_shards], self.recipe, self.adam, self.ledger)

    # ---------------------------------------------------------------- lifecycle hooks
    def _prefetch(self, j: int) -> None:
        if not 0 <= j < len(self.units) or self.units[j].state != SHARDED:
            return
        busy = sum(u.state != SHARDED for u in self.units)
        if self.limit_all_gathers is not None and busy >= int(self.limit_all_gathers):
            return  # over the limit: this unit will gather when it is needed
        self.units[j].unshard(async_op=True)

    def pre_forward(self, u: Unit):
        u.unshard()
        if self.forward_prefetch:
            self._prefetch(u.index + 1)  # module order is execution order for these models
        u.bind()

    def post_forward(self, u: Unit, out, args=()):
        outs = _grad_tensors(out)
        if torch.is_grad_enabled():
            # No output that requires grad (a frozen embedding of token ids): backward never
            # runs through this unit, so it is neither gathered for backward nor prefetched.
            u.in_backward = bool(outs)
        if outs and torch.is_grad_enabled():
            # Fires when the gradient of the unit's output is ready, i.e. right before the unit's
            # own backward runs: the moment to gather its parameters again.
            torch.autograd.graph.register_multi_grad_hook(outs, lambda _g, u=u: self.pre_backward(u),
                                                          mode="any")
            ins = _grad_tensors(args)
            if not u.train_leaves and ins:
                # A unit whose every parameter is frozen gets no gradient hook; its backward is
                # over when its inputs have their gradients: reshard then, not at the end.
                torch.autograd.graph.register_multi_grad_hook(ins, lambda _g, u=u: self._frozen_done(u),
                                                              mode="all")
        if self.reshard_after_forward:
            u.reshard()

    def pre_backward(self, u: Unit):
        u.unshard()
        if self.backward_prefetch and (u.index == 0 or self.units[u.index - 1].in_backward):
            # Issued now, before this unit's reduce-scatter: the previous unit's parameters
            # travel while this unit computes its gradients.
            self._prefetch(u.index - 1)

    def _frozen_done(self, u: Unit):
        self._reduced.add(u.index)
        self.post_backward(u)

    def _leaf_grad_ready(self, u: Unit):
        u.ready += 1
        if u.ready == len(u.train_leaves):  # every leaf of the unit has its full gradient
            u.ready = 0
            self._reduced.add(u.index)
            self.post_backward(u)

    def post_backward(self, u: Unit) -> list[torch.Tensor]:
        """Reduce-scatter the unit's gradients (SUM over the shard axis), reshard; return the
        grad shards (a hybrid subclass reduces them further over dp_outer)."""
        shards = u.reduce_grads(accumulate=self._shards_hold_sum)
        u.reshard()
        return shards

    def reduce_unused_units(self) -> None:
        """A unit that got no (or partial) gradient this micro-batch, e.g. frozen or unused, still
        joins its collectives, with zeros, in a fixed order on every rank: otherwise a peer
        that did get gradients would wait in a reduce-scatter nobody matches, and Adam would
        apply last step's grad shards again."""
        for u in reversed(self.units):
            if u.index not in self._reduced:
                for leaf in u.train_leaves:
                    if leaf.grad is None:
                        leaf.grad = torch.zeros(leaf.shape, dtype=leaf.dtype, device=leaf.device)
                u.ready = 0
                self.post_backward(u)
        self._reduced.clear()

    def after_backward(self) -> None:
        # Inner reductions run synchronously inside post_backward, every micro-batch (the full
        # gradient does not outlive it); units that got no gradient join with zeros now.
        self.reduce_unused_units()
        self._shards_hold_sum = True

    def finish_grad_sync(self) -> None:
        """Everything inner is reduced by the end of each backward; hybrids wait for their
        outer reductions here. A step with no backward at all reduces zeros for every unit
        (so no rank applies last step's shards again)."""
        if self.micro_batches == 0:
            self.reduce_unused_units()

    # ---------------------------------------------------------------- step
    def after_update(self):
        self._shards_hold_sum = False

    def grads_for_optimizer(self) -> list[torch.Tensor]:
        return [g for u in self.units for g in u.grad_shards]

    def full_parameters(self):
        return [p for u in self.units for p in u.full_parameters()]
