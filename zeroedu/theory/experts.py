"""Expert parallelism's closed forms (the algorithm: `strategies.expert_parallel`).

Capacity: an expert takes at most C = ceil(capacity_factor · k · T / E) of a rank's T tokens'
assignments (`capacity`; GShard §2.2). Bytes one rank sends per MoE layer and micro-batch with
n[s][d] the kept assignments rank s routes to rank d's experts, D-wide rows (`all_to_all_bytes`):
dispatch Σ_{d≠r} n[r][d]·D·bytes, combine Σ_{s≠r} n[s][r]·D·bytes, their gradients the same
reversed, and the counts (ep-1)·(E/ep)·8. A balanced router with nothing dropped sends
k·T·D·bytes·(ep-1)/ep per all-to-all (`balanced_bytes`). Parameters per rank (`param_count`):
the dense model less its MLPs, a router per layer, and E/ep experts per layer.

What autograd saves in one MoE layer for one micro-batch of B sequences, T = B·S tokens, each
sequence routed as one group (`models.moe`), with N the assignments this rank kept and M the rows
its own experts ran (ep: received; one process: N), a bytes per activation element, D the width, r
the MLP ratio (`moe_layer_activation_bytes`, torch 2.13, counted by the ledger's storages):
    a·T·E       the router's softmax output                      softmax
    8·k·T       the top-k indices, int64                         topk
    a·B·E       each group's expert shares f (no gradient)       f · P, for P's gradient
    k·T         each group's keep mask, bool                     p[keep]
    16·N        each group's sort order and token index, int64   p[keep][order], x[token]
    16·N        ep with B > 1: the order merging the groups and its inverse, int64
    M·(8 + 2aD(1 + r))   per expert: its row index, its input and output rows (D), the
                GELU's input and output (rD)                     x[idx], fc, gelu, fc2, index_copy
    a·N·D + a·N + a·N·D  the combined rows, their gate weights, the weighted rows
                                                                 y · w, index_add
The dense block's MLP saves 2a·r·T·D (fc's output, GELU's output); its input, the ln2 output, is
saved by the router instead, so a MoE GPT saves the dense GPT's bytes less 2a·r·T·D per layer plus
the above.
"""
from __future__ import annotations

import math
from fractions import Fraction


def capacity(capacity_factor, top_k: int, tokens: int, experts: int) -> int:
    """C = ceil(capacity_factor · k · T / E): at most this many of T tokens' assignments per expert."""
    return math.ceil(Fraction(str(capacity_factor)) * top_k * tokens / experts)


# ------------------------------------------------------------------ closed forms
def owner(expert: int, experts: int, ep: int) -> int:
    return expert // (experts // ep)


def all_to_all_bytes(sent: list[list[int]], rank: int, d_model: int, experts: int, dtype_bytes: int = 4
                     ) -> dict[str, int]:
    """Bytes rank `rank` sends in one MoE layer's forward and backward, from n = `sent`
    (n[s][d]: kept assignments rank s routes to rank d's experts)."""
    ep = len(sent)
    out = sum(sent[rank][d] for d in range(ep) if d != rank) * d_model * dtype_bytes
    back = sum(sent[s][rank] for s in range(ep) if s != rank) * d_model * dtype_bytes
    counts = (ep - 1) * (experts // ep) * 8
    return {"dispatch": out, "combine": back, "combine_grad": out, "dispatch_grad": back, "counts": counts}


def balanced_bytes(tokens: int, top_k: int, d_model: int, ep: int, dtype_bytes: int = 4) -> Fraction:
    """One all-to-all's bytes per rank if every expert got the same share and nothing was dropped."""
    return Fraction(top_k * tokens * d_model * dtype_bytes * (ep - 1), ep)


def param_count(cfg, experts: int, ep: int) -> dict[str, int]:
    """Parameters one rank holds: the dense GPT's (`GPTConfig.param_count`) less its L MLPs
    (2rD² + rD + D each), plus per layer a router (E·D, no bias) and E/ep experts of the MLP's shape."""
    D, L, r = cfg.d_model, cfg.n_layers, cfg.mlp_ratio
    mlp = 2 * r * D * D + r * D + D
    shared = cfg.param_count() - L * mlp + L * experts * D
    return {"shared": shared, "experts": L * (experts // ep) * mlp}


def moe_layer_activation_bytes(batch: int, seq: int, experts: int, top_k: int, d_model: int, mlp_ratio: int,
                               dtype_bytes: int, kept: int, ran: int, merged: bool) -> int:
    """Bytes one MoE layer saves for one micro-batch (module docstring): `kept` = N, `ran` = M,
    `merged`: the groups' rows merged into one all-to-all (ep, batch > 1)."""
    a, T, D = dtype_bytes, batch * seq, d_model
    router = a * T * experts + 8 * top_k * T + a * batch * experts + top_k * T + 16 * kept
    return (router + (16 * kept if merged else 0) + ran * (8 + 2 * a * D * (1 + mlp_ratio))
            + 2 * a * kept * D + a * kept)


__all__ = ["all_to_all_bytes", "balanced_bytes", "capacity", "moe_layer_activation_bytes", "owner", "param_count"]
