"""Every benchmark script runs end to end on a tiny model (one round, one step): its jobs, its
torch counterparts, its table and its results file. Timings are not checked here (they are
measurements, compared as ratios inside one run by `make bench`), only that the scripts work
and that what they write has the documented shape."""
from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


@pytest.fixture
def bench(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEROEDU_BENCH_RESULTS", str(tmp_path))
    monkeypatch.syspath_prepend(BENCH)
    sys.modules.pop("common", None)  # read the results folder from the environment afresh

    def load(name):
        spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    yield load, tmp_path
    sys.modules.pop("common", None)


def test_compare(bench):
    load, out = bench
    rows = load("bench_compare").main(["--n", "2", "--model", "gpt-tiny", "--recipes", "fp32,mixed-bf16",
                                       "--rounds", "1", "--steps", "1"])
    assert {(r["strategy"], r["recipe"]) for r in rows} >= {("ddp_bucketed", "mixed-bf16"), ("hsdp", "fp32")}
    for r in rows:
        assert r["ratio"] > 0 and r["zeroedu"]["wire"] > 0 and r["torch"]["wire"] > 0
        assert len(r["round_ratios"]) == 1 and r["round_ratios"][0] == pytest.approx(r["ratio"])
    assert len(json.load(open(out / "compare.json"))["rows"]) == len(rows)


@pytest.mark.fast
def test_round_ratios_pair_each_round():
    """Round k's ratio is the median of arm a's steps in round k over arm b's, by hand."""
    from zeroedu.references.bench import round_ratios

    a = [1.0, 3.0, 2.0, 10.0, 12.0, 11.0]  # two rounds of three steps: medians 2 and 11
    b = [2.0, 2.0, 2.0, 10.0, 10.0, 20.0]  # medians 2 and 10
    assert round_ratios(a, b, 3) == [1.0, 1.1]
    with pytest.raises(ValueError):
        round_ratios(a, b[:3], 3)


def test_collectives_and_instrumentation(bench):
    load, out = bench
    rows = load("bench_collectives").main(["--n", "2", "--model", "gpt-tiny", "--rounds", "1", "--steps", "1"])
    by = {r["strategy"]: r for r in rows}
    # gloo's reduce-scatter is an all-reduce: the backend sends more for ZeRO-2 and FSDP
    assert by["zero2"]["backend"]["wire"] > by["zero2"]["ring"]["wire"]
    assert by["ddp_bucketed"]["backend"]["wire"] == by["ddp_bucketed"]["ring"]["wire"]
    rows = load("bench_instrumentation").main(["--n", "2", "--model", "gpt-tiny", "--rounds", "1", "--steps", "1",
                                               "--strategies", "fsdp2"])
    assert rows[0]["full_over_minimal"] > 0 and rows[0]["minimal_over_no_meter"] > 0
    # the arm without the meter reads no bytes on the wire; the others do (where a meter exists)
    assert rows[0]["minimal, no wire meter"]["wire"] is None
    assert (rows[0]["minimal"]["wire"] is None) == (rows[0]["full"]["wire"] is None)
    assert os.path.exists(out / "collectives.json") and os.path.exists(out / "instrumentation.json")


def test_scaling_writes_the_documented_json(bench):
    from zeroedu.references.bench import load_results

    load, out = bench
    load("bench_scaling").main(["--ns", "1,2", "--model", "gpt-tiny", "--rounds", "1", "--steps", "1"])
    data = load_results(str(out / "scaling.json"))
    assert data["loopback"]["bandwidth"] > 0
    assert {(r["n"], r["strategy"]) for r in data["rows"]} == {(n, s) for n in (1, 2) for s in ("ddp", "zero2", "fsdp")}
    for r in data["rows"]:
        assert set(r) >= {"n", "strategy", "zeroedu", "torch", "ratio", "closed_form"}
        if r["n"] == 1:
            assert r["zeroedu"]["wire"] == 0 and r["closed_form"]["sent"] == 0
        else:  # the ring model of zeroedu's collectives is what the closed form says
            assert r["zeroedu"]["ring_model"] == r["closed_form"]["sent"]


def test_launch(bench):
    load, _ = bench
    assert load("bench_launch").main(["--n", "2", "--reps", "1"]) > 0


def test_links(bench):
    load, out = bench
    rows = load("bench_links").main(["--n", "2", "--model", "gpt-tiny", "--rounds", "1", "--steps", "1"])
    arms = {r["arm"]: r for r in rows if "median" in r}
    assert set(arms) == {"ddp, one bucket", "ddp, 1 MiB buckets", "fsdp2, no prefetch", "fsdp2, prefetch"}
    for r in arms.values():
        assert r["steps"] == 1 and r["median"] > 0 and r["comm"] > 0 and r["exposed"] <= r["median"]
    assert [q["against"] for q in rows if "ratio" in q] == ["ddp, one bucket", "fsdp2, no prefetch"]
    assert len(json.load(open(out / "links.json"))["rows"]) == 4


def test_predict(bench):
    load, out = bench
    rows = load("bench_predict").main(["--n", "2", "--model", "gpt-tiny", "--steps", "2", "--strategies",
                                       "ddp_bucketed,fsdp2", "--link", "domain"])
    assert [(r["strategy"], r["n"], r["link"]) for r in rows] == [("ddp_bucketed", 2, "domain"), ("fsdp2", 2, "domain")]
    for r in rows:
        assert r["step_measured"] > 0 and r["step_predicted"] > 0 and r["ratio"] == r["step_predicted"] / r["step_measured"]
        assert r["predicted_comm"] > 0 and r["predicted_exposed"] <= r["step_predicted"]
        assert 0 < r["bound"] <= r["step_predicted"] + 1e-9 and r["efficiency"] == r["bound"] / r["step_measured"]
    saved = json.load(open(out / "predict.json"))
    assert len(saved["rows"]) == 2 and saved["max_error"] >= saved["median_error"] >= 0


def test_lessons(bench):
    load, out = bench
    got = load("bench_lessons").main(["--model", "gpt-tiny", "--steps", "2", "--rounds", "2",
                                      "--lessons", "fsdp_prefetch"])
    from zeroedu.notebook import time_lessons
    rows = got["fsdp_prefetch"]
    assert [r.label for r in rows] == [label for label, _, _ in time_lessons.LESSONS["fsdp_prefetch"]]
    assert all(r.measured > 0 and r.predicted > 0 and 0 < r.bound <= r.predicted + 1e-9 for r in rows)
    saved = time_lessons.results("fsdp_prefetch", str(out / "lessons.json"))
    assert saved == rows and json.load(open(out / "lessons.json"))["rounds"] == 2


def test_loss_curves(bench):
    load, out = bench
    rows = load("bench_loss_curves").main(["--steps", "3", "--families", "zero2,hfsdp"])
    assert [(r["strategy"], r["n"], r["m"]) for r in rows] == [("zero2", 4, 1), ("hfsdp", 2, 2)]
    data = json.load(open(out / "loss_curves.json"))
    assert data["steps"] == 3 and all(len(r["losses"]) == len(r["reference"]) == 3 for r in data["rows"])
    assert all(r["worst_relative"] < 1e-4 for r in rows)  # fp32: the single-process curve


@pytest.mark.fast
def test_gpu_memory_check_says_it_needs_a_gpu_and_fails_loudly_on_an_unread_term(bench, monkeypatch, capsys):
    """Without CUDA the script says so and exits 2; a report whose cuBLAS workspace was not read
    has no named total; a torch without the workspace-freeing function is named in the error."""
    import torch

    from zeroedu.references import torch_private
    from zeroedu.reports import CudaMemory

    load, _ = bench
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load("gpu_memory_check").main([]) == 2
    assert "needs a GPU" in capsys.readouterr().out
    seen = CudaMemory(max_allocated=1000, max_reserved=2048, device_used=5000, outside_allocator=2952)
    assert CudaMemory.from_plain(seen.plain()) == seen
    with pytest.raises(ValueError, match="cuBLAS workspace was not read"):
        seen.named(900)
    seen.cublas_workspace = 96
    assert seen.named(900) == 996
    monkeypatch.delattr(torch._C, "_cuda_clearCublasWorkspaces", raising=False)
    with pytest.raises(RuntimeError, match="cannot be read"):
        torch_private.cublas_workspace_bytes("cuda:0")


def test_pipeline(bench):
    load, out = bench
    res = load("bench_pipeline").main(["--model", "gpt-tiny", "--stages", "2", "--micro", "2", "--dp-micro", "1",
                                       "--forward-ms", "5", "--backward-ms", "10"])
    assert [(r["p"], r["schedule"], r["m"]) for r in res["equality"]] == [(2, "gpipe", 2), (2, "1f1b", 2)]
    assert all(r["exact"] for r in res["equality"] + res["dp"])
    assert [r["strategy"] for r in res["dp"]] == ["zero1", "zero2", "fsdp1", "fsdp2"]
    from zeroedu.notebook.time_lessons import pipeline_results

    rows = pipeline_results(str(out / "pipeline.json"))
    assert [(r.p, r.schedule, r.m) for r in rows] == [(2, "gpipe", 2), (2, "1f1b", 2)]
    assert all(len(r.measured) == 2 and r.predicted == pytest.approx(1 / 3) for r in rows)


def test_planner(bench):
    """The planner against published runs: every row's configuration exists and fits, its rank
    and the planner's #1 are written beside the predicted and published throughput."""
    load, out = bench
    rows = load("bench_planner").main([])
    data = json.load(open(out / "planner.json"))
    assert [r["name"] for r in data["rows"]] == [r["name"] for r in rows]
    # each GPU's share of peak, the preset's, and the calibration that set it
    assert data["efficiency"] == {"h100-sxm": 0.5, "a100-80gb": 0.575}
    assert {g: c["share"] for g, c in data["calibrated"].items()} == data["efficiency"]
    assert all(r["fits"] and 1 <= r["rank"] <= r["of"] and r["best"] for r in rows)
    # the two Megatron papers' tables: every row there, none refused, each fitting, ranked
    papers = data["narayanan_2021"] + data["korthikanti_2022"]
    assert [len(data["narayanan_2021"]), len(data["korthikanti_2022"])] == [10, 4]
    assert all("refused" not in r and r["fits"] and 1 <= r["rank"] <= r["of"] for r in papers)


def test_matmul16(bench):
    load, out = bench
    rows = load("bench_matmul16").main(["--model", "gpt-tiny", "--quick", "--steps", "1", "--batch", "4"])
    assert [r["matmul16"]["bf16"] for r in rows[1:]] == ["native", "emulated"]
    assert rows[0]["matmul16"]["forced"] is False  # the probe decides, whatever the caller's environment
    assert all(r["fp32"] > 0 and r["mixed-bf16"] > 0 and r["ratio"] > 0 for r in rows)
    assert rows[1]["matmul16"]["onednn_bf16"] is False  # the recipe takes oneDNN's bf16 away
    data = json.load(open(out / "matmul16.json"))
    assert [r["label"] for r in data["rows"]] == [r["label"] for r in rows]


def test_plans(bench):
    """The suite's planner against its own runs: each timed plan's figures exact, its results file
    the rows it printed."""
    load, out = bench
    rows = load("bench_plans").main(["--model", "gpt-tiny", "--n", "2", "--top", "2", "--steps", "2"])
    assert len(rows) == 2 and all(r["figures_exact"] and r["trains"] and r["measured_s"] > 0 for r in rows)
    data = json.load(open(out / "plans.json"))
    assert [r["plan"] for r in data["rows"]] == [r["plan"] for r in rows] and data["link"] == "domain"
