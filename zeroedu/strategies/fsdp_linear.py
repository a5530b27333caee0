"""A hand-written FSDP linear layer (and its DDP twin): ZeRO-3 in one autograd Function.

Each of the N ranks stores rows [r·c, min((r+1)·c, d_out)) of W (d_out x d_in) and b, with
c = ceil(d_out / N) (`shard.dim0_rows`: uneven, the last shard may be short or empty).

    forward(X):   W = all_gather(W shards)        # rows padded to c on the wire only
                  Y = X Wᵀ + b ; free W           # X is this rank's micro-batch
    backward(dY): W = all_gather(W shards) again  # it was freed after forward
                  dX = dY W ; free W              # local: the batch is local
                  dW = dYᵀ X, db = Σ dY           # full shape, from the local batch only
                  dW_shard = reduce_scatter(dW)/N # SUM over ranks, keep my rows; /N = mean loss

Bytes per step per rank (ring, (N-1)/N of each padded buffer): all-gather W and b in forward,
W alone in backward (dX = dY W needs no b), reduce-scatter dW and db: 3Ψ less one bias, i.e.
`theory.exact_comm("fsdp2", [[W.shape, b.shape]], N)` minus one all-gather of b. `DDPLinear`
keeps W whole and all-reduces dW, db instead: 2Ψ, and N times the parameter memory.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import shard
from ..runtime.comm import tag


def _gather_rows(part: torch.Tensor, d0: int, layer, what: str) -> torch.Tensor:
    """All-gather dim-0 shards into the full tensor (pad each to c rows on the wire)."""
    c = shard.dim0_chunk_rows(d0, layer.axis.size)
    padded = torch.zeros((c, *part.shape[1:]), dtype=part.dtype, device=part.device)
    padded[:part.shape[0]] = part
    full = torch.empty((c * layer.axis.size, *part.shape[1:]), dtype=part.dtype, device=part.device)
    layer.comm.all_gather(full, padded, layer.axis, tag(layer.tag, what, "params"))
    return full[:d0]


def _scatter_rows(full: torch.Tensor, rows: shard.Range, layer, what: str) -> torch.Tensor:
    """Reduce-scatter (SUM) a full gradient; return this rank's rows, divided by N (`mean_grad`)."""
    n = layer.axis.size
    c = shard.dim0_chunk_rows(full.shape[0], n)
    padded = torch.zeros((c * n, *full.shape[1:]), dtype=full.dtype, device=full.device)
    padded[:full.shape[0]] = full
    mine = torch.empty((c, *full.shape[1:]), dtype=full.dtype, device=full.device)
    layer.comm.reduce_scatter(mine, padded, layer.axis, tag(layer.tag, what, "grads"))
    return layer.mean_grad(mine[:rows.size])


class _FSDPLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_shard, b_shard, layer):
        w = _gather_rows(w_shard, layer.out_features, layer, "weight")
        b = _gather_rows(b_shard, layer.out_features, layer, "bias")
        y = x @ w.T + b
        ctx.save_for_backward(x)  # only X: W is gathered again in backward, not kept
        ctx.layer = layer
        return y  # w, b go out of scope here: the unsharded weight is freed

    @staticmethod
    def backward(ctx, dy):
        (x,), layer = ctx.saved_tensors, ctx.layer
        w = _gather_rows(layer.weight.detach(), layer.out_features, layer, "weight")
        dx = dy @ w
        del w
        dw = _scatter_rows(dy.T @ x, layer.rows, layer, "weight")
        db = _scatter_rows(dy.sum(0), layer.rows, layer, "bias")
        return dx, dw, db, None


class FSDPLinear(nn.Module):
    """nn.Linear whose W and b are sharded on dim 0 over `axis`; communicates through `comm`."""

    def __init__(self, linear: nn.Linear, axis, comm, tag: str = "fsdp_linear"):
        super().__init__()
        self.axis, self.comm, self.tag = axis, comm, tag
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.rows = shard.dim0_rows(linear.out_features, axis.size, axis.rank)
        self.weight = nn.Parameter(linear.weight.detach()[self.rows.start:self.rows.end].clone())
        self.bias = nn.Parameter(linear.bias.detach()[self.rows.start:self.rows.end].clone())

    def forward(self, x):
        return _FSDPLinearFn.apply(x, self.weight, self.bias, self)

    def mean_grad(self, summed: torch.Tensor) -> torch.Tensor:
        """The reduce-scatter SUMs over ranks; each rank's loss is a mean over its own batch, so
        the gradient of the global batch's mean is the sum divided by N."""
        return summed / self.axis.size

    def full_parameters(self) -> list[torch.Tensor]:
        return [_gather_rows(p.detach(), self.out_features, self, w) for w, p in (("weight", self.weight), ("bias", self.bias))]


class _DDPLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, layer):
        ctx.save_for_backward(x, w)
        ctx.layer = layer
        return x @ w.T + b

    @staticmethod
    def backward(ctx, dy):
        (x, w), layer = ctx.saved_tensors, ctx.layer
        dw, db = dy.T @ x, dy.sum(0)
        for what, g in (("weight", dw), ("bias", db)):  # SUM over ranks, then /N: the mean loss
            layer.comm.all_reduce(g, layer.axis, tag(layer.tag, what, "grads"))
        n = layer.axis.size
        return dy @ w, dw / n, db / n, None


class DDPLinear(nn.Module):
    """The DDP variant: W and b replicated on every rank; gradients all-reduced in backward."""

    def __init__(self, linear: nn.Linear, axis, comm, tag: str = "ddp_linear"):
        super().__init__()
        self.axis, self.comm, self.tag = axis, comm, tag
        self.weight = nn.Parameter(linear.weight.detach().clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        return _DDPLinearFn.apply(x, self.weight, self.bias, self)

    def full_parameters(self) -> list[torch.Tensor]:
        return [self.weight.detach().clone(), self.bias.detach().clone()]


# ---------------------------------------------------------------- verification jobs
def make_linear(in_features: int, out_features: int, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(in_features, out_features)


def make_linear_batch(step: int, global_batch: int, in_features: int, out_features: int):
    g = torch.Generator().manual_seed(500 + step)
    return torch.randn(global_batch, in_features, generator=g), torch.randn(global_batch, out_features, generator=g)


def linear_job(ctx, kind: str = "fsdp", in_features: int = 12, out_features: int = 7, global_batch: int = 24,
               steps: int = 5, lr: float = 0.1, layer: str | None = None) -> dict:
    """Train FSDPLinear (`kind="fsdp"`), DDPLinear (`"ddp"`) or any layer class `layer`
    ("package.module:Class", e.g. a notebook's deliberately broken one) with SGD on this rank's
    slice; returns the losses, the full parameters (also after the first step), bytes sent
    (ring model) and, per call of the last step (forward, backward): the ring model, the bytes on
    the wire (this rank's sockets), the messages, and the bytes of the tensors saved for backward."""
    from fractions import Fraction

    from ..models import local_slice
    from ..runtime.rank import resolve_ref
    from ..runtime.comm import Comm
    from ..runtime.ledger import Ledger

    ledger = Ledger(ctx.rank)
    cls = resolve_ref(layer) if layer is not None else {"fsdp": FSDPLinear, "ddp": DDPLinear}[kind]
    mod = cls(make_linear(in_features, out_features), ctx.world_axis(), Comm(ledger))
    opt = torch.optim.SGD(mod.parameters(), lr=lr)
    meter = ctx.wire if getattr(ctx.wire, "available", False) else None
    sl = local_slice(global_batch, ctx.world_size, ctx.rank)
    losses, first_step, calls = [], None, {}

    def measure(call: str, fn):
        before, snap = len(ledger.comm), meter.snapshot() if meter is not None else None
        out = fn()
        recs = ledger.comm[before:]
        calls[call] = {"ring_model": float(sum((r.sent for r in recs), Fraction(0))),
                       "wire": meter.sent_since(snap).sent if meter is not None else None,
                       "messages": sum(r.messages for r in recs), "collectives": [r.op for r in recs]}
        return out

    for step in range(steps):
        ledger.begin_step(step)
        x, y = make_linear_batch(step, global_batch, in_features, out_features)
        opt.zero_grad()
        saved: dict = {}

        def pack(t):
            saved[(t.data_ptr(), tuple(t.shape))] = t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = measure("forward", lambda: mod(x[sl]))
        loss = torch.nn.functional.mse_loss(out, y[sl])
        measure("backward", loss.backward)
        opt.step()
        losses.append(loss.item())
        if step == 0:
            first_step = [p.detach().clone() for p in mod.full_parameters()]
        calls["saved_bytes"] = sum(saved.values())
    sent = {k: float(v) for k, v in ledger.comm_by_collective().items()}
    return {"rank": ctx.rank, "losses": losses, "sent": sent, "calls": calls,
            "shard_rows": [tuple(p.shape) for p in mod.parameters()],
            "shard_shapes": [tuple(p.shape) for p in mod.parameters()],
            "params_after_first_step": first_step, "params": mod.full_parameters()}
