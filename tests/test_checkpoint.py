"""Sharded checkpoints: save from one strategy and world size, resume in another, continue
training exactly; DCP in both directions; a bad checkpoint is a clear ValueError.

Expected values are independent of the checkpoint code: the uninterrupted run of the source
strategy (which keeps training after it saved), `train.reference` (single process,
torch.optim.Adam), torch's Adam state for m/v, and torch's own fully_shard + DCP."""
import json
import os
import shutil

import pytest
import torch

from zeroedu.runtime import cluster
from zeroedu.checkpoint import (LATEST, MANIFEST, load_checkpoint, rank_file_name, resume,
                                step_dir_name, train_and_save)
from zeroedu.checkpoint.dcp import export_dcp, load_dcp
from zeroedu.references.torch_dcp import fsdp2_resume_job, fsdp2_save_job
from zeroedu.models import MLPConfig, make_batch, make_model
from zeroedu.train import RunConfig, config_to_dict, reference

STEPS, SAVE = 6, 3
TOL = 1e-6


def rel(a, b) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def rel_params(a, b) -> float:
    return max(float((x.detach() - y.detach()).abs().max() / y.detach().abs().max()) for x, y in zip(a, b))


def cfg(strategy, world, m=1, recipe="fp32", **kw):
    kw.setdefault("model", "mlp")
    return RunConfig(strategy, world, steps=STEPS, recipe=recipe, m=m, **kw)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Uninterrupted runs that save at step 3 on the way."""
    out = {}
    for key, c in {"fsdp1@4": cfg("fsdp1", 4), "hfsdp2x2": cfg("hfsdp", 4, m=2),
                   "fsdp2@3": cfg("fsdp2", 3), "ddp@2": cfg("ddp", 2)}.items():
        d = str(tmp_path_factory.mktemp(key.replace("@", "_")))
        out[key] = (d, train_and_save(c, d, [SAVE]))
    return out


# (source) -> (target strategy, world size, M): 4 -> 1, 2, 3, 8; flat -> dim0, hybrid -> flat, ...
MATRIX = [
    ("fsdp1@4", "ddp", 1, 1), ("fsdp1@4", "ddp", 2, 1), ("fsdp1@4", "zero2", 3, 1),
    ("fsdp1@4", "fsdp2", 8, 1), ("fsdp1@4", "fsdp2", 4, 1), ("fsdp1@4", "megatron_distopt", 3, 1),
    ("hfsdp2x2", "zero2", 4, 1), ("hfsdp2x2", "fsdp1", 2, 1), ("hfsdp2x2", "ddp_bucketed", 3, 1),
    ("fsdp2@3", "hfsdp", 4, 2), ("fsdp2@3", "zero1", 4, 1), ("ddp@2", "hsdp", 4, 2),
]


@pytest.mark.parametrize("src,strategy,world,m", MATRIX, ids=[f"{a}->{b}@{c}x{d}" for a, b, c, d in MATRIX])
def test_reshard_and_continue_exactly(sources, src, strategy, world, m):
    d, base = sources[src]
    r = resume(cfg(strategy, world, m=m), d)
    assert r["start"] == SAVE
    diff = rel(r["losses"], base["losses"][SAVE:])
    print(f"\n{src} -> {strategy}@{world}(M={m}): max rel loss diff {diff:.2e}")
    assert diff <= TOL
    ref_losses, ref_params = reference(cfg(strategy, world, m=m))
    assert rel(r["losses"], ref_losses[SAVE:]) <= TOL
    assert rel_params(r["params"], base["params"]) <= TOL
    assert rel_params(r["params"], ref_params) <= TOL


def _torch_adam_state(steps):
    """m, v and params of torch.optim.Adam after `steps` steps (the independent yardstick)."""
    c = RunConfig("ddp", 1, steps=steps, recipe="fp32", model="mlp").resolved()
    model = make_model(c.model)
    a = c.resolved().adam
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, foreach=False)
    for s in range(steps):
        x, y = make_batch(s, c.global_batch, c.model)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    ps = list(model.parameters())
    return ps, [opt.state[p]["exp_avg"] for p in ps], [opt.state[p]["exp_avg_sq"] for p in ps]


@pytest.mark.parametrize("src", ["fsdp1@4", "hfsdp2x2", "fsdp2@3"])
def test_reconstructed_state_equals_torch_adam(sources, src):
    st = load_checkpoint(sources[src][0])
    ps, m, v = _torch_adam_state(SAVE)
    assert st.step == SAVE and st.adam_step == SAVE
    assert rel_params(st.params, ps) <= TOL
    assert rel_params(st.m, m) <= 1e-5  # m is a difference of gradients: a little less precise
    assert rel_params(st.v, v) <= 1e-5


def test_files_layout_metadata_and_padding(sources):
    d = sources["fsdp1@4"][0]
    assert open(os.path.join(d, LATEST)).read().strip() == step_dir_name(SAVE)
    sd = os.path.join(d, step_dir_name(SAVE))
    man = json.load(open(os.path.join(sd, MANIFEST)))
    assert man["world_size"] == 4 and man["strategy"] == "fsdp1" and man["layout"] == "flat"
    assert [f["name"] for f in man["files"]] == [rank_file_name(r, 4) for r in range(4)]
    assert not [f for f in os.listdir(sd) if ".tmp" in f]  # no temporary files left behind
    psi = sum(p.numel() for p in make_model(MLPConfig()).parameters())
    counted = 0
    for r in range(4):
        st = torch.load(os.path.join(sd, rank_file_name(r, 4)), weights_only=True)
        assert st["rank"] == r and st["n"] == 4 and st["step"] == SAVE
        for u, t in zip(st["units"], st["targets"]):
            assert u["padded_numel"] % 4 == 0 and u["padded_numel"] >= u["numel"]
            lo, hi = u["shard_range"]
            assert hi - lo == u["padded_numel"] // 4 == t["master"].numel()
            # padding is never data: the pieces cover exactly the real elements of this chunk
            data = sum(pe - ps for _, ps, pe, _ in t["pieces"])
            assert data == max(0, min(hi, u["numel"]) - lo)
            counted += data
            pad = torch.ones(t["master"].numel(), dtype=torch.bool)
            for _, ps, pe, ls in t["pieces"]:
                pad[ls:ls + pe - ps] = False
            assert torch.all(t["master"][pad] == 0) and torch.all(t["m"][pad] == 0)
    assert counted == psi  # every parameter element saved exactly once across the 4 ranks


def test_mixed_bf16_same_layout_resumes_bit_exactly(tmp_path):
    c = cfg("fsdp1", 4, recipe="mixed-bf16")
    base = train_and_save(c, str(tmp_path), [SAVE])
    r = resume(c, str(tmp_path))
    assert r["losses"] == base["losses"][SAVE:]  # same strategy and N: the same arithmetic
    # bf16 into another N: reduction order of bf16 grads differs; documented tolerance 2e-2
    r2 = resume(cfg("zero2", 2, recipe="mixed-bf16"), str(tmp_path))
    assert rel(r2["losses"], base["losses"][SAVE:]) <= 2e-2


def test_empty_shards_tiny_model(tmp_path):
    """Ψ = 2 < N: ranks with no data save empty pieces; resuming on 8 ranks still matches."""
    tiny = MLPConfig(d_in=1, hidden=1, depth=1, d_out=1)
    c = RunConfig("fsdp2", 4, steps=STEPS, recipe="fp32", model=tiny, global_batch=8)
    base = train_and_save(c, str(tmp_path), [SAVE])
    r = resume(RunConfig("zero2", 8, steps=STEPS, recipe="fp32", model=tiny, global_batch=8), str(tmp_path))
    assert rel(r["losses"], base["losses"][SAVE:]) <= TOL


# ------------------------------------------------------------------------------ DCP
def test_zeroedu_to_dcp_to_torch_fully_shard(sources, tmp_path):
    st = load_checkpoint(sources["hfsdp2x2"][0])
    c = cfg("fsdp2", 4).resolved()
    export_dcp(st, str(tmp_path / "dcp"), c.resolved().adam)
    # plain torch reads it back as model.state_dict()-keyed full tensors
    model = make_model(c.model)
    sd = {"model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()}}
    import torch.distributed.checkpoint as dcp
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(sd, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    assert all(torch.equal(a, b) for a, b in zip(sd["model"].values(), st.params))
    # torch's own FSDP2 on 4 gloo ranks resumes from it and continues like the uninterrupted run
    ranks = cluster.run(fsdp2_resume_job, 4, {"cfg": config_to_dict(c), "dcp_dir": str(tmp_path / "dcp")})
    losses = [sum(r["losses"][k] for r in ranks) / 4 for k in range(STEPS - SAVE)]
    assert ranks[0]["start"] == SAVE
    assert rel(losses, sources["hfsdp2x2"][1]["losses"][SAVE:]) <= TOL
    assert rel_params(ranks[0]["params"], sources["hfsdp2x2"][1]["params"]) <= TOL


def test_torch_fully_shard_dcp_into_zeroedu(tmp_path):
    c3 = RunConfig("fsdp2", 4, steps=SAVE, recipe="fp32", model="mlp").resolved()
    cluster.run(fsdp2_save_job, 4, {"cfg": config_to_dict(c3), "dcp_dir": str(tmp_path)})
    st = load_dcp(str(tmp_path), c3.model)
    ps, m, v = _torch_adam_state(SAVE)
    assert st.step == SAVE and rel_params(st.params, ps) <= TOL and rel_params(st.v, v) <= 1e-5
    ref_losses, _ = reference(cfg("zero2", 3))
    for strategy, world in [("zero2", 3), ("fsdp1", 2)]:
        r = resume(cfg(strategy, world), str(tmp_path), format="dcp")
        assert r["start"] == SAVE and rel(r["losses"], ref_losses[SAVE:]) <= TOL


# ------------------------------------------------------------------------------ bad checkpoints
@pytest.fixture()
def damaged(sources, tmp_path):
    d = str(tmp_path / "ck")
    shutil.copytree(sources["fsdp1@4"][0], d)
    return d, os.path.join(d, step_dir_name(SAVE))


def test_truncated_shard_file(damaged):
    d, sd = damaged
    f = os.path.join(sd, rank_file_name(2, 4))
    data = open(f, "rb").read()
    open(f, "wb").write(data[:len(data) // 2])
    with pytest.raises(ValueError, match=r"rank-00002-of-00004\.pt: truncated"):
        load_checkpoint(d)
    with pytest.raises(ValueError, match="truncated"):
        resume(cfg("ddp", 2), d)  # checked in the parent, before any rank starts


def test_missing_shard_file(damaged):
    d, sd = damaged
    os.remove(os.path.join(sd, rank_file_name(3, 4)))
    with pytest.raises(ValueError, match=r"rank-00003-of-00004\.pt: shard file of rank 3 is missing"):
        load_checkpoint(d)


def test_shard_file_from_another_world_size(damaged, sources):
    """A rank file swapped in from a 2-rank run, with the manifest's size and hash updated to
    match it (so only the content check can catch it): mismatched world size, named."""
    d, sd = damaged
    other = os.path.join(sources["ddp@2"][0], step_dir_name(SAVE), rank_file_name(1, 2))
    dst = os.path.join(sd, rank_file_name(1, 4))
    shutil.copy(other, dst)
    man_path = os.path.join(sd, MANIFEST)
    man = json.load(open(man_path))
    import hashlib
    data = open(dst, "rb").read()
    man["files"][1].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    json.dump(man, open(man_path, "w"))
    with pytest.raises(ValueError, match=r"rank-00001-of-00004\.pt: mismatched shard file: world_size = 2"):
        load_checkpoint(d)


def test_corrupt_bytes_same_size(damaged):
    d, sd = damaged
    f = os.path.join(sd, rank_file_name(0, 4))
    data = bytearray(open(f, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(f, "wb").write(bytes(data))
    with pytest.raises(ValueError, match=r"rank-00000-of-00004\.pt: contents do not match"):
        load_checkpoint(d)


def test_wrong_model_shapes(damaged):
    d, _ = damaged
    with pytest.raises(ValueError, match=r"parameter shapes .* but this run's model has"):
        resume(cfg("ddp", 2, model=MLPConfig(hidden=21)), d)


def test_incomplete_step_directory(damaged):
    d, sd = damaged
    os.remove(os.path.join(sd, MANIFEST))
    with pytest.raises(ValueError, match="no manifest.json: the checkpoint is incomplete"):
        load_checkpoint(sd)
    with pytest.raises(ValueError, match="not a zeroedu checkpoint"):
        load_checkpoint(os.path.dirname(d))


# ------------------------------------------------------------------------------ untrusted files
class _Payload:
    """Unpickling this runs code: it writes `marker` (what a crafted DCP .metadata can do)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def _crafted_dcp_dir(path, marker) -> str:
    import pickle

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(_Payload(str(marker)), f)
    return str(path)


def test_a_crafted_dcp_metadata_runs_nothing_on_any_default_load_path(tmp_path):
    """DCP is read only when asked for: a directory holding a pickled .metadata is never
    unpickled by load_any, resume or load_checkpoint, each of which says what it found."""
    from zeroedu.checkpoint import load_any

    marker = tmp_path / "ran"
    d = _crafted_dcp_dir(tmp_path / "crafted", marker)
    model = cfg("ddp", 2).resolved().model
    for load in (lambda: load_any(d, model), lambda: resume(cfg("ddp", 2), d), lambda: load_checkpoint(d)):
        with pytest.raises(ValueError, match="not a zeroedu checkpoint"):
            load()
        assert not marker.exists(), "loading a checkpoint ran code from its .metadata"
    with pytest.raises(ValueError, match="format='dcp'"):  # and the message says how to opt in
        load_any(d, model)
    with pytest.raises(ValueError, match="format must be one of zeroedu, dcp"):
        load_any(d, model, format="pickle")
    # The payload is real: asking for DCP on this untrusted directory does run it.
    with pytest.raises(Exception):
        load_any(d, model, format="dcp")
    assert marker.read_text() == "ran"


# ------------------------------------------------------------------------------ odd manifests, odd directories
def _set(key, value):
    def edit(man):
        man[key] = value
        return man
    return edit


def _drop(key):
    def edit(man):
        del man[key]
        return man
    return edit


def _file(r, key, value):
    def edit(man):
        man["files"][r][key] = value
        return man
    return edit


@pytest.mark.parametrize("edit, says", [
    (lambda man: [man], "a JSON list, not an object"),
    (_drop("files"), "files must list one entry per rank"),
    (_drop("step"), "step must be an integer"),
    (_set("world_size", "4"), "world_size must be an integer"),
    (_set("world_size", True), "world_size must be an integer"),
    (_set("param_shapes", "big"), "param_shapes must be a list"),
    (_set("strategy", None), "strategy must be a string"),
    (lambda man: {**man, "files": man["files"][:2]}, "files must list one entry per rank"),
    (_file(1, "name", "../../rank-00001-of-00004.pt"), "files\\[1\\] must name rank-00001-of-00004.pt"),
    (_file(0, "sha256", 7), "sha256"),
    (_file(2, "bytes", -1), "bytes"),
])
def test_every_malformed_manifest_is_a_value_error_naming_the_file(damaged, edit, says):
    d, sd = damaged
    p = os.path.join(sd, MANIFEST)
    man = json.load(open(p))
    open(p, "w").write(json.dumps(edit(man)))
    with pytest.raises(ValueError, match=rf"manifest\.json: malformed manifest: .*{says}"):
        load_checkpoint(d)


@pytest.mark.parametrize("content, says", [("../../etc", "not a step directory"),
                                           ("step-00000099", "which is not in")])
def test_a_bad_latest_pointer_is_named(damaged, content, says):
    d, _ = damaged
    open(os.path.join(d, LATEST), "w").write(content)
    with pytest.raises(ValueError, match=rf"latest: names .*{says}"):
        load_checkpoint(d)


def test_permission_problems_are_named_as_such(damaged, monkeypatch):
    """Root reads any file, so the kernel's refusal is stood in for: `open` raises what it would."""
    import builtins

    d, sd = damaged
    real_open = builtins.open

    def refusing(path, *a, **kw):
        if os.path.basename(str(path)) in (MANIFEST, rank_file_name(1, 4)):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(builtins, "open", refusing)
    with pytest.raises(ValueError, match=r"manifest\.json: permission denied: cannot read the manifest"):
        load_checkpoint(d)
    monkeypatch.setattr(builtins, "open", lambda path, *a, **kw: (
        real_open(path, *a, **kw) if os.path.basename(str(path)) != rank_file_name(1, 4)
        else refusing(path, *a, **kw)))
    with pytest.raises(ValueError, match=r"rank-00001-of-00004\.pt: permission denied"):
        load_checkpoint(d)


@pytest.mark.fast
def test_an_unwritable_save_directory_is_refused_before_training(tmp_path, monkeypatch):
    """Checked in the parent before any rank starts (a fast test: starting ranks would fail it)."""
    from zeroedu.checkpoint import format as ckfmt
    from zeroedu.checkpoint import train_and_save

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"a-file/ck: checkpoints cannot be written there \(Not a directory\)"):
        train_and_save(cfg("ddp", 2), str(blocker / "ck"), [2])
    with pytest.raises(ValueError, match="exists and is not a directory"):
        train_and_save(cfg("ddp", 2), str(blocker), [2])

    def denied(*a, **kw):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(ckfmt.os, "makedirs", denied)
    with pytest.raises(ValueError, match=r"ro: permission denied: checkpoints cannot be written there"):
        train_and_save(cfg("ddp", 2), str(tmp_path / "ro"), [2])
    with pytest.raises(ValueError, match="permission denied"):
        resume(cfg("ddp", 2), str(tmp_path), ckpt_dir=str(tmp_path / "ro"))


@pytest.mark.fast
@pytest.mark.parametrize("kw", [dict(tp=2), dict(pp=2), dict(experts=4, ep=2, strategy="zero2")])
def test_a_run_whose_ranks_hold_part_of_a_replica_is_not_checkpointed(kw, tmp_path):
    from zeroedu.checkpoint.jobs import train_and_save
    from zeroedu.train import RunConfig

    cfg = RunConfig(**{"strategy": "zero1", "world_size": 4, "model": "gpt-tiny", "steps": 2, **kw})
    with pytest.raises(ValueError, match="holds part of one"):
        train_and_save(cfg, str(tmp_path / "ckpt"), [0])
