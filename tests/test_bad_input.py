"""Bad input, everywhere a user can type it: the CLI exits with status 2 and one clear error
line (no traceback), the API raises ValueError naming the allowed range, widgets show a
message. The table in docs/bad_input.md lists the same cases.

Plus torch-tensor-level property tests of the shard index math (tests/test_shard.py tests
the pure integers): flat shard then gather returns the original exactly, dim-0 shards
concatenate to the original, and padding is never counted as data."""
import math
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zeroedu import cli, shard, theory
from zeroedu.runtime import cluster
from zeroedu.models import MLPConfig, local_slice, make_model
from zeroedu.train import config_to_dict, RunConfig, run


# ------------------------------------------------------------------------------ CLI
CLI_CASES = [
    (["memory", "--psi", "-1"], "parameter count must be between 1 and 1e+15"),
    (["memory", "--psi", "0"], "parameter count must be between 1 and 1e+15"),
    (["memory", "--psi", "nan"], "parameter count must be between 1 and 1e+15"),
    (["memory", "--psi", "1e30"], "parameter count must be between 1 and 1e+15, got '1e30'"),
    (["memory", "--psi", "2.5"], "a parameter count is a whole number, got '2.5'"),
    (["memory", "--psi", "7B", "--pp", "1000"], "--pp 1000: a pipeline stage holds at least one layer, and the model has 32"),
    (["memory", "--psi", "7B", "--tp", "3"], "--tp 3: tensor parallelism splits the 32 attention heads evenly"),
    (["run", "--strategy", "zero2", "--world-size", "4", "--outer", "2"],
     "--outer 2: M is the dp_outer axis of a hybrid strategy (hsdp, hfsdp); zero2 is flat"),
    (["run", "--strategy", "ddp", "--timeout", "-5"], "argument --timeout: expected a number > 0, got '-5'"),
    (["run", "--strategy", "ddp", "--timeout", "0"], "argument --timeout: expected a number > 0, got '0'"),
    (["run", "--strategy", "ddp", "--timeout", "nan"], "argument --timeout: expected a number > 0, got 'nan'"),
    (["run", "--strategy", "ddp", "--timeout", "inf"], "argument --timeout: expected a number > 0, got 'inf'"),
    (["memory", "--psi", "abc"], "invalid parameter count 'abc'"),
    (["memory", "--psi", "7B", "--n", "0"], "expected an integer >= 1"),
    (["memory", "--psi", "7B", "--m", "-2"], "expected an integer >= 1"),
    (["memory", "--psi", "7B", "--strategy", "zero9"], "unknown strategy 'zero9'; choose one of"),
    (["memory", "--psi", "7B", "--recipe", "fp8"], "invalid choice: 'fp8'"),
    (["run", "--strategy", "ddp", "--world-size", "0"], "--world-size must be >= 1"),
    (["run", "--strategy", "ddp", "--world-size", "17"], "exceeds the local rank limit 16 (1..16)"),
    (["run", "--strategy", "zero9"], "unknown strategy 'zero9'"),
    (["run", "--strategy", "ddp", "--recipe", "fp8"], "invalid choice: 'fp8'"),
    (["run", "--strategy", "hsdp", "--world-size", "4", "--outer", "3"], "M = 3 must be >= 1 and divide the world size 4"),
    (["run", "--strategy", "ddp", "--world-size", "5"], "global batch 8 must be divisible"),
]


@pytest.mark.fast
@pytest.mark.parametrize("timeout", [0, -5, math.nan, math.inf, True, "10"])
def test_api_timeout_is_a_finite_number_of_seconds(timeout):
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds > 0"):
        cluster.check_timeout(timeout)
    assert cluster.check_timeout(None) is None and cluster.check_timeout(0.5) == 0.5


@pytest.mark.fast
def test_unknown_backend_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv("ZEROEDU_BACKEND", "glooo")
    with pytest.raises(ValueError, match="ZEROEDU_BACKEND='glooo': the backend is one of gloo, nccl"):
        cluster.choose_backend(2)
    with pytest.raises(SystemExit) as ei:  # before any rank starts
        cli.main(["run", "--strategy", "ddp", "--world-size", "2", "--model", "mlp", "--steps", "1"])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert [ln for ln in err.splitlines() if "error:" in ln] == [
        "zeroedu: error: ZEROEDU_BACKEND='glooo': the backend is one of gloo, nccl"], err


@pytest.mark.fast
def test_tour_runs_with_the_learning_rate_and_record_it_is_given(monkeypatch):
    from zeroedu.cli import tour

    class Started(Exception):
        pass

    seen = []

    def first_run(cfg):  # the configuration tour hands to its first run, no ranks started
        seen.append(cfg)
        raise Started

    monkeypatch.setattr(tour, "run", first_run)
    with pytest.raises(Started):
        cli.main(["tour", "--world-size", "2", "--lr", "0.01", "--record", "minimal"])
    assert seen[0].adam.lr == 0.01 and seen[0].timeline == "minimal"


def test_a_hung_rank_is_reported_with_the_limit_it_ran_under():
    from zeroedu.runtime import faults

    with cluster.Pool(2) as pool:  # the pool's limit is 60 s; this job's is 2 s
        with pytest.raises(ValueError, match="timeout must be"):
            pool.run(faults.ok, timeout=0)  # refused before the job is handed to the ranks
        assert [r["sum"] for r in pool.run(faults.ok)] == [8.0, 8.0]  # the pool is unharmed
        with pytest.raises(cluster.RankError, match=r"did not finish within 2 s"):
            pool.run(faults.hang_on, {"bad_rank": 1}, timeout=2)


@pytest.mark.fast
@pytest.mark.parametrize("argv,msg", CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_cli_exit_2_one_line(argv, msg, capsys):
    with pytest.raises(SystemExit) as ei:
        cli.main(argv)
    assert ei.value.code == 2
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(errors) == 1 and msg in errors[0], err
    assert "Traceback" not in err


def test_cli_subprocess_no_traceback():
    """End to end through `python -m zeroedu`: status 2, last line is the error."""
    p = subprocess.run([sys.executable, "-m", "zeroedu", "run", "--strategy", "fsdp1", "--world-size", "99"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("zeroedu: error: --world-size 99 exceeds")


# ------------------------------------------------------------------------------ API
@pytest.mark.fast
@pytest.mark.parametrize("psi", [0, -5, float("nan"), float("inf"), "7B", None, True])
def test_api_psi(psi):
    with pytest.raises(ValueError, match="psi must be"):
        theory.model_states("zero2", psi, 8)


@pytest.mark.fast
@pytest.mark.parametrize("n", [0, -1, 2.5, "4"])
def test_api_n(n):
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        theory.model_states("zero2", 1e9, n)


@pytest.mark.fast
def test_api_unknown_names():
    with pytest.raises(ValueError, match="unknown strategy 'zero9'; choose one of ddp"):
        RunConfig("zero9", 4, model="mlp").resolved()
    with pytest.raises(ValueError, match="fp8"):
        RunConfig("ddp", 4, recipe="fp8", model="mlp").resolved()


@pytest.mark.fast
@pytest.mark.parametrize("world,m,msg", [(0, 1, "world size must be an integer >= 1"),
                                         (4, 3, "M = 3 must be >= 1 and divide the world size 4"),
                                         (4, 0, "M = 0 must be >= 1")])
def test_api_world_and_m(world, m, msg):
    with pytest.raises(ValueError, match=msg):
        RunConfig("hsdp", world, m=m, model="mlp").resolved()


@pytest.mark.fast
def test_api_rank_limit():
    with pytest.raises(ValueError, match=r"world size 17 is more than the local rank limit 16"):
        cluster.Pool(cluster.MAX_LOCAL_RANKS + 1)
    with pytest.raises(ValueError, match="world size must be an integer >= 1"):
        cluster.Pool(0)


@pytest.mark.fast
def test_api_bad_model_and_batch():
    with pytest.raises(ValueError, match="model sizes must be >= 1"):
        make_model(MLPConfig(hidden=0))
    with pytest.raises(ValueError, match="global batch 24 must be divisible by the number of data-parallel ranks 5"):
        local_slice(24, 5, 0)
    # gpt-small's 8 sequences over 4 ranks leave 2 per rank: 4 micro-batches need 16, and it says so
    with pytest.raises(ValueError, match=r"multiple of N·K = 16, e\.g\. --global-batch 16"):
        RunConfig("ddp", 4, model="gpt-small", micro_batches=4).resolved()


def test_api_unknown_strategy_option():
    # Checked in the parent by RunConfig.resolved(), before any rank starts.
    with pytest.raises(ValueError, match=r"fsdp1 does not take option\(s\) \['bogus'\]; it takes \['backward_prefetch'"):
        run(RunConfig("fsdp1", 1, steps=1, options={"bogus": 1}, model="mlp"))
    # and the strategy itself still refuses one if it is built directly on the ranks
    with pytest.raises(cluster.RankError, match=r"ValueError: ddp_bucketed does not take option\(s\) \['bogus'\]; it takes \['bucket_bytes'\]"):
        cluster.run("zeroedu.train.launch:train_job", 1, {"cfg": {**config_to_dict(RunConfig("ddp_bucketed", 1, model="mlp").resolved()),
                                                           "options": {"bogus": 1}}})


@pytest.mark.parametrize("strategy,world,m", [("zero2", 8, 1), ("fsdp1", 4, 1), ("fsdp2", 4, 1),
                                              ("hfsdp", 4, 2)])
def test_model_smaller_than_n_works_with_empty_shards(strategy, world, m):
    """Decision: Ψ < N is allowed. Ranks whose chunk is all padding hold empty or zero shards,
    take part in every collective, and the run equals single-process training; the bytes still
    match the closed forms (padding counted)."""
    tiny = MLPConfig(d_in=1, hidden=1, depth=1, d_out=1)  # Ψ = 2
    r = run(RunConfig(strategy, world, steps=5, recipe="fp32", m=m, model=tiny, global_batch=8))
    assert r.psi == 2 < r.n * r.m
    assert r.match.plain() == {"model_states": True, "comm": True, "wire": True, "activations": True, "losses": True}
    assert max(abs(a - b) / b for a, b in zip(r.losses, r.reference_losses)) <= 1e-6


# ------------------------------------------------------------------------------ widgets
@pytest.mark.fast
def test_memory_explorer_messages():
    from zeroedu.notebook.widgets import MemoryExplorer

    w = MemoryExplorer()
    assert w.set(psi=-5) is True and "clamped" in w.message.value and w.psi.value == w.PSI_RANGE[0]
    assert w.set(n=0) is True and "n = 0 clamped to [1, 1024]" in w.message.value and w.n.value == 1
    assert w.set(n=5000) is True and w.n.value == 1024
    assert w.set(psi=float("nan")) is False and "rejected" in w.message.value
    assert w.set(m=2.5) is False and "needs an integer" in w.message.value
    assert w.set(strategy="zero9") is False and "choose one of" in w.message.value
    assert w.set(recipe="fp8") is False and "rejected" in w.message.value
    assert w.set(n=8, psi=7e9) is True  # good values still work afterwards


@pytest.mark.fast
def test_run_panel_bad_mesh_shows_message_without_starting_ranks():
    from zeroedu.notebook.widgets import RunPanel

    p = RunPanel("hsdp", n=4)
    p.m.value = 3
    assert p.run() is None
    import html
    assert "ValueError: M = 3 must be >= 1 and divide the world size 4" in html.unescape(p.message.value)
    assert p.status.value == "failed"


# ------------------------------------------------------------------------------ tensor-level shard math
shapes = st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple), min_size=1, max_size=4)


@pytest.mark.fast
@settings(max_examples=60, deadline=None)
@given(shapes=shapes, n=st.integers(1, 9))
def test_flat_shard_then_gather_is_identity(shapes, n):
    g = torch.Generator().manual_seed(sum(map(math.prod, shapes)) + n)
    params = [torch.randn(s, generator=g) for s in shapes]
    lay = shard.FlatLayout(shapes, n)
    flat = torch.zeros(lay.padded_numel)
    for i, p in enumerate(params):
        r = lay.param_range(i)
        flat[r.start:r.end] = p.reshape(-1)
    chunks = [flat[lay.shard_range(r).start:lay.shard_range(r).end].clone() for r in range(n)]
    assert all(c.numel() == lay.shard_numel for c in chunks)
    gathered = torch.cat(chunks)[:lay.numel]  # concatenate the shards, strip the padding
    back = [gathered[lay.param_range(i).start:lay.param_range(i).end].view(s) for i, s in enumerate(shapes)]
    assert all(torch.equal(a, b) for a, b in zip(back, params))
    # rebuild from per-parameter slices only (what a checkpoint stores): padding never enters
    rebuilt = [torch.full(s, float("nan")) for s in shapes]
    data = 0
    for r in range(n):
        for sl in lay.param_slices(r):
            rebuilt[sl.index].view(-1)[sl.param.start:sl.param.end] = chunks[r][sl.local.start:sl.local.end]
            data += sl.param.size
    assert data == lay.numel  # padding is never counted as data
    assert all(torch.equal(a, b) for a, b in zip(rebuilt, params))
    pad = lay.padded_numel - lay.numel
    assert pad < n and torch.all(torch.cat(chunks)[lay.numel:] == 0)


@pytest.mark.fast
@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple), n=st.integers(1, 9))
def test_dim0_shards_concatenate_to_original(shape, n):
    t = torch.arange(math.prod(shape), dtype=torch.float32).view(shape)
    pieces = [t[shard.dim0_rows(shape[0], n, r).start:shard.dim0_rows(shape[0], n, r).end] for r in range(n)]
    assert torch.equal(torch.cat(pieces), t)
    assert sum(p.numel() for p in pieces) == t.numel()  # storage holds no padding
    assert [p.numel() for p in pieces] == [shard.dim0_shard_numel(shape, n, r) for r in range(n)]
    # on the wire every chunk is padded to c rows; stripping the trailing rows gives the original
    c = shard.dim0_chunk_rows(shape[0], n)
    wire = torch.cat([torch.cat([p, p.new_zeros((c - p.shape[0], *shape[1:]))]) for p in pieces])
    assert wire.numel() == shard.dim0_padded_numel(shape, n)
    assert torch.equal(wire[:shape[0]], t)
