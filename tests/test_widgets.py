"""The dashboards without a browser: observers fire, values clamp, bad input is rejected with a
visible message (never an exception), and the run panel drives a real run whose events reach
its live plot. Expected numbers come from `zeroedu.theory` and from the run's own report.
"""
from dataclasses import replace

import pytest

from zeroedu import catalog, theory
from zeroedu.notebook import widgets


def test_explorer_observers_recompute_from_theory():
    e = widgets.memory_explorer(psi=7e9, n=8)
    before = e.updates
    e.psi.value = 70e9  # as a slider drag does: the observer calls update()
    e.n.value = 16
    assert e.updates == before + 2
    for s in catalog.STRATEGIES:
        assert e.data[s]["total"] == pytest.approx(float(theory.model_states(s, e.psi.value, 16).total))
        assert sum(e.data[s]["comm"].values()) == pytest.approx(float(theory.comm_per_rank(s, e.psi.value, 16).total()))
    assert "70" in e.plot.value  # the title carries Ψ
    e.strategy.value = "zero2"
    assert "<b>zero2</b>" in e.summary.value
    assert e.message.value == ""


def test_explorer_fits_agrees_with_theory():
    """"fits" counts model states + activations (the shape inferred from Ψ) + the gathered unit."""
    shape = theory.transformer_shape(7e9)
    e = widgets.memory_explorer(psi=7e9, n=8, gpu_gb=80)
    for s in catalog.STRATEGIES:
        assert e.data[s]["fits"] == theory.fits(s, 7e9, 8, gpu_bytes=80e9, shape=shape)
    assert not e.data["ddp"]["fits"] and e.data["fsdp1"]["fits"]  # 112 GB vs 14 GB (ZeRO §5.1)
    e.set(tp=2, pp=2, offload="optimizer")
    for s in catalog.STRATEGIES:
        if theory.offload_not_applicable(s, "optimizer"):
            assert "error" in e.data[s]
            continue
        assert e.data[s]["fits"] == theory.fits(s, 7e9, 8, gpu_bytes=80e9, tp=2, pp=2, offload="optimizer",
                                                shape=shape)


def test_explorer_clamps_and_rejects_visibly():
    e = widgets.memory_explorer()
    e.n.value = 5000  # the slider model itself clamps to its range
    assert e.n.value == 1024
    assert e.set(n=0) and e.n.value == 1 and "clamped" in e.message.value
    assert e.set(psi=1e15) and e.psi.value == pytest.approx(1e12) and "clamped" in e.message.value
    psi = e.psi.value
    assert not e.set(psi="a lot") and e.psi.value == psi and "rejected" in e.message.value
    assert not e.set(n=2.5) and "rejected" in e.message.value
    assert not e.set(recipe="fp8") and "rejected" in e.message.value
    assert not e.set(strategy="zero4") and "rejected" in e.message.value
    # a combination the closed forms refuse: the row says n/a and the message says why
    assert e.set(strategy="zero1", offload="optimizer+params")
    assert "error" in e.data["zero1"] and "shards params" in e.message.value
    assert "n/a" in e.plot.value
    assert e.set(m=4) and "only affects hybrid" in e.message.value


def test_explorer_is_displayable():
    e = widgets.memory_explorer()
    bundle = e._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle


@pytest.fixture(scope="module")
def panel_run():
    p = widgets.run_panel("ddp", n=2, steps=3, recipe="fp32", model="gpt-tiny")
    p.button.click()  # the button's handler is the run() method
    return p


def test_run_panel_runs_and_streams(panel_run):
    p = panel_run
    rep = p.report
    assert rep is not None and p.message.value == ""
    assert rep.strategy == "ddp" and rep.world_size == 2 and rep.steps == 3
    assert rep.match.plain() == {"model_states": True, "comm": True, "wire": True, "activations": True, "losses": True}
    # every ledger event of every rank reached the live plot's callback while the job ran
    assert p.events_received == sum(len(r.timeline.events) for r in rep.ranks) > 0
    assert p.live_redraws >= 1 and p.image.value[:4] == b"\x89PNG"
    assert p.progress.value == p.progress.max == 3
    assert "match" in p.status.value and "True" in p.status.value
    # one row per quantity, the two ranks collapsed: header + 4 states + activations + 1 collective + wire + peak
    assert p.table.value.count("<tr") == 1 + 8
    assert p.table.value.count("all 2 ranks") == 8 and "differs" not in p.table.value


def test_run_panel_live_plot_receives_events():
    p = widgets.run_panel("ddp", n=2, steps=2, recipe="fp32")
    p._predicted, p._world, p._last_step, p._last_draw = {0: 100.0, 1: 100.0}, 2, {}, 0.0
    p.progress.max = 2
    msg = {"type": "event", "rank": 0, "t": 0.1, "kind": "other", "unit": None, "label": "x", "step": 0,
           "bytes": {"param": 10}}
    p.on_event(msg)
    p.on_event(dict(msg, rank=1, step=1, t=0.2))
    from zeroedu.kinds import EventKind
    from zeroedu.reports import Event

    assert p.events_received == 2 and p.events == {  # typed as the report's timeline is
        0: [Event(0.1, EventKind.OTHER, 0, {"param": 10})], 1: [Event(0.2, EventKind.OTHER, 1, {"param": 10})]}
    assert p.live_redraws == 1  # throttled: the second event came within redraw_every
    assert p.progress.value == 1  # rank 0 finished step 0 only


def test_run_panel_bad_config_is_a_message():
    p = widgets.run_panel("hsdp", n=2, steps=1)
    p.m.value = 3  # M must divide the world size
    assert p.run() is None
    assert "ValueError" in p.message.value and "divide" in p.message.value
    assert not p.button.disabled


def test_run_panel_rank_error_is_a_message():
    p = widgets.run_panel("ddp", n=2, steps=1, recipe="megatron-bf16")  # ddp refuses fp32 grads
    assert p.run() is None
    assert "RankError" in p.message.value and "megatron" in p.message.value
    assert "Traceback" not in p.message.value
    assert p.status.value == "failed"


def test_run_panel_defaults_to_gpt_small_and_offers_m_only_for_hybrids():
    p = widgets.run_panel("zero2", n=4)
    assert p.model.value == "gpt-small"
    assert p.m.layout.display == "none"
    p.m.value = 3  # ignored: zero2 has no outer axis
    assert p.config().m == 1 and p.config().world_size == 4
    p.strategy.value = "hsdp"
    assert p.m.layout.display is None
    p.m.value = 2
    assert p.config().m == 2 and p.config().n == 2


def test_run_panel_table_collapses_agreeing_ranks_and_calls_out_the_one_that_differs(panel_run):
    from zeroedu.notebook.widgets.run_panel import summary_rows

    rep = panel_run.report
    rows = summary_rows(rep)
    assert [r.what for r in rows][:4] == ["param", "grad", "optim", "total"]
    assert all(r.ranks == "all 2 ranks" and not r.differs for r in rows)
    assert rows[0].measured == rep.ranks[0].measured.param
    wire = next(r for r in rows if r.what.startswith("on the wire"))
    assert wire.measured == rep.ranks[0].wire.sent and wire.match is True
    # rank 1 measures another gradient size: its own row, flagged, the others unchanged
    ranks = [rep.ranks[0], replace(rep.ranks[1], measured=replace(rep.ranks[1].measured, grad=1))]
    rows = summary_rows(replace(rep, ranks=ranks))
    grad = [r for r in rows if r.what == "grad"]
    assert [(g.ranks, g.differs, g.match) for g in grad] == [("rank 0", False, True), ("rank 1", True, False)]
    assert len([r for r in rows if r.what == "param"]) == 1


# ---------------------------------------------------------------- the activation explorer
def test_activation_explorer_bars_are_device_bytes_and_fits():
    e = widgets.activation_explorer()  # 7B-like: L = 32, h = 4096, a = 32, S = 4096, N = 8, 80 GB
    shape = theory.transformer_shape(1, layers=32, hidden=4096, heads=32, seq=4096)
    for s, d in e.data.items():
        want = theory.device_bytes(s, shape.params, 8, shape=shape, recompute="selective")
        assert d["total"] == pytest.approx(float(want["total"]))
        assert d["activations"] == pytest.approx(float(want["activations"]))
        assert d["fits"] == theory.fits(s, shape.params, 8, gpu_bytes=80e9, shape=shape, recompute="selective")
    assert not e.data["ddp"]["fits"] and e.data["fsdp1"]["fits"]
    assert e.data["fsdp1"]["unit"] > 0 and e.data["zero2"]["unit"] == 0
    e.recompute.value = "none"  # an observer recomputes; fused attention (the default) stores no scores
    assert e.data["fsdp1"]["fits"] and "fused attention" in e.summary.value
    e.attention.value = "eager"  # the paper's count: the s² scores stored in every layer
    assert not any(d["fits"] for d in e.data.values()) and "no strategy fits" in e.summary.value
    assert e.set(attention="flash") is False and "rejected" in e.message.value
    assert "application/vnd.jupyter.widget-view+json" in e._repr_mimebundle_()


def test_activation_explorer_clamps_and_rejects_visibly():
    e = widgets.activation_explorer()
    before = dict(e.data)
    assert e.set(heads=30) is False
    assert "not divisible" in e.message.value and e.data == before  # the bars keep the last good shape
    assert e.set(heads=32, seq=10**7) is True and "clamped" in e.message.value and e.seq.value == 131072
    assert e.set(micro_batch=2.5) is False and "needs an integer" in e.message.value
    assert e.set(recompute="partial") is False and "rejected" in e.message.value
    assert e.set(hidden=4000) is True and "rounded" in e.message.value and e.hidden.value == 3968
    assert e.set(bogus=1) is False and "unknown control" in e.message.value
    assert e.set(seq=4096, hidden=4096) is True and e.message.value == ""
