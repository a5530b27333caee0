"""Known mistakes as named closed forms (`zeroedu.theory.mistakes`): each computes the figure one
misconception gives, by hand here, and an exercise that anticipates it names it when a learner
gives exactly that figure."""
from __future__ import annotations

import pytest

from zeroedu.notebook.exercises import all_exercises, check
from zeroedu.theory import mistakes as M

pytestmark = pytest.mark.fast

PSI, N = 13e9, 16
# (the mistake, its figure worked by hand, a word its message must hold)
CASES = [
    (M.other_stage_states("zero1", "ddp", PSI, N), 16 * PSI, "ddp"),  # DDP's replica for ZeRO-1
    (M.other_stage_states("zero2", "fsdp1", 30e9, 64), 16 * 30e9 / 64, "fsdp1"),
    (M.only_optimizer_shard("zero1", PSI, N), 12 * PSI / N, "optimizer state alone"),
    (M.missing_gradients("zero2", 30e9, 64), 2 * 30e9 + 12 * 30e9 / 64, "gradients are missing"),
    (M.ring_factor_dropped("ddp", 1.5e9, 16), 2 * 1.5e9 * 2, "(N-1)/N"),  # a whole all-reduce per rank
    (M.allreduce_counted_once("ddp", 1.5e9, 16), 15 / 16 * 1.5e9 * 2, "two passes"),
    (M.other_stage_comm("zero1_allreduce", "zero1", PSI, N), 2 * 15 / 16 * PSI * 2, "zero1"),
    (M.fp32_gradients("ddp", 1.5e9, 16), 2 * 15 / 16 * 1.5e9 * 4, "bf16"),
    (M.whole_buffer_sent("all_reduce", 1e9, 8), 2e9, "N-1 of the N chunks"),
    (M.whole_buffer_sent("all_gather", 1e9, 8), 1e9, "N-1 of the N chunks"),
    (M.one_pass_of_allreduce(1e9, 8), 7 / 8 * 1e9, "one half of the ring"),
    (M.allreduce_for("all_gather", 1e9, 8), 2 * 7 / 8 * 1e9, "an all-gather is one pass"),
    (M.elements_for_bytes(12e6, 4), 3e6, "4 bytes"),
    (M.optimizer_forgotten("ddp", 1.5e9, 8), 4 * 1.5e9, "optimizer state is missing"),
    (M.optimizer_forgotten("megatron_distopt", PSI, N), 6 * PSI, "optimizer state is missing"),  # fp32 grads
    (M.parameters_only("zero2", 30e9, 64), 2 * 30e9, "parameters alone"),
    (M.other_recompute("none", "selective", 2048, 1, 12288, 96), 34 * 2048 * 12288, "selective"),
    (M.other_recompute("selective", "full", 4096, 1, 4096, 32, layers=32), 32 * 2 * 4096 * 4096, "full"),
    (M.one_layer_only(4096, 1, 4096, 32, "selective", 32), 34 * 4096 * 4096, "32"),
    (M.even_split(10, 4), 2.5, "whole rows"),  # 10 rows on 4 ranks: chunks of 3, 3, 3, 1
    (M.full_chunk_everywhere(10, 4), 3, "last rank"),
    (M.floor_rows(10, 4), 2, "no owner"),
    (M.unpadded_buffer(10, 4, per_row=4), 40, "padded"),
    (M.one_padded_chunk(10, 4, per_row=4), 12, "N of them"),
]


@pytest.mark.parametrize("mistake,want,word", CASES, ids=[c[0].name + str(i) for i, c in enumerate(CASES)])
def test_each_mistake_computes_its_figure(mistake, want, word):
    assert mistake.value == pytest.approx(want, rel=1e-12)
    assert word in mistake.why


def test_every_named_mistake_is_anticipated_somewhere_and_named_there():
    """Each named mistake is an anticipated wrong answer of at least one exercise, and giving its
    figure there gets the diagnosis, not "off by a factor"."""
    used = {}
    for ex in all_exercises():
        for w in ex.wrong:
            if w.mistake:
                used.setdefault(w.mistake, []).append((ex, w))
    assert set(used) == {f.__name__ for f in M.MISTAKES}
    for name, pairs in used.items():
        for ex, w in pairs:
            with pytest.raises(AssertionError) as ei:
                check(ex.id, w.value)
            assert w.why in str(ei.value) and "off by a factor" not in str(ei.value), (name, ex.id)
