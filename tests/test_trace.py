"""`zeroedu run --trace` (`zeroedu.notebook.trace`): a Chrome trace shaped as torch.profiler's, with
every collective the ledger recorded once and the ledger's memory as a counter track."""
from __future__ import annotations

import collections
import json
import os

import torch

from zeroedu.kinds import CATEGORIES
from zeroedu.notebook import trace
from zeroedu.train import RunConfig


def _torch_trace(path) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        x = torch.randn(32, 32, requires_grad=True)
        (x @ x).sum().backward()
    p.export_chrome_trace(str(path))
    return json.load(open(path))


def test_the_trace_is_torch_profilers_shape_with_every_collective_and_the_ledgers_memory(runs, tmp_path):
    rep = runs(RunConfig("fsdp2", 4, steps=5, recipe="fp32", model="mlp"))
    files = trace.write(rep, str(tmp_path / "run.json"))
    ours = json.load(open(files[0]))  # valid JSON (written with allow_nan=False)
    theirs = _torch_trace(tmp_path / "torch.json")
    assert list(ours) == list(theirs)  # the same top-level keys, in the same order
    phases = collections.Counter(e["ph"] for e in ours["traceEvents"])
    torch_phases = {e["ph"] for e in theirs["traceEvents"]}
    assert set(phases) - {"C"} <= torch_phases and phases["X"] and phases["M"]  # C: our memory counter
    meta = {e["name"] for e in ours["traceEvents"] if e["ph"] == "M"}
    assert meta == {e["name"] for e in theirs["traceEvents"] if e["ph"] == "M"}
    names = {e["pid"]: e["args"]["name"] for e in ours["traceEvents"] if e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(4)}  # one process per rank
    for r in rep.ranks:
        mine = [e for e in ours["traceEvents"] if e["pid"] == r.rank]
        slices = sorted((e["args"]["collective"], e["args"]["bytes"], e["args"]["step"])
                        for e in mine if e.get("cat") == "collective")
        recorded = sorted((c.op, c.payload, c.step) for c in r.timeline.comm if c.t_end is not None)
        assert slices == recorded and len(recorded) > 0  # every collective, once, with its bytes
        counters = [e["args"] for e in mine if e["ph"] == "C"]
        assert counters == [{c: e.bytes.get(c, 0) for c in CATEGORIES} for e in r.timeline.events]
        steps = [e for e in mine if e.get("cat") == "user_annotation"]  # torch.profiler's step slices
        assert [(e["name"], e["args"]["step"]) for e in steps] == [(f"ProfilerStep#{k}", k) for k in range(5)]
        for cat in ("forward", "backward", "optimizer"):
            assert sum(e.get("cat") == cat for e in mine) == 5


def test_a_folder_gets_one_trace_per_rank_with_its_distributed_info(runs, tmp_path):
    rep = runs(RunConfig("hsdp", 4, m=2, steps=5, recipe="fp32", model="mlp"))
    files = trace.write(rep, str(tmp_path / "traces"), per_rank=True)
    assert sorted(os.listdir(tmp_path / "traces")) == [f"rank{r}.json" for r in range(4)]
    for r, f in enumerate(files):
        d = json.load(open(f))
        assert d["distributedInfo"] == {"rank": r, "world_size": 4, "backend": "gloo"}
        assert {e["pid"] for e in d["traceEvents"]} == {r}
        threads = {e["args"]["name"] for e in d["traceEvents"] if e["name"] == "thread_name"}
        assert {"compute", "comm dp_shard", "comm dp_outer"} <= threads



def test_holistic_trace_analysis_loads_the_per_rank_folder(runs, tmp_path):
    """The folder layout is the one Holistic Trace Analysis reads: `TraceAnalysis` finds every
    rank by its distributedInfo and keeps each rank's slices (the `X` events it analyses), all of
    them, and finds the steps by torch.profiler's `ProfilerStep#k` names. (By default HTA drops
    the last step as possibly incomplete, `Trace.align_and_filter_trace`; asked to keep it, it
    keeps every slice.)"""
    from hta.trace_analysis import TraceAnalysis

    rep = runs(RunConfig("fsdp2", 2, steps=3, recipe="fp32", model="mlp"))
    files = trace.write(rep, str(tmp_path / "traces"), per_rank=True)
    analysis = TraceAnalysis(trace_dir=str(tmp_path / "traces"), include_last_profiler_step=True)
    assert sorted(analysis.t.traces) == [0, 1]
    for r, f in enumerate(files):
        ours = [e for e in json.load(open(f))["traceEvents"] if e["ph"] == "X"]
        df = analysis.t.get_trace(r)
        names = analysis.t.symbol_table.get_sym_table()
        assert len(df) == len(ours) > 0
        assert sorted(names[i] for i in df["name"]) == sorted(e["name"] for e in ours)
        assert sorted(analysis.t.get_iterations(r)) == [0, 1, 2]


def test_every_axis_of_a_composed_run_is_in_its_trace(runs, tmp_path):
    """pp, cp and ep join the trace as dp does: each rank's collectives on every axis, once, with
    their bytes, and one comm thread per axis (a pipeline's sends, the ring's, the all-to-alls)."""
    for cfg, axes in ((RunConfig("zero1", 4, steps=2, recipe="fp32", model="gpt-tiny", pp=2, micro_batches=2),
                       {"comm pp", "comm dp_shard"}),
                      (RunConfig("ddp", 2, steps=2, recipe="fp32", model="gpt-tiny", attention="eager", cp=2,
                                 global_batch=4), {"comm cp", "comm dp_shard"}),
                      (RunConfig("zero2", 4, steps=2, recipe="fp32", model="gpt-tiny", experts=4, ep=2),
                       {"comm ep", "comm dp_shard"})):
        rep = runs(cfg)
        files = trace.write(rep, str(tmp_path / f"{rep.strategy}-{rep.pp}-{rep.cp}-{rep.ep}"), per_rank=True)
        for r, f in zip(rep.ranks, files):
            events = json.load(open(f))["traceEvents"]
            threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
            assert axes <= threads, threads
            slices = sorted((e["args"]["collective"], e["args"]["bytes"], e["args"]["step"])
                            for e in events if e.get("cat") == "collective")
            assert slices == sorted((c.op, c.payload, c.step) for c in r.timeline.comm if c.t_end is not None)
