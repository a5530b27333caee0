"""16-bit matrix multiplications on CPUs that have no fast 16-bit kernel: the same bytes, fp32's speed.

Why: mixed precision keeps weights, gradients, saved activations and the bytes on the wire in
16 bits, and a GPU multiplies those operands on tensor cores, accumulating in fp32. Many CPUs
have no such unit. With AVX-512-BF16 or AMX, oneDNN multiplies bf16 faster than fp32; without
it (AVX2 laptops, most hosted CI runners), torch 2.13 falls back to a scalar loop: bf16 and fp16
at 1.5 GFLOP/s against fp32's 70 (one thread, 512 x 512), and a mixed-bf16 gpt-small step 20x
slower than an fp32 one. The lessons are about bytes, not about that loop.

What the emulation does (a `TorchDispatchMode`, so it sits *below* autograd): each matrix
multiplication whose operands are bf16 or fp16 CPU tensors (`mm`, `addmm`, `bmm`, `baddbmm`,
CPU flash attention forward and backward) is computed from those 16-bit operands converted to
fp32, and its result rounded once to the operands' dtype, which is what a native kernel that
accumulates in fp32 returns (up to the order of the sums). Autograd, above the mode, records and
saves the very tensors it saves natively: the model states, the saved activations and every
collective's payload are the same tensors, byte for byte (tested per strategy and recipe). The
fp32 copies live only inside one multiplication; they are not saved and never reach the ledger.

Decided once per process and dtype (`decision()`): `ZEROEDU_MATMUL16=native|emulated` forces
it; otherwise a timing probe (a 128 x 128 product in fp32 and in the dtype, best of three)
emulates where the 16-bit product is more than `SLOW` times slower than fp32's. What torch
reports of the CPU (its kernel level, whether oneDNN has bf16 and fp16) is kept beside the
verdict for the run report and the progress line ("bf16 matmul: emulated").

Recipe to see the slow path on a CPU that has native bf16 (tests/README.md):
``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2``: oneDNN then reports no bf16 and torch
takes its fallback loop (measured here: a bf16 256 x 256 product 23x slower than fp32's).
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from enum import Enum

ENV = "ZEROEDU_MATMUL16"
SLOW = 2.0  # a 16-bit product more than this many times slower than fp32's is emulated
DTYPES = ("bf16", "fp16")


class Matmul16(str, Enum):
    NATIVE = "native"
    EMULATED = "emulated"


@dataclass(frozen=True)
class Decision:
    """How this process multiplies 16-bit matrices, and why."""
    bf16: Matmul16
    fp16: Matmul16
    forced: bool  # set by ZEROEDU_MATMUL16 rather than by the probe
    cpu_capability: str  # torch's kernel level: "AVX512", "AVX2", "DEFAULT", ...
    onednn_bf16: bool  # oneDNN says it has a bf16 path on this CPU
    onednn_fp16: bool
    slowdown: dict  # dtype -> the probe's 16-bit time over fp32's (empty when forced)

    def mode(self, dtype: str) -> Matmul16:
        return getattr(self, dtype)

    @property
    def emulates(self) -> bool:
        return Matmul16.EMULATED in (self.bf16, self.fp16)

    def line(self, dtype: str) -> str:
        """For the progress line: "bf16 matmul: emulated"."""
        return f"{dtype} matmul: {self.mode(dtype).value}"

    def plain(self) -> dict:
        d = asdict(self)
        d["bf16"], d["fp16"] = self.bf16.value, self.fp16.value
        return d

    @classmethod
    def from_plain(cls, d: dict) -> "Decision":
        return d if isinstance(d, cls) else cls(**{**d, "bf16": Matmul16(d["bf16"]), "fp16": Matmul16(d["fp16"])})


_DECISION: Decision | None = None
_LOCK = threading.Lock()


def forced() -> Matmul16 | None:
    """The mode `ZEROEDU_MATMUL16` forces, or None (unset or "auto": the probe decides)."""
    v = os.environ.get(ENV, "").strip().lower()
    if v in ("", "auto"):
        return None
    try:
        return Matmul16(v)
    except ValueError:
        raise ValueError(f"{ENV}={v!r}: use 'native', 'emulated' or 'auto'") from None


def decision() -> Decision:
    """This process's decision, made at the first call (the probe takes a few milliseconds)."""
    global _DECISION
    with _LOCK:
        if _DECISION is None:
            _DECISION = _decide()
        return _DECISION


def _decide() -> Decision:
    import torch

    cap = torch.backends.cpu.get_cpu_capability()
    bf16_ok = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    fp16_ok = bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    force = forced()
    if force is not None:
        return Decision(force, force, True, cap, bf16_ok, fp16_ok, {})
    slowdown = {d: _probe(d) for d in DTYPES}
    modes = {d: Matmul16.EMULATED if s > SLOW else Matmul16.NATIVE for d, s in slowdown.items()}
    return Decision(modes["bf16"], modes["fp16"], False, cap, bf16_ok, fp16_ok,
                    {d: round(s, 2) for d, s in slowdown.items()})


def _probe(dtype: str, n: int = 128, reps: int = 3) -> float:
    """Time of an n x n product in `dtype` over fp32's, each the best of `reps` (after a warm-up)."""
    import torch

    from ..recipes import torch_dtype

    def best(dt) -> float:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(n, n, generator=g).to(dt), torch.randn(n, n, generator=g).to(dt)
        a @ b
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
        return min(times)

    return best(torch_dtype(dtype)) / max(best(torch.float32), 1e-9)


def _emulation_mode():
    """The dispatch mode (built on first use: torch is imported only where a run needs it)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    d = decision()
    wanted = tuple(dt for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16"))
                   if d.mode(name) == Matmul16.EMULATED)
    products = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
    flash = aten._scaled_dot_product_flash_attention_for_cpu.default
    flash_bwd = aten._scaled_dot_product_flash_attention_for_cpu_backward.default

    def up(x):
        return x.float() if isinstance(x, torch.Tensor) and x.dtype in wanted else x

    class Emulate16(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in products or func is flash or func is flash_bwd:
                first = args[0]
                if first.dtype in wanted and first.device.type == "cpu":
                    dtype = first.dtype
                    out = func(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items()})
                    if func is flash:  # (output, logsumexp): the log-sum-exp is fp32 natively too
                        return out[0].to(dtype), out[1]
                    if func is flash_bwd:
                        return tuple(g.to(dtype) for g in out)
                    return out.to(dtype)  # the one rounding a native fp32-accumulating kernel does
            return func(*args, **kwargs)

    return Emulate16


def mode_for(dtype: str) -> str | None:
    """"native" or "emulated" for a 16-bit dtype name ("bf16", "fp16"); None for fp32, which
    needs no decision (and so makes no probe)."""
    return decision().mode(dtype).value if dtype in DTYPES else None


_MODE_CLASS = None
_ACTIVE = threading.local()


@contextmanager
def compute(dtype: str | None = None):
    """Inside: 16-bit CPU matrix products as `decision()` says. `dtype` ("bf16", "fp16", "fp32"):
    the run's compute dtype; a no-op where it is fp32 or multiplies natively (None: whichever
    16-bit dtype is emulated), and when already inside on this thread. Autograd carries the mode
    into backward when `backward()` is called inside."""
    global _MODE_CLASS
    if getattr(_ACTIVE, "on", False) or getattr(_ACTIVE, "native", False):
        yield
        return
    wanted = DTYPES if dtype is None else (dtype,) if dtype in DTYPES else ()
    if not any(decision().mode(d) == Matmul16.EMULATED for d in wanted):
        yield
        return
    if _MODE_CLASS is None:
        _MODE_CLASS = _emulation_mode()
    _ACTIVE.on = True
    try:
        with _MODE_CLASS():
            yield
    finally:
        _ACTIVE.on = False


@contextmanager
def native():
    """Inside, on this thread: torch's own 16-bit kernels, whatever `decision()` says (`compute`
    adds nothing). For what torch's memory trackers measure: an emulated product allocates fp32
    copies of its operands and of its result for the length of one call, which no native kernel
    (and no GPU) allocates, and a tracker would count them beside the lesson's bytes."""
    before = getattr(_ACTIVE, "native", False)
    _ACTIVE.native = True
    try:
        yield
    finally:
        _ACTIVE.native = before
