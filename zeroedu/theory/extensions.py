"""Beyond plain data parallelism: offloading, composing with TP/PP, and "does it fit?".

* **ZeRO-Offload** (Ren et al. 2021, §4): the optimizer state (fp32 master, any fp32 main-grad
  copy, Adam m and v) and the optimizer step live in host memory; weights and gradients stay on
  the GPU. Each rank's host keeps that rank's shard, so the host bytes are the strategy's own
  optimizer bytes.
* **ZeRO-Infinity** (Rajbhandari et al. 2021, §5): parameters move to host too (``what=
  "optimizer+params"``). Only meaningful when parameters are sharded (ZeRO-3), as in DeepSpeed,
  where parameter offload requires stage 3. The real systems also stream each gradient shard to
  the host as it is produced; here gradients stay on the device, so the device figure is an
  upper bound.
* **With tensor / pipeline parallelism** (Megatron-LM; ZeRO §8 on combining with MP): each
  data-parallel rank first holds only Ψ/(tp·pp) parameters, and the data-parallel sharding then
  divides that share, so every closed form applies to Ψ/(tp·pp).
"""
from __future__ import annotations

from .. import catalog
from .inputs import check_count, check_psi, resolve
from .memory import ModelStates, model_states

OFFLOAD_MODES = ("none", "optimizer", "optimizer+params")


def compose(strategy, psi, n, m=1, recipe=None, tp=1, pp=1) -> ModelStates:
    """Model states per rank when each DP rank already holds 1/(tp·pp) of the model."""
    tp, pp = check_count(tp, "tp"), check_count(pp, "pp")
    return model_states(strategy, check_psi(psi) / (tp * pp), n, m, recipe)


def offload(strategy, psi, n, m=1, recipe=None, what="optimizer") -> dict[str, ModelStates]:
    """Split one rank's model states into {"device": ..., "host": ...}."""
    if what not in OFFLOAD_MODES:
        raise ValueError(f"unknown offload {what!r}; choose one of {', '.join(OFFLOAD_MODES)}")
    spec, _ = resolve(strategy, recipe)
    ms = model_states(strategy, psi, n, m, recipe)
    if what == "none":
        return {"device": ms, "host": ModelStates()}
    optim = dict(master=ms.master, main_grad=ms.main_grad, m=ms.m, v=ms.v)
    if what == "optimizer":
        return {"device": ModelStates(param=ms.param, grad=ms.grad), "host": ModelStates(**optim)}
    if not catalog.shards(spec.inner)["param"]:
        raise ValueError(f"offloading params needs a strategy that shards params (ZeRO-3: fsdp1, "
                         f"fsdp2, hsdp, hfsdp); {spec.name!r} does not")
    return {"device": ModelStates(grad=ms.grad), "host": ModelStates(param=ms.param, **optim)}


_offload = offload  # `fits` takes a parameter named `offload`


def fits(strategy, psi, n, m=1, recipe=None, gpu_bytes=80e9, tp=1, pp=1, offload="none",
         reserve_bytes=0) -> bool:
    """Do this rank's device-resident model states fit in `gpu_bytes` minus `reserve_bytes`
    (room kept for activations, unsharded units and buffers)?"""
    if not gpu_bytes > 0:
        raise ValueError(f"gpu_bytes must be > 0, got {gpu_bytes!r}")
    per_rank_psi = check_psi(psi) / (check_count(tp, "tp") * check_count(pp, "pp"))
    device = _offload(strategy, per_rank_psi, n, m, recipe, offload)["device"]
    return device.total <= gpu_bytes - reserve_bytes


__all__ = ["OFFLOAD_MODES", "compose", "offload", "fits"]
