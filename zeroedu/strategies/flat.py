"""The flat-buffer unit: one padded buffer per unit, cut into N equal chunks.

Used by every strategy whose layout is ``flat`` in `zeroedu.catalog`: ZeRO-1, ZeRO-2,
Megatron's distributed optimizer (parameters and gradients whole, optimizer state sharded) and
FSDP1 / the hybrids (parameters sharded too). A *unit* is a group of parameters communicated
together (one top-level layer by default). `FlatUnit` lays the group out with
`shard.FlatLayout` (flattened, concatenated, padded with zeros to a multiple of the shard count)
and names this rank's chunk in the buffer-wide index space, `shard_range`:

    param buffer  [ w0 ........ | b0 .. | w1 ..... | pad ]   padded_numel elements, param dtype
    grad buffer   [ same layout, grad dtype                                           ]
    shard_range   [r*c, (r+1)*c), c = padded_numel / N       (buffer-wide positions)

Two ways to hold the parameters:

* ``shard_params=False`` (ZeRO-1/2, Megatron): the whole buffer is kept; every original
  parameter becomes a *view* into it, so the model's forward and autograd work on ordinary
  `nn.Parameter`s while the strategy communicates one contiguous tensor. `param_shard` is the
  view of this rank's chunk: an in-place reduce-scatter into it, an optimizer step on it and an
  all-gather back into the buffer need no copies.
* ``shard_params=True`` (FSDP1, HSDP, HFSDP): only this rank's chunk is kept (`param_shard`, a
  tensor of its own); `param_buffer` is the unsharded flat buffer, allocated with no storage:
  the FSDP lifecycle gives it bytes to all-gather into and takes them back (`fsdp_units`).

Gradients: `alloc_grad` makes a full gradient buffer of the same layout (optionally bound as
every parameter's `.grad`, so autograd accumulates straight into it); `grad_shard` is where this
rank's reduced chunk lives, either a view of that buffer (`grad_shard_view`) or a tensor of its
own (`alloc_grad_shard`) when the full buffer does not outlive backward.

`param_pieces` says which parameter elements the unit holds on this rank: the one question a
checkpoint asks. Only index math from `zeroedu.shard` is used; nothing here communicates.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import shard
from ..runtime.ledger import Ledger


class FlatUnit:
    """One unit's parameters flattened into a padded buffer of `n` equal chunks."""

    def __init__(self, name: str, params: list[nn.Parameter], n: int, rank: int, param_dtype, grad_dtype,
                 ledger: Ledger, *, pad_multiple: int | None = None, shard_params: bool = False,
                 index: int | None = None):
        pad_multiple = n if pad_multiple is None else pad_multiple
        if pad_multiple % n:
            raise ValueError(f"padding multiple {pad_multiple} must be a multiple of the shard count {n}")
        self.name, self.n, self.rank = name, n, rank
        self.index = index  # the unit's number in its strategy, for the ledger's events
        self.param_dtype, self.grad_dtype, self.ledger = param_dtype, grad_dtype, ledger
        self.shard_params = shard_params
        self.layout = shard.FlatLayout([tuple(p.shape) for p in params], pad_multiple)
        self.shard_range = shard.shard_range(self.layout.padded_numel, n, rank)  # buffer-wide
        # With whole parameters the originals become views of the buffer and stay bound; with
        # sharded ones the unit must not keep the full fp32 originals alive.
        self.params = [] if shard_params else list(params)
        device = params[0].device
        with torch.no_grad():
            flat = torch.zeros(self.layout.padded_numel, dtype=param_dtype, device=device)
            for i, p in enumerate(params):
                self._slice(flat, self.layout.param_range(i)).copy_(p.detach().reshape(-1))
        if shard_params:
            self.param_shard = ledger.track(self._slice(flat, self.shard_range).clone(), "param")
            # The unsharded buffer: a leaf autograd differentiates, with no bytes until unshard.
            self.param_buffer = torch.empty(self.layout.padded_numel, dtype=param_dtype, device=device,
                                            requires_grad=True)
            self.param_buffer.untyped_storage().resize_(0)
            ledger.track(self.param_buffer, "gathered")
        else:
            self.param_buffer = ledger.track(flat, "param")
            for i, p in enumerate(self.params):
                # Re-point the parameter at its slice of the buffer: from now on the model reads
                # and autograd differentiates the buffer itself (FSDP1's FlatParameter trick).
                p.data = self.param_view(i)
            self.param_shard = self._slice(flat, self.shard_range)
        self.grad_buffer: torch.Tensor | None = None
        self.grad_shard: torch.Tensor | None = None

    @property
    def num_params(self) -> int:
        return len(self.layout.shapes)

    # ------------------------------------------------------------------ views
    @staticmethod
    def _slice(buf: torch.Tensor, r: shard.Range) -> torch.Tensor:
        return buf[r.start:r.end]

    def param_view(self, i: int, buf: torch.Tensor | None = None) -> torch.Tensor:
        """Parameter i, in its own shape, as a view of the param buffer (or of `buf`)."""
        buf = self.param_buffer if buf is None else buf
        return self._slice(buf, self.layout.param_range(i)).view(self.layout.shapes[i])

    def param_views(self) -> list[torch.Tensor]:
        return [self.param_view(i) for i in range(self.num_params)]

    # ------------------------------------------------------------------ gradient buffers
    def alloc_grad(self, bind: bool = True, category: str = "grad") -> torch.Tensor:
        """A zeroed full gradient buffer of the unit's layout; with `bind`, every `p.grad`
        becomes a view into it.

        Autograd accumulates into an existing `.grad` in place (grad mode is off during the
        accumulation, which it is inside backward), so backward writes straight into the buffer
        and the buffer is what gets communicated."""
        self.grad_buffer = self.ledger.track(
            torch.zeros(self.layout.padded_numel, dtype=self.grad_dtype, device=self.param_buffer.device),
            category)
        if bind:
            for i, p in enumerate(self.params):
                p.grad = self.param_view(i, self.grad_buffer)
        return self.grad_buffer

    def grad_view(self, i: int) -> torch.Tensor:
        """Parameter i's gradient, in its own shape, as a view of the full gradient buffer."""
        return self.param_view(i, self.grad_buffer)

    def grad_shard_view(self) -> torch.Tensor:
        """This rank's chunk of the full gradient buffer (a view: the buffer must stay alive)."""
        self.grad_shard = self._slice(self.grad_buffer, self.shard_range)
        return self.grad_shard

    def alloc_grad_shard(self) -> torch.Tensor:
        """A persistent gradient chunk of its own, for layouts whose full gradient is freed."""
        self.grad_shard = self.ledger.track(
            torch.zeros(self.shard_range.size, dtype=self.grad_dtype, device=self.param_buffer.device), "grad")
        return self.grad_shard

    def free_grad(self) -> None:
        """Drop every reference to the full gradient buffer so its memory really goes.

        The views in `p.grad` share its storage, so they must go too; the ledger holds only a
        weak reference and stops counting the buffer once it is gone."""
        for p in self.params:
            p.grad = None
        self.grad_buffer = None

    def zero_grad(self) -> None:
        if self.grad_buffer is not None:
            self.grad_buffer.zero_()

    # ------------------------------------------------------------------ what this rank holds
    def param_pieces(self) -> list[tuple[torch.Tensor, list[tuple[int, int, int, int]]]]:
        """The tensor holding parameter values on this rank and the pieces it holds: the whole
        buffer (every parameter, at its buffer-wide offset), or this rank's chunk (the parts of
        parameters inside `shard_range`, at their local positions). Padding is in no piece."""
        L = self.layout
        if not self.shard_params:
            return [(self.param_buffer, [(i, 0, k, L.offsets[i]) for i, k in enumerate(L.numels)])]
        pieces = []
        for i in range(self.num_params):
            b = L.param_range(i).intersect(self.shard_range)
            if b.size:
                pieces.append((i, b.start - L.offsets[i], b.end - L.offsets[i], b.start - self.shard_range.start))
        return [(self.param_shard, pieces)]

    def describe(self) -> dict:
        L = self.layout
        return {"layout": "flat", "numel": L.numel, "padded_numel": L.padded_numel,
                "param_offsets": list(L.offsets), "param_numels": list(L.numels),
                "shard_range": [self.shard_range.start, self.shard_range.end]}
