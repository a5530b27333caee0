"""Beyond plain data parallelism: offloading, composing with TP/PP, and "does it fit on one GPU?".

**ZeRO-Offload** (Ren et al. 2021, §4; DeepSpeed ``offload_optimizer``, "Valid for ZeRO stage 1,
2, 3"). The optimizer state, the fp32 gradients and the optimizer step live on the CPU; the GPU
keeps the 16-bit parameters. As DeepSpeed does it (deepspeed/runtime/zero/stage_1_and_2.py,
v0.19.6): the fp32 master partition and its fp32 gradient partition are allocated on the CPU, each
reduced gradient slice is copied there as fp32 (``async_inplace_copy_grad_to_fp32_buffer_from_gpu``,
which then drops the GPU gradient), the step runs on the CPU and the updated partition is copied
back into the 16-bit parameters before their all-gather: cast first into a pinned 16-bit host
buffer since v0.17.0 (PR #7309), so 2 bytes per element cross PCIe going up; v0.16.x copied the
fp32 partition (``offload_pcie_bytes``). Per rank, with P, G the recipe's
parameter and gradient bytes, K its optimizer bytes, S the strategy's optimizer sharding (N,
or N·M)::

    strategy           device                         host
    zero1(_allreduce)  PΨ + GΨ                        (K + 4)Ψ/S      stage 1: the full 16-bit
                                                                      gradients stay until reduced
    zero2              PΨ                 (= 2Ψ)      (K + 4)Ψ/S      DeepSpeed's estimator: 2Ψ
    zero3 family       PΨ/N               (= 2Ψ/N)    (K + 4)Ψ/S      + one gathered unit on device
    ddp, ddp_bucketed  not applicable: no ZeRO optimizer partition to offload
    megatron_distopt   not modelled (Megatron-Core's own offload is another design, see below)

The "+ 4" is the fp32 gradient partition, the size of the optimizer's own partition; a recipe
with an fp32 main-grad copy (``fp16``) already counts it in K. A recipe whose parameter is its
own master (``fp32``) gets a host fp32 copy of the partition as master, since the CPU step needs
one. Checks against DeepSpeed's estimators: ``estimate_zero2_model_states_mem_needs`` with
cpu_offload returns ``gpu_mem = 2 * total_params`` (= zero2 above); stage 3's
``estimate_zero3_model_states_mem_needs`` returns ``largest_layer_memory + 2Ψ/N`` for optimizer
offload and CPU 16Ψ per node over the node's GPUs (= (12 + 4)Ψ/N).

*Stage 1.* DeepSpeed has one code path for stages 1 and 2 and one estimator (named for stage 2).
But stage 1 does not partition gradients: without ``overlap_comm`` (off by default for stages
1-2) its per-gradient hooks reduce nothing (since v0.16.5, PR #7018, they are created whenever
``contiguous_gradients`` is on, its default; ``process_gradients`` reduces only when gradients
are partitioned or ``overlap_comm`` is set), and it reduces the full 16-bit gradients after
backward, at the accumulation boundary (``reduce_gradients``), so they live on the GPU through
backward (deepspeed/runtime/zero/stage_1_and_2.py, DeepSpeed v0.16.4, v0.16.5 and v0.19.5 read). Here
ZeRO-1 with offload therefore keeps PΨ + GΨ = 4Ψ, not the estimator's 2Ψ.

*DDP.* ZeRO-Offload moves a ZeRO optimizer's partition; plain DDP has none. DeepSpeed's config
does not reject stage 0 + ``offload_optimizer``, but no ZeRO optimizer is built, so nothing is
placed on the host, and the ``DeepSpeedCPUAdam`` it substitutes for Adam asserts that its
parameters are on the CPU (read from the source, engine.py and ops/adam/cpu_adam.py). Here it is
"not applicable": `offload` raises, the CLI prints n/a.

*Megatron.* DeepSpeed's offload is not Megatron's. Megatron-Core has its own
(``OptimizerConfig.optimizer_cpu_offload`` and ``optimizer_offload_fraction`` in
megatron/core/optimizer/optimizer_config.py, a ``HybridDeviceOptimizer``), with a fraction of
the optimizer state on the CPU; zeroedu does not model it, so megatron_distopt is n/a here.

**ZeRO-Infinity** (Rajbhandari et al. 2021, §5; ``what="optimizer+params"``): the parameter
shards move to the host too; DeepSpeed's ``offload_param`` is "Valid only with stage 3". The
device keeps no model states, only the unit being gathered; host (P + 4 + K)Ψ/N = 18Ψ/N, as in
``estimate_zero3_model_states_mem_needs`` (CPU Ψ·18 per node over its GPUs). The hybrids
(hsdp, hfsdp) are modelled as ZeRO-3 on their own shards (DeepSpeed's MiCS was not checked).

**With tensor / pipeline parallelism** (Megatron-LM; ZeRO §8 on combining with MP): each
data-parallel rank first holds only Ψ/(tp·pp) parameters, and the data-parallel sharding then
divides that share, so every closed form applies to Ψ/(tp·pp). N is the data-parallel degree, so
the job uses N·tp·pp GPUs (N·M·tp·pp for the hybrids): `gpu_count`.

**Does it fit?** One GPU holds its device model states + activations + the largest unit a
ZeRO-3-family strategy gathers (`device_bytes`, `fits`):

* activations: `activations.transformer_activation_bytes` (Korthikanti et al. 2022) for a GPT
  shape (`activations.transformer_shape`), in the recipe's parameter dtype (bf16/fp16: 2 bytes,
  fp32: 4); default recompute "selective" (34sbh per layer: no s² attention tensors kept, which
  is also what a fused attention kernel keeps);
* gathered unit (fsdp1, fsdp2, hsdp, hfsdp only): the unsharded parameters of the largest FSDP
  unit, P × max(one layer, the embedding). One layer on a tensor-parallel rank has
  12h²/t + 7h/t + 6h parameters (QKV, MLP-in weights and biases are split; the projection and
  MLP-out biases and both LayerNorms are whole); the vocab-parallel embedding vh/t. The layer's
  unsharded gradient before its reduce-scatter and a prefetched next unit can add as much again
  (DeepSpeed's estimator counts 4 bytes per parameter of the largest layer: 16-bit params and
  grads); they are not counted. Other strategies gather no unit: 0.
"""
from __future__ import annotations

from fractions import Fraction

from .. import catalog
from ..recipes import DTYPE_BYTES
from .activations import DEFAULT_ATTENTION, RECOMPUTE, TransformerShape, transformer_activation_bytes
from .inputs import check_count, check_psi, resolve
from .memory import ModelStates, model_states

OFFLOAD_MODES = ("none", "optimizer", "optimizer+params")
DEFAULT_RECOMPUTE = "selective"


def compose(strategy, psi, n, m=1, recipe=None, tp=1, pp=1) -> ModelStates:
    """Model states per rank when each DP rank already holds 1/(tp·pp) of the model."""
    tp, pp = check_count(tp, "tp"), check_count(pp, "pp")
    return model_states(strategy, check_psi(psi) / (tp * pp), n, m, recipe)


def gpu_count(strategy, n, m=1, tp=1, pp=1) -> int:
    """GPUs the job uses: N (data-parallel degree) · tp · pp, times M for the hybrids (non-hybrid
    strategies have no outer axis and ignore M, as everywhere in `theory`)."""
    spec, _ = resolve(strategy, None)
    n, m = check_count(n, "n"), check_count(m, "m")
    return n * (m if spec.hybrid else 1) * check_count(tp, "tp") * check_count(pp, "pp")


def offload_not_applicable(strategy, what: str = "optimizer") -> str | None:
    """Why `strategy` cannot take offload `what` (a sentence), or None when it can."""
    if what not in OFFLOAD_MODES:
        raise ValueError(f"unknown offload {what!r}; choose one of {', '.join(OFFLOAD_MODES)}")
    spec, _ = resolve(strategy, None)
    if what == "none":
        return None
    if what == "optimizer+params" and not catalog.shards(spec.inner)["param"]:
        return (f"offloading params needs a strategy that shards params (ZeRO-3: fsdp1, fsdp2, "
                f"hsdp, hfsdp); {spec.name!r} does not")
    if spec.inner == "no_shard":
        return (f"ZeRO-Offload applies to ZeRO stages 1-3 only (zero1, zero1_allreduce, zero2, "
                f"fsdp1, fsdp2, hsdp, hfsdp); {spec.name!r} is DDP, with no optimizer partition "
                f"to offload")
    if spec.name == "megatron_distopt":
        return ("offload is not modelled for megatron_distopt: DeepSpeed's ZeRO-Offload is not "
                "Megatron's, and Megatron-Core's own optimizer CPU offload (optimizer_cpu_offload, "
                "optimizer_offload_fraction) is not modelled here")
    return None


def offload(strategy, psi, n, m=1, recipe=None, what="optimizer") -> dict[str, ModelStates]:
    """Split one rank's model states into {"device": ..., "host": ...} (module docstring).

    Raises ValueError for a combination that does not exist (`offload_not_applicable`)."""
    reason = offload_not_applicable(strategy, what)
    spec, rec = resolve(strategy, recipe)
    ms = model_states(strategy, psi, n, m, recipe)
    if what == "none":
        return {"device": ms, "host": ModelStates()}
    if reason:
        raise ValueError(reason)
    # The optimizer's partition has ms.m / (bytes of m) elements; its fp32 gradient partition
    # and (for a recipe without a separate master) the fp32 master copy have as many.
    part = ms.m / DTYPE_BYTES[rec.m]
    host = ModelStates(grad=0 if rec.main_grad else 4 * part,
                       master=ms.master if rec.master else 4 * part,
                       main_grad=ms.main_grad, m=ms.m, v=ms.v)
    # Stage 1 keeps its full gradients on the device until they are reduced; a strategy that
    # shards gradients copies each reduced slice to the host as it comes.
    device_grad = 0 if catalog.shards(spec.inner)["grad"] else ms.grad
    if what == "optimizer":
        return {"device": ModelStates(param=ms.param, grad=device_grad), "host": host}
    return {"device": ModelStates(grad=device_grad),
            "host": ModelStates(param=ms.param, grad=host.grad, master=host.master,
                                main_grad=host.main_grad, m=host.m, v=host.v)}


# What DeepSpeed's ZeRO-1/2 offload path copies back to the device after the CPU's Adam step:
# the fp32 partition itself before v0.17.0; since v0.17.0 (PR #7309) the partition is first cast
# into a pinned 16-bit host buffer (`param_buffer_of_bit16_for_cpu_offload_groups`) and that is
# uploaded (`deepspeed/runtime/zero/stage_1_and_2.py`, v0.19.6 and v0.16.4 read).
OFFLOAD_UPLOADS = ("bit16", "fp32")


def offload_pcie_bytes(strategy, psi, n, m=1, recipe=None, upload: str = "bit16", down: str = "fp32") -> dict:
    """Bytes one GPU moves over PCIe per optimizer step under optimizer offload (ZeRO-Offload,
    Ren et al. 2021 §4), {"down", "up", "total"}: down, the reduced gradient shard, cast to fp32
    on the device before the copy (`async_inplace_copy_grad_to_fp32_buffer_from_gpu`), 4Ψ/N;
    up, the updated weights: 2Ψ/N as 16 bits (`upload="bit16"`, DeepSpeed ≥ 0.17.0) or the fp32
    partition, 4Ψ/N (`"fp32"`, DeepSpeed ≤ 0.16.x), cast on the device. `down="bit16"` is the
    paper's data flow instead (§3, its Fig. 2: the 16-bit gradients cross and the CPU casts them),
    2Ψ/N: with 16-bit weights coming up, the 4Ψ of one GPU that the paper calls the least any
    offload of the optimizer can move; DeepSpeed's fp32 copy down makes it 6Ψ."""
    for name, value in (("upload", upload), ("down", down)):
        if value not in OFFLOAD_UPLOADS:
            raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(OFFLOAD_UPLOADS)}")
    host = offload(strategy, psi, n, m, recipe)["host"]
    _, rec = resolve(strategy, recipe)
    part = host.m / DTYPE_BYTES[rec.m]  # elements of this rank's optimizer partition
    down = 4 * part if down == "fp32" else DTYPE_BYTES[rec.grad] * part
    up = 4 * part if upload == "fp32" else DTYPE_BYTES[rec.param] * part
    return {"down": down, "up": up, "total": down + up}


def gathered_unit_bytes(strategy, shape: TransformerShape, recipe=None, tp=1) -> dict:
    """The largest unit a ZeRO-3-family strategy all-gathers, unsharded, on one GPU:
    {"bytes", "unit" ("layer" | "embedding" | None), "params"} (module docstring). Strategies
    that keep whole parameters gather nothing: bytes 0, unit None."""
    spec, rec = resolve(strategy, recipe)
    t = check_count(tp, "tp")
    if not catalog.shards(spec.inner)["param"]:
        return {"bytes": 0, "unit": None, "params": 0}
    h = shape.hidden
    layer = Fraction(12 * h * h + 7 * h, t) + 6 * h
    embedding = Fraction(shape.vocab * h, t)
    unit, params = ("layer", layer) if layer >= embedding else ("embedding", embedding)
    plain = lambda x: int(x) if x.denominator == 1 else x
    return {"bytes": plain(rec.param_bytes * params), "unit": unit, "params": plain(params)}


def _check_recompute(recompute: str) -> str:
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    return recompute


def device_bytes(strategy, psi, n, m=1, recipe=None, tp=1, pp=1, offload="none", shape=None,
                 recompute=DEFAULT_RECOMPUTE, activation_bytes=None, unit_bytes=None,
                 attention=DEFAULT_ATTENTION) -> dict:
    """Everything one GPU holds: {"model_states" (device ModelStates), "host" (ModelStates),
    "activations", "gathered_unit", "total"}.

    Activations and the gathered unit come from `shape` (a `TransformerShape`) unless given in
    bytes; with neither they are 0 and "total" is the model states alone."""
    tp, pp = check_count(tp, "tp"), check_count(pp, "pp")
    psi = check_psi(psi)
    split = _offload(strategy, psi / (tp * pp), n, m, recipe, offload)
    _, rec = resolve(strategy, recipe)
    _check_recompute(recompute)
    act = unit = 0
    if shape is not None:
        act = transformer_activation_bytes(shape, recompute, rec.param_bytes, tp, pp, attention)["total"]
        unit = gathered_unit_bytes(strategy, shape, recipe, tp)["bytes"]
    for name, given in (("activation_bytes", activation_bytes), ("unit_bytes", unit_bytes)):
        if given is not None and not given >= 0:
            raise ValueError(f"{name} must be >= 0, got {given!r}")
    act = act if activation_bytes is None else activation_bytes
    unit = unit if unit_bytes is None else unit_bytes
    states = split["device"]
    return {"model_states": states, "host": split["host"], "activations": act,
            "gathered_unit": unit, "total": states.total + act + unit}


_offload = offload  # `fits` and `device_bytes` take a parameter named `offload`


def fits(strategy, psi, n, m=1, recipe=None, gpu_bytes=80e9, tp=1, pp=1, offload="none",
         reserve_bytes=0, shape=None, recompute=DEFAULT_RECOMPUTE, activation_bytes=None,
         unit_bytes=None, attention=DEFAULT_ATTENTION) -> bool:
    """Does one GPU's `device_bytes` total (device model states + activations + gathered unit)
    fit in `gpu_bytes` minus `reserve_bytes` (room kept for buffers)? Without `shape`,
    `activation_bytes` or `unit_bytes` this is the model states alone."""
    if not gpu_bytes > 0:
        raise ValueError(f"gpu_bytes must be > 0, got {gpu_bytes!r}")
    d = device_bytes(strategy, psi, n, m, recipe, tp, pp, offload, shape, recompute,
                     activation_bytes, unit_bytes, attention)
    return d["total"] <= gpu_bytes - reserve_bytes


__all__ = ["OFFLOAD_MODES", "DEFAULT_RECOMPUTE", "compose", "gpu_count", "offload",
           "offload_not_applicable", "gathered_unit_bytes", "device_bytes", "fits"]
