"""Where the student's code plugs into the real strategies (labs 5 to 8).

`ZeRO2Lab` is `zeroedu.strategies.zero2.ZeRO2` whose backward hooks call the student's four
functions (`pre_accumulate`, `post_accumulate`, `reduce_scatter_unit`, `free_finished`);
`FSDPLab` is `zeroedu.strategies.fsdp1.FSDP1` whose unit lifecycle calls the student's six
(`unshard`, `reshard`, `prefetch`, `pre_forward`, `post_forward`, `pre_backward`); `DDPBucketedLab` is
`zeroedu.strategies.ddp_bucketed.DDPBucketed` whose gradient hooks and final sync call the student's four
(`post_accumulate`, `launch_ready`, `all_reduce_bucket`, `finish`); `FSDP2Lab` is
`zeroedu.strategies.fsdp2.FSDP2` (one collective per parameter) whose shard rows, unshard / reshard,
backward prefetch and asynchronous reduce-scatter are the student's six (`shard_rows`, `unshard`,
`reshard`, `pre_backward`, `post_backward`, `finish_reduce`). Everything
else (flat units, Adam on the shard, the optimizer step, the all-gathers after it, the runner's
loop) is the package's own code, so a student's version is graded inside the real algorithm.

The scaffolds also *watch* the contract, deterministically, without trusting timing:

* every collective goes through `WatchingComm`, whose handles remember whether anyone saw them
  finish (`wait()` returned, or `done()` said True). A full gradient buffer freed while the
  reduce-scatter reading it was not seen finished is a violation even when, on gloo, the
  collective happened to be done already: with NCCL the caching allocator would hand that
  memory to the next layer while the collective still reads it;
* the FSDP hooks compare every unit's state before and after each student call: the unit is
  unsharded (and waited for) when forward or backward uses it, resharded when the options say,
  the right neighbour prefetched (asynchronously) exactly when `forward_prefetch` /
  `backward_prefetch` and `limit_all_gathers` allow it.

Violations that would make the rest of the run meaningless raise `LabViolation`; the others are
collected in `violations` (plain dicts: test, message, unit, step) for the grader. The ledger
events of the real strategies (buffer allocated / freed, unit unshard / reshard) are emitted here,
not by the student's code, so every timeline has the same landmarks.

Suggested for `zeroedu.strategies` (not done here; see the labs README): a `register_pre_backward`
split out of `FSDPStrategy.post_forward`, so `FSDPLab.post_forward` would not repeat its hook line.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from .. import shard
from ..kinds import EventKind as Ev
from ..runtime.comm import Comm, Handle, UnitName, tag as comm_tag
from ..strategies.ddp_bucketed import DDPBucketed
from ..strategies.fsdp1 import FSDP1, FlatParamUnit
from ..strategies.fsdp2 import FSDP2, Dim0Unit
from ..strategies.fsdp_units import SHARDED, UNSHARDED
from ..strategies.zero2 import ZeRO2
from .student import LabViolation


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class Watched:
    """A `Handle` that remembers whether its completion was observed (`seen_done`)."""

    def __init__(self, handle: Handle | None, op: str, ptr: int):
        self.handle, self.op, self.ptr = handle, op, ptr
        self.seen_done = handle is None  # a synchronous collective has finished when it returns

    @property
    def rec(self):
        return self.handle.rec if self.handle is not None else None

    def done(self) -> bool:
        d = self.handle is None or self.handle.done()
        self.seen_done = self.seen_done or d
        return d

    def wait(self):
        if self.handle is not None:
            self.handle.wait()
        self.seen_done = True
        return self


class WatchingComm:
    """The run's own `Comm` (whatever `runner.dist_state` configured), whose async handles come back
    `Watched`, each tagged with the buffer it reads or writes. Everything else is delegated.

    While the student's code runs, a scaffold sets `attribute`: each collective is attributed to
    the buffer it reads or writes (a bucket's whole buffer, a unit's leaf, a leaf's full
    gradient) before it is issued, and recorded under *that* buffer's tag, whatever tag the
    student passed; one that carries none of them (an empty decoy, a scratch tensor of the
    student's own, a collective the lab does not use) is refused with a `LabViolation` naming
    it. The grader's criteria (bytes per bucket, overlap, prefetch) read those records, so they
    follow the buffers, not the student's labels."""

    def __init__(self, comm: Comm):
        self._comm = comm
        self.launched: list[Watched] = []
        self.attribute = None  # (op, out, inp) -> the buffer's Tag, or raises LabViolation

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def _watch(self, h, op, t):
        w = Watched(h, op, _ptr(t))
        self.launched.append(w)
        return w if h is not None else None

    def _tag(self, op, out, inp, tag):
        return tag if self.attribute is None else self.attribute(op, out, inp)

    def all_reduce(self, t, axis, tag, async_op=False):
        tag = self._tag("all_reduce", t, t, tag)
        return self._watch(self._comm.all_reduce(t, axis, tag, async_op=async_op), "all_reduce", t)

    def reduce_scatter(self, out, inp, axis, tag, async_op=False):
        tag = self._tag("reduce_scatter", out, inp, tag)
        return self._watch(self._comm.reduce_scatter(out, inp, axis, tag, async_op=async_op), "reduce_scatter", inp)

    def all_gather(self, out, inp, axis, tag, async_op=False):
        tag = self._tag("all_gather", out, inp, tag)
        return self._watch(self._comm.all_gather(out, inp, axis, tag, async_op=async_op), "all_gather", out)


def _is(t: torch.Tensor, buf: torch.Tensor | None) -> bool:
    """`t` is `buf` itself (the same memory, every element): not a slice, view or copy of it."""
    return (buf is not None and t.numel() == buf.numel() and t.numel() > 0
            and t.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
            and t.data_ptr() == buf.data_ptr())


def _described(op: str, out: torch.Tensor, inp: torch.Tensor) -> str:
    t = out if op == "all_gather" else inp
    return f"a {op} of {t.numel() * t.element_size()} bytes ({tuple(t.shape)})"


@contextmanager
def _attributing(comm: WatchingComm, attribute):
    old, comm.attribute = comm.attribute, attribute
    try:
        yield
    finally:
        comm.attribute = old


# ====================================================================== lab 5: ZeRO-2's hooks
class ZeRO2Lab(ZeRO2):
    """The real ZeRO-2 with the student's hook functions. What the student's code sees:

    ``zero2.units[k]`` (a `FlatUnit`), ``zero2.pending[k]`` (parameters of unit k still without a
    gradient in this backward), ``zero2.inflight`` (unit index -> handle of its reduce-scatter),
    ``zero2.comm``, ``zero2.dist.inner``, ``zero2.tag(unit.name, "grads")``."""

    name = "zero2"

    def __init__(self, model, dist, recipe, adam=None, *, student, **options):
        if not isinstance(dist.comm, WatchingComm):
            raise TypeError("ZeRO2Lab needs a DistState whose comm is a WatchingComm")
        self.student = student
        self.violations: list[dict] = []
        self.grad_snapshot: list[torch.Tensor] | None = None
        self._buffer_ptr: dict[int, int] = {}  # unit -> storage of its full buffer, while alive
        super().__init__(model, dist, recipe, adam, **options)
        for k, u in enumerate(self.units):
            u.free_grad = self._watched_free(k, u.free_grad)

    # ---------------------------------------------------------------- the student's view
    @property
    def pending(self) -> list[int]:
        return self._pending

    @property
    def inflight(self) -> dict:
        return self._inflight

    # ---------------------------------------------------------------- routing to the student
    def _pre_accumulate_hook(self, k: int):
        def hook(grad):
            u = self.units[k]
            had = u.grad_buffer is not None
            self._call("pre_accumulate", self, u)
            if u.grad_buffer is None:
                raise LabViolation("grads", f"pre_accumulate left {u.name} without a full gradient buffer: "
                                            "allocate it (unit.alloc_grad()) when the unit's first gradient "
                                            "arrives", unit=k)
            if not had:
                self._buffer_ptr[k] = _ptr(u.grad_buffer)
                self.ledger.event(Ev.GRAD_ALLOC, k)
            elif self._buffer_ptr.get(k) != _ptr(u.grad_buffer):
                self._violate("grads", k, f"pre_accumulate replaced {u.name}'s full gradient buffer, which already "
                                          "held the gradients accumulated so far (they are lost): allocate only "
                                          "when unit.grad_buffer is None")
                self._buffer_ptr[k] = _ptr(u.grad_buffer)
            return None
        return hook

    def _post_accumulate_hook(self, k: int):
        def hook(_p):
            self._call("post_accumulate", self, k)
            self._check_inflight()
        return hook

    def _check_inflight(self) -> None:
        for k, h in self._inflight.items():
            if not isinstance(h, Watched):
                raise LabViolation("overlap", f"zero2.inflight[{k}] is {h!r}, not the handle of unit {k}'s "
                                              "reduce-scatter: launch it with async_op=True and store the "
                                              "handle it returns", unit=k)

    def post_backward(self, k: int) -> None:
        # ZeRO2.after_backward's path for a unit that got no gradient (joins with zeros).
        self._inflight[k] = self._call("reduce_scatter_unit", self, self.units[k])
        self._check_inflight()

    def free_finished(self, wait: bool = False) -> None:
        if not self._inflight:
            return  # nothing in flight (e.g. before the first backward): nothing to ask the student
        self._call("free_finished", self, wait)
        if wait and self._inflight:
            raise LabViolation("freed", f"free_finished(wait=True) returned with units {sorted(self._inflight)} "
                                        "still in zero2.inflight: wait for every one, free its buffer and "
                                        "remove it")

    def _call(self, fn: str, *args):
        out = getattr(self.student, fn)(*args)
        # A buffer dropped without unit.free_grad() (grad_buffer set to None by hand).
        for k, u in enumerate(self.units):
            if u.grad_buffer is None and k in self._buffer_ptr:
                self._check_free(k)
                self._freed(k)
        return out

    # ---------------------------------------------------------------- watching the frees
    def _watched_free(self, k: int, free):
        def free_grad():
            if self.units[k].grad_buffer is not None and k in self._buffer_ptr:
                self._check_free(k)
                free()
                self._freed(k)
            else:
                free()
        return free_grad

    def _check_free(self, k: int) -> None:
        ptr = self._buffer_ptr[k]
        mine = [w for w in self.comm.launched if w.ptr == ptr]
        name = self.units[k].name
        if not mine:
            self._violate("no_early_free", k, f"{name}'s full gradient was freed before any collective read it: "
                                              "launch its reduce-scatter first")
        elif not all(w.seen_done for w in mine):
            self._violate("no_early_free", k, f"{name}'s full gradient was freed while its reduce-scatter was "
                                              "still in flight: free it only after handle.done() is True or "
                                              "handle.wait() returned (with NCCL the memory would be reused "
                                              "while the collective still reads it)")


    def _freed(self, k: int) -> None:
        ptr = self._buffer_ptr.pop(k)
        self.comm.launched = [w for w in self.comm.launched if w.ptr != ptr]
        self.ledger.event(Ev.GRAD_FREED, k)

    def _violate(self, test: str, unit: int, message: str) -> None:
        self.violations.append({"test": test, "unit": unit, "step": self.ledger.step, "message": message})

    def before_micro_batch(self):
        super().before_micro_batch()
        # Keep watching only collectives on buffers that are still alive.
        alive = set(self._buffer_ptr.values())
        self.comm.launched = [w for w in self.comm.launched if w.ptr in alive]

    # ---------------------------------------------------------------- what the grader reads
    def update(self, grads, scratch=False):
        if self.grad_snapshot is None:  # the first step's reduced shards (SUM over ranks)
            self.grad_snapshot = [g.detach().float().cpu().clone() for g in grads]
        super().update(grads, scratch)


# ====================================================================== lab 6: FSDP's lifecycle
class LabFlatUnit(FlatParamUnit):
    """FSDP1's flat unit whose `unshard` / `reshard` are the student's."""

    student = None
    violations: list[dict] = []

    def _bytes(self) -> int:
        return sum(leaf.untyped_storage().nbytes() for leaf in self.leaves)

    def unshard(self, async_op: bool = False) -> None:
        before = self.state
        self.student.unshard(self, async_op)
        if before == SHARDED and self.state != SHARDED:
            self.ledger.event(Ev.UNSHARD, self.index)
        if not async_op and self.state != UNSHARDED:
            raise LabViolation("lifecycle", f"unshard(unit {self.index}, async_op=False) returned with the unit "
                                            f"{self.state.value}: wait for its all-gather (unit.wait_unshard()) "
                                            "before returning", unit=self.index)
        if self.state != SHARDED and self._bytes() == 0:
            raise LabViolation("lifecycle", f"unit {self.index} is {self.state.value} but its unsharded buffer "
                                            "has no storage: resize each leaf's storage to its full size before "
                                            "the all-gather writes into it", unit=self.index)

    def reshard(self) -> None:
        before = self.state
        self.student.reshard(self)
        if self.state != SHARDED:
            self.violations.append({"test": "lifecycle", "unit": self.index, "step": self.ledger.step,
                                    "message": f"reshard(unit {self.index}) left it {self.state.value}; "
                                               "set unit.state = SHARDED once its memory is freed"})
        elif self._bytes():
            self.violations.append({"test": "memory", "unit": self.index, "step": self.ledger.step,
                                    "message": f"unit {self.index} is sharded but its unsharded buffer still "
                                               f"holds {self._bytes()} bytes: resize the leaves' storage to 0 "
                                               "(autograd keeps views of it, so dropping a reference frees "
                                               "nothing)"})
        if before != SHARDED:
            self.ledger.event(Ev.RESHARD, self.index)


class FSDPLab(FSDP1):
    """The real FSDP1 with the student's lifecycle functions. What the student's code sees:
    ``fsdp.units`` (`LabFlatUnit`s: ``state``, ``leaves``, ``shards``, ``handles``, ``comm``,
    ``axis``, ``tag``, ``wait_unshard()``), ``fsdp.reshard_after_forward``, ``fsdp.forward_prefetch``,
    ``fsdp.backward_prefetch``, ``fsdp.limit_all_gathers``."""

    name = "fsdp1"

    def __init__(self, model, dist, recipe, adam=None, *, student, **options):
        self.student = student
        self.violations: list[dict] = []
        super().__init__(model, dist, recipe, adam, **options)

    def make_unit(self, index, module):
        u = LabFlatUnit(index, module, self.shard_axis(), self.pad_multiple(), self.comm, self.ledger,
                        self.param_dtype, self.grad_dtype, tag=self.tag)
        u.student, u.violations = self.student, self.violations
        return u

    def _states(self):
        return [u.state for u in self.units]

    def _violate(self, test: str, unit: int, message: str) -> None:
        self.violations.append({"test": test, "unit": unit, "step": self.ledger.step, "message": message})

    # ---------------------------------------------------------------- the hooks
    def _prefetch(self, j: int) -> None:
        self.student.prefetch(self, j)

    def pre_forward(self, u):
        before = self._states()
        self.student.pre_forward(self, u)
        self._check_use(u, before, "pre_forward", +1, self.forward_prefetch, "forward_prefetch")
        u.bind()

    def post_forward(self, u, out, args=()):
        outs = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
                if isinstance(t, torch.Tensor) and t.requires_grad]
        if outs and torch.is_grad_enabled():  # as FSDPStrategy.post_forward: backward finds the unit
            torch.autograd.graph.register_multi_grad_hook(outs, lambda _g, u=u: self.pre_backward(u), mode="any")
        before = self._states()
        self.student.post_forward(self, u)
        after = self._states()
        if self.reshard_after_forward and u.state != SHARDED:
            self._violate("lifecycle", u.index, f"post_forward left unit {u.index} {u.state.value}: with "
                                                "reshard_after_forward=True free its parameters after forward")
        if not self.reshard_after_forward and u.state == SHARDED:
            self._violate("lifecycle", u.index, f"post_forward resharded unit {u.index} although "
                                                "reshard_after_forward=False: backward then gathers it again, "
                                                "one all-gather more")
        self._others_unchanged("post_forward", u, {u.index}, before, after)

    def pre_backward(self, u):
        before = self._states()
        self.student.pre_backward(self, u)
        self._check_use(u, before, "pre_backward", -1, self.backward_prefetch, "backward_prefetch")

    # ---------------------------------------------------------------- the contract
    def _check_use(self, u, before, phase: str, direction: int, enabled: bool, option: str) -> None:
        after = self._states()
        use = "forward" if phase == "pre_forward" else "backward"
        if u.state != UNSHARDED:
            raise LabViolation("lifecycle", f"{phase}: unit {u.index} is {u.state.value} when its {use} runs: "
                                            "unshard it and wait for the all-gather first", unit=u.index)
        j = u.index + direction
        inside = 0 <= j < len(self.units)
        busy = sum(s != SHARDED for s in before) + (before[u.index] == SHARDED)
        limit = self.limit_all_gathers
        expect = enabled and inside and before[j] == SHARDED and (limit is None or busy < int(limit))
        got = inside and before[j] == SHARDED and after[j] != SHARDED
        if expect and not got:
            self._violate("prefetch", j, f"{phase} of unit {u.index} did not prefetch unit {j}: with {option}=True "
                                         f"start unit {j}'s all-gather now (async), so it travels while unit "
                                         f"{u.index} computes")
        elif got and not enabled:
            self._violate("prefetch", j, f"{phase} of unit {u.index} prefetched unit {j} although {option}=False")
        elif got and not expect:
            self._violate("prefetch", j, f"{phase} of unit {u.index} prefetched unit {j} although {busy} unit(s) "
                                         f"were already unsharded and limit_all_gathers={limit}")
        if got and after[j] == UNSHARDED:
            self._violate("prefetch", j, f"{phase} of unit {u.index} prefetched unit {j} and waited for it: a "
                                         "prefetch is asynchronous (unshard(unit, async_op=True)), waited for "
                                         "only when the unit is used")
        self._others_unchanged(phase, u, {u.index, j}, before, after)

    def _others_unchanged(self, phase, u, allowed, before, after) -> None:
        for k, (b, a) in enumerate(zip(before, after)):
            if k not in allowed and b != a:
                self._violate("lifecycle", k, f"{phase} of unit {u.index} changed unit {k} from {b.value} to "
                                              f"{a.value}")




# ====================================================================== lab 7: bucketed DDP's hooks
class DDPBucketedLab(DDPBucketed):
    """The real bucketed DDP with the student's hook functions. What the student's code sees:

    ``ddp.buckets[k]`` (a `Bucket`: ``index``, ``buffer``, ``param_ids``, ``pending``),
    ``ddp.bucket_of[i]``, ``ddp.next_bucket``, ``ddp.inflight`` (bucket index -> handle of its
    all-reduce), ``ddp.require_sync``, ``ddp.comm``, ``ddp.dist.inner``, ``ddp.tag(...)``.

    The scaffold keeps its own count of each bucket's gradients (the student's `pending` is theirs
    to get wrong) and emits `GRADS_READY` (with the bucket's index) when a bucket is complete, so
    the timeline shows where backward was while each all-reduce flew. It records, per step, the
    order in which buckets were reduced (by the buffer each collective read) and whether every
    collective was seen finished before the optimizer reads the gradients."""

    name = "ddp_bucketed"

    def __init__(self, model, dist, recipe, adam=None, *, student, **options):
        if not isinstance(dist.comm, WatchingComm):
            raise TypeError("DDPBucketedLab needs a DistState whose comm is a WatchingComm")
        self.student = student
        self.violations: list[dict] = []
        self._inflight: dict = {}
        self._noted_no_sync = False
        super().__init__(model, dist, recipe, adam, **options)
        self._own_pending = [len(b.param_ids) for b in self.buckets]
        self._bucket_at = {_ptr(b.buffer): b.index for b in self.buckets}

    @property
    def inflight(self) -> dict:
        return self._inflight

    def _post_accumulate_hook(self, i: int):
        def hook(_p):
            if self.require_sync:
                b = self.bucket_of[i]
                self._own_pending[b.index] -= 1
                if self._own_pending[b.index] == 0:
                    self.ledger.event(Ev.GRADS_READY, b.index)
            before = len(self.comm.launched)
            with _attributing(self.comm, self._attribute):
                self.student.post_accumulate(self, i)
            if not self.require_sync and len(self.comm.launched) > before and not self._noted_no_sync:
                self._noted_no_sync = True
                self._violate("bytes", self.bucket_of[i].index, "an all-reduce was launched inside no_sync(): "
                              "while micro-batches accumulate (ddp.require_sync is False) the hooks must do "
                              "nothing, and the next synchronised backward reduces the sum once")
            self._check_inflight()
        return hook

    def _check_inflight(self) -> None:
        for k, h in self._inflight.items():
            if not isinstance(h, Watched):
                raise LabViolation("overlap", f"ddp.inflight[{k}] is {h!r}, not the handle of bucket {k}'s "
                                              "all-reduce: launch it with async_op=True and store the handle "
                                              "it returns", unit=k)

    def _violate(self, test: str, bucket: int | None, message: str) -> None:
        self.violations.append({"test": test, "unit": bucket, "step": self.ledger.step, "message": message})

    def _settle(self, why: str) -> None:
        """Wait for every collective the student left unwaited (so the run goes on), naming each."""
        for w in self.comm.launched:
            if not w.seen_done:
                k = self._bucket_at.get(w.ptr)
                self._violate("waited", k, f"bucket {k}'s all-reduce was not waited for {why}: the "
                                           "optimizer would read a gradient the collective is still "
                                           "writing (handle.wait() on every bucket in finish)")
                w.wait()
        self.comm.launched = []

    def before_micro_batch(self):
        if self.require_sync:
            self._own_pending = [len(b.param_ids) for b in self.buckets]
            self._settle("before the next backward")
            self._inflight.clear()
        elif self.comm.launched:
            self._settle("before the next micro-batch")
        super().before_micro_batch()

    def _attribute(self, op, out, inp):
        """The bucket whose whole buffer this collective all-reduces (its tag), else refused."""
        k = next((b.index for b in self.buckets if _is(inp, b.buffer)), None) if op == "all_reduce" else None
        if k is None:
            raise LabViolation("bytes", f"{_described(op, out, inp)} that is no bucket's all-reduce: every collective "
                                        "in lab 7 all-reduces one bucket's whole buffer (ddp.buckets[k].buffer); one "
                                        "on anything else (empty, a copy, a slice, another kind of collective) "
                                        "carries no bucket's gradients and is refused")
        return comm_tag(self.name, f"bucket{k}", "grads")

    def finish_grad_sync(self) -> None:
        with _attributing(self.comm, self._attribute):
            self.student.finish(self)
        self._check_inflight()
        order = [self._bucket_at.get(w.ptr) for w in self.comm.launched if w.op == "all_reduce"]
        want = list(range(len(self.buckets)))
        if order != want:
            twice = sorted({k for k in order if order.count(k) > 1})
            missing = [k for k in want if k not in order]
            if twice:
                why = f"bucket {twice[0]} was all-reduced {order.count(twice[0])} times in one step"
            elif missing:
                why = f"bucket {missing[0]} was never all-reduced in this step"
            else:
                first = next(a for a, b in zip(order, want) if a != b)
                why = (f"bucket {first} was launched out of order (order {order}): every rank must issue "
                       "the buckets' collectives in the same order, bucket 0 first")
            self._violate("order", None, why)
        self._settle("before the optimizer step")
        if self._inflight:
            self._violate("waited", min(self._inflight), f"finish returned with buckets {sorted(self._inflight)} "
                                                         "still in ddp.inflight: wait for each and remove it")
            self._inflight.clear()
        self.ledger.mark(Ev.GRADS_SYNCED)


# ====================================================================== lab 8: FSDP2 with prefetch
class LabDim0Unit(Dim0Unit):
    """FSDP2's per-parameter unit (one collective per parameter) whose shard rows, `unshard` and
    `reshard` are the student's (`lab`, the `FSDP2Lab` around it, watches every call); it offers
    `padded_shard(j)` and `free_grads()`."""

    lab = None  # set on a per-run subclass: the shard rows are asked for inside __init__

    def _shard_rows(self, d0: int, n: int, r: int) -> shard.Range:
        got = self.lab.student.shard_rows(d0, n, r)
        c = shard.dim0_chunk_rows(d0, n)
        try:
            start, end = (int(v) for v in got)
        except (TypeError, ValueError):
            raise LabViolation("shards", f"shard_rows({d0}, {n}, {r}) returned {got!r}, not a pair (start, end) "
                                         "of row numbers") from None
        if not (0 <= start <= end <= d0) or end - start > c:
            raise LabViolation("shards", f"shard_rows({d0}, {n}, {r}) returned rows [{start}, {end}): a rank keeps "
                                         f"at most ceil(d0/N) = {c} of the parameter's {d0} rows, inside [0, {d0})")
        return shard.Range(start, end)

    def padded_shard(self, j: int) -> torch.Tensor:
        """Parameter j's shard with zero rows added up to c_j rows: what this rank sends in its
        all-gather (every rank sends the same size; only the wire is padded)."""
        return self._padded(self.shards[j], self.chunk_rows[j])

    def free_grads(self) -> None:
        """Drop the unit's full gradients (every leaf's .grad)."""
        for leaf in self.leaves:
            leaf.grad = None

    def unshard(self, async_op: bool = False) -> None:
        self.lab.call("unshard", self, async_op)
        if not async_op and self.state != UNSHARDED:
            raise LabViolation("lifecycle", f"unshard(unit {self.index}, async_op=False) returned with the unit "
                                            f"{self.state.value}: wait for its all-gathers (unit.wait_unshard()) "
                                            "before returning", unit=self.index)

    def reshard(self) -> None:
        self.lab.call("reshard", self)


class FSDP2Lab(FSDP2):
    """The real FSDP2 (one all-gather and one reduce-scatter per parameter) with the student's
    shard rows, unshard / reshard, backward prefetch and asynchronous reduce-scatter. What the
    student's code sees: ``fsdp.units`` (`LabDim0Unit`s: ``state``, ``leaves``, ``shards``,
    ``grad_shards``, ``chunk_rows``, ``padded_shard(j)``, ``handles``, ``wait_unshard()``,
    ``free_grads()``, ``comm``, ``axis``, ``tag``), ``fsdp.backward_prefetch``, ``fsdp.inflight``
    (theirs to set), ``fsdp.accumulate``.

    Every call into the student's code is watched (`call`): a unit that went from sharded to
    not gets `UNSHARD` on the timeline, one that went back `RESHARD` (and must hold no bytes);
    each unit's `POST_BACKWARD` (its full gradients all there: its backward computed) is marked
    before the student's post_backward, so the grader can see whether the previous unit's
    all-gather was in flight while this unit computed; a full gradient dropped while the
    reduce-scatter reading it was not seen finished is a violation (`_check_frees`)."""

    name = "fsdp2"

    def __init__(self, model, dist, recipe, adam=None, *, student, **options):
        if not isinstance(dist.comm, WatchingComm):
            raise TypeError("FSDP2Lab needs a DistState whose comm is a WatchingComm")
        self.student = student
        self.violations: list[dict] = []
        self.inflight = None
        self._grad_ptr: dict[tuple[int, int], int] = {}  # (unit, param) -> its full gradient's storage
        super().__init__(model, dist, recipe, adam, **{**options, "batched": False, "async_reduce_scatter": False})

    def make_unit(self, index, module):
        cls = type("LabDim0Unit", (LabDim0Unit,), {"lab": self})
        return cls(index, module, self.shard_axis(), self.comm, self.ledger, self.param_dtype, self.grad_dtype,
                   tag=self.tag, batched=False)

    @property
    def accumulate(self) -> bool:
        """True from the step's second micro-batch on: add the reduced rows to the grad shards."""
        return self._shards_hold_sum

    def _violate(self, test: str, unit: int | None, message: str) -> None:
        self.violations.append({"test": test, "unit": unit, "step": self.ledger.step, "message": message})

    # ---------------------------------------------------------------- watching the student
    def _attribute(self, op, out, inp):
        """The unit leaf this all-gather writes, or the full gradient this reduce-scatter reads
        (its tag, with the unit's number), else refused."""
        for u in getattr(self, "units", []):
            for j in range(len(u.leaves)):
                if op == "all_gather" and _is(out, u.leaves[j]):
                    return comm_tag(self.name, UnitName(u.index), "params", f"param{j}")
                grads = (u.leaves[j].grad, u.train_leaves[j].grad if j < len(u.train_leaves) else None)
                if op == "reduce_scatter" and any(g is not None and _is(inp, g) for g in grads):
                    return comm_tag(self.name, UnitName(u.index), "grads", f"param{j}")
        what = ("writes no unit's leaf (gather straight into unit.leaves[j]: a scratch tensor of your own is "
                "memory the ledger cannot see)" if op == "all_gather" else
                "reads no leaf's full gradient (reduce-scatter leaf.grad itself)" if op == "reduce_scatter" else
                "is not a collective FSDP2 uses (one all-gather per leaf, one reduce-scatter per gradient)")
        raise LabViolation("bytes", f"{_described(op, out, inp)} that {what}: a collective that carries none "
                                    "of the units' parameters or gradients is refused")

    def call(self, fn: str, *args):
        before = [u.state for u in self.units] if hasattr(self, "units") else []
        with _attributing(self.comm, self._attribute):
            out = getattr(self.student, fn)(*args)
        for u, b in zip(self.units, before):
            held = sum(leaf.untyped_storage().nbytes() for leaf in u.leaves)
            if b == SHARDED and u.state != SHARDED:
                self.ledger.event(Ev.UNSHARD, u.index)
                if any(leaf.untyped_storage().nbytes() == 0 for leaf in u.leaves):
                    raise LabViolation("lifecycle", f"{fn}: unit {u.index} is {u.state.value} but a leaf has no "
                                                    "storage: resize each leaf's storage to its full size before "
                                                    "the all-gather writes into it", unit=u.index)
            elif b != SHARDED and u.state == SHARDED:
                self.ledger.event(Ev.RESHARD, u.index)
                if held:
                    self._violate("memory", u.index, f"{fn}: unit {u.index} is sharded but its leaves still hold "
                                                     f"{held} bytes: resize each leaf's storage to 0 (autograd keeps "
                                                     "views of it, so dropping a reference frees nothing)")
        self._check_frees()
        # Gathers seen finished hold only their padded send buffers now: let them go.
        self.comm.launched = [w for w in self.comm.launched if w.op != "all_gather" or not w.seen_done]
        return out

    def _check_frees(self) -> None:
        for (k, j), ptr in list(self._grad_ptr.items()):
            leaf = self.units[k].train_leaves[j]
            if leaf.grad is not None and _ptr(leaf.grad) == ptr:
                continue  # still there
            mine = [w for w in self.comm.launched if w.op == "reduce_scatter" and w.ptr == ptr]
            if not mine:
                self._violate("no_early_free", k, f"unit {k}, parameter {j}: its full gradient was freed before "
                                                  "any reduce-scatter read it")
            elif not all(w.seen_done for w in mine):
                self._violate("no_early_free", k, f"unit {k}, parameter {j}: its full gradient was freed while its "
                                                  "reduce-scatter was still in flight: free it only after "
                                                  "handle.wait() returned (with NCCL the caching allocator would "
                                                  "hand that memory to the next layer while the collective "
                                                  "still reads it)")
            del self._grad_ptr[(k, j)]
            self.comm.launched = [w for w in self.comm.launched if w.ptr != ptr]

    # ---------------------------------------------------------------- the hooks
    def pre_backward(self, u):
        self.call("pre_backward", self, u)
        if u.state != UNSHARDED:
            raise LabViolation("lifecycle", f"pre_backward: unit {u.index} is {u.state.value} when its backward "
                                            "runs: unshard it and wait for its all-gathers first", unit=u.index)

    def post_backward(self, u):
        for j, leaf in enumerate(u.train_leaves):
            self._grad_ptr[(u.index, j)] = _ptr(leaf.grad)
            self.ledger.track(leaf.grad, "comm_buffer")
        self.ledger.event(Ev.POST_BACKWARD, u.index)
        self.call("post_backward", self, u)
        if u.state != SHARDED:
            self._violate("memory", u.index, f"post_backward left unit {u.index} {u.state.value}: reshard it once "
                                             "its reduce-scatters are launched")
        return u.grad_shards

    def _finish(self, when: str) -> None:
        self.call("finish_reduce", self)
        if self.inflight is not None:
            raise LabViolation("waited", f"finish_reduce returned with fsdp.inflight still set {when}: wait for "
                                         "the reduce-scatters, copy the rows out and set it to None")

    def after_backward(self) -> None:
        self.reduce_unused_units()
        self._finish("at the end of backward")  # before the sum flag: this micro-batch's rows
        self._shards_hold_sum = True

    def finish_grad_sync(self) -> None:
        if self.micro_batches == 0:
            self.reduce_unused_units()
            self._finish("before the optimizer step")
        alive = sorted({k for (k, _j) in self._grad_ptr})
        if alive:
            self._violate("memory", alive[0], f"the full gradients of unit(s) {alive} are still alive at the "
                                              "optimizer step: free them (unit.free_grads()) once their "
                                              "reduce-scatter finished")
            for u in self.units:
                u.free_grads()
            self._grad_ptr.clear()
        self.comm.launched = []


__all__ = ["DDPBucketedLab", "FSDP2Lab", "FSDPLab", "LabDim0Unit", "LabFlatUnit", "Watched", "WatchingComm",
           "ZeRO2Lab"]
