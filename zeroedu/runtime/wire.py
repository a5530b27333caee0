"""Bytes this process really sent over TCP, read from the kernel, socket by socket.

Why: a ledger that computes "bytes sent" as payload x ring factor agrees with the theory by
construction. This module asks the operating system instead, so a measured figure can disagree
with a predicted one (and does: gloo's reduce-scatter is an all-reduce underneath).

How
---
* Sockets of this process: every fd in /proc/self/fd that `fstat` says is a socket. Its inode
  (`st_ino`) is the socket's identity for its whole life, so a socket keeps its counters across
  snapshots even if its fd number changes (dup) and a new socket is never confused with an old
  one whose fd number was reused.
* Counters: one `getsockopt(fd, IPPROTO_TCP, TCP_INFO)` per socket. It fails on non-TCP sockets
  (AF_UNIX, pipes are not sockets), which is how TCP sockets are recognised; no /proc/net/tcp
  parsing is needed (that file lists the whole network namespace, not this process).
  `getsockname` / `getpeername` give the ports, once per socket (cached by inode).
* The syscalls go through ctypes on the raw fd (after `os.dup`, so the inode we read is the one we
  checked). Not through `socket.socket(fileno=...)`: when the program has called
  `socket.setdefaulttimeout`, wrapping an fd makes CPython switch it to non-blocking, and the
  O_NONBLOCK flag is shared with gloo's own fd.
* Why not netlink sock_diag (what `ss -ti` uses): it dumps every socket of the network
  namespace (other jobs, other ranks) and then needs the inode list from /proc/self/fd anyway to
  keep only ours; getsockopt on our own fds is simpler, needs no privileges and is per process by
  construction.

What is counted (struct tcp_info, include/uapi/linux/tcp.h; the struct is append-only ABI, so
offsets never move, newer kernels only make it longer; checked here on 6.18 with `verify_offsets`)
--------------------------------------------------------------------------------------------------
* `written` = tcpi_bytes_sent - tcpi_bytes_retrans + tcpi_notsent_bytes: every payload byte the
  application (gloo) handed to this TCP socket, each counted once. This is the headline number
  (what `zeroedu.runtime.ledger` reports as a rank's wire bytes).
  It is exact at any moment, including right after a collective returns while this rank's last
  chunk still sits in the send queue, and it ignores retransmissions. It includes gloo's own
  framing: every gloo message costs 3 x 48-byte op headers, 96 B on the sender's socket
  (NOTIFY_SEND_READY + the data header) and 48 B on the receiver's (NOTIFY_RECV_READY), so a
  rank that sends and receives M messages writes payload + 144*M. No TCP/IP headers.
* `wire` = tcpi_bytes_sent: payload bytes that left in segments, retransmissions included, TCP/IP
  headers excluded; lags `written` by whatever is still queued. Retransmissions do happen on
  loopback when a receiver stops draining (zero-window probes, RTO), so `wire` can exceed what
  the program sent.
* `received` = tcpi_bytes_received (payload received, in order, each byte once).
* tcpi_bytes_acked is not used: it also counts the SYN (it is one more than the bytes acked).
All need Linux >= 4.19 (tcpi_bytes_sent / tcpi_bytes_retrans); older kernels get a reason.

Which sockets count
-------------------
`kind` of each TCP socket: "listen" (a listener, never counted), "control" (its local or remote
port is in `exclude_ports`, e.g. the TCPStore's: the rendezvous and every store get/set of this
rank, and the store server's accepted sockets on the rank that hosts it), "baseline" (it existed
when the meter was created and `exclude_existing=True`), or "data" (counted: gloo pair sockets).
`store_ports()` finds the default process group's TCPStore port (and MASTER_PORT); the default
`exclude_ports="auto"` uses it. Sockets that appear between two snapshots (gloo connecting a pair
lazily, a new process group) count from zero. Sockets that disappear between two snapshots
(a process group destroyed) lose whatever they sent after the first snapshot: the delta lists
them in `lost` and sets `complete=False`.

Backends: only for transports that use kernel TCP sockets (gloo over tcp). For NCCL (NVLink,
InfiniBand, its own proxy threads) the bytes are not visible here; the meter then is
`available=False` with a `reason`, and `snapshot()` / `sent_since()` return None.
"""
from __future__ import annotations

import ctypes
import functools
import os
import socket
import stat
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from ..kinds import Implementation

# Offsets in struct tcp_info (bytes). Stable ABI; verified by verify_offsets() on this kernel.
TCPI_STATE = 0            # u8
TCPI_BYTES_ACKED = 120    # u64, Linux 4.1, includes the SYN (+1)
TCPI_BYTES_RECEIVED = 128  # u64, Linux 4.1
TCPI_NOTSENT_BYTES = 144  # u32, Linux 4.6: write_seq - snd_nxt
TCPI_BYTES_SENT = 200     # u64, Linux 4.19: data bytes in sent segments, retransmits included
TCPI_BYTES_RETRANS = 208  # u64, Linux 4.19
_NEEDED_LEN = TCPI_BYTES_RETRANS + 8
_INFO_BUFLEN = 512        # ask for more than any kernel has; the kernel says how much it wrote

TCP_LISTEN = 10
_IPPROTO_TCP = socket.IPPROTO_TCP
_TCP_INFO = getattr(socket, "TCP_INFO", 11)
_AF_INET, _AF_INET6 = socket.AF_INET, socket.AF_INET6

_libc = None
if sys.platform.startswith("linux"):
    _libc = ctypes.CDLL(None, use_errno=True)
    _getsockopt = _libc.getsockopt
    _getsockopt.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                            ctypes.POINTER(ctypes.c_uint32)]
    _getsockname = _libc.getsockname
    _getpeername = _libc.getpeername
    for _f in (_getsockname, _getpeername):
        _f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]


# gloo's framing: every message of a collective or send/recv costs 96 bytes on the sender's socket
# (NOTIFY_SEND_READY + the data header) and 48 on the receiver's (NOTIFY_RECV_READY), 144 B per
# message in all (measured: send/recv of known payloads fits 1.000000 x payload + 96 x messages
# on the sending side exactly).
FRAMING_PER_MESSAGE = 144


def framing(op: str, messages: int) -> int:
    """gloo's framing bytes one rank writes for one of its records of `messages` messages
    (`messages` below): 96 per message it sends, 48 per message it receives, so a send writes
    96 per message, a recv 48, and a ring collective, which sends and receives as many, 144."""
    if op == "send":
        return 96 * messages
    if op == "recv":
        return 48 * messages
    return FRAMING_PER_MESSAGE * messages


@functools.lru_cache(maxsize=4096)  # asked at every collective's launch, with a few shapes a run
def messages(op: str, numel: int, elem_size: int, group: int, implementation: str) -> int:
    """Point-to-point messages one rank sends (and receives) in one collective on gloo.

    zeroedu's ring ("ring"): g-1 per reduce-scatter or all-gather. gloo's own ("backend"): its
    ring all-reduce cuts each rank's chunk into `spr` segments (at least 2, at most 1 MiB) and
    runs 2(g-1) steps of spr messages; its reduce_scatter_single *is* that all-reduce; its
    all_gather_single 2(g-1) messages. A group of one sends nothing."""
    from .ring import gloo_segments_per_rank

    g = group
    if op == "all_to_all" and g > 1:
        # one message to each other rank, even of no rows: a rank whose experts got no tokens
        # still frames an empty message to every peer (measured: 144 B each, tests/test_expert_spine.py)
        return g - 1
    if g <= 1 or numel == 0:
        return 0
    if op in ("send", "recv", "broadcast"):
        return 1
    if implementation == Implementation.RING and op in ("reduce_scatter", "all_gather"):
        return g - 1
    if op == "all_gather":
        return 2 * (g - 1)
    return 2 * (g - 1) * gloo_segments_per_rank(numel, elem_size, g)


class SockCounters(NamedTuple):  # a NamedTuple: built ~30 times per snapshot, must be cheap
    written: int    # payload bytes handed to TCP by the application (sent + queued, no retransmits)
    wire: int       # tcpi_bytes_sent: bytes in transmitted segments, retransmissions included
    retrans: int    # tcpi_bytes_retrans
    received: int   # tcpi_bytes_received


@dataclass(frozen=True)
class SockInfo:
    inode: int
    family: int
    local: tuple    # (address, port)
    remote: tuple   # (address, port) or None for a listener
    kind: str       # "data" | "control" | "baseline" | "listen"


@dataclass
class WireSnapshot:
    """Counters of every TCP socket of this process at one moment (data sockets and the rest)."""

    t: float
    counters: dict   # inode -> SockCounters (TCP sockets that are not listeners)
    info: dict       # inode -> SockInfo

    @property
    def total(self) -> int:
        """Bytes written so far on the counted ("data") sockets that are alive now."""
        return sum(c.written for i, c in self.counters.items() if self.info[i].kind == "data")

    def __int__(self):
        return self.total


@dataclass
class WireDelta:
    """What happened between two snapshots, on the counted sockets unless stated."""

    sent: int            # bytes written (headline): payload + gloo framing, no retransmits
    wire: int            # tcpi_bytes_sent delta: includes retransmissions, excludes what is queued
    retrans: int
    received: int
    control_sent: int    # the same `written` delta on control sockets (store), for the curious
    seconds: float
    new: list = field(default_factory=list)    # SockInfo of sockets that appeared (counted from 0)
    lost: list = field(default_factory=list)   # SockInfo of sockets that vanished: bytes unknown
    per_socket: dict = field(default_factory=dict)  # inode -> sent, data sockets that moved
    per_label: dict = field(default_factory=dict)   # label (see WireMeter.label_new) -> sent

    @property
    def complete(self) -> bool:
        return not self.lost


def _sockaddr(fn, fd: int):
    buf = ctypes.create_string_buffer(128)
    ln = ctypes.c_uint32(128)
    if fn(fd, buf, ctypes.byref(ln)) != 0:
        return None
    raw = buf.raw[:ln.value]
    fam = struct.unpack_from("=H", raw, 0)[0]
    port = struct.unpack_from("!H", raw, 2)[0]
    if fam == _AF_INET:
        return fam, (socket.inet_ntop(_AF_INET, raw[4:8]), port)
    if fam == _AF_INET6:
        return fam, (socket.inet_ntop(_AF_INET6, raw[8:24]), port)
    return fam, None


def _tcp_info(fd: int, buf) -> bytes | None:
    ln = ctypes.c_uint32(_INFO_BUFLEN)
    if _getsockopt(fd, _IPPROTO_TCP, _TCP_INFO, buf, ctypes.byref(ln)) != 0:
        return None  # not a TCP socket (AF_UNIX, UDP, ...)
    return buf.raw[:ln.value]


_Q, _I, _QQ = struct.Struct("=Q"), struct.Struct("=I"), struct.Struct("=QQ")


def _counters(raw: bytes) -> SockCounters:
    sent, retrans = struct.unpack_from("=QQ", raw, TCPI_BYTES_SENT)
    notsent = struct.unpack_from("=I", raw, TCPI_NOTSENT_BYTES)[0]
    received = struct.unpack_from("=Q", raw, TCPI_BYTES_RECEIVED)[0]
    return SockCounters(sent - retrans + notsent, sent, retrans, received)


def store_ports() -> set[int]:
    """Ports of the rendezvous store: the default group's TCPStore, and MASTER_PORT if set."""
    ports = set()
    if os.environ.get("MASTER_PORT", "").isdigit():
        ports.add(int(os.environ["MASTER_PORT"]))
    try:
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _get_default_store
        if dist.is_initialized():
            st = _get_default_store()
            for _ in range(8):  # PrefixStore(PrefixStore(TCPStore)) ...
                port = getattr(st, "port", None)
                if isinstance(port, int):
                    ports.add(port)
                    break
                st = getattr(st, "underlying_store", None)
                if st is None:
                    break
    except Exception:  # store introspection is best effort; explicit exclude_ports still work
        pass
    return ports


class WireMeter:
    """Per-process TCP byte meter. A snapshot costs ~75 µs with 9 TCP sockets, ~200 µs with 33.

    >>> m = WireMeter()                 # after init_process_group, so the store port is known
    >>> s = m.snapshot(); dist.all_reduce(t); d = m.sent_since(s); d.sent
    """

    def __init__(self, exclude_ports="auto", exclude_existing: bool = False,
                 backend: str | None = None):
        self.available, self.reason = True, ""
        if backend is None:
            try:
                import torch.distributed as dist
                backend = dist.get_backend() if dist.is_initialized() else "gloo"
            except Exception:
                backend = "gloo"
        backend = str(backend).lower()
        if _libc is None:
            self.available, self.reason = False, f"needs Linux TCP_INFO (platform {sys.platform})"
        elif backend != "gloo":
            self.available, self.reason = False, (
                f"backend {backend!r} does not move tensors through this process's kernel TCP "
                "sockets (NCCL uses NVLink/PCIe/IB and its own proxy threads): bytes not observable")
        elif os.environ.get("GLOO_DEVICE_TRANSPORT", "TCP").upper() not in ("TCP", "TCP_TLS"):
            self.available, self.reason = False, (
                f"gloo transport {os.environ['GLOO_DEVICE_TRANSPORT']} is not kernel TCP")
        if exclude_ports == "auto":
            exclude_ports = store_ports()
        self.exclude_ports = frozenset(int(p) for p in (exclude_ports or ()))
        self._info: dict[int, SockInfo] = {}
        self._buf = ctypes.create_string_buffer(_INFO_BUFLEN) if _libc is not None else None
        self._ln = ctypes.c_uint32(_INFO_BUFLEN)
        self._skip: set[int] = set()  # inodes of sockets that are not TCP, or are listeners
        self._labels: dict[int, str] = {}
        self._baseline = frozenset()
        if self.available:
            if not self._offsets_supported():
                self.available, self.reason = False, (
                    f"kernel {os.uname().release} has no tcpi_bytes_sent (needs Linux >= 4.19)")
            elif exclude_existing:
                self._baseline = frozenset(self._read()[0])
                self._info.clear()  # classified before the baseline was known: redo on next read

    # ------------------------------------------------------------------ reading
    def _offsets_supported(self) -> bool:
        with socket.socket(_AF_INET, socket.SOCK_STREAM) as a:  # TCP_INFO works unconnected too
            raw = _tcp_info(a.fileno(), self._buf)
            return raw is not None and len(raw) >= _NEEDED_LEN

    def _classify(self, fd: int, inode: int, state: int) -> SockInfo | None:
        fam, local = _sockaddr(_getsockname, fd) or (0, None)
        peer = None if state == TCP_LISTEN else (_sockaddr(_getpeername, fd) or (0, None))[1]
        if state != TCP_LISTEN and peer is None:
            return None  # not connected yet (gloo connecting lazily): classify on a later read
        ports = {p for p in ((local or (None, None))[1], (peer or (None, None))[1]) if p is not None}
        if state == TCP_LISTEN:
            kind = "listen"
        elif ports & self.exclude_ports:
            kind = "control"
        elif inode in self._baseline:
            kind = "baseline"
        else:
            kind = "data"
        return SockInfo(inode, fam, local, peer, kind)

    def _read(self):
        """inode -> SockCounters of every connected TCP socket of this process, and all inodes seen.

        Per socket-fd: fstat (is it a socket, which inode), getsockopt(TCP_INFO), fstat again.
        The second fstat guards against the fd being closed and reused by another socket while
        we read it (then we skip it this time). ~3 syscalls per TCP socket, one per other fd.
        """
        counters, seen = {}, {}
        info_cache, skip = self._info, self._skip
        buf, ln = self._buf, self._ln
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            try:
                st = os.fstat(fd)
            except OSError:  # the fd listdir used, or one closed meanwhile
                continue
            if not stat.S_ISSOCK(st.st_mode):
                continue
            ino = st.st_ino
            if ino in seen or ino in skip:
                if ino in info_cache:  # a listener: listed by sockets(), never read
                    seen[ino] = None
                continue  # a second fd on a socket already read; or not TCP / a listener
            ln.value = _INFO_BUFLEN
            if _getsockopt(fd, _IPPROTO_TCP, _TCP_INFO, buf, ctypes.byref(ln)) != 0:
                skip.add(ino)  # not TCP (AF_UNIX, UDP): never will be
                continue
            try:
                if os.fstat(fd).st_ino != ino:
                    continue
            except OSError:
                continue
            info = info_cache.get(ino)
            if info is None:
                info = self._classify(fd, ino, buf[TCPI_STATE][0])
                if info is None:
                    continue
                info_cache[ino] = info
                if info.kind == "listen":
                    skip.add(ino)
                    seen[ino] = None
                    continue
            seen[ino] = None
            sent, retrans = _QQ.unpack_from(buf, TCPI_BYTES_SENT)
            counters[ino] = SockCounters(sent - retrans + _I.unpack_from(buf, TCPI_NOTSENT_BYTES)[0],
                                         sent, retrans, _Q.unpack_from(buf, TCPI_BYTES_RECEIVED)[0])
        return counters, seen

    # ------------------------------------------------------------------ API
    def snapshot(self) -> WireSnapshot | None:
        if not self.available:
            return None
        counters, _ = self._read()
        return WireSnapshot(time.perf_counter(), counters, dict(self._info))

    def sent_since(self, snap: WireSnapshot | None, now: WireSnapshot | None = None) -> WireDelta | None:
        if snap is None or not self.available:
            return None
        now = now or self.snapshot()
        d = WireDelta(0, 0, 0, 0, 0, now.t - snap.t)
        zero = SockCounters(0, 0, 0, 0)
        for ino, c in now.counters.items():
            info = now.info[ino]
            b = snap.counters.get(ino)
            if b is None:
                if info.kind == "data":
                    d.new.append(info)
                b = zero
            dw = c.written - b.written
            if info.kind == "control":
                d.control_sent += dw
            if info.kind != "data":
                continue
            d.sent += dw
            d.wire += c.wire - b.wire
            d.retrans += c.retrans - b.retrans
            d.received += c.received - b.received
            if dw:
                d.per_socket[ino] = dw
                lab = self._labels.get(ino)
                d.per_label[lab] = d.per_label.get(lab, 0) + dw
        d.lost = [snap.info[i] for i in snap.counters
                  if i not in now.counters and snap.info[i].kind == "data"]
        return d

    def labels(self) -> set[str]:
        """The labels this rank's sockets carry (one per axis whose groups opened sockets)."""
        return set(self._labels.values())

    def label_new(self, label: str) -> int:
        """Give `label` to every data socket that has none yet; returns how many got it.

        gloo opens one socket per peer and process group, so calling this right after creating
        (and, with TORCH_GLOO_LAZY_INIT=1, first using) a group tags that group's sockets, and
        deltas then split bytes by group in `per_label` (e.g. intra- vs inter-domain axis).
        Unlabelled sockets are reported under None.
        """
        if not self.available:
            return 0
        counters, _ = self._read()
        n = 0
        for ino in counters:
            if self._info[ino].kind == "data" and ino not in self._labels:
                self._labels[ino] = label
                n += 1
        return n

    def measure(self):
        """Context manager: `with meter.measure() as m: ...` then `m.delta` (None if unavailable)."""
        return _Measure(self)

    def sockets(self) -> list[SockInfo]:
        """Every TCP socket currently open in this process, classified."""
        if not self.available:
            return []
        _, seen = self._read()
        return [self._info[i] for i in seen]


class _Measure:
    def __init__(self, meter):
        self.meter, self.delta = meter, None

    def __enter__(self):
        self._snap = self.meter.snapshot()
        return self

    def __exit__(self, *exc):
        self.delta = self.meter.sent_since(self._snap)
        return False


def verify_offsets(nbytes: int = 1_234_567) -> dict:
    """Send a known number of bytes over a loopback connection and check every field we read.

    Returns the values seen; raises AssertionError if an offset is wrong on this kernel.
    """
    if _libc is None:
        raise RuntimeError("Linux only")
    srv = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(srv.getsockname())
    s, _ = srv.accept()
    buf = ctypes.create_string_buffer(_INFO_BUFLEN)
    try:
        c.sendall(b"x" * nbytes)
        got = 0
        while got < nbytes:
            got += len(s.recv(1 << 20))
        s.sendall(b"y" * 4321)
        got = 0
        while got < 4321:
            got += len(c.recv(1 << 16))
        raw = _tcp_info(c.fileno(), buf)
        cc = _counters(raw)
        acked = struct.unpack_from("=Q", raw, TCPI_BYTES_ACKED)[0]
        out = dict(kernel=os.uname().release, tcp_info_len=len(raw), written=cc.written,
                   wire=cc.wire, retrans=cc.retrans, received=cc.received, acked=acked)
        assert cc.written == nbytes, out
        assert cc.received == 4321, out
        assert acked == nbytes + 1, out  # the SYN counts once
        return out
    finally:
        for x in (c, s, srv):
            x.close()

