"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, §3) and sequence parallelism (Korthikanti
et al. 2022, §4.2.2) for zeroedu's GPT blocks, from scratch on `comm`, on a `tp` axis of t ranks.

Algorithm. Each block's matrices are split so that every matmul runs on a slice and only one sum
per sub-layer crosses the axis:

    MLP        fc  column-parallel: rank r keeps rows r·(4h/t) .. of W₁ and b₁      Y_r = GeLU(X W₁ᵣᵀ + b₁ᵣ)
               fc2 row-parallel:    rank r keeps the matching columns of W₂        Z = Σ_r Y_r W₂ᵣᵀ, + b₂ once
    attention  qkv column-parallel by heads: rank r keeps heads r·H/t .. (r+1)·H/t of q, k and v,
               the attention core runs on those heads only; proj row-parallel, + its bias once.

Two conjugate operators join the slices (§3, Figure 3), as autograd functions:

    f  identity forward, all-reduce backward   before each column-parallel sub-layer (its input
                                                is replicated; each rank's dX is a partial sum)
    g  all-reduce forward, identity backward   after each row-parallel sub-layer (each rank's
                                                output is a partial sum of Z)

Sequence parallelism (Korthikanti §4.2.2, Figure 5) keeps the activations between sub-layers
(LayerNorm, residual, biases) split along the sequence, s/t positions per rank, and replaces g by
a reduce-scatter along the sequence (ḡ: reduce-scatter forward, all-gather backward) and f by an
all-gather (all-gather forward, reduce-scatter backward). An all-reduce is a reduce-scatter plus
an all-gather, so the bytes are the same; what changes is that LayerNorm's inputs and the
residual stream are stored once per t ranks. The all-gather runs inside the column-parallel layer
(`SequenceGatherLinear`, as Megatron-LM's), which saves its input as this rank's shard and
gathers it again in backward: the qkv and fc inputs are stored once per t ranks too.

Bytes per layer per step, per rank, with b·s·h activation elements of a bytes (ring model):
    TP       4 all-reduces (f, g in attention and MLP, forward and backward): 4 · 2(t-1)/t · bsha
    TP + SP  8 all-gathers / reduce-scatters of bsha:                           8 · (t-1)/t · bsha
             (the same total) + the 2 all-gathers again in backward:          2 · (t-1)/t · bsha.
             `theory.tensor_parallel` has the closed forms.

Memory per rank: the split matrices and their column-parallel biases hold 1/t; LayerNorm weights
and the row-parallel biases are replicated (1x on every rank). Without SP their gradients are the
same on every tp rank (their inputs are replicated); with SP each rank's gradient covers its part
of the sequence, so each such parameter enters the computation through f, whose backward
all-reduces its gradient over tp (`_replicated`; Megatron-LM sums the same "layernorm grads (for
sequence parallelism)" over tp after backward, `_allreduce_non_tensor_model_parallel_grads` in
megatron/core/distributed/finalize_model_grads.py): 2(t-1)/t · 6h·a more bytes per layer. The gradients leave
backward whole, so a data-parallel strategy wrapped around the model (FSDP2 over dp) needs to
know nothing of tp.

Time: each f / g is a blocking collective on the critical path (the next matmul needs its
result), which is why TP stays inside an NVLink domain.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..runtime.comm import tag


# ---------------------------------------------------------------------------- the operators
class _Ctx:
    """What an operator needs to talk: the axis, the comm, and the tag's prefix."""

    def __init__(self, axis, comm, name: str):
        self.axis, self.comm, self.name = axis, comm, name

    def all_reduce(self, t: torch.Tensor, where: str) -> torch.Tensor:
        t = t.contiguous().clone()
        self.comm.all_reduce(t, self.axis, tag("tp", self.name, "data", where))
        return t

    def gather_seq(self, t: torch.Tensor, where: str) -> torch.Tensor:
        """(B, S/t, D) shards -> (B, S, D), concatenated along the sequence in axis order."""
        n = self.axis.size
        shard = t.transpose(0, 1).contiguous()  # (S/t, B, D): a rank's positions are contiguous
        out = torch.empty((n * shard.shape[0], *shard.shape[1:]), dtype=t.dtype, device=t.device)
        self.comm.all_gather(out, shard, self.axis, tag("tp", self.name, "data", where))
        return out.transpose(0, 1).contiguous()

    def scatter_seq(self, t: torch.Tensor, where: str) -> torch.Tensor:
        """(B, S, D) partial sums -> this rank's (B, S/t, D) positions of the sum."""
        n = self.axis.size
        full = t.transpose(0, 1).contiguous()  # (S, B, D)
        if full.shape[0] % n:
            raise ValueError(f"sequence parallelism needs the sequence ({full.shape[0]}) divisible by t = {n}")
        out = torch.empty((full.shape[0] // n, *full.shape[1:]), dtype=t.dtype, device=t.device)
        self.comm.reduce_scatter(out, full, self.axis, tag("tp", self.name, "data", where))
        return out.transpose(0, 1).contiguous()


class CopyToTP(torch.autograd.Function):
    """f: identity forward, all-reduce (SUM) of the input gradient backward."""

    @staticmethod
    def forward(ctx, x, c: _Ctx, where: str = "f"):
        ctx.c, ctx.where = c, where
        return x

    @staticmethod
    def backward(ctx, dy):
        return ctx.c.all_reduce(dy, ctx.where), None, None


class ReduceFromTP(torch.autograd.Function):
    """g: all-reduce (SUM) forward, identity backward."""

    @staticmethod
    def forward(ctx, x, c: _Ctx):
        return c.all_reduce(x, "g")

    @staticmethod
    def backward(ctx, dy):
        return dy, None


class GatherFromSequence(torch.autograd.Function):
    """The sequence gathered for what runs whole on every rank (the head): all-gather forward;
    every rank's gradient is then already the full one, so backward keeps this rank's positions
    (summing would count it t times: Megatron-LM's `gather_from_sequence_parallel_region(...,
    tensor_parallel_output_grad=False)`, whose backward splits, megatron/core/tensor_parallel/
    mappings.py). Before a column-parallel layer the gather is `SequenceGatherLinear`'s."""

    @staticmethod
    def forward(ctx, x, c: _Ctx):
        ctx.c = c
        return c.gather_seq(x, "f")

    @staticmethod
    def backward(ctx, dy):
        t, r, s = ctx.c.axis.size, ctx.c.axis.rank, dy.shape[1]
        return dy[:, r * s // t:(r + 1) * s // t].contiguous(), None


class ScatterToSequence(torch.autograd.Function):
    """SP's ḡ: reduce-scatter along the sequence forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, c: _Ctx):
        ctx.c = c
        return c.scatter_seq(x, "g")

    @staticmethod
    def backward(ctx, dy):
        return ctx.c.gather_seq(dy, "g"), None


class SequenceGatherLinear(torch.autograd.Function):
    """SP's all-gather fused with the column-parallel layer it feeds, as Megatron-LM runs it
    (`LinearWithGradAccumulationAndAsyncCommunication`, megatron/core/tensor_parallel/layers.py):
    forward all-gathers this rank's s/t positions and multiplies; it saves the *shard*, not the
    gathered sequence, so what the layer keeps for backward is divided by t (Korthikanti §4.2.2's
    34/t). Backward pays for that with one more all-gather (the input again, for the weight
    gradient), then reduce-scatters the input gradient along the sequence (it is a partial sum
    over the tp ranks' columns). Megatron overlaps the re-gather with the input-gradient matmul;
    here it is issued first and waited for."""

    @staticmethod
    def forward(ctx, x, weight, bias, c: _Ctx):
        ctx.c, ctx.has_bias = c, bias is not None
        ctx.save_for_backward(x, weight)
        return F.linear(c.gather_seq(x, "f"), weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        full = ctx.c.gather_seq(x, "f_regather")  # (B, S, in): the input again, for dW
        dx = ctx.c.scatter_seq(dy.matmul(weight), "f")  # partial sums over tp -> this rank's positions
        dw = dy.reshape(-1, dy.shape[-1]).t().matmul(full.reshape(-1, full.shape[-1]))
        db = dy.sum(dim=(0, 1)) if ctx.has_bias else None
        return dx, dw, db, None


def _leave(x, c: _Ctx, sp: bool):
    return ScatterToSequence.apply(x, c) if sp else ReduceFromTP.apply(x, c)


# ---------------------------------------------------------------------------- the layers
def _rows(t: torch.Tensor, idx: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.detach().index_select(0, idx).clone())


class ColumnParallelLinear(nn.Module):
    """nn.Linear whose output features are split: rank r keeps rows `out_rows` of W and b.
    `forward` expects the input already entered (f or SP's all-gather) and returns this rank's
    slice of the output features."""

    def __init__(self, linear: nn.Linear, out_rows: torch.Tensor):
        super().__init__()
        self.weight = _rows(linear.weight, out_rows)
        self.bias = _rows(linear.bias, out_rows) if linear.bias is not None else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def entered(self, x, c: _Ctx, sp: bool):
        """The layer on its replicated input: through f (TP), or, with SP, on this rank's
        positions, all-gathered inside the layer (`SequenceGatherLinear`)."""
        if sp:
            return SequenceGatherLinear.apply(x, self.weight, self.bias, c)
        return self(CopyToTP.apply(x, c))


class RowParallelLinear(nn.Module):
    """nn.Linear whose input features are split: rank r keeps columns `in_cols` of W; the bias is
    replicated and added once, after the sum (by the caller, after g / ḡ)."""

    def __init__(self, linear: nn.Linear, in_cols: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().index_select(1, in_cols).clone())
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None

    def forward(self, x):
        return F.linear(x, self.weight)  # a partial sum: the bias waits for the reduction


def _row_out(layer: RowParallelLinear, x, c: _Ctx, sp: bool):
    """A row-parallel layer's output: the partial products summed over tp (g, or SP's
    reduce-scatter), then the bias once. On one rank there is nothing to sum, and the layer is
    exactly the nn.Linear it was (the bias inside the matmul, as torch adds it): tp = 1 is the
    unsplit model, to the bit."""
    if c.axis.size == 1:
        return F.linear(x, layer.weight, layer.bias)
    return _leave(layer(x), c, sp) + _replicated(layer.bias, c, sp)


def _replicated(p: torch.Tensor, c: _Ctx, sp: bool) -> torch.Tensor:
    """A replicated parameter as a computation on this rank's positions uses it. Without SP every
    tp rank computes the same thing and gets the same, whole gradient. With SP each rank sees only
    its s/t positions, so the gradient passes through f (identity forward, all-reduce backward):
    every rank's parameter gradient comes out whole, before any data-parallel strategy reads it
    (Megatron-LM all-reduces the same gradients after backward)."""
    return CopyToTP.apply(p, c, "replicated_grads") if sp else p


def _span(start: int, size: int) -> torch.Tensor:
    return torch.arange(start, start + size)


class TPMLP(nn.Module):
    """zeroedu's MLP (fc, GELU, fc2) with fc column-parallel and fc2 row-parallel."""

    def __init__(self, mlp: nn.Module, c: _Ctx, sp: bool = False):
        super().__init__()
        t, r = c.axis.size, c.axis.rank
        width = mlp.fc.out_features
        if width % t:
            raise ValueError(f"the MLP width {width} is not divisible by t = {t}")
        cols = _span(r * width // t, width // t)
        self.fc, self.fc2 = ColumnParallelLinear(mlp.fc, cols), RowParallelLinear(mlp.fc2, cols)
        self.c, self.sp = c, sp

    def forward(self, x):
        h = F.gelu(self.fc.entered(x, self.c, self.sp), approximate="tanh")
        return _row_out(self.fc2, h, self.c, self.sp)


class TPAttention(nn.Module):
    """zeroedu's CausalSelfAttention with its heads split: qkv column-parallel (each rank keeps its
    heads' rows of q, k and v, which sit in three places of the fused (3h, h) weight), the core on
    those heads, proj row-parallel."""

    def __init__(self, attn: nn.Module, c: _Ctx, sp: bool = False):
        super().__init__()
        t, r = c.axis.size, c.axis.rank
        if attn.n_heads % t:
            raise ValueError(f"{attn.n_heads} heads are not divisible by t = {t}")
        self.n_heads, self.d_head = attn.n_heads // t, attn.d_head
        d, w = attn.n_heads * attn.d_head, self.n_heads * attn.d_head
        mine = _span(r * w, w)
        self.qkv = ColumnParallelLinear(attn.qkv, torch.cat([mine, mine + d, mine + 2 * d]))
        self.core = attn.core
        self.proj = RowParallelLinear(attn.proj, mine)
        self.c, self.sp = c, sp

    def forward(self, x):
        qkv = self.qkv.entered(x, self.c, self.sp)
        B, S, _ = qkv.shape
        H, Dh = self.n_heads, self.d_head
        q, k, v = qkv.split(H * Dh, dim=2)

        def heads(t):
            return t.view(B, S, H, Dh).transpose(1, 2).clone(memory_format=torch.contiguous_format)

        y = self.core(heads(q * (1.0 / math.sqrt(Dh))), heads(k), heads(v))
        y = y.transpose(1, 2).contiguous().view(B, S, H * Dh)
        return _row_out(self.proj, y, self.c, self.sp)


class TPBlock(nn.Module):
    """A pre-LayerNorm block with TP (and, with `sp`, sequence parallelism): the LayerNorms are
    replicated; with `sp` the block's input and output are this rank's s/t positions."""

    def __init__(self, block: nn.Module, axis, comm, sp: bool = False, name: str = "block"):
        super().__init__()
        c = _Ctx(axis, comm, name)
        # registered in Block's order (ln1, attn, ln2, mlp), so parameter lists line up with it
        self.ln1 = block.ln1
        self.attn = TPAttention(block.attn, c, sp)
        self.ln2 = block.ln2
        # A mixture of experts (`models.moe`) stays whole on every tp rank: each runs it on the same
        # tokens (the residual stream is replicated over tp), so its gradients are whole and equal
        # on every tp rank, as the embedding's; its experts are split over ep instead.
        self.moe = getattr(block.mlp, "spec", None) is not None
        self.mlp = block.mlp if self.moe else TPMLP(block.mlp, c, sp)
        self.c, self.sp = c, sp

    def forward(self, x):
        x = x + self.attn(self._norm(self.ln1, x))
        return x + self.mlp(self._norm(self.ln2, x))

    def _norm(self, ln: nn.LayerNorm, x):
        if not self.sp:
            return ln(x)
        return F.layer_norm(x, ln.normalized_shape, _replicated(ln.weight, self.c, True),
                            _replicated(ln.bias, self.c, True), ln.eps)

    def replicated_parameters(self) -> list[nn.Parameter]:
        """Parameters every tp rank holds whole: the LayerNorms and the row-parallel biases."""
        if self.moe:
            raise ValueError("a mixture of experts beside tp runs without sequence parallelism")
        return [*self.ln1.parameters(), *self.ln2.parameters(), self.attn.proj.bias, self.mlp.fc2.bias]


class TPGPT(nn.Module):
    """zeroedu's GPT with every block tensor-parallel (`TPBlock`) on the `tp` axis. The embedding
    and the head are replicated (neither is vocab-parallel here). With `sp` the embedding's output
    is split along the sequence (each rank keeps its s/t positions: a slice, nothing sent) and the
    last block's output is all-gathered before the head, so the head and the loss run whole on
    every rank, as without SP."""

    def __init__(self, model: nn.Module, axis, comm, sp: bool = False):
        super().__init__()
        # registered in the unsplit GPT's order (embed, blocks, head): parameter lists match it
        self.embed, self.sp = model.embed, sp
        self.blocks = nn.ModuleList(TPBlock(b, axis, comm, sp=sp, name=f"block{i}")
                                    for i, b in enumerate(model.blocks))
        self.head = model.head
        self.c = _Ctx(axis, comm, "head")
        self.loss = model.loss
        self.cfg = model.cfg  # its shape (a pipeline stage cut from it reads the width)

    def moe_layers(self) -> list[nn.Module]:
        """A mixture of experts' layers, replicated over tp (`TPBlock`)."""
        return [b.mlp for b in self.blocks]

    def expert_units(self) -> list[nn.Module]:
        """The unit policy under expert parallelism (`models.moe.MoEGPT.expert_units`) for the
        tp-split blocks: [embed, per block its LayerNorms, tp attention and router, its experts, head]."""
        from ..models.moe import _Shared

        out = [self.embed]
        for b in self.blocks:
            out += [_Shared(b.ln1, b.attn, b.ln2, b.mlp.router), b.mlp.experts]
        return out + [self.head]

    def units(self) -> list[nn.Module]:
        """The unit policy FSDP composes with: [embed, *blocks, head], as the unsplit GPT's."""
        return [self.embed, *self.blocks, self.head]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        if self.sp:
            t, r = self.c.axis.size, self.c.axis.rank
            s = x.shape[1]
            if s % t:
                raise ValueError(f"sequence parallelism needs the sequence ({s}) divisible by t = {t}")
            # keep this rank's positions; f sums the positions' gradients over tp in backward, so
            # the (replicated) embedding's gradient comes out whole on every rank
            # (a copy: a slice would keep the whole sequence's storage alive in what ln1 saves)
            x = CopyToTP.apply(x, self.c, "embed")[:, r * s // t:(r + 1) * s // t].clone(
                memory_format=torch.contiguous_format)
        for block in self.blocks:
            x = block(x)
        if self.sp:  # the head runs whole on every rank: its input's gradient is not a partial sum
            x = GatherFromSequence.apply(x, self.c)
        return self.head(x)



def unsplit(names: list[str], per_rank: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """The unsplit GPT's parameters from the t tp ranks' (`per_rank[r]`, in TPGPT's parameter
    order, which is the GPT's, named `names`): each split parameter concatenated back along the
    dimension it was cut (qkv by heads inside each of q, k and v; fc by rows; proj and fc2 by
    columns), a replicated one taken from rank 0. The inverse of the slicing in `TPAttention`
    and `TPMLP`: what a checkpoint consolidator does with Megatron's TP shards."""
    t = len(per_rank)
    out = []
    for i, name in enumerate(names):
        parts = [p[i] for p in per_rank]
        if name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            w = parts[0].shape[0] // 3
            out.append(torch.cat([parts[r][k * w:(k + 1) * w] for k in range(3) for r in range(t)]))
        elif name.endswith(("mlp.fc.weight", "mlp.fc.bias")):
            out.append(torch.cat(parts))
        elif name.endswith(("attn.proj.weight", "mlp.fc2.weight")):
            out.append(torch.cat(parts, dim=1))
        else:
            out.append(parts[0])
    return out
