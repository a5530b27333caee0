"""The multi-rank harness: real collectives, bytes on the ring, failures, warm pools."""
import _thread
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from fractions import Fraction

import pytest
import torch

from zeroedu.runtime import cluster, faults
from zeroedu.runtime.collectives import collectives_job, rank_tensor


def _expected_sum(n, numel):
    return sum(rank_tensor(r, numel) for r in range(n))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_collectives_values_and_ring_bytes(n):
    numel = 24
    res = cluster.run(collectives_job, n, {"numel": numel})
    exp = _expected_sum(n, numel)
    pad = (-numel) % n
    padded = numel + pad
    for r, out in enumerate(res):
        assert torch.equal(out["all_reduce"], exp)
        assert torch.equal(out["rs_ag"], exp)  # all-reduce = reduce-scatter + all-gather
        assert torch.equal(out["ring"], exp)  # hand-written ring from send/recv = dist.all_reduce
        c = padded // n
        assert torch.equal(out["shard"], torch.cat([exp, torch.zeros(pad)])[r * c:(r + 1) * c])
        s = numel * 4
        if n > 1:
            assert out["comm"][0] == {"all_reduce": float(Fraction(2 * (n - 1), n) * s)}
            sp = padded * 4
            assert out["comm"][1] == {"reduce_scatter": float(Fraction(n - 1, n) * sp),
                                      "all_gather": float(Fraction(n - 1, n) * sp)}
            # the ring's measured sends are exactly 2(N-1)/N * S: 2(N-1) chunks of S/N
            assert out["comm"][2]["send"] == float(Fraction(2 * (n - 1), n) * sp)
        else:
            assert out["comm"][0] == {"all_reduce": 0.0}


def test_warm_pool_reuses_processes_and_is_faster():
    pool = cluster.Pool(2)
    try:
        pids1 = pool.run(faults.pid)
        pids2 = pool.run(faults.pid)
        assert pids1 == pids2  # the same ranks served both jobs
        assert pool.start_seconds > 0
    finally:
        pool.close()
    assert all(not p.is_alive() for p in pool.procs)


def test_concurrent_pools_do_not_collide():
    a, b = cluster.Pool(2), cluster.Pool(2)
    try:
        assert a._store.port != b._store.port
        ra, rb = a.run(faults.ok), b.run(faults.ok)
        assert [r["sum"] for r in ra] == [8.0, 8.0] and [r["sum"] for r in rb] == [8.0, 8.0]
    finally:
        a.close(); b.close()


def _assert_dead(pool):
    for p in pool.procs:
        p.join(timeout=5)
        assert not p.is_alive(), "orphan rank process left behind"


@pytest.mark.parametrize("job,kind", [(faults.raise_on, "raised"), (faults.exit_on, "exited with code 7")])
def test_failing_rank_is_named_and_pool_cleaned(job, kind):
    pool = cluster.Pool(3, timeout=20)
    t0 = time.monotonic()
    with pytest.raises(cluster.RankError) as ei:
        pool.run(job, {"bad_rank": 1})
    assert time.monotonic() - t0 < 60  # bounded (generous: not a timing assertion)
    assert ei.value.rank == 1 and kind in str(ei.value)
    if job is faults.raise_on:
        assert "deliberate failure on rank 1" in str(ei.value)  # the rank's traceback travels
        assert "Traceback" in ei.value.detail
    _assert_dead(pool)
    with cluster.Pool(3) as again:  # the next run works
        assert [r["sum"] for r in again.run(faults.ok)] == [12.0] * 3


def test_hanging_rank_times_out_and_next_run_works():
    pool = cluster.Pool(2, timeout=4)
    t0 = time.monotonic()
    with pytest.raises(cluster.RankError) as ei:
        pool.run(faults.hang_on, {"bad_rank": 1})
    elapsed = time.monotonic() - t0
    assert "did not finish within 4 s" in str(ei.value)
    assert elapsed < 60  # bounded: the deadline plus killing the pool (generous backstop)
    _assert_dead(pool)
    assert [r["sum"] for r in cluster.run(faults.ok, 2, warm=False)] == [8.0, 8.0]


@pytest.fixture
def started_in_background():
    """This process's SIGINT ignored while the test runs, as a suite started the way a background
    job starts has it (a script's `cmd &`, `nohup`, some CI runners: ignored, inherited across
    exec). The interrupt tests below take it first, so they run in the harder of the two launch
    contexts; a terminal's foreground (Python's own handler) is what `sigint_raises` and
    `_sigint_default_in_child` set in either case, so one context stands for both (before, a second
    pytest re-ran the two tests with SIGINT ignored: 21 s of the suite)."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt in this process while the test runs, whatever it inherited.
    A suite started with SIGINT ignored (a script's `cmd &`, `nohup`, some CI runners) passes that
    on: Python then installs no handler and `_thread.interrupt_main()` does nothing, so the tests
    below would test the launch context instead of the product. The disposition is the test's own."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _sigint_default_in_child():
    """For Popen's preexec_fn: the child's SIGINT starts at the default, as a terminal's foreground
    job has it, so Python installs its KeyboardInterrupt handler after exec (an ignored signal
    would stay ignored across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_an_interrupted_run_leaves_the_next_run_working(started_in_background, sigint_raises):
    """A notebook's stop button (KeyboardInterrupt in the parent) or a terminal's Ctrl-C (SIGINT
    to the ranks too) during a warm-pool job: the pool is ended, and the next run works. Before,
    the ranks went on with the old job and the next run read its KeyboardInterrupt traceback."""
    pool = cluster.get_pool(2)
    ranks = [p.pid for p in pool.procs]

    def ctrl_c():
        for pid in ranks:  # what a terminal does: SIGINT to the whole foreground process group
            os.kill(pid, signal.SIGINT)
        _thread.interrupt_main()

    timer = threading.Timer(1.0, ctrl_c)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            # rank 0 sleeps 20 s while rank 1 waits for it in an all-reduce
            cluster.run(faults.hang_on, 2, {"bad_rank": 0, "seconds": 20})
    finally:
        timer.cancel()
    assert pool.closed and all(not p.is_alive() for p in pool.procs)
    assert [r["sum"] for r in cluster.run(faults.ok, 2, timeout=30)] == [8.0, 8.0]
    assert cluster.get_pool(2) is not pool  # a fresh pool served it


def test_ctrl_c_ends_a_cli_run_with_one_line_and_status_130(started_in_background):
    """SIGINT to a real `zeroedu run` (its whole process group, as a terminal sends it) while
    the ranks train: exit status 130 and one line, no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "zeroedu", "run", "--strategy", "ddp", "--world-size", "2",
                             "--model", "gpt-tiny", "--steps", "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_sigint_default_in_child)
    try:
        seen = []
        for line in proc.stderr:  # the progress line appears once the ranks have trained a step
            seen.append(line)
            if line.startswith("step "):
                break
        assert seen and seen[-1].startswith("step "), "".join(seen)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=60)
        took = time.monotonic() - t0
        rest = proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == 130, rest
    assert rest.strip().splitlines()[-1] == "zeroedu: interrupted" and "Traceback" not in rest, rest
    print(f"Ctrl-C to exit: {took:.2f} s")  # measured here; the closing note reports it


def test_rank_logs_are_capped_and_say_so():
    cap = 1 << 20
    with cluster.Pool(2, log_cap=cap) as pool:
        assert pool.run("tests.rank_jobs:chatty", {"mib": 4, "marker": "FIRST-JOB-END"}) == [0, 1]
        assert pool.run("tests.rank_jobs:chatty", {"mib": 1, "marker": "SECOND-JOB-END"}) == [0, 1]
        logs = pool.logs()
        sizes = [os.path.getsize(p) for p in pool.log_paths]
    for log, size in zip(logs, sizes):
        assert f"this rank's log reached its cap of {cap:,} bytes; later output is dropped" in log
        assert size < 4 * cap  # the first job alone printed 4 MiB
        assert "SECOND-JOB-END" not in log  # everything after the cap is dropped


@pytest.mark.fast
def test_the_loopback_interface_is_found_not_assumed(monkeypatch):
    from zeroedu.runtime import rank

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(rank.socket, "if_nameindex", lambda: [(1, "lo0"), (2, "en0")])  # macOS
    assert rank.loopback_interface() == "lo0"
    monkeypatch.setattr(rank.socket, "if_nameindex", lambda: [(1, "eth0"), (2, "lo")])  # Linux
    assert rank.loopback_interface() == "lo"
    monkeypatch.setattr(rank.socket, "if_nameindex", lambda: [(1, "eth0")])
    with pytest.raises(RuntimeError, match=r"no loopback interface among this machine's \['eth0'\]: set "
                                           "GLOO_SOCKET_IFNAME"):
        cluster.Pool(2, backend="gloo")  # refused in the parent, before any rank starts
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    assert rank.loopback_interface() == "eth0"  # the user's choice stands


def test_the_cause_is_found_by_the_exception_type_not_its_words():
    """Rank 1 raises a RuntimeError of its own whose text reads like gloo's; rank 0's all-reduce
    fails as a consequence. Rank 1 is blamed, by type: the collective's failure arrives as a
    `CollectiveError`. (Read by words, both looked like transport errors and rank 0 was blamed.)"""
    with pytest.raises(cluster.RankError) as ei:
        cluster.run("tests.rank_jobs:own_error_in_transport_words", 2, {"bad_rank": 1}, warm=False, timeout=30)
    e = ei.value
    assert (e.rank, e.kind, e.type, e.also) == (1, "raised", "builtins.RuntimeError", [0]), str(e)
    assert "words only, a bug of this rank" in e.detail
    shutil.rmtree(str(e).rsplit("kept in ", 1)[1].rstrip(")"), ignore_errors=True)


@pytest.mark.fast
def test_blame_reads_types():
    own = {"traceback": "RuntimeError: Connection closed by peer", "type": "builtins.RuntimeError",
           "collective": False}
    fallout = {"traceback": "CollectiveError: all_reduce failed", "type": "zeroedu.runtime.rank.CollectiveError",
               "collective": True}
    assert cluster.blame({0: fallout, 1: own}, {}, {0, 1}) == (1, "raised")
    assert cluster.blame({0: fallout}, {1: -9}, {0, 1}) == (1, "exited")
    assert cluster.blame({0: fallout}, {}, {0, 1}) == (1, "hung")
    assert cluster.blame({1: fallout, 0: fallout}, {}, {0, 1}) == (0, "collective")


@pytest.fixture
def own_tempdir(tmp_path, monkeypatch):
    """This process's temporary folders (the pools' log folders among them) go into a folder of
    the test's own: `make test` runs nbval beside this stage, whose pools make and remove their
    own log folders in the system's temporary folder while these tests count theirs."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def test_a_comm_owns_its_ring_thread_and_a_script_owns_its_ranks(own_tempdir):
    import zeroedu

    before = _log_folders()
    with zeroedu.ranks(2) as pool:
        first = pool.run("tests.rank_jobs:ring_threads")
        second = pool.run("tests.rank_jobs:ring_threads")
        procs = list(pool.procs)
    assert pool.closed and not any(p.is_alive() for p in procs) and _log_folders() == before
    for r in first + second:
        assert r["ok"] and r["own_stream"] and r["during"] == ["ring-comm"]
        assert r["after"] == []  # the thread ended with its Comm: job after job, none piles up


def _log_folders() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "zeroedu-ranks-*")))


def test_no_log_folder_outlives_a_run_that_worked_and_a_failed_run_names_its_own(own_tempdir):
    before = _log_folders()
    assert cluster.run(faults.ok, 2, warm=False)[0]["sum"] == 8.0
    pool = cluster.Pool(2)
    pool.run(faults.ok)
    pool.close()
    assert _log_folders() == before  # both folders removed with their pools
    with pytest.raises(cluster.RankError) as ei:
        cluster.run(faults.raise_on, 2, warm=False)
    kept = _log_folders() - before
    assert len(kept) == 1, kept  # the failed run's logs, for the reader to look into
    folder = kept.pop()
    assert f"every rank's log is kept in {folder}" in str(ei.value)
    names = os.listdir(folder)
    assert sorted(n for n in names if not n.startswith((".", "tmp-"))) == ["links.board", "rank0.log", "rank1.log"]
    assert {".owner", ".kept"} <= set(names)  # named in the error: a later start never sweeps it
    shutil.rmtree(folder)


def test_rank_logs_are_separate_and_in_order():
    with cluster.Pool(2) as pool:
        pool.run(faults.ok)
        logs = pool.logs()
    assert len(logs) == 2 and all("[job 1 done]" in log for log in logs)


def test_job_must_be_importable():
    def local(ctx):
        return 1

    with pytest.raises(ValueError, match="importable"):
        cluster.run(local, 1)


def test_script_without_main_guard_is_told_why_its_ranks_died(tmp_path):
    """Ranks re-import the caller's main module (forkserver): a script without the guard makes
    each rank start runs of its own and die; the error says what to do."""
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text("from zeroedu.runtime import cluster\n"
                      "from zeroedu.runtime.collectives import collectives_job\n"
                      "cluster.run(collectives_job, 2, {'numel': 4}, warm=False, timeout=30)\n")
    # Its temporary folder is this test's: the ranks that died mid-start leave the log folders of
    # the runs they started themselves (the next pool's start would sweep them), removed with tmp_path.
    env = dict(os.environ, TMPDIR=str(tmp_path))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode != 0
    assert "RankError" in res.stderr and 'if __name__ == "__main__":' in res.stderr


@pytest.mark.parametrize("n", [0, -1, cluster.MAX_LOCAL_RANKS + 1])
def test_world_size_out_of_range(n):
    with pytest.raises(ValueError, match="world size"):
        cluster.Pool(n)


def test_torchrun_environment_detection(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    assert not cluster.under_torchrun() and cluster.stale_torchrun_variables() == []
    monkeypatch.setenv("RANK", "0"); monkeypatch.setenv("WORLD_SIZE", "1"); monkeypatch.setenv("LOCAL_RANK", "0")
    # left over from another launch: not torchrun, and said so
    assert not cluster.under_torchrun()
    assert cluster.stale_torchrun_variables() == ["RANK", "WORLD_SIZE", "LOCAL_RANK"]
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # what torchrun's agent sets for its workers
    assert cluster.under_torchrun() and cluster.stale_torchrun_variables() == []


def test_stale_torchrun_variables_are_warned_about_and_ignored(monkeypatch):
    from .cli_inprocess import zeroedu

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    for k, v in (("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "3"), ("MASTER_ADDR", "10.0.0.1")):
        monkeypatch.setenv(k, v)
    out = zeroedu("run", "--strategy", "ddp", "--world-size", "2", "--model", "mlp", "--steps", "1", "--quiet")
    assert out.returncode == 0, out.stderr
    assert ("zeroedu: warning: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR set, but this process was not started "
            "by torchrun (no TORCHELASTIC_RUN_ID): ignored; running 2 local ranks") in out.stderr
    assert "world size 2" in out.stdout  # the local run, not a wait for 8 ranks


def test_events_stream_to_the_parent_while_the_job_runs():
    """Ledger events reach the parent during the run (what a live plot draws), from every rank,
    and end with the same bytes the final report measures."""
    from zeroedu.kinds import MODEL_STATE, EventKind
    from zeroedu.train import RunConfig, run

    msgs = []
    report = run(RunConfig("ddp", 2, steps=2, model="mlp"), on_event=msgs.append)
    seen = [e for e in msgs if e["type"] == "event"]
    # one progress message per rank and step, with the step's loss
    assert sorted((e["rank"], e["step"]) for e in msgs if e["type"] == "progress") == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {e["rank"] for e in seen} == {0, 1}
    assert any(e["kind"] == EventKind.OPTIMIZER_STEP for e in seen)
    last = [e for e in seen if e["rank"] == 0 and e["kind"] == EventKind.OPTIMIZER_STEP][-1]
    model_states = sum(last["bytes"][c] for c in MODEL_STATE)
    assert model_states == report.ranks[0].measured.total


def _listening_sockets(pids) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that one of `pids` holds, read from
    the kernel's tables (/proc/net/tcp, tcp6) and each process's file descriptors."""
    import os

    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                local, state, inode = cols[1], cols[3], cols[9]
                if state != "0A" or inode not in inodes:  # 0A: TCP_LISTEN
                    continue
                addr, port = local.split(":")
                raw = bytes.fromhex(addr)
                if width == 8:
                    text = ".".join(str(b) for b in raw[::-1])  # little-endian u32
                else:
                    import ipaddress

                    words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]
                    text = str(ipaddress.IPv6Address(b"".join(words)))
                found.append((text, int(port, 16)))
    return found


def test_a_running_job_listens_on_loopback_only():
    """The rendezvous store and gloo's pair sockets accept connections from this machine only."""
    import os

    pool = cluster.Pool(2)
    try:
        pool.run(faults.pid)  # the group is up and has run a job
        sockets = _listening_sockets([os.getpid()] + [p.pid for p in pool.procs])
        assert pool._store.port in {port for _, port in sockets}, sockets  # the store was seen
        off = [(a, p) for a, p in sockets if a not in ("127.0.0.1", "::1")]
        assert not off, f"listening off loopback: {off}"
    finally:
        pool.close()


# ------------------------------------------------------------------ a torchrun rank's rendezvous
def _torchrun_rank(rank: int, world: int, port: int, *argv: str):
    """`zeroedu run` as torchrun would start rank `rank` of `world` (its environment, no agent)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
               TORCHELASTIC_RUN_ID="test", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    return subprocess.Popen([sys.executable, "-m", "zeroedu", "run", "--strategy", "ddp", "--model", "mlp",
                             "--steps", "1", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _listeners(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} write them) listening on `port`."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    out.append(local.rsplit(":", 1)[0])
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_torchrun_rank_whose_peers_never_come_stops_at_timeout_in_one_line_listening_on_master_addr_only():
    import time

    port = _free_port()
    t0 = time.monotonic()
    p = _torchrun_rank(0, 2, port, "--timeout", "4")
    seen = []
    while p.poll() is None and time.monotonic() - t0 < 60 and not seen:
        seen = _listeners(port)
        time.sleep(0.2)
    out, err = p.communicate(timeout=120)
    # The store rank 0 hosts listens on MASTER_ADDR (127.0.0.1 = 0100007F), not on every interface.
    assert seen == ["0100007F"], seen
    assert p.returncode == 1 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("zeroedu: error: rank 0 could not meet its peers"), err
    assert "1/2 clients joined" in err and time.monotonic() - t0 < 40  # --timeout, not torch's 30 minutes


def test_a_taken_master_port_is_one_line():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        p = _torchrun_rank(0, 2, s.getsockname()[1], "--timeout", "4")
        out, err = p.communicate(timeout=120)
    assert p.returncode == 2 and "is taken by another process" in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv", [
    ("--strategy", "zero2", "--experts", "4", "--ep", "2"),  # ZeRO-2 over dp 2 x ep 2
    ("--strategy", "zero1", "--pp", "2", "--cp", "2", "--attention", "eager", "--micro-batches", "2"),  # pp x cp
])
def test_torchrun_runs_the_composed_axes_as_local_ranks_do(argv):
    """Four ranks started as torchrun starts them (its environment, no agent): rank 0 prints the
    report of a run on the pp, cp or ep axis, every figure == its closed form."""
    import json

    port = _free_port()
    common = ("--model", "gpt-tiny", "--recipe", "fp32", "--global-batch", "8", "--json", "--timeout", "60", *argv)
    procs = [_torchrun_rank(r, 4, port, *common) for r in range(4)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    rep = json.loads(outs[0][0])
    assert rep["world_size"] == 4 and all(v is not False for v in rep["match"].values()), rep["match"]
    assert all(not out for out, _ in outs[1:])  # rank 0 prints for everyone
