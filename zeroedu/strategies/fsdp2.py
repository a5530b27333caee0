"""FSDP2: every parameter sharded on its own along tensor dim 0 (per-parameter sharding).

Algorithm (FSDP2 / `torch.distributed.fsdp.fully_shard`; FSDP paper, Zhao et al. 2023, §3 with
the per-parameter layout that replaced FlatParameter). Set-up: each parameter of shape
(d0, ...) is cut into chunks of c = ceil(d0/N) rows (`zeroedu.shard.dim0_rows`); rank r keeps
rows [r·c, min((r+1)·c, d0)) — the last rank(s) may hold fewer rows, or none. Nothing is
padded in storage, and every shard is a plain (rows, ...) tensor of the original parameter:
a rank's state dict is its shards plus their row offsets, no all-gather needed
(`local_state_dict`). Per step, per unit (lifecycle in `fsdp_units`):
  1. pre_forward: all-gather the unit's shards, each padded to c rows *on the wire* only;
  2. post_forward: free the unsharded parameters (reshard_after_forward=True);
  3. pre_backward: all-gather again;
  4. post_backward: reduce-scatter the full gradients (SUM, grad dtype, each padded to N·c
     rows) and keep this rank's rows as its grad shards; free gradients and buffers;
  5. step: Adam on each shard (fp32 master/m/v of the same rows), scale 1/N.

Batched collectives (``batched=True``, the default; torch's `foreach_all_gather` /
`foreach_reduce` in `_fully_shard/_fsdp_collectives.py`): one all-gather and one reduce-scatter
per unit and direction, whatever its number of parameters. With s_j = c_j·numel_j/d0_j the
row-padded shard of parameter j and S = Σ_j s_j, both buffers are laid out *rank-major*:

    all-gather output   [ rank 0: p0 | p1 | ... | rank 1: p0 | p1 | ... | ... ]   N·S elements
                          └ s_0 ┘└ s_1┘
  1a. copy-in: this rank's row-padded shards into its own slice [r·S, (r+1)·S) of the
      output, which is the all-gather's input (in place, as torch does);
  1b. one all-gather; 1c. copy-out: ``output.view(N, S)`` split by columns (s_j each) is
      parameter j's padded full tensor, N chunks of c_j rows, copied into its unsharded leaf
      (`torch.split_with_sizes_copy`); the output buffer is freed.
  4a. copy-in: each full gradient (N·c_j rows) cut into N chunks of c_j rows; row r of
      ``input.view(N, S)`` is every parameter's chunk r side by side (`torch._chunk_cat`);
      the full gradients are freed; 4b. one reduce-scatter into an S-element output;
      4c. copy-out: parameter j's real rows from its s_j columns into (or onto) its grad shard.

``batched=False`` issues one all-gather and one reduce-scatter per parameter, straight into
the parameter's own leaf and (when it holds c rows) its grad shard: no copies, more and
smaller messages. Both send the same bytes (the ring model of Σ_j N·s_j elements), what the
closed forms count; on the wire they differ only by gloo's framing (144 B per message).
The copy-in/out buffers are communication buffers ("comm_buffer" in the ledger; the
timeline marks the moments when they and the unit's other buffers are all alive).

Memory per rank (model states): (P + G + K) · Σ_params rows_r · (numel/d0): 16Ψ/N with mixed-bf16
up to the uneven last shard; ranks can differ (`theory.exact_model_states("fsdp2", ..., rank)`).
(torch stores its shards padded to c rows, so its rank holds the padded size; see test_fsdp.)
Communication per rank: 2 all-gathers ΨP + reduce-scatter ΨG, each (N-1)/N of the row-padded
sizes (`shard.dim0_padded_numel`): 3Ψ, 1.5x DDP; 2Ψ with reshard_after_forward=False.

Asynchronous reduce-scatter (``async_reduce_scatter=True``, batched only; torch's default, one
reduce-scatter input buffer in flight: `reduce_scatter_max_input_buffers`, waited for in the next
`FSDPParamGroup.post_backward`, torch 2.13): step 4b is issued and backward goes on to the next
unit; that unit's post_backward first waits for it and does its copy-out (4c), then reduces its
own. The link carries a unit's gradients while the next unit's backward computes, instead of
the rank waiting for them. Cost: the in-flight unit's reduce-scatter input (its full gradients,
G_k) and output (G_k/N) stay alive through the next unit's backward
(`theory.memory.fsdp_peak(..., async_reduce=True)`); the last unit's is waited for when
backward ends, before the optimizer step. Bytes on the wire unchanged.

Frozen parameters (``requires_grad=False``), as `fully_shard` treats them: sharded and
all-gathered like any other (forward needs them), but no grad shard, optimizer state or
reduce-scatter; the batched reduce-scatter's buffer holds the trainable parameters' columns
only. A unit with nothing trainable is gathered for backward only if backward reaches it (its
output requires grad: not a frozen embedding on token ids), and then reshards once its inputs
have their gradients; backward prefetch skips a unit backward never reaches (torch's
`FSDPParamGroup._backward_prefetch` walks the whole post-forward order, so it can gather such
a unit once more for nothing). Per rank: P over all rows held, G and K over the trainable rows
(`theory.exact_model_states("fsdp2", ..., trainable=mask)`, `theory.exact_comm` likewise).
"""
from __future__ import annotations

import torch

from .. import shard
from ..kinds import EventKind as Ev
from .fsdp_units import FSDPStrategy, Unit


class Dim0Unit(Unit):
    """A unit whose every parameter is its own dim-0 shard; `leaves[j]` is parameter j's
    row-padded (N·c, ...) unsharded buffer. `batched`: one collective per unit and direction
    (copy-in / copy-out, module docstring), else one per parameter."""

    def __init__(self, index, module, axis, comm, ledger, param_dtype, grad_dtype, tag, batched=True,
                 async_reduce=False):
        super().__init__(index, module, axis, comm, ledger, param_dtype, grad_dtype, tag)
        n, r = axis.size, axis.rank
        self.batched = batched
        self.async_reduce = async_reduce
        self._reducing = None  # an asynchronous reduce-scatter in flight: (handle, copy-out)
        self.shapes, self.rows, self.chunk_rows = [], [], []
        for (_, p), trains in zip(self.params, self.trainable):
            if p.dim() == 0:
                raise ValueError("a 0-dim parameter cannot be sharded on dim 0")
            rows, c = self._shard_rows(p.shape[0], n, r), shard.dim0_chunk_rows(p.shape[0], n)
            self.shapes.append(tuple(p.shape))
            self.rows.append(rows)
            self.chunk_rows.append(c)
            sh = p.detach()[rows.start:rows.end].to(param_dtype).clone()  # (rows, ...), maybe empty
            self.shards.append(ledger.track(sh, "param"))
            if trains:  # a frozen parameter is gathered, never reduced: no grad shard
                self.grad_shards.append(ledger.track(torch.zeros_like(sh, dtype=grad_dtype), "grad"))
            self.leaves.append(self._new_leaf((c * n, *p.shape[1:]), requires_grad=trains))
        # The batched buffers' index space: parameter j owns columns [off_j, off_j + s_j) of
        # each rank's row of S elements; its real rows are the first `real_j` of them. The
        # reduce-scatter's index space is the same over the trainable parameters only.
        self.padded_sizes = [c * shard.numel(s[1:]) for c, s in zip(self.chunk_rows, self.shapes)]
        self.real_sizes = [sh.numel() for sh in self.shards]
        self.shard_numel = sum(self.padded_sizes)  # S
        self.grad_index = [j for j, t in enumerate(self.trainable) if t]
        self.grad_padded_sizes = [self.padded_sizes[j] for j in self.grad_index]
        self.grad_shard_numel = sum(self.grad_padded_sizes)
        self._gather_buffer = None  # the batched all-gather's output while it is in flight
        self._detach_module_params()

    def _shard_rows(self, d0: int, n: int, r: int) -> shard.Range:
        """The rows of a (d0, ...) parameter this rank keeps: chunks of ceil(d0/N) rows."""
        return shard.dim0_rows(d0, n, r)

    # ---------------------------------------------------------------- all-gather
    def _padded(self, t: torch.Tensor, c: int) -> torch.Tensor:
        """`t` padded with zero rows to c rows: only what travels on the wire is padded."""
        if t.shape[0] == c:
            return t
        out = self.ledger.track(t.new_zeros((c, *t.shape[1:])), "comm_buffer")
        out[:t.shape[0]] = t
        return out

    def _all_gather(self):
        if not self.batched:
            self._alloc_leaves()
            return [self.comm.all_gather(leaf.data, self._padded(sh, c), self.axis,  # .data: see FlatUnit
                                         self.tag(self.name, "params", f"param{j}"), async_op=True)
                    for j, (leaf, sh, c) in enumerate(zip(self.leaves, self.shards, self.chunk_rows))]
        n, r, S = self.axis.size, self.axis.rank, self.shard_numel
        out = self.ledger.track(torch.empty(n * S, dtype=self.param_dtype, device=self.device), "comm_buffer")
        # 1a. copy-in: this rank's row of the output is the all-gather's input (in place).
        mine = out.narrow(0, r * S, S)
        for dst, sh, real, s in zip(mine.split(self.padded_sizes), self.shards, self.real_sizes,
                                    self.padded_sizes):
            dst[:real].copy_(sh.reshape(-1))
            if real < s:
                dst[real:].zero_()  # the wire padding of a short (or empty) last shard
        self._gather_buffer = out
        return [self.comm.all_gather(out, mine, self.axis, self.tag(self.name, "params"), async_op=True)]

    def _copy_out(self):
        if not self.batched:
            return
        n, out = self.axis.size, self._gather_buffer
        self._alloc_leaves()
        # 1c. column block j of the (N, S) view is parameter j's N chunks of c_j rows, in rank
        # order: its padded full tensor. `.data`: no version bump (see FlatUnit).
        torch.split_with_sizes_copy(out.view(n, -1), self.padded_sizes, dim=1,
                                    out=[leaf.data.view(n, -1) for leaf in self.leaves])
        # Leaves and the output buffer alive together: the all-gather's largest moment.
        self.ledger.event(Ev.COPY_OUT, self.index)
        self._gather_buffer = None  # the ledger's reference is weak: the buffer goes now

    # ---------------------------------------------------------------- reduce-scatter
    def _reduce_scatter(self, full_grads, accumulate):
        if not self.batched:
            for j, g, gs in zip(self.grad_index, full_grads, self.grad_shards):
                c = self.chunk_rows[j]
                direct = gs.shape[0] == c and not accumulate
                out = gs if direct else self.ledger.track(g.new_empty((c, *g.shape[1:])), "comm_buffer")
                self.comm.reduce_scatter(out, g, self.axis, self.tag(self.name, "grads", f"param{j}"))
                if not direct:  # drop the wire padding; add to the sum of earlier micro-batches
                    (gs.add_ if accumulate else gs.copy_)(out[:gs.shape[0]])
            return
        n, S = self.axis.size, self.grad_shard_numel
        inp = self.ledger.track(torch.empty(n * S, dtype=self.grad_dtype, device=self.device), "comm_buffer")
        # 4a. copy-in: row r of the (N, S) view = chunk r (c_j rows) of every full gradient.
        # The full gradients already have N·c_j rows (the leaves are row-padded), so the chunks
        # are exact; `_chunk_cat` would also pad shorter ones, as torch's does.
        torch._chunk_cat(full_grads, 0, n, out=inp.view(n, S))
        self.ledger.event(Ev.COPY_IN, self.index)  # full gradients + input alive
        full_grads.clear()  # only after the copy-in can the full gradients go
        out = self.ledger.track(torch.empty(S, dtype=self.grad_dtype, device=self.device), "comm_buffer")
        reals = [self.real_sizes[j] for j in self.grad_index]

        def copy_out():
            # 4c. copy-out: parameter j's real rows; add to the sum of earlier micro-batches.
            for src, gs, real in zip(out.split(self.grad_padded_sizes), self.grad_shards, reals):
                if real:
                    (gs.add_ if accumulate else gs.copy_)(src[:real].view(gs.shape))

        if self.async_reduce:
            # In flight while the next unit's backward computes; the input and output buffers
            # stay alive until `finish_reduce` (the closure holds them), as torch's do.
            handle = self.comm.reduce_scatter(out, inp, self.axis, self.tag(self.name, "grads"), async_op=True)
            self._reducing = (handle, inp, copy_out)
            return
        self.comm.reduce_scatter(out, inp, self.axis, self.tag(self.name, "grads"))
        del inp
        copy_out()

    def finish_reduce(self) -> None:
        """Wait for this unit's asynchronous reduce-scatter, copy its shard out, free its buffers."""
        if self._reducing is not None:
            handle, _inp, copy_out = self._reducing
            handle.wait()
            copy_out()
            self._reducing = None  # the buffers go with the closure

    # ---------------------------------------------------------------- views and layout
    def _views(self):
        return [leaf[:shape[0]] for leaf, shape in zip(self.leaves, self.shapes)]

    def param_pieces(self):
        """One holder per parameter: its rows [start, end) are elements [start·rest, end·rest)."""
        out = []
        for j, (sh, rows, s) in enumerate(zip(self.shards, self.rows, self.shapes)):
            rest = shard.numel(s[1:])
            out.append((sh, [(j, rows.start * rest, rows.end * rest, 0)] if rows.size else []))
        return out

    def describe(self):
        return {"layout": "dim0", "shapes": [list(s) for s in self.shapes],
                "rows": [[r.start, r.end] for r in self.rows]}


class FSDP2(FSDPStrategy):
    name = "fsdp2"
    TRAINS_FROZEN = True  # each parameter is its own shard: a frozen one is simply not reduced
    # async_reduce_scatter: one unit's reduce-scatter in flight while the next unit's backward
    # computes (module docstring, "Asynchronous reduce-scatter")
    OPTIONS = {**FSDPStrategy.OPTIONS, "batched": True, "async_reduce_scatter": False}

    @classmethod
    def check_options(cls, options):
        if options["async_reduce_scatter"] and not options["batched"]:
            raise ValueError("async_reduce_scatter keeps one unit's batched reduce-scatter in flight: "
                             "it needs batched=True")

    def __init__(self, model, dist, recipe, adam=None, **options):
        # read before the base constructor builds the units, which take it
        self.async_reduce = bool(options.get("async_reduce_scatter", False))
        self._in_flight: Dim0Unit | None = None
        super().__init__(model, dist, recipe, adam, **options)

    def make_unit(self, index, module):
        return Dim0Unit(index, module, self.shard_axis(), self.comm, self.ledger,
                        self.param_dtype, self.grad_dtype, tag=self.tag, batched=bool(self.options["batched"]),
                        async_reduce=self.async_reduce)

    def post_backward(self, u):
        # At most one reduce-scatter in flight: the previous unit's is waited for before this
        # unit reduces (torch's reduce_scatter_max_input_buffers = 1, FSDPParamGroup.post_backward).
        self._finish_reduce()
        shards = super().post_backward(u)
        if self.async_reduce and u.grad_shards:
            self._in_flight = u
        return shards

    def _finish_reduce(self) -> None:
        if self._in_flight is not None:
            self._in_flight.finish_reduce()
            self._in_flight = None

    def after_backward(self) -> None:
        super().after_backward()
        self._finish_reduce()  # the last unit's (the embeddings'): the optimizer step needs it

    def finish_grad_sync(self) -> None:
        super().finish_grad_sync()
        self._finish_reduce()

    def local_state_dict(self) -> dict[str, tuple[int, torch.Tensor]]:
        """This rank's parameters as (first row, shard) per parameter name: no communication."""
        out = {}
        for u in self.units:
            prefix = dict((m, n) for n, m in self.model.named_modules())[u.module]
            for (name, _), rows, sh in zip(u.params, u.rows, u.shards):
                out[f"{prefix}.{name}" if prefix else name] = (rows.start, sh.detach().clone())
        return out
