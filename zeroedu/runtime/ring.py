"""Ring reduce-scatter, all-gather and all-reduce built from point-to-point send/recv.

Why: on gloo, `dist.reduce_scatter_single` is implemented as clone + all-reduce + copy of one
chunk (ProcessGroupGloo::reduce_scatter_tensor_coalesced), so it moves 2(g-1)/g*S per rank, not
the (g-1)/g*S the ZeRO/FSDP arithmetic assumes. These functions move exactly the ring bound:
g-1 messages of S/g per rank and phase (plus gloo's framing, 144 B per message: `zeroedu.runtime.wire`).

Ring and reduction order (the same as gloo's all-reduce, gloo/allreduce.cc `ring`)
----------------------------------------------------------------------------------
Group ranks r = 0..g-1 in a ring; every rank sends to its LEFT neighbour r-1 and receives from
its RIGHT neighbour r+1. Reduce-scatter, step s = 0..g-2: rank r sends (its partial sum of)
chunk r+1+s and receives chunk r+2+s, to which it adds its own input. The partial sum of chunk c
therefore starts at rank c-1 and walks down the ring, so every element of chunk c is summed as

    ((x[c-1] + x[c-2]) + x[c-3]) + ... + x[c]          (indices mod g)

This is a fixed, documented order and it is gloo's: gloo's ring all-reduce starts chunk c at rank
c-1 and sends to rank-1 too. Bitwise equality with gloo follows whenever our chunk boundaries
equal gloo's (a+b == b+a exactly in IEEE arithmetic, and fp16/bf16 sums round to the storage type
after every addition both in gloo (c10::Half/BFloat16 operator+) and in torch's add_):
* `ring_all_reduce(..., chunks="gloo")` (default) uses gloo's own chunk boundaries (1 MiB
  segments, rounded to a multiple of g, at least 2 per rank), so it equals `dist.all_reduce`
  bitwise for any size.
* `ring_reduce_scatter` must use g equal chunks of k (the output convention). gloo's
  `reduce_scatter_single` is an all-reduce with gloo's chunk boundaries, which are the same as
  ours iff k is a multiple of gloo's segments-per-rank (`gloo_segments_per_rank`; 2 for inputs
  up to 2g MiB). Otherwise elements near the chunk edges are summed in another rotation of the
  ring order by gloo; matching them would need extra traffic (measured: at most 2 ulp).

Sizes: `inp` numel must be g*k exactly (k = 0 allowed: nothing moves). The caller pads to a
multiple of g, as for `dist.reduce_scatter_single`. `out` may alias `inp`'s own chunk r (in-place
reduce-scatter); any other overlap is undefined.

Async: ops run on a `CommStream`, one background thread per process executing ring collectives in
issue order (like a CUDA stream for NCCL); `async_op=True` returns a `RingWork` (`wait()`,
`is_completed()`, `get_future()`), like torch's Work. A synchronous call runs inline on the
caller's thread when the stream is idle (no thread hop), else it queues behind the in-flight ops
and waits. Issue order must be the same on every rank of a group (as for any collective); each
op gets a fresh block of p2p tags (one per message) from a per-group counter, so ops never mix
messages, with each other or with the program's own send/recv (tags from 2**30 up; user code
should use tags below that).

The p2p calls use the ProcessGroup object directly (`pg.send([t], group_rank, tag)`): this is what
`dist.isend(t, dst=dist.get_global_rank(group, r), group=group, tag=tag)` ends in, minus the
Python-level bookkeeping (global<->group rank mapping, the coalescing manager's global state),
which is not thread-safe to share with a main thread that also issues collectives.
"""
from __future__ import annotations

import collections
import os
import threading
import time

import torch
import torch.distributed as dist

TAG_BASE = 1 << 30            # ring tags live in [2**30, 2**31): clear of user p2p tags
GLOO_MAX_SEGMENT_BYTES = 1 << 20  # gloo::AllreduceOptions kMaxSegmentSize


# ---------------------------------------------------------------------------- group context
class _GroupCtx:
    """What the ring needs to know about one process group, computed once."""

    def __init__(self, group):
        self.group = group
        self.pg = group if group is not None else dist.distributed_c10d._get_default_group()
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)  # -1 if this process is not a member
        if self.rank < 0:
            raise ValueError("this process is not a member of the group")
        # Global ranks in group-rank order, for logs and for callers that use dist.isend.
        self.global_ranks = tuple(dist.get_process_group_ranks(self.pg))
        self.left = (self.rank - 1) % self.size
        self.right = (self.rank + 1) % self.size
        self._seq = 0
        self._lock = threading.Lock()

    def next_tag(self, count: int = 1) -> int:
        """First of `count` consecutive fresh tags (one per message of an op).

        Taken at issue time, on the issuing thread: the k-th ring op on a group gets the same
        tags on every rank because every rank issues the group's ops in the same order.
        """
        with self._lock:
            if self._seq + count > TAG_BASE:  # wrap; ops that old have long completed
                self._seq = 0
            tag = TAG_BASE + self._seq
            self._seq += count
        return tag


_ctx_lock = threading.Lock()
_ctxs: dict[int, _GroupCtx] = {}


def _ctx(group) -> _GroupCtx:
    key = id(group) if group is not None else 0
    with _ctx_lock:
        c = _ctxs.get(key)
        if c is None or (group is not None and c.group is not group):
            c = _ctxs[key] = _GroupCtx(group)
        return c


# ---------------------------------------------------------------------------- async machinery
class RingWork:
    """Handle of a ring collective queued on a CommStream. Mirrors torch's Work API."""

    def __init__(self, name: str):
        self.name = name
        self._fut = torch.futures.Future()

    def wait(self, timeout=None) -> bool:
        # Future.wait re-raises the op's exception on the caller's thread. `timeout` is accepted
        # for Work compatibility only: the p2p ops inside already time out with the group's
        # timeout (init_process_group(timeout=...)), which fails the future.
        self._fut.wait()
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    done = is_completed

    def get_future(self) -> torch.futures.Future:
        return self._fut

    def exception(self):
        if not self._fut.done():
            return None
        try:
            self._fut.value()
            return None
        except BaseException as e:  # noqa: BLE001 - reported, not handled
            return e


class CommStream:
    """One background thread that runs ring collectives in FIFO issue order."""

    def __init__(self, name: str = "ring-comm"):
        self._q: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._pending = 0  # queued + running
        self._closed = False
        # OpenMP's thread count is per thread: a fresh thread would use every core for the
        # additions. Carry the creating thread's setting over (ranks run with 1 thread each).
        self._threads = torch.get_num_threads()
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self):
        torch.set_num_threads(self._threads)
        last_end = 0.0
        while True:
            with self._cv:
                while not self._q and not self._closed:
                    self._cv.wait()
                if not self._q:
                    return
                fn, work, submitted = self._q.popleft()
            error = None
            # When the op could have started: issued, and the one before it done. The thread
            # itself wakes later (a core and the interpreter lock to wait for); an emulated
            # link starts the op's first messages at this moment instead (`_relay`).
            _started.ready = max(submitted, last_end)
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                error = e
            _started.ready = None
            last_end = time.monotonic()
            # The op's closure holds its tensors: drop it *before* waking the waiter, or a
            # buffer the caller frees right after the wait (ZeRO-2's full gradient) would stay
            # allocated until the next op comes.
            fn = None
            with self._cv:
                self._pending -= 1
                self._cv.notify_all()
            if error is None:
                work._fut.set_result(None)
            else:
                work._fut.set_exception(error)
            work = error = None

    def submit(self, fn, name: str) -> RingWork:
        work = RingWork(name)
        with self._cv:
            if self._closed:
                raise RuntimeError("CommStream is closed")
            self._pending += 1
            self._q.append((fn, work, time.monotonic()))
            self._cv.notify_all()
        return work

    def idle(self) -> bool:
        with self._cv:
            return self._pending == 0

    def synchronize(self):
        with self._cv:
            while self._pending:
                self._cv.wait()

    def close(self, join: bool = True):
        """No more ops; the thread ends once the queued ones are done (`join`: wait for that)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if join and threading.current_thread() is not self._thread:
            self._thread.join()


_default_stream: CommStream | None = None
_started = threading.local()  # .ready: when the op this stream thread runs could have started


def _late_start() -> float:
    """How long after the op running on this thread could have started it got going (0 for an
    op run inline by its caller)."""
    ready = getattr(_started, "ready", None)
    return 0.0 if ready is None else max(0.0, time.monotonic() - ready)



def default_stream() -> CommStream:
    """The stream of ring calls made without one (direct calls, tests); every `Comm` owns its
    own (`Comm.stream`), which ends with it."""
    global _default_stream
    if _default_stream is None or _default_stream._pid != os.getpid():  # not inherited by fork
        _default_stream = CommStream()
    return _default_stream


def _launch(fn, name, async_op, stream):
    stream = stream or default_stream()
    if not async_op and stream.idle():
        fn()  # nothing in flight on the stream: running here keeps issue order, saves a hop
        return None
    work = stream.submit(fn, name)
    if async_op:
        return work
    work.wait()
    return None


# ---------------------------------------------------------------------------- ring engine
# Default: one message per chunk and step. Cutting chunks into segments (gloo cuts into <= 1 MiB,
# >= 2 per chunk) lets segment j+1 travel while segment j is being added, but on the 2-core
# machines this package targets it measured slower, not faster: every message
# costs a Python round trip and a wake-up of two processes, and there is no spare core to overlap
# with. Pass segment_bytes=1 << 20 to pipeline like gloo (e.g. more cores, a real network).
DEFAULT_SEGMENT_BYTES = None
PIPELINE_MIN_BYTES = 64 << 10  # when segmenting, chunks at least this big get >= 2 segments


def _num_segments(max_chunk_bytes: int, segment_bytes: int | None) -> int:
    """Messages per chunk and step: 1 unless segmenting (small chunks always stay whole)."""
    if not segment_bytes or max_chunk_bytes < PIPELINE_MIN_BYTES:
        return 1
    return max(2, _ceil_div(max_chunk_bytes, segment_bytes))


def _segment(t: torch.Tensor, j: int, m: int) -> torch.Tensor:
    """Segment j of m of a 1-D view: near-equal cut, the same on every rank for the same chunk."""
    q, rem = divmod(t.numel(), m)
    start = j * q + min(j, rem)
    return t[start:start + q + (1 if j < rem else 0)]


def _relay(c: _GroupCtx, tag: int, steps: int, m: int, first, recv_into, on_recv,
           recycled: bool, pace=None, late: float | None = None, entered: float | None = None) -> float:
    """Run `steps` ring steps, each chunk cut into `m` segments that travel independently.

    Step s: receive segment (s, j) from the right neighbour into `recv_into(s, j)`, then
    `on_recv(s, j)` turns it into what is sent left at step s+1 (None: keep it, last step).
    Step 0 sends `first(j)`. The receive for step s+1 is posted one step ahead, so the next
    segment is on the wire while this one is being added. `recycled`: the receive buffer of step
    s+1 is the one sent at step s, so that send must have completed before the receive is posted.
    Empty segments are skipped on both ends alike. Every message has its own tag.
    `pace` (an emulated link, `zeroedu.runtime.links.Pace`): each message's start is posted as
    it is sent, and an arrived message is held until the link would have delivered it. A
    message starts on the link as if this rank had got to it on time: step 0's as the op could
    have started (`late`: how long after that the relay began; by default the stream's
    `_late_start`), step s+1's as step s's message was delivered (`Pace.received`'s lateness),
    but never before this rank could have started the op (`entered`, on the clock of
    `time.monotonic`): a rank that came to the collective after its peers has its own data only
    from then. Returns the lateness of the last message received (what the next relay of the
    same op computes from).
    """
    if late is None:
        late = _late_start()
    if entered is None:
        entered = time.monotonic() - late
    last_late = 0.0
    sends, recvs, sizes = {}, {}, {}

    def post_recv(s, j):
        t = recv_into(s, j)
        if t.numel():
            recvs[s, j] = c.pg.recv([t], c.right, tag + s * m + j)
            sizes[s, j] = t.numel() * t.element_size()

    def post_send(s, j, t, late=0.0):
        if t.numel():
            if pace is not None:
                late = min(late, max(0.0, time.monotonic() - entered))  # not before this rank entered
                pace.sending(c.global_ranks[c.left], t.numel() * t.element_size(), late)
            sends[s, j] = c.pg.send([t], c.left, tag + s * m + j)

    for j in range(m):
        post_recv(0, j)
    for j in range(m):
        post_send(0, j, first(j), late)
    for s in range(steps):
        for j in range(m):
            if s + 1 < steps:
                if recycled and s > 0 and (s, j) in sends:
                    sends.pop((s, j)).wait()
                post_recv(s + 1, j)
            w = recvs.pop((s, j), None)
            late = 0.0
            if w is not None:
                w.wait()
                if pace is not None:
                    late = last_late = pace.received(c.global_ranks[c.right], sizes[s, j])
            nxt = on_recv(s, j)
            if nxt is not None and s + 1 < steps:
                post_send(s + 1, j, nxt, late)  # starts as if this rank had woken on time
    for w in sends.values():
        w.wait()
    return last_late


def _check(out, inp, what):
    if out.dtype != inp.dtype:
        raise ValueError(f"{what}: dtypes differ ({out.dtype} vs {inp.dtype})")
    if out.device != inp.device:
        raise ValueError(f"{what}: devices differ")


def _flat(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError("ring collectives need contiguous tensors")
    return t.view(-1)


def ring_reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group=None, async_op: bool = False,
                        stream: CommStream | None = None, segment_bytes: int | None = DEFAULT_SEGMENT_BYTES,
                        pace=None):
    """SUM of `inp` (numel g*k) over the group; this rank gets chunk `rank` (numel k) in `out`.

    Same convention as dist.reduce_scatter_single. Sends g-1 chunks of k elements (in m
    segments each). Scratch: 2k elements.
    """
    c = _ctx(group)
    g, r = c.size, c.rank
    _check(out, inp, "ring_reduce_scatter")
    k = out.numel()
    if inp.numel() != g * k:
        raise ValueError(f"ring_reduce_scatter: input has {inp.numel()} elements, need {g} x {k} "
                         "(pad the input to a multiple of the group size)")
    x, o = _flat(inp), _flat(out)
    m = _num_segments(k * x.element_size(), segment_bytes)
    tag = c.next_tag((g - 1) * m) if g > 1 and k > 0 else None

    def run():
        if g == 1:
            o.copy_(x)
            return
        if k == 0:
            return
        chunk = lambda i: x[(i % g) * k:(i % g + 1) * k]  # noqa: E731
        bufs = (torch.empty_like(o), torch.empty_like(o))

        def on_recv(s, j):
            b = _segment(bufs[s % 2], j, m)
            if s < g - 2:  # partial sum from the right + our input: forwarded left next step
                return b.add_(_segment(chunk(r + 2 + s), j, m))
            # chunk r+2+(g-2) == r is ours: complete once our own part is added
            torch.add(b, _segment(chunk(r), j, m), out=_segment(o, j, m))
            return None

        # step 0 sends our own contribution to chunk r+1, which starts its walk down the ring
        _relay(c, tag, g - 1, m, lambda j: _segment(chunk(r + 1), j, m),
               lambda s, j: _segment(bufs[s % 2], j, m), on_recv, recycled=True, pace=pace)

    return _launch(run, "ring_reduce_scatter", async_op, stream)


def ring_all_gather(out: torch.Tensor, inp: torch.Tensor, group=None, async_op: bool = False,
                    stream: CommStream | None = None, segment_bytes: int | None = DEFAULT_SEGMENT_BYTES,
                    pace=None):
    """`out` (numel g*k) = every rank's `inp` (numel k) concatenated in group-rank order.

    Same convention as dist.all_gather_single. Sends g-1 chunks of k elements; no scratch.
    """
    c = _ctx(group)
    g, r = c.size, c.rank
    _check(out, inp, "ring_all_gather")
    k = inp.numel()
    if out.numel() != g * k:
        raise ValueError(f"ring_all_gather: output has {out.numel()} elements, need {g} x {k}")
    x, o = _flat(inp), _flat(out)
    m = _num_segments(k * x.element_size(), segment_bytes)
    tag = c.next_tag((g - 1) * m) if g > 1 and k > 0 else None

    def run():
        chunk = lambda i: o[(i % g) * k:(i % g + 1) * k]  # noqa: E731
        chunk(r).copy_(x)  # a no-op copy when inp is already out's chunk r
        if g == 1 or k == 0:
            return
        # step s receives chunk r+1+s straight into `out` and forwards it left at step s+1
        _relay(c, tag, g - 1, m, lambda j: _segment(chunk(r), j, m),
               lambda s, j: _segment(chunk(r + 1 + s), j, m),
               lambda s, j: _segment(chunk(r + 1 + s), j, m), recycled=False, pace=pace)

    return _launch(run, "ring_all_gather", async_op, stream)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


def gloo_segments_per_rank(numel: int, elem_size: int, g: int,
                           max_segment_bytes: int = GLOO_MAX_SEGMENT_BYTES) -> int:
    """Segments per rank in gloo's ring all-reduce for this buffer (see gloo/allreduce.cc)."""
    total = numel * elem_size
    max_seg = elem_size * max(1, max_segment_bytes // elem_size)
    nseg = _round_up(max(_ceil_div(total, max_seg), 2 * g), g)
    return nseg // g


def gloo_chunk_bounds(numel: int, elem_size: int, g: int,
                      max_segment_bytes: int = GLOO_MAX_SEGMENT_BYTES) -> list[tuple[int, int]]:
    """(start, end) element range of chunk c for c in 0..g-1, exactly as gloo's ring cuts it.

    gloo cuts the buffer into g*spr segments of ceil(bytes/(g*spr)) bytes rounded up to an
    element; chunk c is segments c*spr..(c+1)*spr-1, clipped to the buffer (the last chunks can
    be short or empty).
    """
    spr = gloo_segments_per_rank(numel, elem_size, g, max_segment_bytes)
    nseg = spr * g
    total = numel * elem_size
    seg_bytes = _round_up(_ceil_div(total, nseg), elem_size)
    per_chunk = spr * seg_bytes // elem_size
    return [(min(c * per_chunk, numel), min((c + 1) * per_chunk, numel)) for c in range(g)]


def even_chunk_bounds(numel: int, g: int) -> list[tuple[int, int]]:
    """g chunks whose sizes differ by at most one element (torch.tensor_split's cut)."""
    q, rem = divmod(numel, g)
    bounds, start = [], 0
    for c in range(g):
        end = start + q + (1 if c < rem else 0)
        bounds.append((start, end))
        start = end
    return bounds


def ring_all_reduce(t: torch.Tensor, group=None, async_op: bool = False,
                    stream: CommStream | None = None, chunks: str = "gloo",
                    segment_bytes: int | None = DEFAULT_SEGMENT_BYTES, pace=None):
    """In-place SUM all-reduce: ring reduce-scatter then ring all-gather, on one buffer.

    Any numel (chunks may be uneven). chunks="gloo" cuts like gloo's ring, so the result equals
    dist.all_reduce on gloo bitwise; chunks="even" cuts into near-equal chunks (exactly
    2(g-1)/g*S per rank when g divides numel). segment_bytes="gloo" (with chunks="gloo") also
    cuts each chunk into gloo's own segments, one message each, so the messages and their sizes
    are gloo's, and with them the bytes on the wire (what an emulated link needs: the same wire
    whether or not the link is paced). Scratch: two chunks.
    """
    c = _ctx(group)
    g, r = c.size, c.rank
    x = _flat(t)
    n = x.numel()
    if chunks == "gloo":
        bounds = gloo_chunk_bounds(n, x.element_size(), g)
    elif chunks == "even":
        bounds = even_chunk_bounds(n, g)
    else:
        raise ValueError(f"chunks must be 'gloo' or 'even', not {chunks!r}")
    longest = max(e - s for s, e in bounds)
    if segment_bytes == "gloo":
        if chunks != "gloo":
            raise ValueError("segment_bytes='gloo' cuts gloo's chunks: use it with chunks='gloo'")
        m = gloo_segments_per_rank(n, x.element_size(), g)
        e = x.element_size()  # gloo's segment, in elements (as `gloo_chunk_bounds` cuts it)
        seg = _round_up(_ceil_div(n * e, m * g), e) // e if n else 0
        # segment j of a chunk: gloo's j-th segment of it (the chunk's last ones can be short or empty)
        cut = lambda t, j, m: t[min(j * seg, t.numel()):min((j + 1) * seg, t.numel())]  # noqa: E731
    else:
        m = _num_segments(longest * x.element_size(), segment_bytes)
        cut = _segment
    tag = c.next_tag(2 * (g - 1) * m) if g > 1 and n > 0 else None

    def run():
        if g == 1 or n == 0:
            return
        chunk = lambda i: x[bounds[i % g][0]:bounds[i % g][1]]  # noqa: E731
        scratch = torch.empty(2, longest, dtype=x.dtype, device=x.device)
        recv_into = lambda s, j: cut(scratch[s % 2, :chunk(r + 2 + s).numel()], j, m)  # noqa: E731

        def on_recv(s, j):  # chunk r+2+s += partial from the right, in place; sent on next step
            dst = cut(chunk(r + 2 + s), j, m)
            return dst.add_(recv_into(s, j))

        # reduce-scatter phase: afterwards chunk r of t holds the full sum
        entered = time.monotonic() - _late_start()  # when this rank could have started the op
        late = _relay(c, tag, g - 1, m, lambda j: cut(chunk(r + 1), j, m), recv_into, on_recv,
                      recycled=False, pace=pace, entered=entered)
        # all-gather phase: forward the finished chunks leftwards, straight into t
        _relay(c, tag + (g - 1) * m, g - 1, m, lambda j: cut(chunk(r), j, m),
               lambda s, j: cut(chunk(r + 1 + s), j, m),
               lambda s, j: cut(chunk(r + 1 + s), j, m), recycled=False, pace=pace, late=late,
               entered=entered)

    return _launch(run, "ring_all_reduce", async_op, stream)
