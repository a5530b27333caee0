"""The ledger measures storages: proven on a known tensor set and against torch's MemTracker."""
from fractions import Fraction

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker

from zeroedu.runtime.comm import Axis, Comm
from zeroedu.runtime.ledger import Ledger
from zeroedu.models import MLPConfig, make_batch, make_model
from zeroedu.optim import AdamConfig
from zeroedu.recipes import get_recipe
from zeroedu.strategies import build
from zeroedu.strategies.base import DistState
from zeroedu.kinds import EventKind

pytestmark = pytest.mark.fast


def test_known_tensor_set():
    led = Ledger()
    flat = torch.zeros(100)  # 400 B
    led.track(flat, "param")
    led.track(flat[10:20], "param")  # a view: same storage, not counted again
    led.track(flat[:50], "master")  # same storage reached as 'master': charged to 'param' (first)
    g = torch.zeros(30, dtype=torch.bfloat16)  # 60 B
    led.track(g, "grad")
    tmp = torch.empty(8, dtype=torch.float64)  # 64 B
    led.track(tmp, "gathered")
    b = led.bytes_by_category()
    assert (b["param"], b["master"], b["grad"], b["gathered"]) == (400, 0, 60, 64)
    tmp.untyped_storage().resize_(0)  # freeing the storage while the tensor object lives
    assert led.bytes_by_category()["gathered"] == 0
    del g  # a dead tensor drops out
    assert led.bytes_by_category()["grad"] == 0


def test_activations_are_what_autograd_saves():
    led = Ledger()
    w = torch.randn(5, 3, requires_grad=True)
    x = torch.randn(4, 3)
    with led.saving_activations():
        y = torch.tanh(x @ w.t())  # saves x (for dW) and tanh's output
        assert led.bytes_by_category()["activation"] == x.numel() * 4 + y.numel() * 4
        y.sum().backward()
    assert led.bytes_by_category()["activation"] == 0  # freed once backward used them


def test_peak_and_events():
    led = Ledger()
    a = led.track(torch.zeros(10), "param")
    led.event(EventKind.OTHER, note="one")
    t = led.track(torch.zeros(20), "gathered")
    led.event(EventKind.UNSHARD, 2)
    del t
    led.event(EventKind.OTHER, note="three")
    assert led.peak == 120 and led.peak_label == "unit 2 unshard"
    assert [(e.kind, e.unit) for e in led.events] == [(EventKind.OTHER, None), (EventKind.UNSHARD, 2),
                                                      (EventKind.OTHER, None)]
    assert [e.total for e in led.events] == [40, 120, 40]
    assert a.numel() == 10


def _one_rank_state():
    return DistState.single(Ledger())


@pytest.mark.parametrize("recipe", ["fp32", "mixed-bf16", "fp16"])
def test_model_states_agree_with_torch_memtracker(recipe):
    """torch's MemTracker (dispatch-level, sees every allocation) and the ledger agree on what
    stays alive after an optimizer step: parameters, gradients and optimizer state."""
    cfg = MLPConfig()
    model = make_model(cfg)
    mt = MemTracker()
    mt.track_external(model)
    with mt:
        dist = _one_rank_state()
        strat = build("ddp", model, dist, get_recipe(recipe), AdamConfig())
        x, y = make_batch(0, 24, cfg)
        strat.forward_backward(x, y)
        strat.step()
        del x, y
    snap = mt.get_tracker_snapshot("current")[torch.device("cpu")]
    by = {str(k).split(".")[-1]: v for k, v in snap.items()}
    measured = dist.ledger.measured()
    assert by["PARAM"] == measured.param
    assert by["GRAD"] == measured.grad
    # Everything else MemTracker still sees alive is our optimizer state (no activations remain).
    assert by["Total"] == measured.total


def test_comm_records_ring_bytes_exactly():
    led = Ledger()
    axis = Axis("dp_shard", None, 1, 0, (0,))
    comm = Comm(led)
    led.begin_step(0)
    comm.all_reduce(torch.zeros(10), axis, tag="t")
    assert led.comm_by_collective() == {"all_reduce": Fraction(0)}


@pytest.mark.fast
def test_timeline_queries_pick_events_by_step_and_kind_and_the_peak_without_a_category():
    """`Timeline.events_of` and `peak_event` on a timeline written by hand."""
    from zeroedu.kinds import EventKind
    from zeroedu.reports import Event, Timeline

    plain = [{"t": 0.1, "kind": "unshard", "step": 0, "bytes": {"param": 10, "backward_temp": 0}},
          {"t": 0.2, "kind": "reshard", "step": 0, "bytes": {"param": 4, "backward_temp": 9}},
          {"t": 0.3, "kind": "unshard", "step": 1, "bytes": {"param": 12, "backward_temp": 0}}]
    tl = Timeline(events=plain)  # read as the JSON holds it: typed on the way in
    ev = [Event(0.1, EventKind.UNSHARD, 0, {"param": 10, "backward_temp": 0}),
          Event(0.2, EventKind.RESHARD, 0, {"param": 4, "backward_temp": 9}),
          Event(0.3, EventKind.UNSHARD, 1, {"param": 12, "backward_temp": 0})]
    assert tl.events == ev and Timeline.from_plain(tl.plain()) == tl
    assert tl.events_of(step=0) == ev[:2] and tl.events_of(kind=EventKind.UNSHARD) == [ev[0], ev[2]]
    assert tl.events_of(step=1, kind=EventKind.RESHARD) == []
    assert tl.peak_event() == (ev[1], 13) and tl.peak_event(without=("backward_temp",)) == (ev[2], 12)
    with pytest.raises(ValueError, match="no events"):
        Timeline().peak_event()
