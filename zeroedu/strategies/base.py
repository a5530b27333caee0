"""What every strategy shares: the distributed state it is handed, the training-step skeleton,
and Adam state allocated up front and registered with the ledger.

A strategy owns the model's parameters on this rank and implements

    forward_backward(x, y) -> local loss   (one micro-batch; hooks inside launch communication)
    finish_grad_sync()                     (the step's gradient reductions, completed)
    grads_for_optimizer() -> [Tensor]      (the reduced gradients, one per optimizer target)
    after_update()                         (re-gather the updated parameters, zero gradients)
    full_parameters() -> list[Tensor]      (fp32, unsharded; a collective for sharded strategies)

and inherits `step()`, written once here from the three hooks in the middle (finish the sync,
record the model states, Adam, after_update, the step's end). It never prints, times or
plots: it tells the ledger what each tensor is and marks lifecycle points, and all traffic goes
through `dist.comm`.

Construction is the same for every strategy: ``Strategy(model, dist, recipe, adam=None, *,
units=None, loss=None, clip_grad_norm=None, **options)``. `units` is the unit policy (the
modules gathered or bucketed together; default: the model's `units()`, else its top-level
children that own parameters), `loss` the loss (default: the model's `loss(out, y)`). Each class
lists the options it takes with their defaults in `OPTIONS`; anything else is a ValueError
before any tensor moves. Sharded strategies keep their units in `self.units` (flat buffers, FSDP
units), and every unit type says which parameter elements it holds through one method,
`param_pieces()`; checkpoints are built from that alone.

Gradient accumulation: K calls of `forward_backward` before one `step()`. Gradients are SUMs
over ranks and micro-batches; the optimizer takes them times 1/(ranks · K) in fp32
(`grad_scale`), which equals one big batch because every micro-batch has the same size.
Inside `no_sync()` a strategy that *can* postpone its gradient communication to the last
micro-batch does (DDP, ZeRO-1, Megatron, the hybrids' outer axis); ZeRO-2 and ZeRO-3 cannot,
their full gradients do not outlive a backward, so they reduce every micro-batch and accumulate
the reduced shards.

Gradient clipping (`clip_grad_norm=C`): the norm of the whole mean gradient from each rank's
shards, sum of squares per rank, one all-reduce over the axes whose shards are disjoint
(`norm_axes`; replicas are not counted twice), then every shard times min(1, C/(norm + 1e-6)):
what `torch.nn.utils.clip_grad_norm_` does on one process.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

from ..models import buffers_changed, check_trainable, check_units, persistent_buffers
from ..models import units as model_units
from ..kinds import WORLD, EventKind, Mesh
from ..optim import ADAM_CHUNK, AdamConfig, adam_update, grad_goes_through_scratch, scratch_elements
from ..recipes import Recipe, get_recipe, torch_dtype
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
    # The run's mesh and this rank's axis on each of its axes, by name (a model axis such as tp
    # is read from here by the split that uses it); empty for a state built by hand.
    mesh: Mesh | None = None
    axes: dict[str, Axis] = field(default_factory=dict)
    # With expert parallelism: the group the experts' gradients are reduced and sharded over
    # (dp_shard: the ranks that hold the same experts), while `inner` spans dp_shard x ep.
    expert: Axis | None = None
    # Model axes whose ranks hold disjoint parameters (pp's stages): the gradient norm sums over
    # them too (`Strategy.clip_coefficient`).
    disjoint: list[Axis] = field(default_factory=list)

    @classmethod
    def single(cls, ledger: Ledger | None = None, device: str = "cpu") -> "DistState":
        """A world of one rank in this process. A group of one never calls torch.distributed
        (`Comm` returns at once), so a strategy runs here without a process group."""
        ledger = ledger if ledger is not None else Ledger(0)
        return cls(0, 1, device, Axis("dp_shard", None, 1, 0, (0,)), Comm(ledger), ledger)

    @property
    def world(self) -> Axis:
        """Every rank: the group of a hybrid's one all-reduce over both mesh axes."""
        if self.outer is None:
            return self.inner
        return Axis(WORLD, None, self.world_size, self.rank, tuple(range(self.world_size)))


class AdamState:
    """fp32 Adam state for a list of target tensors (whole parameters or flat shards).

    Allocates, per target, what the recipe lists: an fp32 master copy (unless the target is
    already fp32 and *is* the master), an fp32 main-grad copy (Megatron's fp16 recipe), m and v.
    Everything is allocated now, not at the first step, so the ledger sees the optimizer's real
    footprint at the first optimizer step.
    """

    def __init__(self, targets: list[torch.Tensor], recipe: Recipe, cfg: AdamConfig, ledger: Ledger):
        self.targets, self.recipe, self.cfg, self.t, self.ledger = targets, recipe, cfg, 0, ledger
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
    def step(self, grads: list[torch.Tensor], scale: float = 1.0, scratch: bool = False) -> None:
        """Update every target from its gradient times `scale` (e.g. 1/N after a SUM).
        `scratch`: the caller discards `grads` after the step, so an fp32 gradient is scaled in
        place (as torch's DDP divides its bucket in place) instead of through the scratch buffer.

        The update's temporaries are one fp32 buffer, allocated here and charged to
        "optimizer_temp" while it lives (`optim.scratch_elements`: a chunk for the denominator,
        a second for gradients read as fp32), marked with an `UPDATE` event so the peak sees it."""
        self.t += 1
        plan = []
        for i, (x, g) in enumerate(zip(self.targets, grads)):
            if self.main_grads:
                g, s = self.main_grads[i].copy_(g), scale
                if s != 1.0:
                    g.mul_(s)  # fp32 main grad: scaled in place
                s = 1.0
            elif scratch and g.dtype == torch.float32 and scale != 1.0:
                g, s = g.mul_(scale), 1.0
            else:
                s = scale
            plan.append((x, g, s))
        copied = any(grad_goes_through_scratch(g, s) for _, g, s in plan)
        buf = torch.empty(scratch_elements([x.numel() for x in self.targets], copied), dtype=torch.float32,
                          device=self.targets[0].device if self.targets else "cpu")
        self.ledger.track(buf, "optimizer_temp")
        self.ledger.event(EventKind.UPDATE)
        for i, (x, g, s) in enumerate(plan):
            p = self.masters[i] if self.masters else x
            adam_update(p, g, self.m[i], self.v[i], self.t, self.cfg, scale=s, scratch=buf)
            if self.masters:
                x.copy_(p)  # cast the updated master back into the model's precision
        del buf  # the ledger drops it through its weak reference


class Strategy:
    name = "base"
    OPTIONS: dict = {}  # option name -> default; the only options the class accepts
    # DDP and ZeRO-1/2 reduce gradients in the parameter's own dtype; a recipe with another
    # grad dtype (fp32 grads for bf16 params) is Megatron's distributed optimizer's.
    GRADS_IN_PARAM_DTYPE = False
    # Frozen parameters (requires_grad=False) kept out of gradients, optimizer and reductions,
    # as torch's DDP does; a strategy that cannot is refused such a model (`check_trainable`).
    TRAINS_FROZEN = False

    @classmethod
    def check_options(cls, options: dict) -> None:
        """Refuse a combination of options the strategy cannot run (ValueError); `options` holds
        every option, defaults filled in. Called when a configuration is resolved and again by
        the constructor."""

    def __init__(self, model: nn.Module, dist: DistState, recipe: Recipe | str, adam: AdamConfig | None = None,
                 *, units: list[nn.Module] | None = None, loss=None, clip_grad_norm: float | None = None,
                 **options):
        unknown = sorted(set(options) - set(self.OPTIONS))
        if unknown:
            raise ValueError(f"{self.name} does not take option(s) {unknown}; it takes "
                             f"{sorted(self.OPTIONS) or 'none'}")
        self.options = {**self.OPTIONS, **options}
        self.check_options(self.options)
        check_trainable(model, self.TRAINS_FROZEN)  # frozen parameters, running statistics: named
        # Indices (model.parameters() order) of the frozen parameters, read before a sharded
        # strategy takes the parameters out of the modules: no optimizer target covers them.
        self.frozen = tuple(i for i, q in enumerate(model.parameters()) if not q.requires_grad)
        self.model, self.dist, self.recipe = model, dist, get_recipe(recipe)
        self._buffers_checked = False
        self.adam = adam if adam is not None else AdamConfig()
        self.param_dtype = torch_dtype(self.recipe.param)
        self.grad_dtype = torch_dtype(self.recipe.grad)
        if self.GRADS_IN_PARAM_DTYPE and self.grad_dtype != self.param_dtype:
            raise ValueError(f"{self.name} reduces gradients in the parameter's dtype; recipe "
                             f"{self.recipe.name} wants {self.recipe.grad} grads for {self.recipe.param} "
                             "params (fp32 grads are megatron_distopt's recipe)")
        self.loss_fn = loss if loss is not None else getattr(model, "loss", None)
        if not callable(self.loss_fn):
            raise ValueError("no loss: pass loss=(out, y) -> scalar, or give the model a loss(out, y) method")
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise ValueError(f"clip_grad_norm must be > 0 or None, got {clip_grad_norm!r}")
        self.clip_grad_norm = clip_grad_norm
        self._unit_policy = units
        self.units: list = []  # sharded strategies: one entry per unit, in unit order
        self.micro_batches = 0  # backward passes accumulated since the last optimizer step
        self.require_sync = True  # False inside no_sync()

    @property
    def ledger(self) -> Ledger:
        return self.dist.ledger

    @property
    def comm(self) -> Comm:
        return self.dist.comm

    def unit_modules(self) -> list[nn.Module]:
        """The modules communicated as one unit (one FSDP unit / ZeRO bucket each), checked:
        every parameter in exactly one unit (a parameter shared by two units, such as tied
        embeddings in different units, is refused with a ValueError)."""
        policy = self._unit_policy if self._unit_policy is not None else model_units(self.model)
        return check_units(self.model, list(policy))

    def axis_of(self, module: nn.Module) -> Axis:
        """The group a unit's gradients are reduced (and its states sharded) over: `dist.inner`,
        or for a layer's experts under expert parallelism (`models.moe.Experts`) `dist.expert`,
        the ranks that hold the same experts."""
        if getattr(module, "expert_parallel", False) and self.dist.expert is not None:
            return self.dist.expert
        return self.dist.inner

    def tag(self, where: str, payload: str, *detail: str) -> str:
        """A collective's tag, in the package's one format (`zeroedu.runtime.comm.tag`)."""
        return tag(self.name, where, payload, *detail)

    # ---------------------------------------------------------------- one micro-batch
    @contextmanager
    def no_sync(self):
        """Backward passes inside accumulate locally where the strategy can postpone its
        gradient communication to the last micro-batch (see the module docstring)."""
        old, self.require_sync = self.require_sync, False
        try:
            yield
        finally:
            self.require_sync = old

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> float:
        self.before_micro_batch()
        # Float inputs compute in the recipe's parameter dtype; token ids stay integers.
        x = x.to(self.dist.device, self.param_dtype) if x.is_floating_point() else x.to(self.dist.device)
        # The first forward is watched for buffers it changes (a module keeping its own state,
        # which `check_trainable` cannot see by type): each rank would change it from its own batch.
        before = None if self._buffers_checked else {n: b.clone() for n, b in self.model.named_buffers()}
        with self.ledger.saving_activations():
            out = self.model(x)
            if before is not None:
                self._buffers_checked = True
                changed = buffers_changed(before, self.model)
                if changed:
                    raise ValueError(f"forward changed the model's buffers {changed[:6]}: each rank would "
                                     "change them from its own batch, so ranks would disagree; buffers "
                                     "that training updates are not supported")
            loss = self.loss_fn(out, y.to(self.dist.device))
            # The graph keeps what backward needs (log-softmax saves its own output); holding the
            # logits too would add a batch × vocabulary tensor to the peak that no tracker counts.
            del out
            self.ledger.event(EventKind.FORWARD_END)
            self.ledger.mark(EventKind.BACKWARD_BEGIN)
            loss.backward()
        self.ledger.mark(EventKind.BACKWARD_END)
        # and what is held then: backward has freed the activations, so a timeline drawn from the
        # events shows them gone before the gradients' collectives that follow, as they are
        self.ledger.event(EventKind.BACKWARD_END)
        self.micro_batches += 1
        self.after_backward()
        return loss.item()

    # ---------------------------------------------------------------- a pipeline stage's halves
    # A pipeline runs a micro-batch's forward and its backward at different times, with other
    # micro-batches' between (`strategies.pipeline`): the same lifecycle as `forward_backward`,
    # cut in two. The model's hooks (unshard, gradient ready) fire as they do there.
    def forward_only(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's model on `x` (and its loss against `y`, if given), autograd saving what
        backward needs (counted as activations); the backward comes later (`backward_only`)."""
        x = x.to(self.dist.device, self.param_dtype) if x.is_floating_point() else x.to(self.dist.device)
        with self.ledger.saving_activations():
            out = self.model(x)
            if y is not None:
                out = self.loss_fn(out, y.to(self.dist.device))  # the graph keeps what backward needs
        self.ledger.event(EventKind.FORWARD_END)
        return out

    def backward_only(self, out: torch.Tensor, grad: torch.Tensor | None = None, *, sync: bool = True) -> None:
        """Backward from `out` (a loss, or an output with its gradient `grad`), gradients
        accumulated as one micro-batch's; `sync=False`: inside `no_sync()` (not the step's last)."""
        self.before_micro_batch()
        with self.no_sync() if not sync else nullcontext():
            self.ledger.mark(EventKind.BACKWARD_BEGIN)
            out.backward(grad)
            self.ledger.mark(EventKind.BACKWARD_END)
            self.ledger.event(EventKind.BACKWARD_END)  # what is held once backward freed its activations
            self.micro_batches += 1
            self.after_backward()

    def before_micro_batch(self) -> None:
        """Finish what the previous micro-batch left in flight (strategies that need to)."""

    def after_backward(self) -> None:
        """Reduce what backward's hooks did not (strategies that need to)."""

    # ---------------------------------------------------------------- the update
    def data_parallel_size(self) -> int:
        """Ranks whose gradients are summed into each one: N (N·M for the hybrids)."""
        return self.dist.inner.size

    def grad_scale(self) -> float:
        # Collectives SUM (gloo has no AVG or PREMUL_SUM); the mean over ranks and micro-batches
        # is taken here, in fp32 inside the optimizer: dividing low-precision grads first rounds twice.
        # A step with no backward at all updates from zero gradients, as torch.optim does.
        return 1.0 / (self.data_parallel_size() * max(self.micro_batches, 1))

    def norm_axes(self) -> list[Axis]:
        """The axes across which this rank's gradient shards are disjoint (DDP: none)."""
        return [self.dist.inner]

    @torch.no_grad()
    def clip_coefficient(self, grads: list[torch.Tensor], scale: float) -> float:
        """min(1, C / (‖mean gradient‖ + 1e-6)) from this rank's shards: squares summed here,
        then one all-reduce of one fp32 number over `norm_axes()`."""
        sq = torch.zeros(1, dtype=torch.float32, device=self.dist.device)
        # Chunk by chunk through one fp32 buffer, charged like the update's scratch and never
        # larger (`optim.scratch_elements`), instead of three temporaries the size of each shard.
        largest = max((g.numel() for g in grads), default=0)
        buf = self.ledger.track(torch.empty(min(largest, ADAM_CHUNK), dtype=torch.float32, device=self.dist.device),
                                "optimizer_temp")
        for g in grads:
            flat = g.reshape(-1)
            for start in range(0, flat.numel(), ADAM_CHUNK):
                c = buf[:min(ADAM_CHUNK, flat.numel() - start)].copy_(flat[start:start + ADAM_CHUNK]).mul_(scale)
                sq += torch.dot(c, c)
        del buf
        for axis in self.norm_axes() + self.dist.disjoint:
            self.comm.all_reduce(sq, axis, self.tag("norm", "grads"))
        norm = float(sq.sqrt())
        return min(1.0, self.clip_grad_norm / (norm + 1e-6))

    def update(self, grads: list[torch.Tensor], scratch: bool = False) -> None:
        """Adam on the optimizer's targets from their reduced gradients: mean over ranks and
        micro-batches, clipped if asked; then the next step starts counting micro-batches.
        `scratch`: `grads` are zeroed or freed after the step (`AdamState.step`)."""
        scale = self.grad_scale()
        if self.clip_grad_norm is not None:
            scale *= self.clip_coefficient(grads, scale)
        self.optim.step(grads, scale=scale, scratch=scratch)
        self.micro_batches = 0

    # ---------------------------------------------------------------- the optimizer step
    # Written once, here: every strategy's step is these four moves, and a strategy fills in
    # the hooks. `SCALES_GRADS_IN_PLACE`: the strategy discards its fp32 gradients after the
    # update, so Adam scales them in place (`AdamState.step`; the catalog's
    # `scales_grads_in_place` says the same for the closed form of the update's bytes).
    SCALES_GRADS_IN_PLACE = False

    def step(self) -> None:
        """One optimizer step after the step's last micro-batch, the same for every strategy:
        finish the gradient reduction (`finish_grad_sync`), record the model states (what the
        closed forms predict, all alive now), Adam on `grads_for_optimizer()` (mean over ranks and
        micro-batches, clipped if asked), `after_update` (re-gather parameters, zero gradients),
        and the step's end. With no micro-batch at all it reduces and steps on zero gradients,
        as torch.optim does."""
        self.finish_grad_sync()
        self.ledger.record_model_states()
        with torch.no_grad():
            self.update(self.grads_for_optimizer(), scratch=self.SCALES_GRADS_IN_PLACE)
            self.after_update()
        self.ledger.event(EventKind.STEP_END)

    def finish_grad_sync(self) -> None:
        """Complete every gradient reduction of the step (launch what is left, wait)."""
        raise NotImplementedError

    def grads_for_optimizer(self) -> list[torch.Tensor]:
        """The reduced gradients, one per optimizer target, in `AdamState`'s order."""
        raise NotImplementedError

    def after_update(self) -> None:
        """After Adam, inside no_grad: bring the updated parameters back where forward reads them
        and clear what the next step must not see. Nothing by default."""

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
                        v: list[torch.Tensor], step: int, buffers: dict | None = None) -> None:
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
        if buffers:  # the model's persistent buffers, by name, each rank a whole copy
            mine = persistent_buffers(self.model)
            unknown = sorted(set(buffers) - set(mine))
            if unknown:
                raise ValueError(f"the checkpoint holds buffers this model does not have: {unknown[:6]}")
            for name, b in buffers.items():
                if tuple(b.shape) != tuple(mine[name].shape):
                    raise ValueError(f"buffer {name!r} is {tuple(b.shape)} in the checkpoint, "
                                     f"{tuple(mine[name].shape)} in the model")
                mine[name].copy_(b)
