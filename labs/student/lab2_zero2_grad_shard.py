# GENERATED from labs/source/lab2_zero2_grad_shard.py (student skeleton: replace each NotImplementedError).
# Regenerate with `python -m zeroedu.labs build`; check with the command in the docstring.
"""Lab 2: ZeRO-2 gradient sharding of one flat unit.

After backward every rank holds the full gradient of a unit as one flat buffer of `numel`
elements (its own micro-batch's gradient). ZeRO-2 keeps only this rank's 1/N of it, averaged
over ranks: pad the buffer with zeros to a multiple of N, reduce-scatter it (SUM), and divide
by N. The padded buffer's chunk r, positions [r·c, (r+1)·c) with c = padded / N, is this rank's.

Use `zeroedu.shard` for the index math (never re-derive it): `shard.padded_numel`,
`shard.shard_numel`, `shard.shard_range`. Communicate with
`comm.reduce_scatter(out, inp, axis, tag="lab2/grads")` (SUM; inp has N times out's elements).

Bytes: one reduce-scatter of the padded buffer, (N-1)/N · padded · 4 bytes sent per rank, half
of what an all-reduce would send.

Graded (10 points, on N = 4 and, with --hidden, on random N and sizes):
  range 2: shard.shard_range;  values 5: the averaged chunk;  bytes 3: one reduce-scatter.

Check your work:  python -m zeroedu.labs check 2
"""
import torch

from zeroedu import shard


def shard_gradients(flat_grad: torch.Tensor, numel: int, axis, comm):
    """Return (rng, grad_shard): `rng` the buffer-wide `shard.Range` this rank owns (padding
    included), `grad_shard` a tensor of rng.size elements: the average over all ranks of the
    gradient on those positions (zero on padding). `axis.size` is N, `axis.rank` this rank."""
    raise NotImplementedError("write the padding, the reduce-scatter into this rank's chunk, the average, and the shard range")
