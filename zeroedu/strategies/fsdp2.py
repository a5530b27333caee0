"""FSDP2: every parameter sharded on its own along tensor dim 0 (per-parameter sharding).

Algorithm (FSDP2 / `torch.distributed.fsdp.fully_shard`; FSDP paper, Zhao et al. 2023, §3 with
the per-parameter layout that replaced FlatParameter). Set-up: each parameter of shape
(d0, ...) is cut into chunks of c = ceil(d0/N) rows (`zeroedu.shard.dim0_rows`); rank r keeps
rows [r·c, min((r+1)·c, d0)) — the last rank(s) may hold fewer rows, or none. Nothing is
padded in storage, and every shard is a plain (rows, ...) tensor of the original parameter:
a rank's state dict is its shards plus their row offsets, no all-gather needed
(`local_state_dict`). Per step, per unit (lifecycle in `fsdp_units`):
  1. pre_forward: per parameter, all-gather the shards, each padded to c rows *on the wire*
     only, into a (N·c, ...) buffer whose first d0 rows are the full parameter;
  2. post_forward: free the buffers (reshard_after_forward=True);
  3. pre_backward: all-gather again;
  4. post_backward: reduce-scatter each full gradient (SUM, grad dtype, padded to N·c rows) and
     keep this rank's rows as its grad shard; free gradients and buffers;
  5. step: Adam on each shard (fp32 master/m/v of the same rows), scale 1/N.

Memory per rank (model states): (P + G + K) · Σ_params rows_r · (numel/d0): 16Ψ/N with mixed-bf16
up to the uneven last shard; ranks can differ (`theory.exact_model_states("fsdp2", ..., rank)`).
Communication per rank: 2 all-gathers ΨP + reduce-scatter ΨG, each (N-1)/N of the row-padded
sizes (`shard.dim0_padded_numel`): 3Ψ, 1.5x DDP; 2Ψ with reshard_after_forward=False.
torch's FSDP2 batches a unit's parameters into one all-gather (copy-in/copy-out); here each
parameter has its own collective: the same bytes, more, smaller messages, no copies.
"""
from __future__ import annotations

import torch

from .. import shard
from .fsdp_units import FSDPStrategy, Unit


class Dim0Unit(Unit):
    """A unit whose every parameter is its own dim-0 shard; `leaves[j]` is parameter j's
    row-padded (N·c, ...) unsharded buffer."""

    def __init__(self, index, module, axis, comm, ledger, param_dtype, grad_dtype, tag):
        super().__init__(index, module, axis, comm, ledger, param_dtype, grad_dtype, tag)
        n, r = axis.size, axis.rank
        self.shapes, self.rows, self.chunk_rows = [], [], []
        for _, p in self.params:
            if p.dim() == 0:
                raise ValueError("a 0-dim parameter cannot be sharded on dim 0")
            rows, c = shard.dim0_rows(p.shape[0], n, r), shard.dim0_chunk_rows(p.shape[0], n)
            self.shapes.append(tuple(p.shape))
            self.rows.append(rows)
            self.chunk_rows.append(c)
            sh = p.detach()[rows.start:rows.end].to(param_dtype).clone()  # (rows, ...), maybe empty
            self.shards.append(ledger.track(sh, "param"))
            self.grad_shards.append(ledger.track(torch.zeros_like(sh, dtype=grad_dtype), "grad"))
            self.leaves.append(self._new_leaf((c * n, *p.shape[1:])))
        self._detach_module_params()

    def _padded(self, t: torch.Tensor, c: int) -> torch.Tensor:
        """`t` padded with zero rows to c rows: only what travels on the wire is padded."""
        if t.shape[0] == c:
            return t
        out = self.ledger.track(t.new_zeros((c, *t.shape[1:])), "comm_buffer")
        out[:t.shape[0]] = t
        return out

    def _all_gather(self):
        return [self.comm.all_gather(leaf.data, self._padded(sh, c), self.axis,  # .data: see FlatUnit
                                     self.tag(self.name, "params", f"param{j}"), async_op=True)
                for j, (leaf, sh, c) in enumerate(zip(self.leaves, self.shards, self.chunk_rows))]

    def _reduce_scatter(self, full_grads, accumulate):
        for j, (g, gs, c) in enumerate(zip(full_grads, self.grad_shards, self.chunk_rows)):
            direct = gs.shape[0] == c and not accumulate
            out = gs if direct else self.ledger.track(g.new_empty((c, *g.shape[1:])), "comm_buffer")
            self.comm.reduce_scatter(out, g, self.axis, self.tag(self.name, "grads", f"param{j}"))
            if not direct:  # drop the wire padding; add to the sum of earlier micro-batches
                (gs.add_ if accumulate else gs.copy_)(out[:gs.shape[0]])

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

    def make_unit(self, index, module):
        return Dim0Unit(index, module, self.shard_axis(), self.comm, self.ledger,
                        self.param_dtype, self.grad_dtype, tag=self.tag)

    def local_state_dict(self) -> dict[str, tuple[int, torch.Tensor]]:
        """This rank's parameters as (first row, shard) per parameter name: no communication."""
        out = {}
        for u in self.units:
            prefix = dict((m, n) for n, m in self.model.named_modules())[u.module]
            for (name, _), rows, sh in zip(u.params, u.rows, u.shards):
                out[f"{prefix}.{name}" if prefix else name] = (rows.start, sh.detach().clone())
        return out
