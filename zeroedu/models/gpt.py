"""A small decoder-only transformer (GPT-2 shape), written plainly so its saved tensors are analyzable.

Architecture (pre-LayerNorm GPT-2, no dropout anywhere, untied LM head, fp32 unless cast):

    embed   h0 = E_tok[x] + E_pos[:S]                          (one module: token + position)
    block_i h  = h + proj(attn(ln1(h)))                         (L times, nn.ModuleList `blocks`)
            h  = h + fc2(gelu_tanh(fc(ln2(h))))
    head    logits = lm_head(ln_f(h))                           (final LayerNorm + Linear with bias)
    loss    mean cross-entropy of logits.float() (fp32, as mixed-precision training does)

Attention, `GPTConfig.attention`: one fused qkv Linear (with bias), per head
softmax(q kᵀ / sqrt(d_head) + causal) v in `AttentionCore` (a module with no parameters, so
selective recompute can re-run exactly Korthikanti et al.'s "QKᵀ, softmax, attention over V"),
output Linear `proj` (with bias). "eager" (the default) spells the core out and saves the
B·H·S² softmax output, the count of Korthikanti et al. 2022; "fused" calls
F.scaled_dot_product_attention, which saves q, k, v, the output and a log-sum-exp per row and
recomputes the scores in backward, as FlashAttention and every current trainer's attention do.
The default stays eager so the lesson can name every saved tensor; `theory.activations` counts
both exactly.

Activation recompute (`recompute_modules`): "full" re-runs every block in backward (only the
block's input is kept), "selective" re-runs only the attention cores (the B·H·S² softmax
output is not kept); see `models.recompute`.

Choices that decide what autograd saves (`zeroedu.theory.activations` has the exact count):
  * GELU is the tanh approximation (GPT-2's); both variants save only their input.
  * The causal mask is an *additive* bias (0 on/below the diagonal, -inf above), so nothing is
    saved for it; `masked_fill(mask, -inf)` would save the (S, S) bool mask in every layer.
  * The 1/sqrt(d_head) scale is applied to q before the matmul: a multiply by a Python float
    saves no tensor, and the scaled copy of q is what q kᵀ saves anyway.
  * q, k, v are copied into fresh contiguous (B, H, S, d_head) tensors, so what q kᵀ and att·v
    save is the same three (B, S, D) tensors for every B and S (left as strided views, matmul
    copies them itself for B > 1 but keeps views of the qkv output for B = 1, where a saved
    view pins the whole (B, S, 3D) storage).
  * The position embedding is a slice of its weight, not an nn.Embedding call on arange(S):
    a slice saves nothing, an embedding lookup would save an int64 index tensor.

Sizes that teach padding: the presets' vocabularies (67, 97) are primes, so dim-0 shards of the
token embedding and the LM head are uneven for every N > 1; and the LM head has a bias (GPT-2's
has none) of V elements, so the head unit and the whole model have an odd number of parameters
and every flat buffer split N = 2 or 4 ways needs padding (with d_model a multiple of 4 and no
such bias, every unit's size would be a multiple of 4).

Parameter count (V vocab, S seq_len, D d_model, L layers, r mlp_ratio):
    Ψ = V·D + S·D  +  L·(2D + 3D²+3D + D²+D + 2D + r·D²+r·D + r·D²+D)  +  2D + V·D + V
      = (2V + S)·D + L·((2r + 4)·D² + (r + 9)·D) + 2D + V
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..kinds import RecomputeMode
from ..optim import AdamConfig
from . import data

ATTENTION = ("eager", "fused")  # `GPTConfig.attention`, `zeroedu run --attention`


@dataclass(frozen=True)
class GPTConfig:
    vocab: int
    seq_len: int  # the sequence length of the training batches (and of the position table)
    d_model: int
    n_layers: int
    n_heads: int
    mlp_ratio: int = 4
    seed: int = 0
    lr: float = 1e-3  # Adam's learning rate for this size (see `default_adam`)
    preset: str = ""  # the preset's name, when built from one
    # "eager": softmax(q kᵀ) v spelled out, the B·H·S² probabilities saved (Korthikanti et al.'s
    # count); "fused": torch's scaled_dot_product_attention, which saves no scores (module docstring)
    attention: str = "eager"

    kind = "gpt"
    default_global_batch = 8

    def __post_init__(self):
        for name in ("vocab", "seq_len", "d_model", "n_layers", "n_heads", "mlp_ratio"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"GPTConfig.{name} must be an integer >= 1, got {v!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, got {self.attention!r}")
        if self.vocab < data.N_SYMBOLS:
            raise ValueError(f"the training data uses {data.N_SYMBOLS} symbols; vocab {self.vocab} is too small")

    @property
    def name(self) -> str:
        return self.preset or f"gpt(V={self.vocab}, S={self.seq_len}, D={self.d_model}, L={self.n_layers})"

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def as_dict(self) -> dict:
        return {"kind": self.kind, **asdict(self)}

    def build(self) -> "GPT":
        """Same weights on every rank: built from the seed, in fp32, on the CPU."""
        model = GPT(self)
        init_weights(model, self.seed)
        return model

    def param_count(self) -> int:
        """Ψ in closed form (module docstring); equals sum(p.numel()) of `build()`."""
        V, S, D, L, r = self.vocab, self.seq_len, self.d_model, self.n_layers, self.mlp_ratio
        return (2 * V + S) * D + L * ((2 * r + 4) * D * D + (r + 9) * D) + 2 * D + V

    def batch(self, step: int, global_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        return data.make_batch(step, global_batch, self)

    def default_adam(self) -> AdamConfig:
        # gpt-small stalls near 2.4 at lr 2e-3 and near 3.1 at 1e-2; 1e-3 takes it from ln V to
        # about a third of that in 200 steps. gpt-tiny trains at 1e-2.
        return AdamConfig(lr=self.lr)

    def recompute_modules(self, model: "GPT", mode: str) -> list[nn.Module]:
        """What activation recompute re-runs in backward: every block ("full"), or only every
        block's attention core ("selective", Korthikanti et al. 2022 §5)."""
        if mode == RecomputeMode.FULL:
            return list(model.blocks)
        if mode == RecomputeMode.SELECTIVE:
            return [b.attn.core for b in model.blocks]
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {mode!r}")

    def activation_bytes(self, batch: int, dtype_bytes: int, recompute: str = "none",
                         ln_stats_bytes: int | None = None) -> int:
        """Exact bytes autograd saves for one micro-batch of `batch` sequences of seq_len tokens
        (`theory.activations.gpt_activation_bytes`)."""
        from ..theory.activations import gpt_activation_bytes

        return gpt_activation_bytes(self, batch, self.seq_len, dtype_bytes, recompute, ln_stats_bytes,
                                    attention=self.attention)


PRESETS = {
    # Unit tests: Ψ = 30,851, a training step in a few ms.
    "gpt-tiny": GPTConfig(vocab=67, seq_len=32, d_model=32, n_layers=2, n_heads=2, lr=1e-2, preset="gpt-tiny"),
    # Notebooks, the CLI and the dashboards: Ψ = 3,242,081, memory figures in MB.
    "gpt-small": GPTConfig(vocab=97, seq_len=128, d_model=256, n_layers=4, n_heads=4, lr=1e-3,
                           preset="gpt-small"),
}


# ----------------------------------------------------------------------------- modules
class Embed(nn.Module):
    """Token + learned position embeddings: one FSDP unit."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        S = idx.shape[1]
        if S > self.pos.weight.shape[0]:
            raise ValueError(f"sequence length {S} exceeds the position table ({self.pos.weight.shape[0]})")
        # Embedding saves `idx` (int64) for its backward; the position slice saves nothing.
        return self.tok(idx) + self.pos.weight[:S]


class AttentionCore(nn.Module):
    """softmax(q kᵀ + causal) v per head, q already scaled; no parameters. The part selective
    recompute re-runs: its B·H·S² softmax output is the one activation that grows with S².

    `fused`: torch's scaled_dot_product_attention (is_causal, scale 1: q is scaled already),
    which on CPU runs a FlashAttention-style kernel (ScaledDotProductFlashAttentionForCpu in
    torch 2.13) that saves q, k, v, its output and one log-sum-exp per row (fp32), never the
    scores: backward recomputes them block by block, as FlashAttention does on GPUs."""

    def __init__(self, fused: bool = False):
        super().__init__()
        self.fused = fused

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)
        S = q.shape[-2]
        scores = q @ k.transpose(-2, -1)  # (B, H, S, S); saves q and k
        causal = torch.full((S, S), float("-inf"), dtype=scores.dtype, device=scores.device).triu(1)
        att = torch.softmax(scores + causal, dim=-1)  # add saves nothing; softmax saves its output
        return att @ v  # saves att (the softmax output again: same storage) and v


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.core = AttentionCore(fused=cfg.attention == "fused")
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, D = x.shape
        H, Dh = self.n_heads, self.d_head
        q, k, v = self.qkv(x).split(D, dim=2)  # views of one (B, S, 3D) output; not saved

        def heads(t):
            # (B, S, D) -> (B, H, S, Dh), always a fresh contiguous tensor: these three are what
            # the two matmuls save. (.contiguous() would be a no-op when B = S = 1, leaving k
            # and v views of the qkv output, whose whole 3D-wide storage would then be saved.)
            return t.view(B, S, H, Dh).transpose(1, 2).clone(memory_format=torch.contiguous_format)

        y = self.core(heads(q * (1.0 / math.sqrt(Dh))), heads(k), heads(v))
        y = y.transpose(1, 2).contiguous().view(B, S, D)  # heads side by side, a new tensor
        return self.proj(y)  # saves y


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.fc2 = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # fc saves x; GELU saves its input (fc's output); fc2 saves GELU's output: both (B, S, rD).
        return self.fc2(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: one FSDP unit. Residual adds save nothing."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    """Final LayerNorm + LM head (untied from the token embedding, with a bias): one FSDP unit."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


class GPT(nn.Module):
    """token + position embeddings, L blocks, final LayerNorm and LM head; `units()` is its unit
    policy and `loss` its loss."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.head = Head(cfg)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.dim() != 2 or idx.dtype != torch.long:
            raise ValueError(f"expected int64 token ids of shape (B, S), got {tuple(idx.shape)} {idx.dtype}")
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def units(self) -> list[nn.Module]:
        """The unit policy: [embed, *blocks, head], one FSDP unit / ZeRO bucket each (as torch's
        `fully_shard` is applied per block, then to the root for what is left)."""
        return [self.embed, *self.blocks, self.head]

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over all B·S positions, in fp32 (logits are cast first, as
        mixed-precision training does; a no-op for fp32 logits)."""
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def init_weights(model: GPT, seed: int) -> None:
    """GPT-2 init from a private generator, in `named_parameters()` order: Linear and Embedding
    weights ~ N(0, 0.02²); the residual projections (attn.proj, every fc2) ~ N(0, (0.02/√(2L))²);
    biases 0; LayerNorm weight 1, bias 0."""
    g = torch.Generator().manual_seed(seed)
    resid_std = 0.02 / math.sqrt(2 * model.cfg.n_layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln" in name:  # ln1, ln2, ln_f weights
                p.fill_(1.0)
            else:
                # (an expert's fc2 is a residual projection too: "...mlp.experts.3.fc2.weight")
                std = resid_std if name.endswith(("attn.proj.weight", "fc2.weight")) else 0.02
                p.copy_(torch.empty(p.shape).normal_(0.0, std, generator=g))
