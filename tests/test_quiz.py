"""Interview deck, drills and `zeroedu quiz`. Every card figure is checked against a closed form
written out by hand here (ZeRO §5.1, §7; the ring model; Korthikanti et al. §4-5), the ZeRO
paper's own worked example, and the notebooks the cards cite; the CLI is driven through stdin
in this process (tests/cli_inprocess.py). The grading itself (keyword stuffing, wrong accounts) is in
tests/test_deck_grading.py."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli_inprocess import zeroedu
from zeroedu import catalog, theory
from zeroedu.cli import build_parser
from zeroedu.quiz import deck, drills, figures, session
from zeroedu.quiz.deck import CARDS, HARD_CODED, NOTEBOOKS, PAPER_FIG1
from zeroedu.quiz.grading import Choice, Number, Term

from .test_deck_grading import GRADING_CHECKS

ROOT = Path(__file__).resolve().parents[1]
GB = 1e9

# The questions of the two seed interview cards (000 and 004), by card id.
SEED_QUESTIONS = {
    "ddp_overlap": "DDP overlap", "zero_stages": "ZeRO stages", "fsdp_how": "torch FSDP",
    "zero3_comm": "ZeRO-3 vs DDP", "megatron_level": "distributed optimizer level",
    "zero1_vs_zero2_comm": "ZeRO-1 vs ZeRO-2 + gap", "fsdp_hide_comm": "FSDP hides comm",
    "fsdp1_vs_fsdp2": "FSDP1 vs FSDP2", "hybrid_sharding": "hybrid across nodes",
    "fsdp_linear": "hand-written FSDP linear", "mfsdp_v2": "Megatron-FSDP v2",
    "nvlink_levels": "levels inside/across NVLink", "own_optimizer": "its own optimizer",
}
# The topics the deck must cover beyond the seeds (issue "Assignable"), by card id.
NEW_TOPICS = {
    "fsdp_comm_bound", "alpha_beta", "activation_memory", "grad_accumulation", "grad_clipping",
    "meta_init", "loss_scaling", "checkpoint_reshard", "offload", "zero_pp", "fsdp_tp", "pp_zero",
    "debug_hang",
}

# ------------------------------------------------------------------ closed forms, by hand
# Every figure of every card, written out from the formulas (7B = 7e9 parameters, mixed-bf16:
# P = G = 2 bytes, K = 12; ring: reduce-scatter / all-gather send (g-1)/g·S, all-reduce twice).
P7, P13, P70 = 7e9, 13e9, 70e9
RS8 = 7 / 8 * 2 * P7  # one bf16 reduce-scatter or all-gather of 7B over 8 ranks: 12.25 GB
SBH = 2048 * 1 * 4096
ALPHA = theory.DEFAULT_ALPHA["dp_outer"]  # an assumption of the theory, used as given
EXPECTED = {
    "ddp_overlap": {"sent": 2 * RS8, "bpp": 16, "bucket": 25 * 2 ** 20, "first": 2 ** 20},
    "zero_stages": {"ddp": 16 * P7, "z1": 4 * P7 + 12 * P7 / 8, "z2": 2 * P7 + 14 * P7 / 8,
                    "z3": 16 * P7 / 8, "bpp": 16, "k": 12, "gpu": 80e9},
    "fsdp_how": {"z3": 14 * GB, "ratio": 1.5},
    "zero3_comm": {"ratio": 1.5, "ddp": 2 * RS8, "z3": 3 * RS8, "noreshard": 2 * RS8,
                   "fsdp_mixed": 2 * RS8 + 7 / 8 * 4 * P7, "ddp_fp32": 2 * 7 / 8 * 4 * P7,
                   "r_mixed": 2.0, "r_same": 1.0},
    "megatron_level": {"dist": 6 * P7 + 12 * P7 / 8, "full": 18 * P7, "mega_rs": 7 / 8 * 4 * P7,
                       "z1_rs": RS8, "mega_total": 7 / 8 * 4 * P7 + RS8, "z1_total": 2 * RS8},
    "zero1_vs_zero2_comm": {"z1": 38.5 * GB, "z2": 26.25 * GB, "gap": 1.5, "z1ar": 3 * RS8, "z1s": 2 * RS8},
    "fsdp_hide_comm": {"t_block": 7 / 8 * (P7 / 32 * 2) / 450e9, "nvl": 450e9, "nvl_ach": 370e9},
    "fsdp1_vs_fsdp2": {"fsdp": 16 * P7 / 8},
    "hybrid_sharding": {"hsdp": 14 * GB, "flat": 7 * GB, "hfsdp": 4 * P7 / 8 + 12 * P7 / 16,
                        "cross_h": 2 * (1 / 2) * (2 * P7 / 8),
                        "t_flat": 3 * 15 / 16 * 2 * P7 / 50e9,
                        "t_hsdp": 3 * RS8 / 450e9 + 2 * (1 / 2) * (2 * P7 / 8) / 50e9,
                        # striped over 8 NICs of 50 GB/s: min(NVLink 450, 8 x 50) = 400 GB/s
                        "t_flat_striped": 3 * 15 / 16 * 2 * P7 / 400e9, "nic": 50e9,
                        "cross_ratio": (3 * 15 / 16 * 2 * P7 / 8) / (2 * (1 / 2) * (2 * P7 / 8))},
    "fsdp_linear": {"layer": 3 * 7 / 8 * 2 * 4096 * 4096},
    "mfsdp_v2": {"hsdp": 14 * GB, "hfsdp": 8.75 * GB, "flat": 7 * GB},
    "nvlink_levels": {"bw_ratio": 9, "nvl": 450e9, "nic": 50e9, "nvl_ach": 370e9, "nic_ach": 46e9,
                      # a ring over 16 ranks crosses the boundary twice: per rank (g-1)/g·S/N
                      "cross_flat": 3 * 15 / 16 * 2 * P7 / 8, "cross_h": 1.75 * GB},
    "own_optimizer": {"distopt": 6 * P7 + 12 * P7 / 8, "fsdp": 16 * P7 / 8},
    "zero_pp": {"zpp": 3 * RS8 / (7 / 8 * 1 * P7 + 7 / 8 * 0.5 * P7), "hpz_mem": 2 * P7 / 8},
    "zero_equivalence": {"ddp": 16 * P7, "zero3": 16 * P7 / 8},
    "fsdp_comm_bound": {"flops": 400e12, "nvl": 450e9, "nic": 50e9,
                        "t_nvl": 3 * RS8 / 450e9 * 400e12 / (6 * P7),
                        "t_ib": 15 / 16 * 400e12 / 50e9, "t_ib_70b": 15 / 16 * 400e12 / 50e9,
                        "comm_ib": 3 * 15 / 16 * 2 * P7 / 50e9,
                        # at the achieved rates (theory.projection's inputs): T* = (N-1)/N · F/B
                        "nvl_ach": 370e9, "nic_ach": 46e9, "t_nvl_ach": 7 / 8 * 400e12 / 370e9,
                        "t_ib_ach": 15 / 16 * 400e12 / 46e9},
    "reshard_after_forward": {"keep": 2 * RS8, "reshard": 3 * RS8, "full": 2 * P7, "int_mem": 2 * P7 / 8},
    "ring_allreduce": {"ar8": 2 * 7 / 8 * 2 * P7, "ar64": 2 * 63 / 64 * 2 * P7},
    "alpha_beta": {"alpha": ALPHA, "nic": 50e9, "bucket": 25 * 2 ** 20,
                   "s_star": 8 * ALPHA * 50e9, "s90": 9 * 8 * ALPHA * 50e9,
                   "t_bucket": 2 * 7 * ALPHA + 2 * 7 / 8 * 25 * 2 ** 20 / 50e9},
    "debug_hang": {"bucket": 25 * 2**20, "t_ar": 2 * 7 * 2e-6 + 2 * 7 / 8 * 25 * 2**20 / 450e9, "nvl_ach": 370e9},
    "activation_memory": {"none": SBH * (34 + 5 * 32 * 2048 / 4096),
                          "none32": 32 * SBH * (34 + 5 * 32 * 2048 / 4096),
                          "sel": 34 * SBH, "full": 2 * SBH,
                          "fused": 34 * SBH + 4 * 32 * 2048 * 1},  # no scores, an fp32 log-sum-exp per row and head
    "meta_init": {"p70": 2 * P70, "fsdp70": 16 * P70 / 64, "gpu": 80e9},
    # fp32 gradient shard down; the updated weights up in bf16 (DeepSpeed >= 0.17.0) or fp32 (<= 0.16)
    "offload": {"dev": 2 * P7, "host": (12 + 4) * P7 / 8, "pcie_bytes": (4 + 2) * P7 / 8,
                "pcie_old": (4 + 4) * P7 / 8,
                "pcie_t": (4 + 2) * P7 / 8 / 25e9, "pcie_bw": 25e9, "pcie4": 31.5e9, "pcie5": 63e9},
    "fit_stage": {"ddp": 16 * P13, "z1": 4 * P13 + 12 * P13 / 8, "z2": 2 * P13 + 14 * P13 / 8,
                  "z3": 16 * P13 / 8, "gpu": 80e9, "reserve": 20e9},
    "precision_bytes": {"k": 12, "mixed": 16, "meg": 18, "fp16": 20, "fp32": 16},
    # one flat fp32 shard of Ψ/N: foreach one root per element, for-loop the root and the quotient,
    # chunked two 2^20-element fp32 chunks (`theory.memory.adam_step_temporaries`)
    "optimizer_step_memory": {"foreach": 4 * P7 / 8, "forloop": 8 * P7 / 8, "chunked": 2 * 4 * 2**20,
                              "z1": 4 * P7 + 12 * P7 / 8},
    "grad_accumulation": {"z1k": 2 * RS8, "z2k": 4 * RS8 + RS8, "z3k": 4 * 3 * RS8, "z3": 3 * RS8},
    "grad_clipping": {},
    "loss_scaling": {"rs_fp32": 7 / 8 * 4 * P7, "rs_bf16": RS8},
    "checkpoint_reshard": {"opt": 12 * P7, "total": 16 * P7},
    "fsdp_tp": {"ms": 16 * P70 / 64, "dp_sent": 3 * 7 / 8 * 2 * P70 / 8},
    "pp_bubble": {"b48": 3 / 11, "b432": 3 / 35, "inflight": 4},  # (p-1)/(m+p-1); 1F1B's first stage: p
    # one K or V block b = 1 x 8 KV heads x 131072/8 tokens x 128 x 2 B; forward 2(cp-1)b, backward + 2cp b
    "cp_ring": {"fwd": 14 * 8 * 16384 * 128 * 2, "bwd": (14 + 16) * 8 * 16384 * 128 * 2},
    # plain split: rank r computes r + 1 blocks (1 vs 4); zig-zag: (r + 1) + (2cp - r) = 2cp + 1 = 9
    "cp_zigzag": {"ratio": 4, "blocks": 9},
    # k T D bytes (ep-1)/ep = 2 x 8192 x 4096 x 2 x 7/8; ceil(1.25 x 2 x 8192 / 8) = 2560
    "ep_all_to_all": {"disp": 2 * 8192 * 4096 * 2 * 7 / 8},
    "ep_capacity": {"cap": 2560},
    # 4 all-reduces of b s h = 4096 x 8192 bf16 elements, 2(t-1)/t of each sent: 4 x 2 x 7/8 x 67,108,864 B
    "nccl_busbw": {"alg": 130e9, "bus": 130e9 * 2 * 7 / 8, "factor": 2 * 7 / 8},
    # E4M3: 1.75 x 2^8 and 2^-6; E5M2: 1.75 x 2^15; the scale 448 / 0.002 (Micikevicius et al. 2022, Table 1)
    "fp8_scaling": {"e4max": 448, "e4min": 2**-6, "e5max": 57344, "scale": 224000},
    # 5,000,000 rounded up to 512 B: 9766 x 512; a 1-10 MiB request takes a 20 MiB segment; 30,000,000 B:
    # 15 x 2 MiB (torch 2.13 c10/core/AllocatorConfig.h and CUDACachingAllocator.cpp)
    "caching_allocator": {"block": 9766 * 512, "segment": 20 * 2**20, "cached": 20 * 2**20 - 9766 * 512,
                          "seg30": 15 * 2**21, "small": 2**20, "smallseg": 2**21, "minlarge": 10 * 2**20,
                          "largeseg": 20 * 2**20, "roundlarge": 2**21},
    "tp_bytes": {"blk": 4 * 2 * 7 / 8 * 4096 * 8192 * 2, "nv": 4 * 2 * 7 / 8 * 4096 * 8192 * 2 / 450e9,
                 "nic": 4 * 2 * 7 / 8 * 4096 * 8192 * 2 / 50e9, "bw_nv": 450e9, "bw_nic": 50e9},
    # Korthikanti Table 2: sbh(10 + 24/t) selective, 34sbh/t with SP; sbh = 4096 x 8192
    "sp_memory": {"tp_only": 4096 * 8192 * (10 + 24 / 8), "with_sp": 34 * 4096 * 8192 / 8},
    # 6 (8 with full recompute) x 68,976,648,192 x 1000 / 989e12
    "mfu_hfu": {"mfu": 6 * 68976648192 * 1000 / 989e12, "hfu": 8 * 68976648192 * 1000 / 989e12,
                "tps": 1000, "peak": 989e12},
    # b a s^2 x 2 bytes; FlashAttention: 4 bytes per row and head
    "flash_memory": {"scores": 64 * 4096 ** 2 * 2, "lse": 4 * 64 * 4096},
    "pp_zero": {"z1": 2 * 7 / 8 * 2 * P7 / 4, "z2": 17 * 7 / 8 * 2 * P7 / 4, "z3": 16 * 3 * 7 / 8 * 2 * P7 / 4},
}


@pytest.mark.fast
def test_deck_size_and_coverage():
    assert len(CARDS) >= 30 and len(deck.BY_ID) == len(CARDS), "ids are unique"
    assert set(SEED_QUESTIONS) <= set(deck.BY_ID)
    assert NEW_TOPICS <= set(deck.BY_ID)
    assert set(EXPECTED) == set(deck.BY_ID), "every card's figures are written out by hand above"


def card_is_complete(card):
    assert card.question.strip() and card.answer.strip() and card.must_hit
    assert re.search(r"[\u4e00-\u9fff]", card.question_zh), "Chinese question"
    assert card.topic in deck.TOPICS
    assert card.checks and all(isinstance(c, (Number, Choice, Term)) for c in card.checks), \
        "at least one auto-graded check"
    assert any(e.kind == "notebook" for e in card.evidence), "a proof link into a notebook"
    for c in card.checks:
        if isinstance(c, Number):
            assert c.figure in card.figures and "{" + c.figure + "}" not in c.prompt, "prompt hides its answer"
        if isinstance(c, Choice):
            assert len(c.answer) < len(c.options), "ticking every option must not be right"


def no_hard_coded_figures(card):
    texts = card.templates() + [card.question] + [p.text for p in card.must_hit]
    for t in texts:
        assert not HARD_CODED.findall(t), f"{card.id}: write figures as {{name}} -> theory call: {t!r}"
    card.rendered_answer()  # every placeholder resolves
    card.rendered_follow_ups()
    used = set(re.findall(r"{(\w+)}", " ".join(card.templates())))
    used |= {c.figure for c in card.checks if isinstance(c, Number)}
    assert used == set(card.figures), "no unused or undefined figures"


def every_quoted_figure_is_theory_output(card):
    """Each quantity with a unit in the rendered text is one of the card's figures; a computed
    figure's expression goes through the theory layer; an assumed input says where it is from."""
    if not card.figures:
        return
    text = " ".join([card.rendered_answer()] + [t for qa in card.rendered_follow_ups() for t in qa] +
                    [card.check_prompt(i) for i in range(len(card.checks))])
    shown = {f.text() for f in card.figures.values()}
    # ("2 bytes" of a bf16 element is a dtype's width, not a figure: bytes are not checked)
    units = r"GB/s|TFLOP/s|GB|MB|MiB|ms|µs|tokens|×(?!\s*\d)"
    for m in re.finditer(rf"\d+(?:\.\d+)?\s*(?:{units})(?![\w/])", text):
        assert m.group(0) in shown, m.group(0)
    for name, f in card.figures.items():
        if f.input:  # an assumption, given as a value, and said where it comes from
            assert f.fn == "given" and f.note, f"input {name} says where it comes from"
        else:  # computed: a named function over the theory, never a value typed in
            assert f.fn != "given" and f.fn in figures.FIGURES, f"{name}: {f.call()} does not use the theory"
        shown_value = float(f.text().split()[0].rstrip("×%"))
        assert abs(shown_value - float(f.value()) / f.scale) <= 1e-3 * abs(float(f.value()) / f.scale), name


def figures_match_closed_forms(card):
    exp = EXPECTED[card.id]
    assert set(exp) == set(card.figures)
    for name, value in exp.items():
        got = float(card.figures[name].value())
        assert got == pytest.approx(value, rel=1e-9), (card.id, name, got, value)


def card_verdict(card):
    """Each card's own answers earn full marks, and each figure renders as the theory's output
    (and equals the closed form in EXPECTED, checked above)."""
    g = card.grade(card.model_responses(), ticked=range(len(card.must_hit)))
    assert g.auto_points == g.auto_total and g.self_points == g.tick_total
    for name, f in card.figures.items():
        assert card.render("{" + name + "}") == f.text()
        assert f.text() in card.as_text()


@pytest.mark.fast
def test_headline_figures_against_the_closed_forms():
    """The figures interviews quote, written out from ZeRO §5.1 by hand, against the cards."""
    psi, n = 7e9, 8
    z = deck.get_card("zero_stages").figures
    assert z["ddp"].shown() == 16 * psi / GB == 112
    assert z["z1"].shown() == (4 * psi + 12 * psi / n) / GB == 38.5
    assert z["z2"].shown() == (2 * psi + 14 * psi / n) / GB == 26.25
    assert z["z3"].shown() == 16 * psi / n / GB == 14
    assert deck.get_card("megatron_level").figures["dist"].shown() == (6 * psi + 12 * psi / n) / GB == 52.5
    assert deck.get_card("zero3_comm").figures["ratio"].shown() == 1.5
    assert deck.get_card("mfsdp_v2").figures["hfsdp"].shown() == (4 * psi / 8 + 12 * psi / 16) / GB == 8.75


@pytest.mark.fast
def test_theory_reproduces_zero_paper_figure_1():
    # ZeRO paper Fig. 1: Ψ = 7.5B, N = 64, K = 12 -> 120 / 31.4 / 16.6 / 1.9 GB (rounded to 0.1)
    for strategy, printed in PAPER_FIG1.items():
        got = float(theory.model_states(strategy, 7.5e9, 64).total) / 1e9
        assert round(got, 1) == printed, (strategy, got)


@pytest.mark.fast
def test_fit_stage_choice_agrees_with_theory():
    card = deck.get_card("fit_stage")
    reserve, gpu = card.figures["reserve"].value(), card.figures["gpu"].value()
    order = ["ddp", "zero1", "zero2", "fsdp1"]
    first = next(s for s in order if theory.fits(s, 13e9, 8, gpu_bytes=gpu, reserve_bytes=reserve))
    choice = card.checks[2]
    assert isinstance(choice, Choice) and choice.answer == (order.index(first),)


# ------------------------------------------------------------------ the truth fixes
def _text(card_id: str) -> str:
    c = deck.get_card(card_id)
    return " ".join([c.rendered_answer()] + [t for qa in c.rendered_follow_ups() for t in qa] +
                    [e.text() for e in c.evidence] + list(c.sources))


@pytest.mark.fast
def test_deepspeed_zero12_reduction_is_cited_from_the_code():
    t = _text("zero1_vs_zero2_comm")
    for needle in ("use_multi_rank_bucket_allreduce", "v0.12.4", "reduce_scatter: false",
                   "deepspeed/runtime/zero/stage_1_and_2.py", "deepspeed/runtime/zero/config.py",
                   "every micro-batch", "accumulation boundary"):
        assert needle in t, needle
    c = deck.get_card("zero1_vs_zero2_comm")
    # with the default bucket all-reduce: 2Ψ of all-reduce + Ψ of all-gather = 3Ψ
    assert float(c.figures["z1ar"].value()) == 3 * RS8
    assert not re.search(r"DeepSpeed[^.]*\b2Ψ", c.rendered_answer().split("The gap")[1].split("Setting")[0])


@pytest.mark.fast
def test_megatron_follow_up_compares_like_with_like():
    c = deck.get_card("megatron_level")
    f = c.figures
    assert float(f["mega_rs"].value()) == float(theory.sent_bytes("reduce_scatter", 7e9 * 4, 8)) == 24.5 * GB
    assert float(f["z1_rs"].value()) == float(theory.sent_bytes("reduce_scatter", 7e9 * 2, 8)) == 12.25 * GB
    q, a = c.follow_ups[0]
    assert "{mega_rs}" in a and "{z1_rs}" in a and "{mega_total}" in a and "{z1_total}" in a
    assert a.index("{mega_rs}") < a.index("{z1_rs}") < a.index("{mega_total}") < a.index("{z1_total}")


@pytest.mark.fast
def test_no_text_about_how_the_deck_was_written():
    meta = re.compile(r"release notes give no reason|this is the reading|\bseed\b|this deck|this card|"
                      r"worth saying|the notes say|as written here", re.I)
    for c in CARDS:
        for t in c.templates() + [p.text for p in c.must_hit] + [c.question]:
            assert not meta.search(t), (c.id, t)


@pytest.mark.fast
def test_no_text_about_how_the_suite_was_written():
    """The notebooks, README, labs guide and set-up files speak of their subject only."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    meta = re.compile(r"these machines|search tool|release notes give no reason|this is the reading|"
                      r"source documents|seed (notes|documents)", re.I)
    files = [*sorted((root / "notebooks").glob("**/*.ipynb")), root / "README.md", root / "Makefile",
             root / "pyproject.toml", root / "labs" / "README.md"]
    for f in files:
        texts = (["".join(c["source"]) for c in json.loads(f.read_text())["cells"]] if f.suffix == ".ipynb"
                 else [f.read_text()])
        for t in texts:
            m = meta.search(t)
            assert not m, (f.name, t[max(0, m.start() - 80):m.end() + 80])


@pytest.mark.fast
def test_condition_for_one_and_a_half():
    a = deck.get_card("zero3_comm").answer
    assert "same dtype" in a and "{ratio}" in a
    assert float(deck.get_card("zero3_comm").figures["r_mixed"].value()) == 2


@pytest.mark.fast
def test_hpz_is_not_hsdp_and_defaults_are_flat():
    z = _text("zero_pp")
    assert "hpZ is not HSDP" in z and "MiCS" in z
    h = _text("hybrid_sharding")
    assert "FULL_SHARD" in h and "torchtitan" in h and "not a default" in h
    assert "MiCS" in h


@pytest.mark.fast
def test_pcie_figures_are_per_direction_and_generation():
    o = deck.get_card("offload").figures
    assert o["pcie4"].value() == 31.5e9 and o["pcie5"].value() == 63e9  # 16 / 32 GT/s x 16, 128b/130b


# ------------------------------------------------------------------ evidence
SOLUTIONS = ROOT / "notebooks" / "solutions"


def _source(target: str) -> Path:
    """The single source of a cited notebook: the learner's edition `notebooks/NN_name.ipynb`
    is generated from `notebooks/solutions/NN_name.ipynb` with the same markdown."""
    return SOLUTIONS / Path(target).name


def _headings(path: Path) -> set[str]:
    nb = json.loads(path.read_text())
    out = set()
    for c in nb["cells"]:
        if c["cell_type"] == "markdown":
            for line in "".join(c["source"]).splitlines():
                if line.startswith("#"):
                    out.add(line.lstrip("#").strip())
    return out


@pytest.mark.fast
def test_notebook_list_is_one_numbered_sequence():
    names = [Path(p).name for p in NOTEBOOKS.values()]
    assert [int(n[:2]) for n in names] == list(range(1, len(names) + 1))
    assert all(p.startswith("notebooks/") and p.endswith(".ipynb") for p in NOTEBOOKS.values())


def evidence_targets_exist(card):
    for e in card.evidence:
        if e.kind == "module":
            assert (ROOT / e.target).exists(), e.target
        if e.kind == "notebook":
            assert e.target in NOTEBOOKS.values(), e.target
            path = _source(e.target)
            assert path.exists(), f"{card.id} cites {e.target}, but {path.relative_to(ROOT)} does not exist"
            heads = _headings(path)  # "Claim 6" names the heading 'Claim 6: "..."'
            assert any(h == e.detail or h.startswith(e.detail + ":") for h in heads), \
                f"{path.name} has no section {e.detail!r} (cited by card {card.id})"
        if e.kind == "run":
            args = build_parser().parse_args(e.target.split()[1:])  # the command exists, as cited
            if getattr(args, "strategy", None) is not None:  # context / experts name no strategy
                catalog.get_spec(args.strategy)
        if e.kind == "lab":
            from zeroedu.labs import LABS
            assert any(e.target == lab.file[:-3] for lab in LABS.values()), e.target


@pytest.mark.fast
def test_notebook_sections_lists_every_cited_section():
    sections = deck.notebook_sections()
    assert set(sections) <= set(NOTEBOOKS.values())
    assert {f"Card {c.id}" for c in CARDS} <= set(sections[NOTEBOOKS["rehearsal"]])


def _rehearsal_sections() -> dict[str, list[dict]]:
    """The rehearsal notebook's cells, grouped by the "Card <id>" section they sit in."""
    nb = json.loads(_source(NOTEBOOKS["rehearsal"]).read_text())
    out, current = {}, None
    for c in nb["cells"]:
        if c["cell_type"] == "markdown":
            for line in "".join(c["source"]).splitlines():
                m = re.fullmatch(r"#+\s*Card (\w+)\s*", line)
                if m:
                    current = m.group(1)
                    assert current not in out, f"two sections for card {current}"
                    out[current] = []
                elif re.match(r"#{1,2}\s", line):
                    current = None  # a part heading or a section after the cards
        elif current is not None:
            out[current].append(c)
    return out


@pytest.mark.fast
def test_rehearsal_notebook_proves_every_card():
    """One section per card, in the refresher's order; each shows its card's question with the
    answer behind a button (`rehearse`), and a card that quotes figures sets every one of them
    beside its closed form worked by hand."""
    sections = _rehearsal_sections()
    assert list(sections) == [c for row in session.refresher_plan() for c in row["cards"]]
    for card in CARDS:
        src = ["".join(c["source"]) for c in sections[card.id] if c["cell_type"] == "code"]
        assert any(f'rehearse("{card.id}")' in s for s in src), card.id
        if card.figures:
            proofs = [s for s in src if f'figures_vs_by_hand("{card.id}"' in s]
            assert proofs, f"card {card.id}: no figures_vs_by_hand cell"


@pytest.mark.fast
def test_refresher_plan_is_one_hour_over_every_card():
    plan = session.refresher_plan()
    assert sum(r["minutes"] for r in plan) == 60
    assert sorted(c for r in plan for c in r["cards"]) == sorted(c.id for c in CARDS)
    for r in plan:
        args = build_parser().parse_args(r["command"].split()[1:])
        s = session.build(args.topic, seed=args.seed, n_drills=args.drills, n_cards=args.cards)
        assert [c.id for c in s.cards] == r["cards"] and len(s.drills) == 1


@pytest.mark.fast
def test_figures_vs_by_hand(capsys):
    from zeroedu.quiz.proof import figures_vs_by_hand

    figures_vs_by_hand("zero_stages", {"z2": 2 * P7 + 14 * P7 / 8, "bpp": 16})
    out = capsys.readouterr().out
    assert "26.25 GB" in out and out.rstrip().endswith("card zero_stages: every figure equals its closed form (2 of 2)")
    with pytest.raises(AssertionError):
        figures_vs_by_hand("zero_stages", {"z2": 4 * P7 + 12 * P7 / 8})
    assert "✗" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no figure"):
        figures_vs_by_hand("zero_stages", {"nope": 1})


# ------------------------------------------------------------------ drills
@pytest.mark.fast
def test_drills_are_reproducible_and_vary():
    a, b = drills.draw_drills(20, seed=5), drills.draw_drills(20, seed=5)
    assert a == b and a != drills.draw_drills(20, seed=6)
    assert {d.kind for d in a} == set(drills.KINDS)
    assert all(d.strategy in drills.TOPIC_STRATEGIES["hybrid"] for d in drills.draw_drills(10, 1, "hybrid"))


@pytest.mark.fast
@pytest.mark.parametrize("topic", deck.TOPICS)
def test_every_deck_topic_has_drills(topic):
    ds = drills.draw_drills(5, seed=0, topic=topic)
    assert len(ds) == 5 and all(d.kind in drills.TOPIC_KINDS.get(topic, drills.KINDS) for d in ds)


@pytest.mark.fast
def test_drill_grading_uses_theory():
    for seed in range(40):
        d = drills.draw_drills(1, seed=seed)[0]
        if d.kind == "fits":
            total = theory.model_states(d.strategy, d.psi, d.n, d.m, d.recipe).total
            assert d.expected() == (total <= drills.GPU_BYTES), seed
            assert d.grade("yes" if d.expected() else "no")[0], seed
            assert not d.grade("no" if d.expected() else "yes")[0], seed
            continue
        exp = float(d.expected())
        assert d.grade(f"{exp / 1e9 * 1.005} GB")[0], seed  # within 1 %
        assert d.grade(f"{exp:.6e}")[0], seed  # bytes
        assert not d.grade(f"{exp / 1e9 * 1.03}")[0], seed
        assert d.worked().splitlines()[-1].endswith(drills.gb(exp)), seed


@pytest.mark.fast
def test_worked_solution_substitutes_numbers():
    d = drills.Drill("bytes", "zero2", 7e9, 8, 1, "mixed-bf16")
    w = d.worked()
    assert "2 × 7e9 = 14 GB" in w and "2 × 7e9 / 8 = 1.75 GB" in w and "12 × 7e9 / 8 = 10.5 GB" in w
    assert w.endswith("total = 26.25 GB")
    c = drills.Drill("comm", "fsdp1", 7e9, 8, 1, "mixed-bf16").worked()
    assert c.count("(8-1)/8 × 14 GB = 12.25 GB") == 3 and c.endswith("total = 36.75 GB")


@pytest.mark.fast
@pytest.mark.parametrize("text,value", [("38.5", 38.5e9), ("38.5 GB", 38.5e9), ("38500 MB", 38.5e9),
                                        ("3.85e10", 3.85e10), ("1,000,000", 1e6), ("abc", None), ("", None)])
def test_parse_bytes(text, value):
    assert drills.parse_bytes(text) == value


# ------------------------------------------------------------------ the session and the CLI
def _quiz(args, stdin):
    return zeroedu("quiz", *args, stdin=stdin)


def test_cli_full_score_with_correct_answers():
    s = session.build(None, seed=3, n_drills=4, n_cards=2)
    total = sum(len(c.checks) for c in s.cards) + len(s.drills)
    ticks = sum(len(c.must_hit) for c in s.cards)
    p = _quiz(["--seed", "3", "--drills", "4", "--cards", "2"], session.scripted_answers(s))
    assert p.returncode == 0, p.stderr
    assert f"Session score: {total}/{total} auto-graded (100%)" in p.stdout
    assert f"self-ticked {ticks}/{ticks} must-hit points" in p.stdout
    assert "✗" not in p.stdout


def test_cli_wrong_answers_show_answers_and_worked_solution():
    s = session.build("zero", seed=1, n_drills=3, n_cards=1)
    n_checks = len(s.cards[0].checks)
    stdin = "no idea\n" * n_checks + "none\n" + "0\n0\n0\n"
    p = _quiz(["--topic", "zero", "--seed", "1", "--drills", "3", "--cards", "1"], stdin)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("✗") == n_checks + 3 and p.stdout.count("worked solution:") == 3
    for d in s.drills:
        assert d.worked().splitlines()[-1].strip() in p.stdout
    for i in range(n_checks):
        assert s.cards[0].check_answer(i) in p.stdout
    assert "30-second answer:" in p.stdout and "Session score: 0/" in p.stdout


def test_cli_keyword_stuffing_scores_nothing_but_ticks_are_apart():
    s = session.build(None, n_drills=0, card_ids=["own_optimizer", "zero_stages"])
    stuffed = "if ddp shard all-reduce reduce-scatter optimizer state gradient parameter"
    stdin = "".join(stuffed + "\n" for _ in s.cards[0].checks) + "all\n"
    stdin += "".join(stuffed + "\n" for _ in s.cards[1].checks) + "all\n"
    p = _quiz(["--card", "own_optimizer", "--card", "zero_stages", "--drills", "0"], stdin)
    assert p.returncode == 0, p.stderr
    n, t = sum(len(c.checks) for c in s.cards), sum(len(c.must_hit) for c in s.cards)
    assert f"Session score: 0/{n} auto-graded (0%)" in p.stdout
    assert f"self-ticked {t}/{t} must-hit points (not in the score)" in p.stdout


def test_cli_eof_ends_gracefully():
    p = _quiz(["--seed", "0"], "")
    assert p.returncode == 0 and "end of input" in p.stdout and "Session score: 0/0" in p.stdout
    assert "Traceback" not in p.stderr
    card = deck.get_card("zero_stages")  # EOF in the middle of a card: the card is not counted
    p = _quiz(["--card", "zero_stages", "--drills", "0"], "\n".join(card.model_responses()[:2]) + "\n")
    assert p.returncode == 0 and "Session score: 0/0" in p.stdout


def test_cli_list_and_bad_topic():
    p = _quiz(["--list"], "")
    assert p.returncode == 0
    for c in CARDS:
        assert f"Q [{c.id}]" in p.stdout
    assert p.stdout.count("30-second answer:") == len(CARDS) and p.stdout.count("Proof:") == len(CARDS)
    assert "model_states(strategy='hfsdp'" in p.stdout and "Checks (auto-graded):" in p.stdout
    p = _quiz(["--list", "--topic", "hybrid"], "")
    assert p.returncode == 0 and "mfsdp_v2" in p.stdout and "ddp_overlap" not in p.stdout
    p = _quiz(["--topic", "nope"], "")
    assert p.returncode == 2 and "invalid choice" in p.stderr
    p = _quiz(["--card", "nope"], "")
    assert p.returncode == 2 and "invalid choice" in p.stderr


@pytest.mark.fast
def test_session_in_process():
    import io

    s = session.build("megatron", seed=0, n_drills=1, n_cards=1)
    s.inp, s.out = io.StringIO(session.scripted_answers(s, ticks="1")), io.StringIO()
    score = s.run()
    assert score.points == score.total > 0
    assert score.self_points == 1 and score.self_total == len(s.cards[0].must_hit)


@pytest.mark.fast
def test_widgets_grade_like_the_terminal():
    from zeroedu.quiz.widget import CardViewer, DrillTrainer

    t = DrillTrainer(seed=2)
    assert t.check(t.drill.expected_text())
    assert t.drill.worked().splitlines()[-1].strip()[:10] in t.feedback.value
    assert not DrillTrainer(seed=2).check("nonsense")
    v = CardViewer(topic="fsdp")
    g = v.check()  # nothing answered
    assert g.auto_points == 0 and "✗" in v.result.value
    from zeroedu.answers import learner_seed
    from zeroedu.quiz.deck import for_learner

    for canonical in CARDS:
        card = for_learner(canonical, learner_seed())  # the widget shows this learner's order
        v = CardViewer()
        v.pick.value = card.id
        v.set_answers(card.model_responses())
        assert card.grade(v.answers()).full_marks  # the widgets read back what was set
        g = v.check()
        assert g.auto_points == g.auto_total == len(card.checks), card.id
        assert g == card.grade(card.model_responses(), ticked=())
        v.tick([0])
        assert v.grade.self_points == 1 and v.grade.auto_points == g.auto_points
        assert "self-ticked 1/" in v.self_score.value


# ------------------------------------------------------------------ every card, one item each
CONTENT_CHECKS = (card_is_complete, no_hard_coded_figures, every_quoted_figure_is_theory_output,
                  figures_match_closed_forms, card_verdict, evidence_targets_exist)


@pytest.mark.fast
@pytest.mark.parametrize("card", CARDS, ids=lambda c: c.id)
def test_card(card):
    """One item per card: its content (complete, figures from the theory and equal to the closed
    forms above, evidence that exists) and its grading (tests/test_deck_grading.py: right answers
    score, stuffing and wrong accounts do not)."""
    for check in CONTENT_CHECKS + GRADING_CHECKS:
        check(card)


@pytest.mark.fast
def test_a_rehearsal_card_hides_its_answer_until_asked():
    """Notebook 12's cards: the question and what the checks ask are shown; the 30-second answer,
    the checks' answers and the follow-ups only after the button (what `Card.as_text` prints)."""
    import html

    from zeroedu.quiz.widget import rehearse

    for card in CARDS:
        prompt = rehearse(card.id)
        shown = html.unescape(prompt.question.value)
        assert card.question in shown and card.question_zh in shown
        assert "30-second answer" not in shown and prompt.answer.value == ""
        assert all(f"-> {card.check_answer(i)}" not in shown for i in range(len(card.checks)))
        revealed = html.unescape(prompt.reveal())
        assert "30-second answer" in revealed and prompt.button.disabled
