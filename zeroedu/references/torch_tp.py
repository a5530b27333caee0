"""zeroedu's tensor-parallel block beside two yardsticks, on every rank of a tp axis.

`tp_block_job` builds one GPT block (the same seed on every rank) and runs one forward and
backward of it three ways on the same input and the same upstream gradient:

* **one process**: the unsplit block (`models.gpt.Block`), the whole sequence;
* **zeroedu**: `strategies.tensor_parallel.TPBlock` on a `tp` axis over the world (heads and MLP
  columns split, f / g or, with `sp`, the sequence-parallel all-gather / reduce-scatter, through
  `comm`, every collective recorded in a ledger);
* **torch**: the block's MLP under torch's own tensor-parallel API, `parallelize_module` with
  `ColwiseParallel` on `fc` and `RowwiseParallel` on `fc2` (with `sp`: input and output sharded
  on the sequence, `Shard(1)`), on a CPU `DeviceMesh` over gloo. torch's fused-qkv attention has
  no layout in that API that splits by heads (a column split of the (3h, h) weight cuts q, k and
  v in the wrong places), so the attention is held against the one-process block only.

It returns, per rank, the largest differences (relative to the reference's scale) of outputs,
input gradients and every parameter's gradient (this rank's slice of the one-process gradient;
the replicated LayerNorms and row-parallel biases included), zeroedu's MLP
against torch's, and the bytes the ledger recorded for the block's forward and backward beside
`theory.tensor_parallel.block_bytes`, and what the kernel counted on this rank's sockets for them. Nothing of torch's tensor parallelism is used by zeroedu's side.
"""
from __future__ import annotations

import copy
from fractions import Fraction

import torch


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def tp_block_job(ctx, sp: bool = False, batch: int = 2, seq: int = 8, d_model: int = 32, n_heads: int = 4,
                 seed: int = 0) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from ..models.gpt import Block, GPTConfig
    from ..runtime.comm import Comm
    from ..runtime.ledger import Ledger
    from ..strategies.tensor_parallel import TPBlock, TPMLP, _Ctx
    from ..theory.tensor_parallel import block_bytes

    t, r = ctx.world_size, ctx.rank
    cfg = GPTConfig(vocab=97, seq_len=seq, d_model=d_model, n_layers=1, n_heads=n_heads)
    torch.manual_seed(seed)
    block = Block(cfg)
    g = torch.Generator().manual_seed(seed + 1)
    x, w = torch.randn(batch, seq, d_model, generator=g), torch.randn(batch, seq, d_model, generator=g)
    mine = slice(r * seq // t, (r + 1) * seq // t) if sp else slice(None)

    # one process, the whole block
    ref = copy.deepcopy(block)
    xr = x.clone().requires_grad_()
    out_ref = ref(xr)
    (out_ref * w).sum().backward()

    # zeroedu
    ledger = Ledger(r)
    axis = ctx.world_axis("tp")
    tp = TPBlock(copy.deepcopy(block), axis, Comm(ledger, meter=ctx.wire), sp=sp)
    xz = x[:, mine].clone().requires_grad_()
    out_z = tp(xz)
    (out_z * w[:, mine]).sum().backward()
    sent = sum((rec.sent for rec in ledger.comm), Fraction(0))
    collectives = sorted({rec.op for rec in ledger.comm})
    # each collective is blocking, so each ran alone and the kernel's count is its own (None
    # where the meter is unavailable)
    wires = [rec.wire for rec in ledger.comm]
    wire = None if any(v is None for v in wires) else sum(wires)
    messages = sum(rec.messages for rec in ledger.comm)

    heads = tp.attn.n_heads * tp.attn.d_head
    q_rows = torch.cat([torch.arange(r * heads, (r + 1) * heads) + k * d_model for k in range(3)])
    width = tp.mlp.fc.weight.shape[0]
    cols = torch.arange(r * width, (r + 1) * width)
    attn_cols = torch.arange(r * heads, (r + 1) * heads)
    want = {
        "attn.qkv.weight": ref.attn.qkv.weight.grad[q_rows], "attn.qkv.bias": ref.attn.qkv.bias.grad[q_rows],
        "attn.proj.weight": ref.attn.proj.weight.grad[:, attn_cols], "attn.proj.bias": ref.attn.proj.bias.grad,
        "mlp.fc.weight": ref.mlp.fc.weight.grad[cols], "mlp.fc.bias": ref.mlp.fc.bias.grad[cols],
        "mlp.fc2.weight": ref.mlp.fc2.weight.grad[:, cols], "mlp.fc2.bias": ref.mlp.fc2.bias.grad,
        "ln1.weight": ref.ln1.weight.grad, "ln1.bias": ref.ln1.bias.grad,
        "ln2.weight": ref.ln2.weight.grad, "ln2.bias": ref.ln2.bias.grad,
    }
    got = dict(tp.named_parameters())
    vs_single = {"output": _rel(out_z, out_ref[:, mine]), "input_grad": _rel(xz.grad, xr.grad[:, mine])}
    vs_single.update({name: _rel(got[name].grad, g_ref) for name, g_ref in want.items()})

    # the MLP alone: zeroedu's TPMLP against torch's parallelize_module, same input and gradient
    h = torch.randn(batch, seq, d_model, generator=torch.Generator().manual_seed(seed + 2))
    mlp_ctx = _Ctx(axis, Comm(Ledger(r)), "mlp")
    ours = TPMLP(copy.deepcopy(block.mlp), mlp_ctx, sp=sp)
    hz = h[:, mine].clone().requires_grad_()
    out_ours = ours(hz)
    (out_ours * w[:, mine]).sum().backward()

    mesh = init_device_mesh("cpu", (t,), mesh_dim_names=("tp",))
    theirs = copy.deepcopy(block.mlp)
    plan = ({"fc": ColwiseParallel(input_layouts=Shard(1)), "fc2": RowwiseParallel(output_layouts=Shard(1))}
            if sp else {"fc": ColwiseParallel(), "fc2": RowwiseParallel()})
    parallelize_module(theirs, mesh, plan)
    ht = h[:, mine].clone().requires_grad_()
    out_theirs = theirs(ht)
    (out_theirs * w[:, mine]).sum().backward()
    local = {n: p.grad.to_local() for n, p in theirs.named_parameters()}
    vs_torch = {"output": _rel(out_ours, out_theirs), "input_grad": _rel(hz.grad, ht.grad),
                "fc.weight": _rel(ours.fc.weight.grad, local["fc.weight"]),
                "fc.bias": _rel(ours.fc.bias.grad, local["fc.bias"]),
                "fc2.weight": _rel(ours.fc2.weight.grad, local["fc2.weight"])}
    # fc2's bias is replicated: with SP both sum its gradient over the ranks' positions (torch
    # reduces its DTensor gradient to Replicate; zeroedu's bias passes through f)
    vs_torch["fc2.bias"] = _rel(ours.fc2.bias.grad, local["fc2.bias"])
    return {"rank": r, "vs_single": vs_single, "vs_torch": vs_torch, "sent": sent,
            "predicted": block_bytes(batch, seq, d_model, t, 4, sp=sp),
            "collectives": collectives, "wire": wire, "messages": messages}


def tp_train_job(ctx, sp: bool = False, model: str = "gpt-tiny", steps: int = 3, global_batch: int = 4,
                 lr: float = 1e-2, optimizer: str = "adam") -> dict:
    """Train `model` with every block tensor-parallel over the world (`TPGPT`, t = world size) and,
    in the same process, the unsplit model, both with torch's Adam (or SGD) on the same global batches
    (tensor parallelism splits the model, not the batch: every tp rank sees the whole batch).
    Returns the losses of both and, after the last step, the largest relative difference between
    each of this rank's parameters and its slice of the unsplit model's."""
    from ..models import make_batch, make_model
    from ..runtime.comm import Comm
    from ..runtime.ledger import Ledger
    from ..strategies.tensor_parallel import TPGPT

    t, r = ctx.world_size, ctx.rank
    ref = make_model(model)
    tp = TPGPT(copy.deepcopy(ref), ctx.world_axis("tp"), Comm(Ledger(r)), sp=sp)
    make_opt = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}[optimizer]
    opt_ref, opt_tp = make_opt(ref.parameters(), lr=lr), make_opt(tp.parameters(), lr=lr)
    losses, losses_ref = [], []
    for step in range(steps):
        x, y = make_batch(step, global_batch, model)
        for m, opt, out in ((ref, opt_ref, losses_ref), (tp, opt_tp, losses)):
            opt.zero_grad()
            loss = ref.loss(m(x), y)
            loss.backward()
            opt.step()
            out.append(loss.item())

    diffs = _vs_slices(ref, tp, dict(tp.named_parameters()), r)
    return {"rank": r, "losses": losses, "losses_ref": losses_ref, "params": diffs}


def _vs_slices(ref, tp, params: dict, r: int) -> dict:
    """Largest relative difference of each of `tp`'s parameters (`params`, by name) from this tp
    rank's slice of the unsplit model's."""
    d = ref.cfg.d_model
    diffs = {}
    for i, (b_ref, b_tp) in enumerate(zip(ref.blocks, tp.blocks)):
        heads = b_tp.attn.n_heads * b_tp.attn.d_head
        q_rows = torch.cat([torch.arange(r * heads, (r + 1) * heads) + k * d for k in range(3)])
        width = b_tp.mlp.fc.weight.shape[0]
        cols, a_cols = torch.arange(r * width, (r + 1) * width), torch.arange(r * heads, (r + 1) * heads)
        pairs = {"attn.qkv.weight": (b_tp.attn.qkv.weight, b_ref.attn.qkv.weight[q_rows]),
                 "attn.proj.weight": (b_tp.attn.proj.weight, b_ref.attn.proj.weight[:, a_cols]),
                 "mlp.fc.weight": (b_tp.mlp.fc.weight, b_ref.mlp.fc.weight[cols]),
                 "mlp.fc2.weight": (b_tp.mlp.fc2.weight, b_ref.mlp.fc2.weight[:, cols]),
                 "ln1.weight": (b_tp.ln1.weight, b_ref.ln1.weight), "mlp.fc2.bias": (b_tp.mlp.fc2.bias, b_ref.mlp.fc2.bias)}
        pairs = {k: (params[f"blocks.{i}.{k}"], want) for k, (_, want) in pairs.items()}
        diffs.update({f"blocks.{i}.{k}": _rel(a.detach(), b.detach()) for k, (a, b) in pairs.items()})
    for name in ("embed.tok.weight", "embed.pos.weight", "head.lm_head.weight"):
        diffs[name] = _rel(params[name].detach(), dict(ref.named_parameters())[name].detach())
    return diffs


def fsdp2_tp_job(ctx, tp: int = 2, sp: bool = False, model: str = "gpt-tiny", steps: int = 3,
                 global_batch: int = 4, lr: float = 1e-2, eps: float = 1e-3) -> dict:
    """FSDP2 over `dp` on a model whose blocks are tensor-parallel over `tp`: a (dp, tp) mesh of
    the world, tp inner (contiguous ranks, as a node's GPUs), dp = world / tp across (with `sp`,
    sequence parallelism inside tp), as
    torchtitan applies `fully_shard` over a TP-parallelized model. zeroedu's FSDP2 shards every
    parameter (a TP slice or a replicated one) on dim 0 over dp; dp rank d trains on slice d of
    each global batch, the tp ranks of one dp group on the same slice. In the same process, the
    unsplit model with torch's Adam on the whole global batch (the same `eps`: a large one makes
    Adam's update follow the gradient's size, so a gradient counted twice shows, where eps = 1e-8
    divides it out and lets round-off in near-zero gradients flip signs). Returns both runs'
    losses and each parameter's largest relative difference from its slice of the unsplit one."""
    from ..models import make_batch, make_model, local_slice
    from ..optim import AdamConfig
    from ..recipes import get_recipe
    from ..runtime.comm import Axis, Comm
    from ..runtime.ledger import Ledger
    from ..kinds import DP_SHARD, TP, Mesh
    from ..strategies.base import DistState
    from ..strategies.fsdp2 import FSDP2
    from ..strategies.tensor_parallel import TPGPT
    from .. import theory
    from ..theory import tensor_parallel as tp_theory

    if ctx.world_size % tp:
        raise ValueError(f"tp = {tp} must divide the world size {ctx.world_size}")
    # dp_shard strided, tp contiguous; at tp = 1 (which must be FSDP2 to the bit) the mesh has no tp
    # axis, and the model's is a group of this rank alone, which never calls torch.distributed
    mesh = Mesh.build(ctx.world_size, tp=tp)
    dp = mesh.data_parallel
    axes = ctx.axes(mesh)
    dp_axis = axes[DP_SHARD]
    tp_axis = axes[TP] if tp > 1 else Axis(TP, None, 1, 0, (ctx.rank,))
    ledger = Ledger(ctx.rank, wire=ctx.wire)
    comm = Comm(ledger, meter=ctx.wire)
    ref = make_model(model)
    tpm = TPGPT(copy.deepcopy(ref), tp_axis, comm, sp=sp)
    names = [n for n, _ in tpm.named_parameters()]
    strategy = FSDP2(tpm, DistState(ctx.rank, ctx.world_size, ctx.device, dp_axis, comm, ledger),
                     get_recipe("fp32"), AdamConfig(lr=lr, eps=eps))
    opt_ref = torch.optim.Adam(ref.parameters(), lr=lr, eps=eps)
    losses, losses_ref = [], []
    sl = local_slice(global_batch, dp, dp_axis.rank)
    for step in range(steps):
        x, y = make_batch(step, global_batch, model)
        ledger.begin_step(step)
        loss = strategy.forward_backward(x[sl].clone(), y[sl].clone())
        strategy.step()
        ledger.end_step()
        losses.append(loss)
        opt_ref.zero_grad()
        full = ref.loss(ref(x), y)
        full.backward()
        opt_ref.step()
        losses_ref.append(full.item())
    measured = ledger.measured()  # the last step: model states at its optimizer step, bytes per axis
    wire = ledger.wire_report()  # the kernel's count of each axis's sockets in the last step
    last = [rec for rec in ledger.comm if rec.step == ledger.step]
    framing = {ax: sum(rec.messages for rec in last if rec.axis == ax) for ax in ("dp_shard", "tp")}
    c = ref.cfg
    units = tp_theory.gpt_units(c.vocab, c.seq_len, c.d_model, c.n_layers, c.n_heads, c.mlp_ratio, tp)
    states = theory.exact_model_states("fsdp2", units, dp, rank=dp_axis.rank, recipe="fp32")
    predicted_axes = {"dp_shard": {k: float(v) for k, v in
                                   theory.exact_comm("fsdp2", units, dp, recipe="fp32").by_collective().items() if v},
                      "tp": float(tp_theory.gpt_tp_bytes(global_batch // dp, c.seq_len, c.d_model, c.n_layers,
                                                         tp, 4, sp))}
    full = strategy.full_parameters()
    out = {"rank": ctx.rank, "dp_rank": dp_axis.rank, "tp_rank": tp_axis.rank, "losses": losses,
           "losses_ref": losses_ref, "params": _vs_slices(ref, tpm, dict(zip(names, full)), tp_axis.rank),
           # the ledger's (tensors held, collectives' payloads) beside the closed forms'
           "states_ledger": measured.total, "states_theory": states.total,
           "axes_ledger": {"dp_shard": measured.comm_by_axis.get("dp_shard", {}),
                           "tp": sum(measured.comm_by_axis.get("tp", {}).values())},
           "axes_theory": predicted_axes, "activations_ledger": measured.activations,
           "wire_by_axis": wire.by_axis if wire.sent is not None else None, "messages_by_axis": framing,
           "activations_theory": tp_theory.gpt_activation_bytes(c, global_batch // dp, c.seq_len, 4, tp, sp)}
    if tp == 1:  # the same steps with plain FSDP2 on the unsplit model: tp = 1 must be exactly it
        plain = FSDP2(make_model(model), DistState(ctx.rank, ctx.world_size, ctx.device, dp_axis, comm, ledger),
                      get_recipe("fp32"), AdamConfig(lr=lr, eps=eps))
        plain_losses = []
        for step in range(steps):
            x, y = make_batch(step, global_batch, model)
            ledger.begin_step(steps + step)
            plain_losses.append(plain.forward_backward(x[sl].clone(), y[sl].clone()))
            plain.step()
            ledger.end_step()
        out["plain_losses"] = plain_losses
        out["same_as_plain"] = all(torch.equal(a, b) for a, b in zip(full, plain.full_parameters(), strict=True))
    return out


def torch_fsdp2_tp_job(ctx, tp: int = 2, model: str = "gpt-tiny", steps: int = 3, global_batch: int = 4,
                       lr: float = 1e-2, eps: float = 1e-3) -> dict:
    """torch's own composition, the oracle for zeroedu's `run(RunConfig(tp=...))`: a CPU
    `DeviceMesh` (dp, tp), tp inner; every block's MLP under `parallelize_module` (fc
    `ColwiseParallel`, fc2 `RowwiseParallel`) on the tp sub-mesh, then `fully_shard` on the dp
    sub-mesh per unit (embed, each block, head) and the root, as torchtitan applies them; torch's
    Adam (`foreach=False`: the parameters live on two meshes). torch's plans have no fused-qkv
    layout split by heads, so its attention stays whole (sharded by FSDP over dp only): the model
    computes the same function, so its parameters after K steps are the one-process run's, which
    is what zeroedu's unsplit parameters are held against. dp rank d trains on slice d of each
    global batch. Returns the losses and every parameter's full tensor (`full_tensor()`)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from ..models import local_slice, make_batch, make_model

    dp = ctx.world_size // tp
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    m = make_model(model)
    for block in m.blocks:
        parallelize_module(block.mlp, mesh["tp"], {"fc": ColwiseParallel(), "fc2": RowwiseParallel()})
    for unit in (m.embed, *m.blocks, m.head):
        fully_shard(unit, mesh=mesh["dp"])
    fully_shard(m, mesh=mesh["dp"])
    opt = torch.optim.Adam(m.parameters(), lr=lr, eps=eps, foreach=False)
    sl = local_slice(global_batch, dp, mesh["dp"].get_local_rank())
    losses = []
    for step in range(steps):
        x, y = make_batch(step, global_batch, model)
        opt.zero_grad()
        loss = m.loss(m(x[sl].clone()), y[sl].clone())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    placements = {n: [str(p) for p in t.placements] for n, t in m.named_parameters() if isinstance(t, DTensor)}
    full = [t.full_tensor().detach().clone() if isinstance(t, DTensor) else t.detach().clone()
            for t in m.parameters()]
    return {"rank": ctx.rank, "dp_rank": mesh["dp"].get_local_rank(), "losses": losses,
            "params": full if ctx.rank == 0 else None, "placements": placements}
