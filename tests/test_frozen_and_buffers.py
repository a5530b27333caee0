"""Models a user brings that no strategy here trains like single-process training: frozen
parameters, norm layers with running statistics, buffers changed by forward. Each is refused
with the names, before any rank starts (`run`, checkpoint jobs) and when a strategy is built
(the rank side), never trained into a silent `match: True`."""
import pytest
import torch

from zeroedu.catalog import STRATEGIES, get_spec
from zeroedu.checkpoint import train_and_save
from zeroedu.models import CustomModel
from zeroedu.recipes import get_recipe
from zeroedu.strategies import strategy_class
from zeroedu.strategies.base import DistState
from zeroedu.train import RunConfig, run

from tests.custom_models import vector_batch

FROZEN = CustomModel("tests.custom_models:frozen_model", "tests.custom_models:token_batch")
BATCHNORM = CustomModel("tests.custom_models:batchnorm_model", "tests.custom_models:vector_batch")
COUNTER = CustomModel("tests.custom_models:counter_model", "tests.custom_models:vector_batch")
FROZEN_SAYS = (r"frozen parameters \(requires_grad=False\) are not supported here: "
               r"\['tok.weight', 'scale.weight'\].*use ddp")
# ddp, ddp_bucketed and fsdp2 train frozen parameters as torch's DDP and fully_shard do; the
# strategies with flat buffers refuse them, as torch's FSDP1 refuses mixed requires_grad.
TRAINING_FROZEN = ("ddp", "ddp_bucketed", "fsdp2")
REFUSING = [s for s in STRATEGIES if s not in TRAINING_FROZEN]
NORM_SAYS = r"running statistics are not supported: \['norm \(BatchNorm1d\)'\].*nn.LayerNorm"


def _cfg(strategy, model):
    hybrid = get_spec(strategy).hybrid
    return RunConfig(strategy, 4 if hybrid else 2, m=2 if hybrid else 1, steps=2, recipe="fp32", model=model)


@pytest.mark.fast  # refused before a rank starts (conftest checks)
@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("model, says", [(FROZEN, FROZEN_SAYS), (BATCHNORM, NORM_SAYS)],
                         ids=["frozen", "batchnorm"])
def test_refused_before_any_rank_starts(strategy, model, says, tmp_path):
    if model is FROZEN and strategy in TRAINING_FROZEN:
        return  # trained, below
    with pytest.raises(ValueError, match=says):
        run(_cfg(strategy, model))
    with pytest.raises(ValueError, match=says):
        train_and_save(_cfg(strategy, model), str(tmp_path), [1])


@pytest.mark.fast
@pytest.mark.parametrize("strategy, model, says",
                         [(s, FROZEN, FROZEN_SAYS) for s in REFUSING if not get_spec(s).hybrid]
                         + [(s, BATCHNORM, NORM_SAYS) for s in STRATEGIES if not get_spec(s).hybrid])
def test_refused_when_the_strategy_is_built(strategy, model, says):
    """The rank side refuses too (the API without `run`): in the constructor, before any tensor
    is allocated or moved."""
    with pytest.raises(ValueError, match=says):
        strategy_class(strategy)(model.build(), DistState.single(), get_recipe("fp32"))


@pytest.mark.fast
@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if not get_spec(s).hybrid])
def test_a_buffer_changed_by_forward_is_refused_at_the_first_forward(strategy):
    model = COUNTER.build()
    s = strategy_class(strategy)(model, DistState.single(), get_recipe("fp32"))
    x, y = vector_batch(0, 4)
    with pytest.raises(ValueError, match=r"forward changed the model's buffers \['seen'\]"):
        s.forward_backward(x, y)


@pytest.mark.fast
def test_eval_mode_norms_and_fixed_buffers_still_train():
    """Not everything with a buffer is refused: a BatchNorm in eval mode keeps its statistics."""
    model = BATCHNORM.build().eval()
    s = strategy_class("ddp")(model, DistState.single(), get_recipe("fp32"))
    x, y = vector_batch(0, 4)
    before = model.norm.running_mean.clone()
    assert torch.isfinite(torch.tensor(s.forward_backward(x, y)))
    assert torch.equal(model.norm.running_mean, before)


def test_on_real_ranks_a_changed_buffer_is_named_by_the_rank():
    """Past the parent's checks (no norm type, nothing frozen), the ranks' first forward sees it."""
    from zeroedu.runtime.cluster import RankError

    with pytest.raises(RankError, match=r"forward changed the model's buffers \['seen'\]") as e:
        run(_cfg("fsdp2", COUNTER))
    assert e.value.rank == 0


# --------------------------------------------------------------- ddp trains frozen parameters
PSI, PSI_T = 11 * 8 + 8 + (8 * 8 + 8) + (8 * 11 + 11), (8 * 8 + 8) + (8 * 11 + 11)  # by hand: 267, 171


@pytest.mark.fast
def test_theory_counts_trainable_parameters_in_gradients_and_optimizer_only():
    from zeroedu import theory
    from zeroedu.models import unit_shapes, units

    ms = theory.model_states("ddp", PSI, 4, recipe="fp32", psi_trainable=PSI_T)
    assert (ms.param, ms.grad, ms.optim) == (4 * PSI, 4 * PSI_T, 8 * PSI_T)
    z3 = theory.model_states("fsdp2", PSI, 4, recipe="fp32", psi_trainable=PSI_T)
    assert (z3.param, z3.grad, z3.optim) == (PSI, PSI_T, 2 * PSI_T)  # /N, the same terms
    model = FROZEN.build()
    mask = [[p.requires_grad for p in u.parameters()] for u in units(model)]
    exact = theory.exact_model_states("ddp", unit_shapes(model), 4, recipe="fp32", trainable=mask)
    assert (exact.param, exact.grad, exact.optim) == (4 * PSI, 4 * PSI_T, 8 * PSI_T)
    comm = theory.exact_comm("ddp", unit_shapes(model), 4, recipe="fp32", trainable=mask).by_collective()
    assert comm["all_reduce"] == 2 * 3 * 4 * PSI_T / 4  # 2(N-1)/N of the trainable gradient bytes
    with pytest.raises(NotImplementedError, match="a flat buffer keeps gradients of all its parameters"):
        theory.exact_model_states("zero1", unit_shapes(model), 4, recipe="fp32", trainable=mask)


# FSDP2 on 4 ranks, by hand. Units: [tok (11, 8)] frozen, [body (8, 8), (8,)], [scale (8,)]
# frozen, [head (11, 8), (11,)]. Rows per rank c = ceil(d0/4): 3, 2, 2, 2, 3, 3.
FSDP2_RANK_ELEMS = {  # rank: (parameter elements held, of them trainable)
    0: (3 * 8 + 2 * 8 + 2 + 2 + 3 * 8 + 3, 2 * 8 + 2 + 3 * 8 + 3),  # 71, 45
    3: (2 * 8 + 2 * 8 + 2 + 2 + 2 * 8 + 2, 2 * 8 + 2 + 2 * 8 + 2),  # rows 9..10 of the 11: 54, 36
}
# On the wire, padded to 4·c rows: tok 96, body 64 + 8, scale 8, head 96 + 12 elements. tok is
# gathered for forward only (its output, from token ids, needs no gradient, so backward never
# reaches it); scale is gathered twice (backward runs through it to body); only body and head
# are reduce-scattered. fp32: 4 bytes, each collective sends 3/4 of its buffer.
FSDP2_COMM = {"all_gather": (96 + 2 * 72 + 2 * 8 + 2 * 108) * 4 * 3 / 4,  # 1416
              "reduce_scatter": (72 + 108) * 4 * 3 / 4}  # 540
FSDP2_COMM_KEPT = {"all_gather": (96 + 72 + 8 + 108) * 4 * 3 / 4, "reduce_scatter": FSDP2_COMM["reduce_scatter"]}


@pytest.mark.fast
def test_theory_of_fsdp2_with_frozen_parameters_by_hand():
    from zeroedu import theory
    from zeroedu.models import unit_shapes, units

    model = FROZEN.build()
    shapes, mask = unit_shapes(model), [[p.requires_grad for p in u.parameters()] for u in units(model)]
    for rank, (held, trained) in FSDP2_RANK_ELEMS.items():
        ms = theory.exact_model_states("fsdp2", shapes, 4, rank=rank, recipe="fp32", trainable=mask)
        assert (ms.param, ms.grad, ms.optim) == (4 * held, 4 * trained, 8 * trained)
    comm = theory.exact_comm("fsdp2", shapes, 4, recipe="fp32", trainable=mask)
    assert {c: float(b) for c, b in comm.by_collective().items() if b} == FSDP2_COMM
    kept = theory.exact_comm("fsdp2", shapes, 4, recipe="fp32", trainable=mask, reshard_after_forward=False)
    assert {c: float(b) for c, b in kept.by_collective().items() if b} == FSDP2_COMM_KEPT


def _trains_like_torch_adam(r):
    """Equal to single-process torch.optim.Adam (which skips parameters without a gradient):
    the frozen ones unchanged bit for bit, the others trained and equal to the reference."""
    assert r.match.plain() == {"model_states": True, "comm": True, "wire": True, "activations": None, "losses": True}
    assert max(abs(a - b) / b for a, b in zip(r.losses, r.reference_losses)) <= 1e-6
    init = list(FROZEN.build().parameters())
    names = [n for n, _ in FROZEN.build().named_parameters()]
    for name, got, ref, start in zip(names, r.params, r.reference_params, init):
        if name in ("tok.weight", "scale.weight"):
            assert torch.equal(got, start.detach()) and torch.equal(ref, start.detach())
        else:
            assert not torch.equal(got, start.detach())  # trained
            assert float((got - ref).abs().max() / ref.abs().max()) <= 1e-6


@pytest.mark.parametrize("options", [{}, {"batched": False}, {"reshard_after_forward": False}],
                         ids=["batched", "per-parameter", "kept-after-forward"])
def test_fsdp2_trains_frozen_parameters_like_torch_adam_over_the_trainable_ones(options):
    """As `fully_shard`: frozen parameters sharded and gathered, never reduced or updated;
    measured bytes and wire those of the hand count above, rank by rank."""
    r = run(RunConfig("fsdp2", 4, steps=3, recipe="fp32", model=FROZEN, return_params=True, options=options))
    _trains_like_torch_adam(r)
    for rank, (held, trained) in FSDP2_RANK_ELEMS.items():
        me = r.ranks[rank].measured
        assert (me.param, me.grad, me.optim) == (4 * held, 4 * trained, 8 * trained)
    want = FSDP2_COMM_KEPT if options.get("reshard_after_forward") is False else FSDP2_COMM
    assert all(rk.measured.comm == want for rk in r.ranks)


def test_ddp_bucketed_leaves_frozen_parameters_out_of_its_buckets():
    """As torch's Reducer: buckets of the trainable parameters only (small buckets, so several)."""
    r = run(RunConfig("ddp_bucketed", 2, steps=3, recipe="fp32", model=FROZEN, return_params=True,
                      options={"bucket_bytes": 64}))
    _trains_like_torch_adam(r)
    for rk in r.ranks:
        me = rk.measured
        assert (me.param, me.grad, me.optim) == (4 * PSI, 4 * PSI_T, 8 * PSI_T)
        assert me.comm == {"all_reduce": 2 * 1 / 2 * 4 * PSI_T}


@pytest.mark.parametrize("n", [1, 2, 4])
def test_ddp_trains_frozen_parameters_like_torch_adam_over_the_trainable_ones(n):
    """Equal to single-process torch.optim.Adam (which skips parameters without a gradient):
    the frozen ones unchanged bit for bit, the bytes those of the trainable count."""
    r = run(RunConfig("ddp", n, steps=3, recipe="fp32", model=FROZEN, return_params=True))
    _trains_like_torch_adam(r)
    for rk in r.ranks:
        me = rk.measured
        assert (me.param, me.grad, me.optim) == (4 * PSI, 4 * PSI_T, 8 * PSI_T)
        assert me.comm == ({"all_reduce": 2 * (n - 1) / n * 4 * PSI_T} if n > 1 else {})


def test_a_checkpoint_with_frozen_parameters_resumes_into_another_strategy_and_world(tmp_path):
    """fsdp2 on 2 ranks saves at step 2 of 4: the frozen parameters come back from the saved
    shards (no optimizer state: m and v zero), the trainable ones from the fp32 masters; resumed
    into ddp_bucketed on 4 ranks it continues like single-process training, and a strategy that
    refuses frozen parameters refuses the resume before any rank starts."""
    from zeroedu.checkpoint import load_checkpoint, resume
    from zeroedu.train import reference

    cfg = RunConfig("fsdp2", 2, steps=4, recipe="fp32", model=FROZEN)
    train_and_save(cfg, str(tmp_path), [2])
    st = load_checkpoint(str(tmp_path))
    names = [n for n, _ in FROZEN.build().named_parameters()]
    for name, got, m, v, start in zip(names, st.params, st.m, st.v, FROZEN.build().parameters()):
        if name in ("tok.weight", "scale.weight"):
            assert torch.equal(got, start.detach()) and not m.any() and not v.any()
        else:
            assert not torch.equal(got, start.detach()) and v.any()
    r = resume(RunConfig("ddp_bucketed", 4, steps=4, recipe="fp32", model=FROZEN), str(tmp_path))
    ref, _ = reference(cfg)
    assert r["start"] == 2 and max(abs(a - b) / b for a, b in zip(r["losses"], ref[2:])) <= 1e-6
    with pytest.raises(ValueError, match=FROZEN_SAYS):
        resume(RunConfig("zero2", 2, steps=4, recipe="fp32", model=FROZEN), str(tmp_path))


# --------------------------------------------------------------- buffers through checkpoints
BUFFERED = CustomModel("tests.custom_models:buffered_model", "tests.custom_models:vector_batch",
                       units=("inp", "out"))


def test_buffers_go_through_a_checkpoint_round_trip(tmp_path):
    """Rank 0 saves the persistent buffers (not the non-persistent ones); a resume into another
    strategy and world size restores them and continues like single-process training."""
    from zeroedu.checkpoint import load_checkpoint, resume
    from zeroedu.train import reference

    cfg = RunConfig("fsdp2", 2, steps=4, recipe="fp32", model=BUFFERED)
    train_and_save(cfg, str(tmp_path), [2])
    st = load_checkpoint(str(tmp_path))
    assert set(st.buffers) == {"shift.offset"}
    assert torch.equal(st.buffers["shift.offset"], torch.linspace(-1.0, 1.0, 8))
    r = resume(RunConfig("zero2", 4, steps=4, recipe="fp32", model=BUFFERED), str(tmp_path))
    ref, _ = reference(cfg)
    assert r["start"] == 2 and max(abs(a - b) / b for a, b in zip(r["losses"], ref[2:])) <= 1e-6


@pytest.mark.fast
def test_load_full_state_restores_buffers_by_name():
    model = BUFFERED.build()
    s = strategy_class("ddp")(model, DistState.single(), get_recipe("fp32"))
    params = [p.detach().clone() for p in model.parameters()]
    zeros = [torch.zeros_like(p) for p in params]
    saved = {"shift.offset": torch.full((8,), 3.0)}
    s.load_full_state(params, zeros, zeros, 0, saved)
    assert torch.equal(model.shift.offset, saved["shift.offset"])
    with pytest.raises(ValueError, match=r"buffers this model does not have: \['norm.running_mean'\]"):
        s.load_full_state(params, zeros, zeros, 0, {"norm.running_mean": torch.zeros(8)})
    with pytest.raises(ValueError, match=r"buffer 'shift.offset' is \(3,\) in the checkpoint, \(8,\) in the model"):
        s.load_full_state(params, zeros, zeros, 0, {"shift.offset": torch.zeros(3)})
