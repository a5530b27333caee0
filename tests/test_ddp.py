"""Naive DDP end to end: equal to single-process training, bytes equal to the closed forms."""
import json

import pytest

from zeroedu import theory
from zeroedu.kinds import EventKind
from zeroedu.models import MLPConfig, make_model
from zeroedu.train import RunConfig, run

from .cli_inprocess import zeroedu
from .shared_runs import RUNS

PSI = sum(p.numel() for p in make_model(MLPConfig()).parameters())


def rel(a, b):
    return (a - b).abs().max().item() / b.abs().max().item()


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_fp32_equals_single_process(n):
    r = RUNS(RunConfig("ddp", n, steps=5, recipe="fp32", return_params=True, model="mlp"))
    for a, b in zip(r.losses, r.reference_losses):
        assert abs(a - b) <= 1e-6 * abs(b)
    for a, b in zip(r.params, r.reference_params):
        assert rel(a, b) <= 1e-6


def test_bf16_recipe_tolerance():
    """bf16 forward/backward vs an fp32 reference: losses within 1%, parameters within the
    distance Adam can move them (lr per step) — documented in README, 'Precision'."""
    cfg = RunConfig("ddp", 2, steps=5, recipe="mixed-bf16", return_params=True, model="mlp")
    r = run(cfg)
    for a, b in zip(r.losses, r.reference_losses):
        assert abs(a - b) <= 1e-2 * abs(b)
    for a, b in zip(r.params, r.reference_params):
        assert (a - b).abs().max().item() <= 2 * cfg.resolved().adam.lr * cfg.steps


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_bytes_equal_closed_forms(n):
    r = run(RunConfig("ddp", n, steps=2, model="mlp"))
    # independent of the exact-mode code path: replicated DDP is just 16 bytes x Ψ and 2(N-1)/N
    asym = theory.model_states("ddp", PSI, n)
    ring = theory.comm_per_rank("ddp", PSI, n).by_collective()
    for rk in r.ranks:
        me = rk.measured
        assert me.total == 16 * PSI == asym.total
        assert (me.param, me.grad, me.optim) == (2 * PSI, 2 * PSI, 12 * PSI)
        assert me.comm == ({"all_reduce": float(ring["all_reduce"])} if n > 1 else {})
        assert all(getattr(me, k) == getattr(rk.predicted, k) for k in ("param", "grad", "optim", "total", "comm"))
    assert r.match.plain() == {"model_states": True, "comm": True, "wire": True, "activations": True, "losses": True}


def test_cli_run_json():
    out = zeroedu("run", "--strategy", "ddp", "--world-size", "4", "--recipe", "fp32", "--model", "mlp", "--json")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["strategy"] == "ddp" and rep["world_size"] == 4 and len(rep["ranks"]) == 4
    for rk in rep["ranks"]:
        assert set(rk) >= {"rank", "measured", "predicted", "peak"}
        assert rk["measured"]["total"] == rk["predicted"]["total"] == 16 * PSI
        assert rk["measured"]["comm"] == rk["predicted"]["comm"]
    for a, b in zip(rep["losses"], rep["reference_losses"]):
        assert abs(a - b) <= 1e-6 * abs(b)


def test_cli_record_says_what_ranks_keep_and_json_timelines_what_is_printed():
    """--record (what the ranks record) and --json-timelines (what --json prints) are separate."""
    base = ("run", "--strategy", "fsdp2", "--world-size", "2", "--model", "mlp", "--steps", "2", "--json")
    plain_json = json.loads(zeroedu(*base).stdout)
    assert all("timeline" not in rk for rk in plain_json["ranks"])  # recorded, not printed
    full = json.loads(zeroedu(*base, "--json-timelines").stdout)
    minimal = json.loads(zeroedu(*base, "--json-timelines", "--record", "minimal").stdout)
    for rk_full, rk_min in zip(full["ranks"], minimal["ranks"]):
        kinds = {e["kind"] for e in rk_full["timeline"]["events"]}
        assert EventKind.UNSHARD in kinds and EventKind.RESHARD in kinds
        # minimal: only the events the report's figures are read at
        assert {e["kind"] for e in rk_min["timeline"]["events"]} == {EventKind.FORWARD_END, EventKind.OPTIMIZER_STEP}
        assert rk_min["measured"] == rk_full["measured"]
    out = zeroedu(*base[:-1], "--json-timelines")
    assert out.returncode == 2 and "add --json" in out.stderr


@pytest.mark.parametrize("argv,msg", [
    (["--strategy", "nope"], "unknown strategy"),
    (["--strategy", "ddp", "--world-size", "0"], "--world-size"),
    (["--strategy", "ddp", "--world-size", "99"], "rank limit"),
    (["--strategy", "hsdp", "--world-size", "4", "--outer", "3"], "divide"),
])
def test_cli_run_bad_input_exit_2(argv, msg):
    out = zeroedu("run", *argv)
    assert out.returncode == 2 and msg in out.stderr and "Traceback" not in out.stderr


def test_bus_factor_is_what_a_ring_all_reduce_sends_per_rank(runs):
    """Measured: DDP's all-reduce on 4 ranks records 2(N - 1)/N of the gradient bytes sent per rank,
    nccl-tests' bus factor (`theory.bus_factor`)."""
    r = runs(RunConfig("ddp", 4, steps=3, model="gpt-tiny", recipe="fp32"))
    for rank in r.ranks:
        assert rank.measured.comm["all_reduce"] / rank.measured.grad == theory.bus_factor("all_reduce", 4)
