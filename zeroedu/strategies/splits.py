"""How one model replica is split over the mesh's model axes: the one place the run's spine asks.

The data-parallel strategies shard whatever model they are given; a model axis (tensor parallel
today; pipeline, context and expert parallel are the next) changes the model first. Each model
axis is a `Split`, and a mesh without one has `WHOLE`, the replica kept whole, so the code that
builds, predicts and reports a run (`train.runner`, `train.launch`) asks `split_of(mesh)` and
never branches on an axis:

    check(cfg, spec, model)        the configuration this split can run, refused in the parent
    apply(model, dist, cfg)        this rank's part of the model, before the strategy wraps it
    unit_shapes(cfg, rank)         rank `rank`'s units' parameter shapes, for the closed forms
                                   (with the trainable mask, or None: every parameter trains)
    ops(cfg, elem, rank)           the axis's own collectives per step (`theory.comm.CommOp`)
    activation_bytes(cfg, elem, ln_stats, rank)   what the ledger reads at the last forward's end
    unit_groups(cfg, rank)         the units by the group their gradients are reduced over (default:
                                   one, the strategy's inner group; ep: the experts' own too)
    observe(run)                   what a closed form needs of the run itself (ep: the router's
                                   counts), read on the rank after training; None by default
    unsplit(names, per_rank)       one replica's full parameters from its ranks' parts
    inputs(cfg, dist, x, y)        this rank's part of one micro-batch (cp: its positions)
    forward_backward(run, micro)   one step's forwards and backwards (pp: its schedule); the
                                   step's mean loss, or None on a rank that computes none

Adding an axis: a module with the algorithm and a `Split` here, the axis's name in
`kinds.AXIS_ORDER`, its size in `kinds.Mesh.build` (`docs/architecture.md`).
"""
from __future__ import annotations

import functools
from contextlib import nullcontext
from typing import NamedTuple

from ..kinds import CP, DP_SHARD, EP, PP, TP, Mesh, RecomputeMode
from ..models import GPTConfig, MLPConfig
from ..models import unit_shapes as model_unit_shapes
from ..models import units as model_units
from ..theory import tensor_parallel as tp_theory


class UnitGroup(NamedTuple):
    """Units whose gradients are reduced (and states sharded) over one group: the closed forms
    take each group with its size and this rank's place in it."""
    shapes: list
    trainable: list | None
    n: int
    rank: int


def _built_shapes(spec, pp: int = 1, stage: int = 0) -> tuple[list, list | None]:
    """The unit shapes of the model `spec` builds, whole (pp = 1) or pipeline stage `stage`'s, and
    its trainable mask (None when every parameter trains). A preset's or a configuration's are
    the same every time and are built once per process (a plan reads thousands of ranks'); a
    custom model's functions can change, so it is built every time."""
    if isinstance(spec, (GPTConfig, MLPConfig)):
        shapes, mask = _built_shapes_kept(spec, pp, stage)
        return [list(u) for u in shapes], None if mask is None else [list(u) for u in mask]
    return _build_shapes(spec, pp, stage)


def _build_shapes(spec, pp: int, stage: int) -> tuple[list, list | None]:
    model = spec.build()
    if pp > 1:
        from .pipeline import Stage

        model = Stage(model, pp, stage)
        return model_unit_shapes(model), None
    # Frozen parameters: stored, never reduced or updated (the mask only when there are any).
    mask = [[p.requires_grad for p in u.parameters()] for u in model_units(model)]
    return model_unit_shapes(model), None if all(all(f) for f in mask) else mask


@functools.lru_cache(maxsize=32)
def _built_shapes_kept(spec, pp: int, stage: int):
    return _build_shapes(spec, pp, stage)


class Split:
    """A replica kept whole (`WHOLE`): every rank holds the model the configuration builds."""

    axis: str | None = None

    def unit_groups(self, cfg, rank: int = 0) -> list[UnitGroup]:
        shapes, trainable = self.unit_shapes(cfg, rank)
        return [UnitGroup(shapes, trainable, cfg.n, cfg.shard_rank(rank))]

    def observe(self, run):
        return None

    def check(self, cfg, spec, model) -> int:
        """The axis's size for RunConfig `cfg`; ValueError for what it cannot run."""
        return 1

    def apply(self, model, dist, cfg):
        return model

    def unit_shapes(self, cfg, rank: int = 0) -> tuple[list, list | None]:
        return _built_shapes(cfg.model)

    def ops(self, cfg, elem: int, rank: int = 0, observed=None) -> list:
        return []

    def activation_bytes(self, cfg, elem: int, ln_stats: int | None, rank: int = 0, observed=None) -> int | None:
        # One micro-batch's saved tensors in the recipe's parameter dtype; None: no closed form.
        return cfg.model.activation_bytes(cfg.micro_batch_size, elem, cfg.recompute, ln_stats_bytes=ln_stats)

    def unsplit(self, names: list[str], per_rank: list[list]) -> list:
        return per_rank[0]

    def inputs(self, cfg, dist, x, y):
        return x, y

    def forward_backward(self, run, micro) -> float | None:
        # K micro-batches, the first K-1 inside no_sync(): the strategy reduces once per step
        strategy, losses = run.strategy, []
        for k, (x, y) in enumerate(micro):
            with strategy.no_sync() if k < len(micro) - 1 else nullcontext():
                losses.append(strategy.forward_backward(x, y))
        return sum(losses) / len(losses)


class TensorSplit(Split):
    """Every GPT block split over the `tp` axis (`strategies.tensor_parallel`), optionally with
    sequence parallelism; the closed forms are `theory.tensor_parallel`'s."""

    axis = TP

    def check(self, cfg, spec, model) -> int:
        tp = cfg.tp
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp must be an integer >= 1, got {tp!r}")
        if cfg.sequence_parallel and tp == 1:
            raise ValueError("sequence parallelism splits the sequence over the tp ranks: give tp >= 2")
        if tp == 1:
            return 1
        if cfg.world_size % tp:
            raise ValueError(f"tp = {tp} must divide the world size {cfg.world_size}")
        if not isinstance(model, GPTConfig):
            raise ValueError(f"tensor parallelism splits a GPT's blocks: {model.name} is not a gpt-* model")
        refused = [why for bad, why in [
            (spec.hybrid, f"{spec.name} already has two data-parallel axes (a 3-D mesh is not built here)"),
            (model.attention != "eager", "the tensor-parallel attention runs the eager core (--attention eager)"),
            (cfg.recompute != RecomputeMode.NONE, "activation recompute is not applied to tensor-parallel blocks"),
            (cfg.clip_grad_norm is not None, "the gradient norm would need a sum over tp of the split "
                                             "parameters only"),
            (cfg.links is not None, "emulated links cover the data-parallel axes only")] if bad]
        if refused:
            raise ValueError(f"tp = {tp}: {refused[0]}")
        tp_theory.gpt_units(model.vocab, model.seq_len, model.d_model, model.n_layers, model.n_heads,
                            model.mlp_ratio, tp)
        if cfg.sequence_parallel and model.seq_len % tp:
            raise ValueError(f"sequence parallelism needs the sequence ({model.seq_len}) divisible by tp = {tp}")
        return tp

    def apply(self, model, dist, cfg):
        from .tensor_parallel import TPGPT

        return TPGPT(model, dist.axes[TP], dist.comm, sp=cfg.sequence_parallel)

    def unit_shapes(self, cfg, rank: int = 0) -> tuple[list, list | None]:
        c = cfg.model  # one tp rank's slices, every parameter trainable
        return tp_theory.gpt_units(c.vocab, c.seq_len, c.d_model, c.n_layers, c.n_heads, c.mlp_ratio,
                                   cfg.mesh.size(TP)), None

    def ops(self, cfg, elem: int, rank: int = 0, observed=None) -> list:
        c = cfg.model  # in the compute dtype, K micro-batches
        return tp_theory.gpt_tp_ops(cfg.micro_batch_size, c.seq_len, c.d_model, c.n_layers, cfg.mesh.size(TP),
                                    elem, cfg.sequence_parallel, cfg.micro_batches)

    def activation_bytes(self, cfg, elem: int, ln_stats: int | None, rank: int = 0, observed=None) -> int | None:
        c = cfg.model
        return tp_theory.gpt_activation_bytes(c, cfg.micro_batch_size, c.seq_len, elem, cfg.mesh.size(TP),
                                              cfg.sequence_parallel, ln_stats_bytes=ln_stats)

    def unsplit(self, names: list[str], per_rank: list[list]) -> list:
        from .tensor_parallel import unsplit

        return unsplit(names, per_rank)


class ContextSplit(Split):
    """Every sequence split over the `cp` axis (`strategies.context_parallel`: ring attention,
    plain or zig-zag chunks). Each cp rank holds a whole replica, embeds and attends for its own
    positions only, and takes the mean loss over its own tokens; every rank holds as many tokens,
    so the mean over the batch is the mean of the ranks' means, and the strategy's inner group
    spans dp_shard x cp (`kinds.SHARD_AXES`): the gradients of the replicated parameters are
    averaged, and ZeRO shards, over every rank of it (inside each of a hybrid's dp_outer domains); so
    the strategy's gradient norm (clipping) is already the whole model's, its shards disjoint over
    that group as without cp. The ring's hops are sends on the cp axis
    (`theory.context.ring_bytes`); a rank saves the activations of S/cp positions, with the
    attention core's q, k, v, output and one fp32 log-sum-exp per row (`theory.activations`,
    the fused form)."""

    axis = CP

    def check(self, cfg, spec, model) -> int:
        cp = cfg.cp
        if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
            raise ValueError(f"cp must be an integer >= 1, got {cp!r}")
        if cfg.zigzag and cp == 1:
            raise ValueError("--zigzag balances the causal work over the cp ranks: give cp >= 2")
        if getattr(cfg, "ring_class", None) and cp == 1:
            raise ValueError("a ring class replaces context parallelism's ring: give cp >= 2")
        if cp == 1:
            return 1
        if cfg.world_size % cp:
            raise ValueError(f"cp = {cp} must divide the world size {cfg.world_size}")
        if not isinstance(model, GPTConfig):
            raise ValueError(f"context parallelism splits a GPT's sequences: {model.name} is not a gpt-* model")
        # What this composition does not run yet, each refused by name rather than run wrong.
        if getattr(cfg, "ring_class", None):
            from ..runtime.rank import resolve_ref
            from .context_parallel import RingContext

            cls = resolve_ref(cfg.ring_class)
            if not (isinstance(cls, type) and issubclass(cls, RingContext)):
                raise ValueError(f"{cfg.ring_class} is not a subclass of RingContext")
        refused = [why for bad, why in [
            (cfg.sequence_parallel, "sequence parallelism inside tp would split the positions a second time"),
            (model.attention != "eager", "ring attention replaces the eager core (--attention eager)"),
            (cfg.recompute != RecomputeMode.NONE, "activation recompute would re-run the ring's sends"),
            (cfg.links is not None, "emulated links cover the data-parallel axes only")] if bad]
        if refused:
            raise ValueError(f"cp = {cp}: {refused[0]}")
        from ..theory.context import chunks

        chunks(model.seq_len, cp, 0, bool(cfg.zigzag))  # a sequence that does not split is refused here
        return cp

    def apply(self, model, dist, cfg):
        import torch

        from ..runtime.rank import resolve_ref
        from .context_parallel import RingAttentionCore, RingContext, RingStats

        # the ring (a notebook's find-the-bug variant where `ring_class` names one), counting its work
        cls = resolve_ref(cfg.ring_class) if getattr(cfg, "ring_class", None) else RingContext
        ring = cls(dist.comm, dist.axes[CP], cfg.model.seq_len, cfg.zigzag, tag="cp", stats=RingStats())
        for block in model.blocks:
            block.attn.core = RingAttentionCore(ring)
        mine = ring.my_chunks()

        def embed(tokens, e=model.embed):
            # this rank's rows of the position table: slices, concatenated (saves nothing)
            return e.tok(tokens) + torch.cat([e.pos.weight[c.start:c.stop] for c in mine])

        model.embed.forward = embed
        return model

    def inputs(self, cfg, dist, x, y):
        from ..theory.context import positions

        idx = positions(cfg.model.seq_len, cfg.cp, dist.axes[CP].rank, cfg.zigzag)
        return x[:, idx].contiguous(), y[:, idx].contiguous()

    def observe(self, run):
        """The ring's work on this rank (`reports.RingWork`): the score elements its forwards
        computed, counted from the tensors multiplied, beside `theory.context.work_elements` (the
        algorithm's, whatever ring ran); and the first forward's hops, each K/V send's issue and
        wait around the block computed meanwhile."""
        from ..reports import RingWork
        from ..theory.context import chunks, work_elements
        from .context_parallel import RingAttentionCore

        cfg, c = run.cfg, run.cfg.model
        ring = next(m.ctx for m in run.strategy.model.modules() if isinstance(m, RingAttentionCore))
        r = run.dist.axes[CP].rank
        forwards = cfg.steps * cfg.micro_batches * c.n_layers
        sends = [x for x in run.ledger.comm if x.step == 0 and x.op == "send" and x.axis == CP and x.detail == ["kv"]]
        hops = [[min(a.t_start, b.t_start), min(a.waited, b.waited), c0, c1]
                for (a, b), (c0, c1) in zip(zip(sends[::2], sends[1::2]), ring.stats.compute_spans)]
        return RingWork([[x.start, x.stop] for x in chunks(c.seq_len, cfg.cp, r, cfg.zigzag)],
                        ring.stats.forward_elements,
                        forwards * work_elements(cfg.micro_batch_size, c.n_heads, c.seq_len, cfg.cp, r, cfg.zigzag),
                        hops[:c.n_layers * (cfg.cp - 1)])

    def ops(self, cfg, elem: int, rank: int = 0, observed=None) -> list:
        from ..theory.comm import CommOp
        from ..theory.context import ring_bytes

        c, cp = cfg.model, cfg.cp
        shape = (cfg.micro_batch_size, c.n_heads, c.seq_len, c.d_model // c.n_heads, cp)
        kv, acc = ring_bytes(*shape, elem), ring_bytes(*shape, 4)
        # Per attention layer and micro-batch: K and V (the compute dtype) forward, and again in
        # backward; dK and dV are summed in fp32 as they travel, cp hops (the last one home).
        per = kv["forward"] + kv["forward"] + (acc["backward"] - acc["forward"])
        return [CommOp(CP, "send", "cp/ring/data", per, cp)] * (c.n_layers * cfg.micro_batches)

    def activation_bytes(self, cfg, elem: int, ln_stats: int | None, rank: int = 0, observed=None) -> int | None:
        from ..theory.activations import gpt_activation_bytes

        c = cfg.model
        return gpt_activation_bytes(c, cfg.micro_batch_size, c.seq_len // cfg.cp, elem, ln_stats_bytes=ln_stats,
                                    attention="fused")


class ContextTensorSplit(Split):
    """cp outside tp: every sequence split over cp, every block split over tp inside it
    (Megatron-LM's order, tp innermost). Ring attention replaces the core before the blocks are
    split, so each tp rank's attention passes its H/tp heads' K and V around its cp ring; the tp
    collectives move a cp rank's S/cp positions. Shapes and the reassembled replica are tp's;
    inputs are cp's; bytes and activations are tp's closed forms at S/cp positions (with a core
    that keeps no scores) beside the ring's at H/tp heads."""

    axis = None

    def __init__(self, cp: ContextSplit, tp: TensorSplit, cp_size: int):
        self.cp, self.tp, self.cp_size = cp, tp, cp_size

    def apply(self, model, dist, cfg):
        return self.tp.apply(self.cp.apply(model, dist, cfg), dist, cfg)

    def inputs(self, cfg, dist, x, y):
        return self.cp.inputs(cfg, dist, x, y)

    def unit_shapes(self, cfg, rank: int = 0):
        return self.tp.unit_shapes(cfg, rank)

    def ops(self, cfg, elem: int, rank: int = 0, observed=None) -> list:
        from ..theory.comm import CommOp
        from ..theory.context import ring_bytes

        c, cp, t = cfg.model, cfg.cp, cfg.tp
        tp_ops = tp_theory.gpt_tp_ops(cfg.micro_batch_size, c.seq_len // cp, c.d_model, c.n_layers, t, elem,
                                      False, cfg.micro_batches)
        shape = (cfg.micro_batch_size, c.n_heads // t, c.seq_len, c.d_model // c.n_heads, cp)
        kv, acc = ring_bytes(*shape, elem), ring_bytes(*shape, 4)
        per = kv["forward"] + kv["forward"] + (acc["backward"] - acc["forward"])
        return tp_ops + [CommOp(CP, "send", "cp/ring/data", per, cp)] * (c.n_layers * cfg.micro_batches)

    def activation_bytes(self, cfg, elem: int, ln_stats: int | None, rank: int = 0, observed=None) -> int | None:
        c = cfg.model
        return tp_theory.gpt_activation_bytes(c, cfg.micro_batch_size, c.seq_len // cfg.cp, elem, cfg.tp,
                                              ln_stats_bytes=ln_stats, attention="fused")

    def unsplit(self, names: list[str], per_rank: list[list]) -> list:
        # a replica's ranks, row-major: cp outer, tp inner; the first cp rank's tp ranks hold it all
        return self.tp.unsplit(names, per_rank[:len(per_rank) // self.cp_size])


class PipelineSplit(Split):
    """A GPT's blocks cut into pp stages (`strategies.pipeline`: the first stage also embeds, the
    last also has the head and the loss), each step's micro-batches run by GPipe or 1F1B through
    the strategy's `forward_only` / `backward_only`, activations and their gradients sent on the
    pp axis; the strategy is data-parallel over the ranks holding the same stage and steps it.
    Closed forms: the stage's units (`theory.pipeline.stage_layers`), its sends
    (`stage_sent_bytes`) and one micro-batch's activations on it (`stage_activation_bytes`) times
    the micro-batches alive at the step's last forward (the schedule's)."""

    axis = PP

    def check(self, cfg, spec, model) -> int:
        from ..theory.pipeline import SCHEDULES

        pp = cfg.pp
        if isinstance(pp, bool) or not isinstance(pp, int) or pp < 1:
            raise ValueError(f"pp must be an integer >= 1, got {pp!r}")
        if cfg.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {cfg.schedule!r}")
        if getattr(cfg, "emulate", None) is not None and pp == 1:
            raise ValueError("an emulated device paces a pipeline's actions: give pp >= 2")
        if pp == 1:
            return 1
        if cfg.world_size % pp:
            raise ValueError(f"pp = {pp} must divide the world size {cfg.world_size}")
        if not isinstance(model, GPTConfig):
            raise ValueError(f"pipeline parallelism cuts a GPT's blocks into stages: {model.name} is not a gpt-* model")
        if getattr(cfg, "emulate", None) is not None:
            from .pipeline import EmulatedCompute

            EmulatedCompute(*cfg.emulate)  # both lengths > 0, refused here
        if model.n_layers % pp:
            raise ValueError(f"pp = {pp} stages of whole blocks: {model.name}'s {model.n_layers} blocks do not split")
        refused = [why for bad, why in [
            (cfg.cp != 1 and cfg.tp != 1, "cp and tp beside it together are not composed here yet"),
            (cfg.sequence_parallel, "sequence parallelism inside tp is not composed with it yet"),
            (spec.name in PIPELINE_REFUSED, f"{spec.name} gathers its parameters around each forward and backward, "
                                            "which the schedule interleaves (not composed here yet)"),
            (cfg.recompute != RecomputeMode.NONE, "activation recompute is not applied to stages"),
            (cfg.clip_grad_norm is not None and spec.hybrid, f"{spec.name}'s gradient norm runs over the "
                                                             "whole world, which would count the stages twice"),
            (cfg.links is not None, "emulated links cover the data-parallel axes only")] if bad]
        if refused:
            raise ValueError(f"pp = {pp}: {refused[0]}")
        return pp

    def apply(self, model, dist, cfg):
        from .pipeline import Stage

        return Stage(model, cfg.pp, dist.axes[PP].rank)

    def unit_shapes(self, cfg, rank: int = 0):
        return _built_shapes(cfg.model, cfg.pp, cfg.mesh.coord(rank, PP))

    def ops(self, cfg, elem: int, rank: int = 0, observed=None) -> list:
        from ..theory.comm import CommOp
        from ..theory.pipeline import stage_sent_bytes

        c = cfg.model
        sent = stage_sent_bytes(cfg.micro_batch_size, c.seq_len, c.d_model, elem, cfg.pp, cfg.micro_batches,
                                cfg.mesh.coord(rank, PP))
        # clipping: the stages hold disjoint layers, so the norm's square sum is summed over pp too
        norm = [CommOp(PP, "all_reduce", "norm/grads", 4, cfg.pp)] if cfg.clip_grad_norm is not None else []
        return ([CommOp(PP, "send", "pipeline", sent, cfg.pp)] if sent else []) + norm

    def activation_bytes(self, cfg, elem: int, ln_stats: int | None, rank: int = 0, observed=None) -> int | None:
        from ..theory.pipeline import schedule, stage_activation_bytes

        s = cfg.mesh.coord(rank, PP)
        actions = schedule(cfg.schedule, cfg.pp, cfg.micro_batches, s)
        last = max(i for i, (what, _) in enumerate(actions) if what == "F")
        alive = sum(1 if what == "F" else -1 for what, _ in actions[:last + 1])
        return alive * stage_activation_bytes(cfg.model, cfg.micro_batch_size, elem, cfg.pp, s, ln_stats)

    def unsplit(self, names: list[str], per_rank: list[list]) -> list:
        return [q for stage in per_rank for q in stage]  # the stages in order: the model's order

    def observe(self, run):
        """The stage's last step (`reports.PipelineWork`), from the begin and end marks its
        schedule left: its actions, and the most micro-batches alive at once beside the schedule's."""
        from ..kinds import EventKind
        from ..reports import PipelineWork
        from ..theory.pipeline import in_flight

        ledger, cfg, s = run.ledger, run.cfg, run.dist.axes[PP].rank
        begin = {EventKind.MICRO_FORWARD_BEGIN: "F", EventKind.MICRO_BACKWARD_BEGIN: "B"}
        end = {EventKind.MICRO_FORWARD_END: "F", EventKind.MICRO_BACKWARD_END: "B"}
        last = cfg.steps - 1
        started, work, alive, most = {}, [], 0, 0
        for e in ledger.marks:
            if e.step != last:
                continue
            if e.kind in begin:
                started[begin[e.kind], e.micro] = e.t
            elif e.kind in end:
                what = end[e.kind]
                work.append([what, e.micro, ledger.t0 + started.pop((what, e.micro)), ledger.t0 + e.t])
                alive += 1 if what == "F" else -1  # a forward's activations live until its backward ends
                most = max(most, alive)
        layers = run.strategy.model.layers  # the Stage `apply` made
        return PipelineWork(s, [layers.start, layers.stop], most, in_flight(cfg.schedule, cfg.pp, cfg.micro_batches, s),
                            work)

    def forward_backward(self, run, micro) -> float | None:
        from .pipeline import Pipeline

        from .pipeline import EmulatedCompute

        axis = run.dist.axes[PP]
        compute = EmulatedCompute(*run.cfg.emulate) if run.cfg.emulate is not None else None
        engine = Pipeline(None, axis, run.dist.comm, run.ledger, run.cfg.schedule,
                          data_parallel=lambda _stage: run.strategy, stage=run.strategy.model, compute=compute)
        return engine.forward_backward(micro)


PIPELINE_REFUSED: tuple[str, ...] = ()  # strategies refused beside pp (found by the tests)


class PipelineTensorSplit(PipelineSplit):
    """pp outside tp (Megatron-LM's order, as the published 3-D runs): the blocks are split over
    tp first (`TensorSplit`), then the tp-split GPT is cut into stages; each tp rank of a stage
    sends its (replicated) activations to the same tp rank of the next. Shapes, tp's collectives
    and activations are tp's closed forms restricted to the stage's units and blocks; the sends
    are the pipeline's."""

    def __init__(self, tp: TensorSplit, pp_size: int):
        self.tp, self.pp_size = tp, pp_size

    def apply(self, model, dist, cfg):
        return super().apply(self.tp.apply(model, dist, cfg), dist, cfg)

    def _stage_units(self, cfg, rank: int) -> tuple[int, range, bool, bool]:
        from ..theory.pipeline import stage_layers

        s = cfg.mesh.coord(rank, PP)
        return s, stage_layers(cfg.model.n_layers, cfg.pp, s), s == 0, s == cfg.pp - 1

    def unit_shapes(self, cfg, rank: int = 0):
        shapes, _ = self.tp.unit_shapes(cfg, rank)  # [embed, *blocks, head], one tp rank's slices
        _, layers, first, last = self._stage_units(cfg, rank)
        mine = ([shapes[0]] if first else []) + [shapes[1 + i] for i in layers] + ([shapes[-1]] if last else [])
        return mine, None

    def ops(self, cfg, elem: int, rank: int = 0, observed=None) -> list:
        c = cfg.model
        _, layers, _, _ = self._stage_units(cfg, rank)
        tp_ops = tp_theory.gpt_tp_ops(cfg.micro_batch_size, c.seq_len, c.d_model, len(layers), cfg.tp, elem,
                                      False, cfg.micro_batches)
        return tp_ops + super().ops(cfg, elem, rank)

    def activation_bytes(self, cfg, elem: int, ln_stats: int | None, rank: int = 0, observed=None) -> int | None:
        from ..theory.pipeline import schedule

        s, layers, first, last = self._stage_units(cfg, rank)
        actions = schedule(cfg.schedule, cfg.pp, cfg.micro_batches, s)
        end = max(i for i, (what, _) in enumerate(actions) if what == "F")
        alive = sum(1 if what == "F" else -1 for what, _ in actions[:end + 1])
        c = cfg.model
        return alive * tp_theory.gpt_stage_activation_bytes(c, cfg.micro_batch_size, c.seq_len, elem, cfg.tp,
                                                            len(layers), first, last, ln_stats)

    def unsplit(self, names: list[str], per_rank: list[list]) -> list:
        # a replica's ranks, row-major: pp outer, tp inner; each stage's tp slices put back together
        t = len(per_rank) // self.pp_size
        stage_names, out, k = names, [], 0
        for s in range(self.pp_size):
            n = len(per_rank[s * t])
            out += self.tp.unsplit(stage_names[k:k + n], per_rank[s * t:(s + 1) * t])
            k += n
        return out


class PipelineContextSplit(PipelineSplit):
    """pp outside cp: ring attention and each cp rank's position rows applied to the whole GPT,
    which is then cut into stages; each stage's cp ranks pass K and V around their own ring, and a
    stage sends the S/cp positions its cp rank holds to the same cp rank of the next stage. The
    closed forms are the pipeline's at S/cp positions (with a core that keeps no scores) beside the
    ring's for the stage's blocks."""

    def __init__(self, cp: ContextSplit, pp_size: int):
        self.cp, self.pp_size = cp, pp_size

    def apply(self, model, dist, cfg):
        return super().apply(self.cp.apply(model, dist, cfg), dist, cfg)

    def inputs(self, cfg, dist, x, y):
        return self.cp.inputs(cfg, dist, x, y)

    def ops(self, cfg, elem: int, rank: int = 0, observed=None) -> list:
        from ..theory.comm import CommOp
        from ..theory.pipeline import stage_layers, stage_sent_bytes

        c, s = cfg.model, cfg.mesh.coord(rank, PP)
        sent = stage_sent_bytes(cfg.micro_batch_size, c.seq_len // cfg.cp, c.d_model, elem, cfg.pp,
                                cfg.micro_batches, s)
        ring = self.cp.ops(cfg, elem, rank)  # one per layer and micro-batch, every layer's the same
        per_layer = len(ring) // c.n_layers
        mine = ring[:per_layer * len(stage_layers(c.n_layers, cfg.pp, s))]
        norm = [CommOp(PP, "all_reduce", "norm/grads", 4, cfg.pp)] if cfg.clip_grad_norm is not None else []
        return ([CommOp(PP, "send", "pipeline", sent, cfg.pp)] if sent else []) + mine + norm

    def activation_bytes(self, cfg, elem: int, ln_stats: int | None, rank: int = 0, observed=None) -> int | None:
        from ..theory.activations import gpt_activation_terms
        from ..theory.pipeline import schedule, stage_layers

        c, s = cfg.model, cfg.mesh.coord(rank, PP)
        actions = schedule(cfg.schedule, cfg.pp, cfg.micro_batches, s)
        end = max(i for i, (what, _) in enumerate(actions) if what == "F")
        alive = sum(1 if what == "F" else -1 for what, _ in actions[:end + 1])
        terms = gpt_activation_terms(c, cfg.micro_batch_size, c.seq_len // cfg.cp, elem, ln_stats_bytes=ln_stats,
                                     attention="fused")
        per = {u: sum(t.bytes for t in terms if t.unit == u) for u in ("embed", "block", "head")}
        one = (len(stage_layers(c.n_layers, cfg.pp, s)) * per["block"] + (per["embed"] if s == 0 else 0)
               + (per["head"] if s == cfg.pp - 1 else 0))
        return alive * one

    def unsplit(self, names: list[str], per_rank: list[list]) -> list:
        # a replica's ranks, row-major: pp outer, cp inner; each stage's first cp rank holds it whole
        c = len(per_rank) // self.pp_size
        return super().unsplit(names, per_rank[::c])


class ExpertSplit(Split):
    """A mixture-of-experts GPT's experts placed over the `ep` axis (`strategies.expert_parallel`:
    rank r keeps experts [r·E/ep, (r+1)·E/ep) of every layer, tokens go to them and back by
    all-to-all). ep is a data axis too: each ep rank trains on its own share of the batch, so the
    strategy's inner group spans dp_shard x ep for everything but the experts, whose gradients
    are reduced and sharded over dp_shard alone, the ranks holding the same experts (`DistState
    .expert`; two groups, as Megatron-Core's dense and expert data-parallel groups). Closed forms:
    each group's units (`unit_groups`); the all-to-alls' bytes from the router's own counts of
    the step (`observe`, `theory.experts.all_to_all_bytes`), and what each MoE layer saves from the
    last forward's (`theory.experts.moe_layer_activation_bytes`)."""

    axis = EP
    # Strategies whose units are never called (no gather before a unit's forward): an expert
    # unit reduces over its own group, the block's other parameters over dp_shard x ep.
    STRATEGIES = ("ddp", "zero1", "zero1_allreduce", "zero2")

    def check(self, cfg, spec, model) -> int:
        from ..models.moe import MoEGPTConfig

        ep = getattr(cfg, "ep", 1)
        if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
            raise ValueError(f"ep must be an integer >= 1, got {ep!r}")
        moe = isinstance(model, MoEGPTConfig)
        if moe:
            refused = [why for bad, why in [
                (cfg.cp != 1 or cfg.pp != 1, "it runs on the data, ep and tp axes here (cp and pp beside experts "
                                             "are not composed yet)"),
                (cfg.sequence_parallel, "its experts run whole on every tp rank, on the whole sequence: "
                                        "sequence parallelism is not composed with them"),
                (cfg.recompute != RecomputeMode.NONE, "activation recompute is not applied to its blocks")] if bad]
            if refused:
                raise ValueError(f"{model.name}: {refused[0]}")
        if ep == 1:
            return 1
        if not moe:
            raise ValueError(f"ep = {ep} places a mixture of experts' experts over ranks: {model.name} has none "
                             "(give it experts: --experts E)")
        if cfg.world_size % ep:
            raise ValueError(f"ep = {ep} must divide the world size {cfg.world_size}")
        if model.experts % ep:
            raise ValueError(f"ep = {ep} ranks hold E/ep experts each: {model.experts} experts do not split")
        refused = [why for bad, why in [
            (spec.name not in self.STRATEGIES, f"{spec.name} gathers or shards units around their forward, and a "
                                               "layer's experts are a unit of their own group: ep runs with "
                                               f"{', '.join(self.STRATEGIES)}"),
            (cfg.clip_grad_norm is not None, "the gradient norm would need the experts' squares summed over ep"),
            (cfg.links is not None, "emulated links cover the data-parallel axes only")] if bad]
        if refused:
            raise ValueError(f"ep = {ep}: {refused[0]}")
        return ep

    def apply(self, model, dist, cfg):
        from .expert_parallel import EPContext

        placement = EPContext(dist.comm, dist.axes[EP])
        for layer in model.moe_layers():
            layer.ep = placement
            layer.keep_local()
        model.units = model.expert_units  # the experts a unit of their own, reduced over dp_shard
        return model

    def unit_groups(self, cfg, rank: int = 0) -> list[UnitGroup]:
        model, mesh = cfg.model.build(), cfg.mesh
        per = model.cfg.experts // mesh.size(EP)
        mine = range(mesh.coord(rank, EP) * per, (mesh.coord(rank, EP) + 1) * per)
        for layer in model.moe_layers():
            layer.keep(mine)
        units = model.expert_units()
        shapes = lambda us: [[tuple(p.shape) for p in u.parameters()] for u in us]  # noqa: E731
        experts = [u for u in units if getattr(u, "expert_parallel", False)]
        shared = [u for u in units if not getattr(u, "expert_parallel", False)]
        return [UnitGroup(shapes(shared), None, cfg.n, cfg.shard_rank(rank)),
                UnitGroup(shapes(experts), None, mesh.size(DP_SHARD), mesh.coord(rank, DP_SHARD))]

    def unit_shapes(self, cfg, rank: int = 0):
        return [s for g in self.unit_groups(cfg, rank) for s in g.shapes], None

    def observe(self, run):
        """The last step's routing on this rank (`reports.ExpertRouting`): per MoE layer and
        forward, the rows it sent to each expert and received from each ep rank (the router's and
        the counts all-to-all's own numbers), and the assignments dropped."""
        from ..reports import ExpertRouting

        k, layers = run.cfg.micro_batches, run.strategy.model.moe_layers()
        groups = k * run.cfg.micro_batch_size  # one routing group per sequence (`models.moe`)
        return ExpertRouting(list(layers[0].local_experts()), [lay.stats.sent[-k:] for lay in layers],
                             [lay.stats.received[-k:] for lay in layers],
                             [sum(lay.stats.dropped[-groups:]) for lay in layers])

    def ops(self, cfg, elem: int, rank: int = 0, observed=None) -> list:
        from ..theory.comm import CommOp
        from ..theory.experts import all_to_all_bytes

        if observed is None:
            raise ValueError("the all-to-alls' bytes follow the router's choices: they are predicted on the "
                             "rank, from its counts of the step (`ExpertSplit.observe`)")
        ep, E, D = cfg.mesh.size(EP), cfg.model.experts, cfg.model.d_model
        r, per = cfg.mesh.coord(rank, EP), cfg.model.experts // ep
        ops = []
        for layer_sent, layer_received in zip(observed.sent, observed.received):
            for sent, received in zip(layer_sent, layer_received):
                to = [sum(sent[d * per:(d + 1) * per]) for d in range(ep)]
                # n[s][d] for this rank's row and column: what it sends and what it receives
                n = [[to[d] if s == r else (received[s] if d == r else 0) for d in range(ep)] for s in range(ep)]
                for what, b in all_to_all_bytes(n, r, D, E, elem).items():
                    ops.append(CommOp(EP, "all_to_all", f"ep/experts/data/{what}", b, ep, exact=b))
        return ops

    def activation_bytes(self, cfg, elem: int, ln_stats: int | None, rank: int = 0, observed=None) -> int | None:
        from ..models.gpt import GPTConfig
        from ..theory.activations import gpt_activation_bytes
        from ..theory.experts import moe_layer_activation_bytes

        if observed is None:
            return None  # what the experts save is the router's choice: predicted on the rank only
        c, B = cfg.model, cfg.micro_batch_size
        dense = GPTConfig(**{f: getattr(c, f) for f in GPTConfig.__dataclass_fields__})
        T = B * c.seq_len
        out = gpt_activation_bytes(dense, B, c.seq_len, elem, ln_stats_bytes=ln_stats)
        for sent, received in zip(observed.sent, observed.received):  # the last forward's routing
            out += moe_layer_activation_bytes(B, c.seq_len, c.experts, c.top_k, c.d_model, c.mlp_ratio, elem,
                                              sum(sent[-1]), sum(received[-1]), B > 1) \
                - 2 * elem * c.mlp_ratio * T * c.d_model
        return out

    def unsplit(self, names: list[str], per_rank: list[list]) -> list:
        import re

        ep = len(per_rank)
        experts = lambda n: re.search(r"\.experts\.(\d+)\.", n)  # noqa: E731
        total = 1 + max(int(m.group(1)) for n in names if (m := experts(n)))
        per, full = total // ep, {}
        for j, params in enumerate(per_rank):
            mine = [n for n in names if not (m := experts(n)) or int(m.group(1)) // per == j]
            full.update({n: p for n, p in zip(mine, params) if n not in full})
        return [full[n] for n in names]


WHOLE = Split()
SPLITS = {TP: TensorSplit(), CP: ContextSplit(), PP: PipelineSplit(), EP: ExpertSplit()}  # model axis -> its split


class ExpertTensorSplit(ExpertSplit):
    """ep beside tp (tp innermost): the experts placed over ep first, then every block's attention
    split over tp (`tensor_parallel.TPBlock`); each layer's mixture of experts stays whole on every
    tp rank, which runs it on the same tokens as its tp peers (each tp rank's all-to-alls carry
    them, on its own ep group). Closed forms: tp's for the attention (two all-reduces per block
    and micro-batch, its saved tensors split), the experts' from the routers' counts as alone."""

    def apply(self, model, dist, cfg):
        from .tensor_parallel import TPGPT

        model = super().apply(model, dist, cfg)
        tp = TPGPT(model, dist.axes[TP], dist.comm)
        tp.units = tp.expert_units
        return tp

    def unit_groups(self, cfg, rank: int = 0) -> list[UnitGroup]:
        c, mesh = cfg.model, cfg.mesh
        groups = super().unit_groups(cfg, rank)  # the unsplit shapes, each group's n and place
        # the attention's tp slices in place of its whole shapes (`theory.tensor_parallel.gpt_units`)
        block = tp_theory.gpt_units(c.vocab, c.seq_len, c.d_model, c.n_layers, c.n_heads, c.mlp_ratio,
                                    mesh.size(TP))[1]
        shared = [u if i in (0, len(groups[0].shapes) - 1) else block[:8] + u[8:]
                  for i, u in enumerate(groups[0].shapes)]
        return [groups[0]._replace(shapes=shared), groups[1]]

    def ops(self, cfg, elem: int, rank: int = 0, observed=None) -> list:
        from ..theory.comm import CommOp

        c, t = cfg.model, cfg.mesh.size(TP)
        act = cfg.micro_batch_size * c.seq_len * c.d_model * elem
        # per block and micro-batch: the attention's two all-reduces (proj's output forward, the
        # qkv input's gradient backward); the experts run whole, no tp collective
        tp = [CommOp(TP, "all_reduce", f"tp/block{i}/data", act, t)
              for _ in range(cfg.micro_batches) for i in range(c.n_layers) for _ in range(2)]
        return tp + super().ops(cfg, elem, rank, observed)

    def activation_bytes(self, cfg, elem: int, ln_stats: int | None, rank: int = 0, observed=None) -> int | None:
        from ..models.gpt import GPTConfig
        from ..theory.experts import moe_layer_activation_bytes

        if observed is None:
            return None
        c, B, t = cfg.model, cfg.micro_batch_size, cfg.mesh.size(TP)
        dense = GPTConfig(**{f: getattr(c, f) for f in GPTConfig.__dataclass_fields__})
        T = B * c.seq_len
        # tp's count for the dense GPT, less its split MLP's GELU input and output (2a·rTD/t a
        # block; fc's input, the ln2 output, is saved whole by the router instead), plus the experts'
        out = tp_theory.gpt_activation_bytes(dense, B, c.seq_len, elem, t, ln_stats_bytes=ln_stats)
        for sent, received in zip(observed.sent, observed.received):
            out += moe_layer_activation_bytes(B, c.seq_len, c.experts, c.top_k, c.d_model, c.mlp_ratio, elem,
                                              sum(sent[-1]), sum(received[-1]), B > 1) \
                - 2 * elem * c.mlp_ratio * T * c.d_model // t
        return out

    def unsplit(self, names: list[str], per_rank: list[list]) -> list:
        from .tensor_parallel import unsplit as tp_unsplit

        # a replica's ranks, row-major: ep outer, tp inner; put each ep rank's tp slices together
        # (its experts are whole on every tp rank), then the experts from their owners
        t = len(per_rank) // self.ep_size
        local = []
        for e in range(self.ep_size):
            per = self._experts_of(names, e)
            local.append(tp_unsplit(per, per_rank[e * t:(e + 1) * t]))
        return super().unsplit(names, local)

    def __init__(self, ep_size: int = 1):
        self.ep_size = ep_size

    def _experts_of(self, names: list[str], e: int) -> list[str]:
        import re

        total = 1 + max(int(m.group(1)) for n in names if (m := re.search(r"\.experts\.(\d+)\.", n)))
        per = total // self.ep_size
        return [n for n in names if not (m := re.search(r"\.experts\.(\d+)\.", n)) or int(m.group(1)) // per == e]


def split_of(mesh: Mesh) -> Split:
    """How a replica is split on `mesh`: its model axes' `Split` (two of them compose: cp with tp
    as `ContextTensorSplit`, pp with tp as `PipelineTensorSplit`, pp with cp as
    `PipelineContextSplit`), or `WHOLE`."""
    axes = mesh.model_axes
    if axes == (EP, TP):
        return ExpertTensorSplit(mesh.size(EP))
    if EP in axes and axes != (EP,):
        raise ValueError(f"ep does not compose with {', '.join(a for a in axes if a != EP)} here yet")
    if axes == (CP, TP):
        return ContextTensorSplit(SPLITS[CP], SPLITS[TP], mesh.size(CP))
    if axes == (PP, TP):
        return PipelineTensorSplit(SPLITS[TP], mesh.size(PP))
    if axes == (PP, CP):
        return PipelineContextSplit(SPLITS[CP], mesh.size(PP))
    if len(axes) > 1:
        raise ValueError(f"these model axes do not compose here yet: {axes}")
    return SPLITS[axes[0]] if axes else WHOLE


def check(cfg, spec, model) -> dict[str, int]:
    """Every model axis's size for RunConfig `cfg`, each checked by its split (`Split.check`)."""
    return {axis: s.check(cfg, spec, model) for axis, s in SPLITS.items()}
