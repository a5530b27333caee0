"""Figures the prose states, checked against what produced them (issue: teaching truth)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from zeroedu.theory.activations import korthikanti_extra_bytes

pytestmark = pytest.mark.fast
ROOT = Path(__file__).resolve().parents[1]


def test_the_ring_against_gloo_figures_are_the_committed_outputs():
    """README and runtime/comm.py quote notebook 01's timing at 3 MiB, N = 4, and the whole-step
    ratios of benchmarks/results/collectives.json: the numbers must be those outputs'."""
    nb = json.loads((ROOT / "notebooks/solutions/01_collectives.ipynb").read_text())
    text = "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))
    ratio = {op: m for op, m in re.findall(r"^\s*4\s+(reduce_scatter|all_gather)\s+[\d.]+\s+[\d.]+\s+([\d.]+)$",
                                            text, re.M)}
    assert ratio == {"reduce_scatter": "0.50", "all_gather": "1.41"}
    rows = json.loads((ROOT / "benchmarks/results/collectives.json").read_text())["rows"]
    steps = {r["strategy"]: f"{r['ratio']:.2f}" for r in rows}
    assert steps["zero2"] == steps["fsdp2"] == "0.88"
    for doc in ("README.md", "zeroedu/runtime/comm.py"):
        prose = " ".join((ROOT / doc).read_text().split())
        for figure in ("0.50", "1.41", "0.88"):
            assert re.search(rf"\b{re.escape(figure)}(×|x)", prose), (doc, figure)


def test_korthikantis_outside_layer_terms_at_their_22b_shape():
    """theory/activations.py says 2.3 % of the layers' 34sbhL at the paper's 22B shape."""
    s, h, layers, v = 2048, 6144, 48, 51200
    extra = sum(korthikanti_extra_bytes(s, 1, h, v, 1).values())
    assert f"{100 * extra / (34 * s * h * layers):.1f} %" == "2.3 %"
    assert "2.3 % of the layers' 34sbhL" in " ".join((ROOT / "zeroedu/theory/activations.py").read_text().split())


def test_the_flight_recorder_is_on_by_default_with_2000_entries_in_this_torch():
    """Card debug_hang: the number is torch's own default, read from the installed headers."""
    import torch

    from zeroedu.quiz.deck import get_card

    header = Path(torch.__file__).parent / "include/torch/csrc/distributed/c10d/FlightRecorder.hpp"
    code = " ".join(header.read_text().split())
    assert 'getCvarInt( {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 2000)' in code
    assert "enabled_ = max_entries_ > 0;" in code
    answer = get_card("debug_hang").answer
    assert "on by default in torch 2.13 (2000 entries; TORCH_FR_BUFFER_SIZE" in answer


def test_torchs_grad_scaler_halves_at_the_first_overflow():
    """Card loss_scaling: torch's side of the comparison, read from the installed torch."""
    import inspect

    import torch

    from zeroedu.quiz.deck import get_card

    defaults = {k: v.default for k, v in inspect.signature(torch.amp.GradScaler.__init__).parameters.items()}
    assert (defaults["init_scale"], defaults["backoff_factor"], defaults["growth_interval"]) == (2.0 ** 16, 0.5, 2000)
    answer = " ".join(get_card("loss_scaling").answer.split())
    assert "torch's GradScaler halves the scale at the first overflow" in answer
    assert "`hysteresis` overflows (default 2)" in answer


def test_zero2_sends_like_ddp_once_and_k_plus_one_psi_with_accumulation():
    """Card fit_stage: 2Ψ like DDP per step, (K+1)Ψ with K micro-batches (by the closed forms,
    on a real model's shapes, padding aside)."""
    from zeroedu import theory
    from zeroedu.models import get_model, unit_shapes
    from zeroedu.quiz.deck import get_card

    shapes = unit_shapes(get_model("gpt-tiny").build())
    ddp = theory.exact_comm("ddp", shapes, 4, recipe="fp32").total()
    for k in (1, 2, 4):
        zero2 = theory.exact_comm("zero2", shapes, 4, recipe="fp32", micro_batches=k).total()
        assert abs(float(zero2 / ddp) - (k + 1) / 2) < 1e-3
    answer = " ".join(get_card("fit_stage").answer.split())
    assert "2Ψ per step" in answer and "(K+1)Ψ" in answer and "about 3Ψ" in answer


def test_notebook02_ddp_example_keeps_torchs_first_bucket():
    """Item 11: torch 2.13's DDP makes the first bucket 1 MiB only when bucket_cap_mb is left unset;
    passing 25 (the default's value) makes it 25 MiB. Notebook 02's example leaves it unset."""
    import nbformat
    from torch.nn.parallel.distributed import _BucketCapacityConfig
    import torch.distributed as dist

    default = _BucketCapacityConfig.create(None, None, False)
    passed = _BucketCapacityConfig.create(25, None, False)
    assert default.first_bucket_bytes_cap == dist._DEFAULT_FIRST_BUCKET_BYTES == 1 << 20
    assert passed.first_bucket_bytes_cap == passed.bucket_bytes_cap == 25 << 20
    nb = nbformat.read(ROOT / "notebooks" / "solutions" / "02_ddp.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    example = text[text.index("model = torch.nn.parallel.DistributedDataParallel("):]
    assert "bucket_cap_mb=" not in example[:example.index(")")]
    assert "_BucketCapacityConfig.create" in text
