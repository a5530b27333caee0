"""Lab 3: one FSDP linear layer, by hand: the backward pass.

W has shape (out_features, in_features) and is sharded on dim 0 (FSDP2's layout): rank r keeps
the rows `zeroedu.shard.dim0_rows(out_features, N, r)`, chunks of ceil(out_features / N) rows,
so the last rank(s) may hold fewer rows or none. On the wire every chunk is padded to the same
number of rows (a collective needs equal pieces).

The forward is written for you: all-gather the full W, compute y = x Wᵀ on the local batch, and
let the full W go. Write the backward:

  1. all-gather W again (it was freed after forward): use `gather_weight`;
  2. dX = dY W: local, no communication (every rank has its own batch);
  3. dW = dYᵀ X on the local batch: full shape, one contribution per rank;
  4. reduce-scatter dW over ranks (pad rows to N equal chunks, SUM), divide by N for the mean
     over ranks, and keep only this rank's real rows.

Communicate with `comm.reduce_scatter(out, inp, axis, tag="lab3/dW")`.

Graded (15 points, on N = 4 and, with --hidden, on random N and shapes, some with fewer rows
than ranks):  dx 4;  dw 7: this rank's rows of the mean;  bytes 4: one all-gather + one reduce-scatter.

Check your work:  python -m zeroedu.labs check 3
"""
import torch

from zeroedu import shard


def gather_weight(w_shard: torch.Tensor, out_features: int, axis, comm) -> torch.Tensor:
    """All-gather the dim-0 shards into the full (out_features, in_features) W."""
    n = axis.size
    rows = shard.dim0_chunk_rows(out_features, n)
    padded = torch.zeros(rows, w_shard.shape[1], dtype=w_shard.dtype)
    padded[: w_shard.shape[0]] = w_shard
    full = torch.empty(rows * n, w_shard.shape[1], dtype=w_shard.dtype)
    comm.all_gather(full, padded, axis, tag="lab3/W")
    return full[:out_features]


def fsdp_linear_forward(x: torch.Tensor, w_shard: torch.Tensor, out_features: int, axis, comm):
    w = gather_weight(w_shard, out_features, axis, comm)
    return x @ w.t()  # the full W is dropped when this returns (resharded)


def fsdp_linear_backward(x, dy, w_shard, out_features: int, axis, comm):
    """Return (dx, dw_shard): dx = dy @ W for the local batch; dw_shard = this rank's rows of
    the average over ranks of dyᵀ x (shape (rows this rank owns, in_features))."""
    # BEGIN SOLUTION write the backward: gather W, dX, local dW, reduce-scatter dW to this rank's rows, average
    n = axis.size
    w = gather_weight(w_shard, out_features, axis, comm)
    dx = dy @ w
    dw = dy.t() @ x
    rows = shard.dim0_chunk_rows(out_features, n)
    padded = torch.zeros(rows * n, dw.shape[1], dtype=dw.dtype)
    padded[:out_features] = dw
    mine = torch.empty(rows, dw.shape[1], dtype=dw.dtype)
    comm.reduce_scatter(mine, padded, axis, tag="lab3/dW")
    mine /= n  # SUM over ranks -> mean: each rank's dy came from its own micro-batch mean
    r = shard.dim0_rows(out_features, n, axis.rank)
    return dx, mine[: r.size]
    # END SOLUTION
