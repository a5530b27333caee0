"""From this machine to a cluster, as a model: a training step of a 7B GPT projected onto H100s.

Nothing here is measured on a GPU. The projection takes the schedule zeroedu's strategies run
and measures on CPU ranks (`schedule.fsdp`: each unit's all-gather prefetched while the one
before it computes, re-gathered in backward with `reshard_after_forward`, its gradients
reduce-scattered as its backward ends, with HSDP each shard all-reduced across domains, the
optimizer step after every reduction) and fills it with a 7B shape and stated hardware inputs:

    units        the embedding, then L = 32 transformer layers (`transformer_shape(7e9)`: L = 32,
                 h = 4096, 12h² + 13h parameters per layer, vh for the tied embedding)
    compute      6·Ψ_u·tokens FLOPs per unit and step (2 forward, 4 backward: Kaplan et al. 2020,
                 §2.1), at a sustained FLOP/s per GPU
    collectives  a unit's all-gather of its parameters, its gradients' reduce-scatter, each the
                 ring's (g-1)·α + (g-1)/g·S/β on the axis's link (`timing.ring_time`), bytes
                 from the recipe (`mixed-bf16`: bf16 parameters and gradients)
    optimizer    Adam over this GPU's shard, memory-bound: 32 bytes per parameter read and written
                 (fp32 master, m, v, and the gradient) at the HBM bandwidth

Inputs (`H100`), each with where it comes from:

    sustained compute   400 TFLOP/s per GPU   Llama 3 405B pre-training on 16K H100s, BF16: 400
                                              TFLOPs/GPU, 41 % MFU (Dubey et al. 2024, "The
                                              Llama 3 Herd of Models", arXiv 2407.21783, Table 4)
    HBM                 3.35 TB/s             NVIDIA H100 SXM datasheet
    NVLink (in a node)  β 370 GB/s, α 2 µs    ring bus bandwidth NCCL reaches on NVLink 4
                                              (nccl-tests issue #212); α assumed (`timing`)
    network             β 46 GB/s, α 5 µs     one 400 Gb/s NDR NIC per GPU, as NCCL achieves it
                                              (nccl-tests issue #290); α assumed (`timing`)

A flat ZeRO-3 over two nodes is projected two ways (`theory.hybrid`'s two readings). One ring in
lockstep (`flat_ring="single"`, pessimistic): every byte it sends crosses a NIC on the ring's two
boundary hops, so its one axis gets one NIC's link. Rings striped over the node's NICs
(`"striped"`, what NCCL does with one NIC per GPU): the node boundary carries
min(NVLink, gpus_per_node · NIC), about NVLink's own rate with eight NICs, and the flat step is
HSDP's; NVIDIA's measurements (nccl#812) argue for this reading. The truth of a given cluster
lies between them and is for its nccl-tests to say. Which input dominates is read off the model, not asserted: each input is
made twice as fast in turn, and the one whose doubling shortens the step most dominates
(`Projection.sensitivity`).

What is left out: attention's score FLOPs (Kaplan et al.'s 2·L·s·h per token beside 2Ψ: about 8 %
at s = 4096, h = 4096, half that with a causal mask), kernels' launch gaps,
NCCL's own algorithms (tree, NVLS: `README`), stragglers. Label every figure from here "a model".
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..kinds import DP_OUTER as OUTER, DP_SHARD as INNER
from ..recipes import get_recipe
from . import schedule
from .activations import transformer_shape


@dataclass(frozen=True)
class Input:
    """One hardware input: its value (SI units) and where it comes from."""
    value: float
    unit: str
    source: str


@dataclass(frozen=True)
class Hardware:
    name: str
    flops: Input          # sustained FLOP/s per GPU
    hbm: Input            # bytes/s
    nvlink_beta: Input    # bytes/s, inside a node
    nvlink_alpha: Input   # seconds per ring step
    network_beta: Input   # bytes/s per GPU, between nodes
    network_alpha: Input
    gpus_per_node: int = 8

    def inputs(self) -> dict[str, Input]:
        return {k: getattr(self, k) for k in ("flops", "hbm", "nvlink_beta", "nvlink_alpha", "network_beta",
                                              "network_alpha")}


LLAMA3 = "Llama 3 405B on 16K H100s: 400 TFLOPs/GPU, 41 % BF16 MFU (arXiv 2407.21783, Table 4)"
H100 = Hardware(
    "H100 SXM",
    flops=Input(400e12, "FLOP/s", LLAMA3),
    hbm=Input(3.35e12, "B/s", "NVIDIA H100 SXM datasheet: 3.35 TB/s HBM3"),
    nvlink_beta=Input(370e9, "B/s", "achieved: NCCL's ring bus bandwidth on NVLink 4, of a 450 GB/s line rate (nccl-tests issue #212)"),
    nvlink_alpha=Input(2e-6, "s", "assumed: a few microseconds per ring step (theory.timing)"),
    network_beta=Input(46e9, "B/s", "achieved: one 400 Gb/s NDR NIC per GPU (50 GB/s line rate) as NCCL reaches it (nccl-tests issue #290)"),
    network_alpha=Input(5e-6, "s", "assumed: a few microseconds per ring step (theory.timing)"),
)

# (strategy, N, M, flat ring): 8 x H100; 2 x 8 flat, one ring and rings striped over the NICs; 2 x 8 HSDP
SETUPS = (("fsdp2", 8, 1, "single"), ("fsdp2", 16, 1, "single"), ("fsdp2", 16, 1, "striped"), ("hsdp", 8, 2, "single"))
FLAT_RINGS = ("single", "striped")


@dataclass(frozen=True)
class Workload:
    psi: float = 7e9
    seq: int = 4096
    micro_batch: int = 1  # sequences per GPU per step
    recipe: str = "mixed-bf16"


@dataclass
class Projection:
    """One projected step (seconds): `compute` on the compute stream, `exposed` waiting for
    communication, `comm` in flight per axis; `sensitivity`: for each input made twice as fast,
    the step's relative shortening; `dominant`: the input with the largest."""
    strategy: str
    n: int
    m: int
    step: float
    compute: float
    exposed: float
    comm: dict[str, float]
    tokens_per_second: float
    sensitivity: dict[str, float] = field(default_factory=dict)
    dominant: str = ""
    flat_ring: str = "single"

    @property
    def setup(self) -> str:
        nodes = "one node" if self.n * self.m <= H100.gpus_per_node else f"{self.m if self.m > 1 else 2} nodes"
        how = f", M = {self.m}" if self.m > 1 else ", flat"
        if self.m == 1 and self.n > H100.gpus_per_node:
            how += ", one ring" if self.flat_ring == "single" else ", striped"
        return f"{self.strategy}, {self.n * self.m} GPUs ({nodes}{how})"


def _program(strategy: str, n: int, m: int, w: Workload, hw: Hardware, prefetch: bool,
             reshard_after_forward: bool, flat_ring: str = "single") -> tuple[list, dict]:
    if strategy not in ("fsdp1", "fsdp2", "hsdp"):
        raise ValueError(f"the projection schedules ZeRO-3 / FSDP and HSDP (fsdp1, fsdp2, hsdp), got {strategy!r}")
    if (strategy == "hsdp") != (m > 1):
        raise ValueError("hsdp runs on M > 1 domains; fsdp on one axis (M = 1)")
    shape = transformer_shape(w.psi, seq=w.seq, micro_batch=w.micro_batch)
    units = [shape.vocab * shape.hidden + 2 * shape.hidden] + [shape.layer_params] * shape.layers
    recipe = get_recipe(w.recipe)
    tokens = w.seq * w.micro_batch
    flops = hw.flops.value
    forward = [2 * u * tokens / flops for u in units]
    backward = [4 * u * tokens / flops for u in units]
    shard = w.psi / n  # HSDP shards over the n GPUs of a domain only
    optimizer = shard * 32 / hw.hbm.value
    gpus = n * m
    if flat_ring not in FLAT_RINGS:
        raise ValueError(f"flat_ring {flat_ring!r}: one of {FLAT_RINGS}")
    cross = gpus > hw.gpus_per_node and m == 1  # a flat ring through two nodes
    if not cross:
        inner = schedule.Link(hw.nvlink_alpha.value, hw.nvlink_beta.value)
    elif flat_ring == "single":  # one lockstep ring: its boundary hop is one NIC
        inner = schedule.Link(hw.network_alpha.value, hw.network_beta.value)
    else:  # rings striped over the node's NICs: the boundary carries all of them, or NVLink's rate
        inner = schedule.Link(hw.network_alpha.value,
                              min(hw.nvlink_beta.value, hw.gpus_per_node * hw.network_beta.value))
    links = {INNER: inner, OUTER: schedule.Link(hw.network_alpha.value, hw.network_beta.value)}
    prog = schedule.fsdp(forward, backward, [u * recipe.param_bytes for u in units], optimizer, group=n,
                         prefetch=prefetch, reshard_after_forward=reshard_after_forward, outer=m,
                         grad_bytes=[u * recipe.grad_bytes for u in units])
    return prog, links


def project(strategy: str = "fsdp2", n: int = 8, m: int = 1, workload: Workload = Workload(), hw: Hardware = H100,
            prefetch: bool = True, reshard_after_forward: bool = True, sensitivity: bool = True,
            flat_ring: str = "single") -> Projection:
    """The step of `strategy` on n GPUs (x m domains) of `hw` for `workload`: a model. `flat_ring`:
    how a flat ring over several nodes crosses them (module docstring)."""
    prog, links = _program(strategy, n, m, workload, hw, prefetch, reshard_after_forward, flat_ring)
    res = schedule.simulate(prog, links)
    axes = [INNER] + ([OUTER] if m > 1 else [])
    out = Projection(strategy, n, m, res.seconds, res.compute, res.exposed, {a: res.comm(a) for a in axes},
                     tokens_per_second=workload.seq * workload.micro_batch * n * m / res.seconds,
                     flat_ring=flat_ring)
    if sensitivity:
        for name, inp in hw.inputs().items():
            faster = replace(inp, value=inp.value / 2 if name.endswith("alpha") else inp.value * 2)
            other = project(strategy, n, m, workload, replace(hw, **{name: faster}), prefetch,
                            reshard_after_forward, sensitivity=False, flat_ring=flat_ring)
            out.sensitivity[name] = 1 - other.step / res.seconds
        out.dominant = max(out.sensitivity, key=out.sensitivity.get)
    return out


def projection_table(setups=SETUPS, workload: Workload = Workload(), hw: Hardware = H100) -> list[Projection]:
    """The README's and notebook 11's table: 7B on 8 x H100 (FSDP2), on 2 x 8 flat (one ring, and
    rings striped over the NICs) and with HSDP."""
    return [project(s, n, m, workload, hw, flat_ring=ring) for s, n, m, ring in setups]


def table_text(rows: list[Projection], hw: Hardware = H100, workload: Workload = Workload()) -> str:
    """The table with its inputs, labelled a model."""
    lines = [f"A MODEL, not a measurement: {workload.psi / 1e9:g}B GPT, {workload.micro_batch} x {workload.seq} tokens "
             f"per GPU per step, {workload.recipe}, on {hw.name}; the schedule zeroedu's FSDP runs (prefetch, "
             "reshard after forward)",
             f"{'setup':41s} {'step ms':>8s} {'compute':>8s} {'exposed':>8s} {'comm in flight':>22s} "
             f"{'tokens/s':>10s}  dominant input (2x faster: step shorter by)"]
    for p in rows:
        comm = " ".join(f"{a.replace('dp_', '')} {1e3 * v:.0f}" for a, v in p.comm.items())
        lines.append(f"{p.setup:41s} {1e3 * p.step:8.0f} {1e3 * p.compute:8.0f} {1e3 * p.exposed:8.0f} {comm:>22s} "
                     f"{p.tokens_per_second:10,.0f}  {p.dominant} ({p.sensitivity[p.dominant]:.0%})")
    lines.append("inputs:")
    for name, inp in hw.inputs().items():
        v = inp.value
        shown = (f"{v / 1e12:g} TFLOP/s" if inp.unit == "FLOP/s" else f"{v / 1e9:g} GB/s" if inp.unit == "B/s"
                 else f"{v * 1e6:g} us")
        lines.append(f"  {name:14s} {shown:>14s}  {inp.source}")
    return "\n".join(lines)

