"""The single-process reference: kept per configuration, and indistinguishable from training it again."""
from __future__ import annotations

import importlib

import pytest
import torch

from zeroedu.models import CustomModel
from zeroedu.train import RunConfig

R = importlib.import_module("zeroedu.train.reference")
pytestmark = pytest.mark.fast


def _fresh(cfg: RunConfig):
    R._CACHE.clear()
    out = R.reference(cfg)
    return out, torch.rand(4)


def test_a_kept_reference_equals_training_again_and_leaves_the_generator_where_training_would():
    base = RunConfig("ddp", 4, steps=3, model="gpt-tiny")
    (losses, params), after = _fresh(base)
    # Strategy, world size, recipe, micro-batches and recompute do not enter the reference.
    for cfg in (RunConfig("zero2", 2, steps=3, model="gpt-tiny", micro_batches=2),
                RunConfig("fsdp2", 8, steps=3, model="gpt-tiny", recipe="mixed-bf16", recompute="full")):
        torch.manual_seed(123)  # whatever the caller drew before
        kept_losses, kept_params = R.reference(cfg)
        assert len(R._CACHE) == 1
        assert kept_losses == losses
        assert all(torch.equal(p, q) for p, q in zip(kept_params, params, strict=True))
        assert torch.equal(torch.rand(4), after)


def test_what_the_caller_gets_is_its_own():
    cfg = RunConfig("ddp", 2, steps=2, model="mlp")
    (losses, params), _ = _fresh(cfg)
    losses.append(0.0)
    params[0].add_(1.0)
    again_losses, again_params = R.reference(cfg)
    assert len(again_losses) == 2 and not torch.equal(again_params[0], params[0])


@pytest.mark.parametrize("change", [dict(steps=3), dict(global_batch=16), dict(clip_grad_norm=0.5),
                                    dict(model="gpt-tiny")])
def test_anything_the_reference_reads_is_part_of_the_key(change):
    cfg = RunConfig("ddp", 2, steps=2, model="mlp")
    R._CACHE.clear()
    R.reference(cfg)
    other = RunConfig(**{**dict(strategy="ddp", world_size=2, steps=2, model="mlp"), **change})
    got = R.reference(other)
    R._CACHE.clear()
    assert got[0] == R.reference(other)[0]
    assert len(R._CACHE) == 1


def test_a_custom_model_is_trained_every_time():
    model = CustomModel("tests.custom_models:tied_model", "tests.custom_models:token_batch")
    R._CACHE.clear()
    R.reference(RunConfig("ddp", 2, steps=1, model=model))
    assert len(R._CACHE) == 0
