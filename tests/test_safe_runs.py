"""Runs that cannot lie about their result: a non-finite loss stops the run (one error naming
step and rank), `match` covers the losses, and JSON output is strict JSON."""
import json
import math

import os

import pytest

from tests.cli_inprocess import zeroedu
from zeroedu.notebook.report import all_match, plain
from zeroedu.runtime.cluster import RankError, RunStopped
from zeroedu.optim import AdamConfig
from zeroedu.train import RunConfig, run


def _strict(text: str):
    """json.loads that refuses NaN and Infinity, which are not JSON."""
    def reject(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=reject)


def _cli(*argv):
    return zeroedu("run", *argv)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_a_diverging_run_stops_with_one_error_naming_step_and_rank(strategy):
    out = _cli("--strategy", strategy, "--world-size", "2", "--model", "mlp", "--steps", "4",
               "--lr", "1e30", "--json")
    assert out.returncode == 1, (out.returncode, out.stderr)
    errors = [line for line in out.stderr.splitlines() if line.startswith("zeroedu: error:")]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "stopped the run: the loss is inf at step 2 of 4 on rank 0: training diverged" in errors[0]
    assert out.stdout == ""  # no report, so no match: True and no NaN anywhere


def test_the_api_raises_run_stopped_and_the_next_run_works():
    cfg = RunConfig("zero2", 2, steps=3, recipe="fp32", model="mlp")
    bad = RunConfig("zero2", 2, steps=3, recipe="fp32", model="mlp",
                    adam=AdamConfig(lr=1e30))
    with pytest.raises(RunStopped) as e:
        run(bad)
    assert isinstance(e.value, RankError) and e.value.rank == 0 and e.value.type == "NonFiniteLoss"
    assert "at step 2 of 3" in e.value.reason and "Traceback" not in str(e.value)
    good = run(cfg)  # a fresh pool: the stopped one was closed
    assert good.match.losses is True and all(map(math.isfinite, good.losses))


def test_match_covers_the_losses():
    """A strategy whose bytes are all right and whose training is wrong does not match."""
    bug = run(RunConfig("zero1", 2, steps=3, recipe="fp32", model="gpt-tiny",
                        strategy_class="zeroedu.notebook.bugs.nb03:BuggyZeRO1"))
    assert {k: v for k, v in bug.match.plain().items() if k != "losses"} == {
        "model_states": True, "comm": True, "wire": True, "activations": True}
    assert bug.match.losses is False and all_match(bug) is False


def test_a_long_low_precision_run_matches_within_the_measured_bound():
    """hsdp in mixed-bf16 on gpt-tiny for 60 steps: its losses leave 1 % of the fp32 reference
    (the bf16 trajectory separates from the fp32 one), and stay inside the bound the report's match
    uses, which is measured in the same run: one process in mixed-bf16 with torch alone
    (`report.recipe_losses`), whose own drift from fp32 widens the flat tolerance
    (`recipes.loss_bound`). The bound still refuses a run that is 2 % off in its first steps."""
    from zeroedu.recipes import LOWP_FACTOR, TOLERANCE, loss_bound
    from zeroedu.train.launch import losses_match

    rep = run(RunConfig("hsdp", 4, m=2, steps=60, recipe="mixed-bf16", model="gpt-tiny"))
    ref, one = rep.reference_losses, rep.recipe_losses
    rel = [abs(a - b) / abs(b) for a, b in zip(rep.losses, ref)]
    one_rel = [abs(a - b) / abs(b) for a, b in zip(one, ref)]
    assert max(rel) > 0.01 and max(one_rel) > 0.01  # what a flat 1 % called a mismatch, both drift
    assert all(r <= loss_bound("mixed-bf16", k, one, ref) for k, r in enumerate(rel)) and rep.match.losses is True
    # the bound, worked by hand at two steps: flat, plus twice the one process's largest drift so far
    for k in (3, 59):
        assert loss_bound("mixed-bf16", k, one, ref) == TOLERANCE["mixed-bf16"] + LOWP_FACTOR * max(one_rel[:k + 1])
    assert loss_bound("fp32", 59, one, ref) == 1e-6 and loss_bound("mixed-bf16", 59) == 0.01
    off = [y * (1.02 if k == 3 else 1.0) for k, y in enumerate(ref)]
    assert losses_match(ref, ref, "mixed-bf16", one) and not losses_match(off, ref, "mixed-bf16", one)
    # A run in fp32 has no one-process yardstick (its bound stays 1e-6), and a 16-bit one within
    # the flat tolerance needs none: the second training is made only where it can change the verdict.
    assert run(RunConfig("ddp", 2, steps=2, recipe="fp32", model="gpt-tiny")).recipe_losses is None
    short = run(RunConfig("ddp", 2, steps=2, recipe="mixed-bf16", model="gpt-tiny"))
    assert short.recipe_losses is None and short.match.losses is True


def test_cli_json_is_strict_json():
    out = _cli("--strategy", "ddp", "--world-size", "2", "--model", "mlp", "--steps", "2", "--recipe", "fp32",
               "--json")
    assert out.returncode == 0, out.stderr
    rep = _strict(out.stdout)
    assert rep["match"]["losses"] is True and len(rep["losses"]) == 2


@pytest.mark.fast
def test_plain_turns_non_finite_floats_into_null():
    report = {"losses": [1.0], "overlap": float("nan"), "ranks": [{"rank": 0, "x": [float("inf"), 2.0]}]}
    text = json.dumps(plain(report), allow_nan=False)
    assert _strict(text) == {"losses": [1.0], "overlap": None, "ranks": [{"rank": 0, "x": [None, 2.0]}]}


@pytest.mark.fast
def test_the_progress_line_goes_to_stderr_as_it_is_when_the_run_starts():
    """Not to the stream that was sys.stderr when the CLI was imported (a notebook or a test that
    redirects stderr later would write into a closed file)."""
    import contextlib
    import io

    from zeroedu.cli.run import Progress

    for _ in range(2):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            Progress(2)({"type": "progress", "rank": 0, "step": 1, "loss": 1.5})
        assert "step 2/2" in err.getvalue() and "loss 1.5000" in err.getvalue()


def test_a_checkpoint_manifest_naming_code_runs_nothing(tmp_path):
    """A crafted manifest with {"kind": "custom", "build": "module:function"}: exporting it to DCP
    refuses in one line naming the file, and the named function is never called."""
    import torch

    from tests import custom_models
    from zeroedu.checkpoint.dcp import export_dcp
    from zeroedu.checkpoint.format import FullState

    crafted = {"kind": "custom", "build": "tests.custom_models:must_not_run",
               "batch": "tests.custom_models:token_batch"}
    st = FullState(0, 0, [torch.zeros(2)], [torch.zeros(2)], [torch.zeros(2)], [], {"model": crafted},
                   str(tmp_path / "step_00000000"))
    with pytest.raises(ValueError, match="step_00000000: its manifest describes a model of kind 'custom'"):
        export_dcp(st, str(tmp_path / "dcp"))
    assert custom_models.CALLED == [] and not (tmp_path / "dcp").exists()


@pytest.mark.fast
def test_checkpoint_files_that_are_not_regular_or_not_bounded_are_refused_before_reading(tmp_path):
    """A 'latest' pointer, a manifest or a shard that is a link to /dev/zero or a FIFO would be read
    forever (memory gone in seconds) or block; JSON nested 200,000 deep overflows the parser. Each
    is one ValueError naming the file, and nothing is read."""
    from zeroedu.checkpoint.format import (FORMAT, LATEST, MANIFEST, read_manifest, read_rank_file,
                                           rank_file_name, resolve_step_dir)

    root = tmp_path / "zero"
    root.mkdir()
    os.symlink("/dev/zero", root / LATEST)
    with pytest.raises(ValueError, match="'latest' pointer is not a regular file"):
        resolve_step_dir(str(root))
    fifo = tmp_path / "fifo" / "step-00000002"
    fifo.mkdir(parents=True)
    os.mkfifo(fifo / MANIFEST)
    with pytest.raises(ValueError, match="manifest is not a regular file"):
        read_manifest(str(fifo))
    deep = tmp_path / "deep" / "step-00000002"
    deep.mkdir(parents=True)
    (deep / MANIFEST).write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ValueError, match="nested too deeply"):
        read_manifest(str(deep))
    shard = tmp_path / "shard"
    shard.mkdir()
    info = {"name": rank_file_name(0, 1), "bytes": 0, "sha256": "0" * 64}
    man = {"format": FORMAT, "step": 2, "world_size": 1, "strategy": "ddp", "param_shapes": [], "files": [info]}
    os.symlink("/dev/zero", shard / info["name"])
    with pytest.raises(ValueError, match="shard file of rank 0 is not a regular file"):
        read_rank_file(str(shard), info, man, 0)


@pytest.mark.fast
def test_crafted_checkpoints_are_refused_in_one_line(tmp_path):
    """Shapes asking for more than the shard files hold (400 GB from a few bytes), a step folder
    linked from outside the root, a pickle that is not plain data: one ValueError each, naming the
    file, and never torch's advice to load with weights_only=False."""
    import io
    import json
    from hashlib import sha256

    import torch

    from zeroedu.checkpoint.format import (FORMAT, LATEST, MANIFEST, read_manifest, read_rank_file,
                                           rank_file_name, resolve_step_dir)

    d = tmp_path / "root" / "step-00000002"
    d.mkdir(parents=True)
    info = {"name": rank_file_name(0, 1), "bytes": 16, "sha256": "0" * 64}
    man = {"format": FORMAT, "step": 2, "world_size": 1, "strategy": "ddp",
           "param_shapes": [[100_000, 1_000_000]], "files": [info]}
    (d / MANIFEST).write_text(json.dumps(man))
    with pytest.raises(ValueError, match="more than the shard files' 16 bytes"):
        read_manifest(str(d))
    outside = tmp_path / "elsewhere" / "step-00000004"
    outside.mkdir(parents=True)
    os.symlink(outside, tmp_path / "root" / "step-00000004")
    (tmp_path / "root" / LATEST).write_text("step-00000004")
    with pytest.raises(ValueError, match="outside the checkpoint"):
        resolve_step_dir(str(tmp_path / "root"))
    buf = io.BytesIO()
    torch.save({"x": io.StringIO("not plain data")}, buf)  # an object weights_only refuses
    data = buf.getvalue()
    info = {"name": rank_file_name(0, 1), "bytes": len(data), "sha256": sha256(data).hexdigest()}
    (d / info["name"]).write_bytes(data)
    with pytest.raises(ValueError) as e:
        read_rank_file(str(d), info, dict(man, param_shapes=[], files=[info]), 0)
    assert "never unpickled" in str(e.value) and "weights_only=False" not in str(e.value)


@pytest.mark.fast
@pytest.mark.parametrize("bad", ["/nonexistent/dir/t.json", "{file}/t.json", "{file}/traces"])
def test_a_trace_path_that_cannot_be_written_is_refused_before_any_rank_starts(bad, tmp_path):
    """Before: `zeroedu run --trace /nonexistent/dir/t.json` trained, then printed a traceback and
    no report. Now one line and status 2 before training (this test is `fast`: starting a rank
    would fail it, tests/conftest.py)."""
    (tmp_path / "f").write_text("a file, not a folder")
    bad = bad.format(file=tmp_path / "f")
    p = zeroedu("run", "--strategy", "ddp", "--world-size", "2", "--model", "mlp", "--steps", "1",
                "--trace", bad)
    assert p.returncode == 2 and "--trace" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("zeroedu: error: --trace"), p.stderr


def test_the_report_is_printed_even_when_the_trace_cannot_be_written(tmp_path, monkeypatch):
    """A trace folder that turns unwritable during the run: the report is out first, then one line."""
    from zeroedu.notebook import trace

    def fail(*_a, **_k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(trace, "write", fail)
    p = zeroedu("run", "--strategy", "ddp", "--world-size", "2", "--model", "mlp", "--steps", "1",
                "--trace", str(tmp_path / "t.json"))
    assert p.returncode == 2 and "match" in p.stdout and "the report above is complete" in p.stderr, p.stderr


# ------------------------------------------------------------------ rank failures in one line
@pytest.mark.parametrize("env,says", [
    ({"ZEROEDU_BACKEND": "nccl"}, "NCCL needs one CUDA GPU per rank"),
    ({"GLOO_SOCKET_IFNAME": "bogus0"}, "this machine has no interface 'bogus0'"),
])
def test_a_backend_this_machine_cannot_run_is_refused_before_any_rank_starts(monkeypatch, env, says):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if "ZEROEDU_BACKEND" in env:
        import torch

        if torch.cuda.is_available():
            monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # fewer GPUs than the 2 ranks asked
    out = _cli("--strategy", "ddp", "--world-size", "2", "--model", "mlp", "--steps", "1")
    assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) <= 3  # the progress line, usage, the error


def test_a_run_past_its_timeout_is_one_line_naming_the_logs():
    # A rank's deadline runs from its latest message (every step sends one: `cluster.Pool.run`), so
    # the job's first step must outlast it: gpt-small on 128 sequences per rank takes seconds
    out = _cli("--strategy", "ddp", "--world-size", "2", "--model", "gpt-small", "--steps", "1",
               "--global-batch", "256", "--quiet", "--timeout", "0.5")
    err = out.stderr.strip().splitlines()
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert err[-1].startswith("zeroedu: error: ranks did not finish within 0.5 s") and "(logs: " in err[-1], err


def test_a_stopped_rank_is_named():
    from zeroedu.runtime import cluster

    with pytest.raises(RankError) as e:
        cluster.run("tests.rank_jobs:stop_self", 3, {"rank": 1}, warm=False, timeout=4)
    assert e.value.rank == 1 and "is stopped (SIGSTOP" in e.value.summary(), e.value.summary()


# ------------------------------------------------------------------ bounds, before allocating
@pytest.mark.parametrize("argv,says", [
    (["--model", "mlp", "--hidden", "1000000"], "this machine has"),
    (["--model", "mlp", "--depth", "100000000"], "at most 1,024 Linear layers"),
    (["--global-batch", "200000"], "of activations for a local batch of 50000"),
])
def test_a_run_too_big_for_this_machine_is_refused_before_anything_is_built(argv, says):
    import time

    t0 = time.perf_counter()
    out = _cli("--strategy", "ddp", *argv)
    assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert time.perf_counter() - t0 < 10  # refused from the closed forms, not after building


def test_quiz_and_labs_counts_are_bounded(capsys):
    out = zeroedu("quiz", "--drills", "1000000000")
    assert out.returncode == 2 and "at most 1000" in out.stderr and "Traceback" not in out.stderr
    from zeroedu.labs.__main__ import main as labs_main

    with pytest.raises(SystemExit) as e:
        labs_main(["check", "1", "--hidden", "100000"])
    assert e.value.code == 2 and "at most 50 hidden cases" in capsys.readouterr().err


# ------------------------------------------------------------------ nothing left behind
_POOL_THEN_WAIT = """
import sys, time
from zeroedu.runtime import cluster
if __name__ == "__main__":
    pool = cluster.Pool(2)
    print(pool.log_dir, flush=True)
    time.sleep(120)
"""

_SAVE = """
from zeroedu.checkpoint import train_and_save
from zeroedu.train import RunConfig
if __name__ == "__main__":
    train_and_save(RunConfig(strategy="zero2", world_size=2, model="mlp", steps=2), sys.argv[1], [2])
"""


def test_a_killed_parent_leaves_log_folders_the_next_start_sweeps(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from zeroedu.runtime import cluster

    env = dict(os.environ, TMPDIR=str(tmp_path))
    script = tmp_path / "pool.py"
    script.write_text(_POOL_THEN_WAIT)
    p = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    log_dir = p.stdout.readline().strip()
    assert log_dir.startswith(str(tmp_path)) and os.path.isdir(log_dir)
    kept = tmp_path / "zeroedu-ranks-kept"  # a failed run's logs, named in its error
    kept.mkdir()
    (kept / ".owner").write_text("999999999 ?")
    (kept / ".kept").write_text("")
    p.send_signal(signal.SIGKILL)
    p.wait()
    time.sleep(3)  # its ranks see the parent gone (they look every second) and exit
    assert os.path.isdir(log_dir)  # SIGKILL: nothing of the parent ran
    mine = cluster.Pool(1, log_dir=None)  # a pool of this (live) process: its folder is not swept
    try:
        assert cluster.sweep_stale_log_dirs(str(tmp_path)) == [log_dir]
        assert not os.path.exists(log_dir) and kept.is_dir()
    finally:
        mine.close()


def test_saving_a_checkpoint_leaves_no_temporary_folder_or_socket(tmp_path):
    import subprocess
    import sys

    import shutil
    import tempfile
    from pathlib import Path

    # a short folder: a Unix socket's path (multiprocessing's, inside it) has at most 107 bytes
    tmp = Path(tempfile.mkdtemp(prefix="zs-", dir="/tmp"))
    script = tmp_path / "save.py"
    script.write_text("import sys\n" + _SAVE)
    env = dict(os.environ, TMPDIR=str(tmp))
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "ckpt")], env=env, capture_output=True,
                       text=True, timeout=300)
    try:
        assert r.returncode == 0, r.stderr[-2000:]
        assert sorted(os.listdir(tmp)) == [], os.listdir(tmp)  # no pymp-* (and its listener), no rank logs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_temp_dir_that_cannot_take_the_logs_is_named_before_any_rank_starts(monkeypatch, tmp_path):
    """Python's tempfile swaps an unusable TMPDIR for /tmp without a word, and a full one made a
    rank die writing its log ("exited with code 1", an empty log): both are one line now."""
    import collections

    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
    out = _cli("--strategy", "ddp", "--world-size", "2", "--model", "mlp", "--steps", "1")
    assert out.returncode == 2 and "is not a folder this process can write" in out.stderr, out.stderr
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    full = collections.namedtuple("statvfs", "f_bavail f_frsize")(3, 4096)
    monkeypatch.setattr(os, "statvfs", lambda path: full)
    out = _cli("--strategy", "ddp", "--world-size", "2", "--model", "mlp", "--steps", "1")
    assert out.returncode == 2 and "has 0.0 MiB free" in out.stderr and "Traceback" not in out.stderr, out.stderr
