"""`zeroedu memory`: seed figures through the CLI, JSON shape, and exit status 2 on bad input."""
import json
import subprocess
import sys

import pytest

from zeroedu import catalog, cli
from zeroedu.cli.args import parse_psi

GB = 10**9


def run_main(capsys, *argv):
    rc = cli.main(["memory", *argv])
    return rc, capsys.readouterr()


def test_subprocess_json_seed_figures():
    out = subprocess.run([sys.executable, "-m", "zeroedu", "memory", "--psi", "7e9", "--n", "8",
                          "--m", "2", "--json"], capture_output=True, text=True, check=True)
    rep = json.loads(out.stdout)
    assert (rep["psi"], rep["n"], rep["m"], rep["recipe"]) == (7 * GB, 8, 2, None)
    assert set(rep["strategies"]) == set(catalog.STRATEGIES) == set(rep["comm"])
    totals = {k: v["total"] for k, v in rep["strategies"].items()}
    assert totals["ddp"] == 112 * GB and totals["zero1"] == 38.5 * GB
    assert totals["zero2"] == 26.25 * GB and totals["fsdp1"] == 14 * GB
    assert totals["megatron_distopt"] == 52.5 * GB
    assert totals["hsdp"] == 14 * GB and totals["hfsdp"] == 8.75 * GB
    for v in rep["strategies"].values():
        assert {"param", "grad", "optim", "total"} <= set(v)
    assert rep["comm"]["fsdp1"] == 1.5 * rep["comm"]["ddp"]


@pytest.mark.fast
def test_in_process_json(capsys):
    rc, io = run_main(capsys, "--psi", "7B", "--n", "16", "--strategy", "zero3", "--json")
    rep = json.loads(io.out)
    assert rc == 0 and rep["strategies"]["fsdp1"]["total"] == 7 * GB
    assert rep["comm"]["fsdp1"] == 15 / 16 * 6 * 7 * GB


@pytest.mark.fast
def test_recipe_tp_pp_offload(capsys):
    _, io = run_main(capsys, "--psi", "7e9", "--strategy", "megatron_distopt", "--recipe", "fp32",
                     "--json")
    assert json.loads(io.out)["strategies"]["megatron_distopt"]["total"] == 7 * (8 + 1) * GB
    _, io = run_main(capsys, "--psi", "7e9", "--strategy", "ddp", "--tp", "2", "--pp", "4",
                     "--json")
    assert json.loads(io.out)["strategies"]["ddp"]["total"] == 14 * GB
    _, io = run_main(capsys, "--psi", "7e9", "--offload", "optimizer+params", "--json")
    rep = json.loads(io.out)
    # every strategy is listed; those that cannot offload params carry no figure and a reason
    assert set(rep["strategies"]) == set(catalog.STRATEGIES)
    applicable = {s for s, r in rep["strategies"].items() if r["total"] is not None}
    assert applicable == {"fsdp1", "fsdp2", "hsdp", "hfsdp"}
    assert "shards params" in rep["strategies"]["zero2"]["not_applicable"]
    # ZeRO-Infinity: no model states left on the device; host 2 + 4 + 12 bytes per param / N
    assert rep["strategies"]["fsdp1"]["total"] == 0
    assert rep["strategies"]["fsdp1"]["host_total"] == 18 * 7 * GB / 8


@pytest.mark.fast
def test_table(capsys):
    rc, io = run_main(capsys, "--psi", "7e9", "--n", "8", "--gpu-gb", "80")
    assert rc == 0
    lines = io.out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines if line.split()[:1] in
            ([s] for s in catalog.STRATEGIES)}
    # strategy recipe param grad optim states host act unit device comm fits
    states, act, device = 5, 7, 9
    assert rows["ddp"][states] == "112.00" and rows["ddp"][-1] == "no"
    assert rows["zero1"][states] == "38.50" and rows["zero1"][-1] == "yes"
    # the device column adds the activations (and, for ZeRO-3, the gathered unit)
    assert float(rows["zero1"][device]) == pytest.approx(38.5 + float(rows["zero1"][act]), abs=0.011)
    assert "GPUs: N·tp·pp = 8" in io.out and io.out.count("activations: GPT") == 1


@pytest.mark.fast
@pytest.mark.parametrize("text, value", [("7e9", 7 * GB), ("7B", 7 * GB), ("1.5T", 1.5e12),
                                         ("125M", 125_000_000), ("350k", 350_000), ("12", 12)])
def test_parse_psi(text, value):
    assert parse_psi(text) == value


@pytest.mark.fast
@pytest.mark.parametrize("argv, msg", [
    (["--psi", "0"], "--psi"),
    (["--psi", "-7B"], "--psi"),
    (["--psi", "seven"], "--psi"),
    (["--psi", "inf"], "--psi"),
    (["--psi", "7B", "--n", "0"], "--n"),
    (["--psi", "7B", "--m", "0"], "--m"),
    (["--psi", "7B", "--n", "2.5"], "--n"),
    (["--psi", "7B", "--recipe", "bf17"], "--recipe"),
    (["--psi", "7B", "--strategy", "zero9"], "unknown strategy 'zero9'"),
    (["--psi", "7B", "--strategy", "ddp", "--offload", "optimizer+params"], "shards params"),
])
def test_bad_input_exits_2(capsys, argv, msg):
    with pytest.raises(SystemExit) as e:
        cli.main(["memory", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "error:" in err and msg in err


@pytest.mark.parametrize("argv", [["quiz", "--list"], ["memory", "--psi", "7e9", "--json"]])
def test_output_into_a_closed_pipe_ends_quietly(argv):
    # `zeroedu ... | head`: the reader goes away; no BrokenPipeError traceback, status 0.
    sh = subprocess.run(f"'{sys.executable}' -m zeroedu {' '.join(argv)} | head -1", shell=True,
                        capture_output=True, text=True)
    assert sh.stderr == "" and len(sh.stdout.splitlines()) == 1
    # deterministic: the read end is closed before the command writes anything
    p = subprocess.Popen([sys.executable, "-m", "zeroedu", *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=60) == 0 and err == b""


def test_subprocess_bad_input_exit_code():
    out = subprocess.run([sys.executable, "-m", "zeroedu", "memory", "--psi", "-1"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "error:" in out.stderr and out.stdout == ""
