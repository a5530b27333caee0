"""Faults inside real training and checkpoint jobs (tests/test_harness.py covers toy jobs).

A rank that raises, exits hard or hangs in a collective in the middle of training: the parent
raises one `RankError` naming that rank within a bounded time, every rank process is gone, and
the next run works. A rank killed in the middle of a checkpoint leaves `latest` on the
previous, complete checkpoint, which still resumes exactly."""
import json
import os
import time

import pytest

from zeroedu.runtime import cluster
from zeroedu.checkpoint import (LATEST, load_checkpoint, rank_file_name, resume, step_dir_name, train_and_save)
from zeroedu.checkpoint.format import partial_dir_name
from zeroedu.train import RunConfig, reference, run

# How much slower than a quiet machine this one is: the load per core when the module is imported
# (1 on a quiet 2-core machine running the suite). A rank starved of CPU on a busy machine can take
# seconds to reach a collective that its peers already wait in, which a fixed 5 s would misread as
# a hang; the deadlines scale with the load instead (a hung rank still hangs for good).
BUSY = max(1.0, min(os.getloadavg()[0] / (os.cpu_count() or 1), 6.0))
TIMEOUT = 5.0 * BUSY  # collective timeout of the ranks: a peer waiting this long reports the hang
JOB_TIMEOUT = 30.0 * BUSY  # the parent's deadline for the whole job (a backstop; the peers report first)
STEPS = 6


def _cfg(strategy="fsdp1", world=4, **kw):
    kw.setdefault("model", "mlp")
    return RunConfig(strategy, world, steps=STEPS, recipe="fp32", **kw)


def _assert_gone(pool):
    for p in pool.procs:
        p.join(timeout=5)
        assert not p.is_alive(), f"orphan rank process {p.pid}"
        with pytest.raises(OSError):
            os.kill(p.pid, 0)  # the pid no longer exists (reaped)


def _fails(tmp_path, fault, strategy="fsdp1"):
    pool = cluster.Pool(4, timeout=TIMEOUT)
    t0 = time.monotonic()
    with pytest.raises(cluster.RankError) as ei:
        train_and_save(_cfg(strategy), str(tmp_path), [2, 4], pool=pool, fault=fault,
                       timeout=JOB_TIMEOUT)
    dt, now = time.monotonic() - t0, time.time()
    _assert_gone(pool)
    # The fault strikes right after the step-2 checkpoint: time from its manifest to the error.
    man = tmp_path / step_dir_name(2) / "manifest.json"
    since = now - json.loads(man.read_text())["saved_at"] if man.exists() else float("nan")
    print(f"\n{fault}: RankError {dt:.2f} s after the run started, {since:.2f} s after the fault")
    return ei.value, dt


def _next_run_works():
    r = run(_cfg("zero2", 2))
    assert max(abs(a - b) / b for a, b in zip(r.losses, r.reference_losses)) <= 1e-6


def test_rank_raises_mid_training(tmp_path):
    err, dt = _fails(tmp_path, {"rank": 2, "kind": "raise", "where": "step", "at": 3})
    assert err.rank == 2 and "raised" in str(err)
    assert "deliberate failure on rank 2 at step 3" in err.detail and "Traceback" in err.detail
    assert dt < JOB_TIMEOUT  # bounded (a generous backstop: times are not asserted tightly)
    _next_run_works()


def test_rank_exits_hard_mid_training(tmp_path):
    err, dt = _fails(tmp_path, {"rank": 1, "kind": "exit", "where": "step", "at": 3, "code": 9},
                     strategy="zero2")
    assert err.rank == 1 and "exited with code 9" in str(err)
    assert dt < JOB_TIMEOUT  # bounded (a generous backstop: times are not asserted tightly)
    _next_run_works()


def test_rank_hangs_in_collective(tmp_path):
    # Rank 3 sleeps at step 3; its peers block in the first all-gather of that step.
    err, dt = _fails(tmp_path, {"rank": 3, "kind": "hang", "where": "step", "at": 3})
    assert err.rank == 3 and "did not finish" in str(err)
    # Found through the peers' collective timeout (their report is carried along), not by the
    # parent's backstop deadline, which would name no rank.
    assert "never reached the collective" in str(err)
    assert dt < 2 * JOB_TIMEOUT  # bounded; a generous backstop, not a timing assertion
    _next_run_works()


def test_rank_killed_mid_checkpoint_keeps_previous(tmp_path):
    # Rank 2 dies after writing its file of the step-4 checkpoint, before the manifest.
    err, dt = _fails(tmp_path, {"rank": 2, "kind": "exit", "where": "save", "at": 4})
    assert err.rank == 2
    assert open(tmp_path / LATEST).read().strip() == step_dir_name(2)
    # The step-4 files are in the hidden partial directory: no step-4 directory, no manifest.
    assert not os.path.exists(tmp_path / step_dir_name(4))
    assert not os.path.exists(tmp_path / partial_dir_name(4) / "manifest.json")
    assert os.path.exists(tmp_path / partial_dir_name(4) / rank_file_name(2, 4))
    st = load_checkpoint(str(tmp_path))
    assert st.step == 2
    # ... and the previous checkpoint resumes exactly, on another strategy and world size
    r = resume(_cfg("fsdp2", 3), str(tmp_path))
    ref, _ = reference(_cfg("fsdp2", 3))
    assert r["start"] == 2
    assert max(abs(a - b) / b for a, b in zip(r["losses"], ref[2:])) <= 1e-6


def test_rank_raises_while_resuming_then_retry_works(tmp_path):
    train_and_save(_cfg("ddp", 2), str(tmp_path), [3])
    pool = cluster.Pool(2, timeout=TIMEOUT)
    with pytest.raises(cluster.RankError) as ei:
        resume(_cfg("fsdp1", 2), str(tmp_path), pool=pool,
               fault={"rank": 0, "kind": "raise", "where": "step", "at": 4}, timeout=JOB_TIMEOUT)
    assert ei.value.rank == 0
    _assert_gone(pool)
    r = resume(_cfg("fsdp1", 2), str(tmp_path))  # the retry, on a fresh pool
    ref, _ = reference(_cfg("fsdp1", 2))
    assert max(abs(a - b) / b for a, b in zip(r["losses"], ref[3:])) <= 1e-6


def test_resaving_the_step_latest_names_never_breaks_it(tmp_path):
    """The same step saved again (a rerun into the same directory) with a rank dying mid-save:
    `latest` still names a complete step, the one saved before, which still resumes exactly."""
    train_and_save(_cfg(), str(tmp_path), [2, 4])
    before = load_checkpoint(str(tmp_path))
    assert before.step == 4
    pool = cluster.Pool(4, timeout=TIMEOUT)
    with pytest.raises(cluster.RankError) as ei:  # saves step 4 only: the step `latest` names
        train_and_save(_cfg(), str(tmp_path), [4], pool=pool, timeout=JOB_TIMEOUT,
                       fault={"rank": 1, "kind": "exit", "where": "save", "at": 4})
    assert ei.value.rank == 1
    _assert_gone(pool)
    assert open(tmp_path / LATEST).read().strip() == step_dir_name(4)
    after = load_checkpoint(str(tmp_path))  # complete: manifest, every rank file, digests
    assert after.step == 4 and all(a.equal(b) for a, b in zip(after.params, before.params))
    # Saved again to the end, the step is replaced by a complete one, and nothing partial stays.
    train_and_save(_cfg(), str(tmp_path), [4])
    assert load_checkpoint(str(tmp_path)).step == 4
    assert sorted(os.listdir(tmp_path)) == [LATEST, step_dir_name(2), step_dir_name(4)]
