"""Notebook 14 (beyond data parallelism): which context-parallel rank works hardest, the causal
imbalance read off a run, a 70B plan's bubble and model states by hand, then the 70B design
exercise (before the planner's ranking and widget are shown), a ring attention whose work is off,
and the rows an expert-parallel dispatch sends across, read off the router's counts."""
from __future__ import annotations


from ...theory import context as cp_theory
from ...theory import planner
from ...theory import mistakes
from . import Exercise, Wrong, example_report, mistaken, register

# The notebook's context-parallel runs: gpt-tiny (2 heads, S = 32), global batch 4, cp = 4.
CP, HEADS, SEQ, BATCH = 4, 2, 32, 4
RANK_OPTIONS = {"a": "rank 0, the first chunk", "b": "rank 3, the last chunk", "c": "all four the same",
                "d": "ranks 1 and 2, in the middle"}


def _busiest_zigzag() -> str:
    """Which option describes where zig-zag puts the most score elements (theory.context)."""
    work = [cp_theory.work_elements(BATCH, HEADS, SEQ, CP, r, zigzag=True) for r in range(CP)]
    if len(set(work)) == 1:
        return "c"
    top = max(work)
    return {(0,): "a", (CP - 1,): "b", (1, 2): "d"}[tuple(r for r, w in enumerate(work) if w == top)]


def _imbalance(plain) -> float:
    ranks = plain.ranks  # a run's report: each rank's ring work, counted (`reports.RingWork`)
    return ranks[-1].ring.score_elements / ranks[0].ring.score_elements


def _example_plain() -> dict:
    # the score elements of the notebook's plain cp = 4 run (rank r computes r + 1 blocks)
    from ...reports import RingWork

    class Rank:  # what the exercise reads of a RunReport's rank: its ring's work
        def __init__(self, r: int):
            self.ring = RingWork([[8 * r, 8 * r + 8]], 1024 * (r + 1), 1024 * (r + 1))

    class Plain:
        ranks = [Rank(r) for r in range(CP)]

    return {"plain": Plain()}


def _rows(moe, held: bool | None) -> int:
    """Rank 0's rows in layer 0's dispatch, last step, all micro-batches: to experts it holds
    (True), to the others (False), or all of them (None); from the router's counts."""
    r = moe.ranks[0].routing
    return sum(n for mb in r.sent[0] for e, n in enumerate(mb) if held is None or (e in r.held) == held)


def _example_moe() -> dict:
    # rank 0 holds experts 0 and 1 of 4; one micro-batch routed 30, 25, 20 and 21 rows to them
    from ...reports import ExpertRouting

    routing = ExpertRouting(held=[0, 1], sent=[[[30, 25, 20, 21]]], received=[[[55, 41]]], dropped=[0])
    return {"moe": example_report({"routing": routing})}


def _grade(answer) -> tuple[bool, str]:
    g = planner.grade_design(answer) if isinstance(answer, str) else planner.grade_design("")
    if g.ok:
        return True, f"{g.plan}: " + "; ".join(c.detail for c in g.conditions)
    return False, "; ".join(f"{c.name}: {c.detail}" for c in g.broken())


def _canon(answer):
    return planner.parse_plan(answer) if isinstance(answer, str) else None


# The by-hand plan of 14.6 and 14.7: dp 16 x tp 8 x pp 2, ZeRO-1, a micro-batch of one sequence
_HAND = {"dp": 16, "tp": 8, "pp": 2, "m": 256 // 16}
_HAND_PSI = planner.LLAMA2_70B.params() // (_HAND["tp"] * _HAND["pp"])  # 80 layers split evenly: Ψ/16 exactly


def _hand_bubble():
    from ...theory import pipeline

    return pipeline.bubble_fraction(_HAND["pp"], _HAND["m"])


def _hand_states() -> float:
    """The planner's model-state bytes per GPU for the by-hand plan (ZeRO-1 over the dp ranks)."""
    est = planner.estimate(planner.LLAMA2_70B, planner.Cluster(256), planner.Plan(_HAND["dp"], _HAND["tp"], _HAND["pp"], 1, 1), 256)
    return est.states


register(
    Exercise(
        id="14.1", kind="choice", style="predict",
        prompt="Before the runs: causal attention over cp = 4 ranks with the zig-zag split (rank r holds "
               "chunks r and 7 - r of 8). Which rank computes the most score elements?",
        options=RANK_OPTIONS,
        expected=_busiest_zigzag,
        hint="count, for each rank's two chunks, the chunks at or before it: chunk c sees c + 1 of them.",
        wrong=(Wrong("b", "that is the plain split, where the last rank's queries see every key; zig-zag gives it "
                          "the first chunk too"),
               Wrong("a", "rank 0's chunk 7 sees all eight chunks, but its chunk 0 sees only itself: 1 + 8, as "
                          "every other rank's pair sums to 9"),
               Wrong("d", "the middle ranks hold chunks 3 and 4 (or 2 and 5): 4 + 5 = 3 + 6 = 9, the same as the "
                          "edges")),
    ),
    Exercise(
        id="14.2", kind="number", style="measure",
        prompt="From `plain` (the plain split at cp = 4): the score elements rank 3 computed divided by "
               "rank 0's.",
        expected=_imbalance,
        example=_example_plain,
        hint="plain.ranks[r].ring.score_elements; rank r's queries meet r + 1 key blocks, each computed whole.",
        wrong=(mistaken(mistakes.assumed_equal("ratio"),
                        "the plain split is not balanced: each rank skips the blocks wholly in its future, and "
                        "rank 0 has the most of them"),
               mistaken(mistakes.masked_scores_only(CP)),
               mistaken(mistakes.imbalance_vs_mean(CP)),
               mistaken(mistakes.upside_down(CP), "upside down: rank 3 holds the last positions, whose queries "
                                                  "see every key")),
    ),
    Exercise(
        id="14.3", kind="design", style="formula",
        prompt="Train Llama-2-70B on 256 GPUs (8 per node, 80 GB each), global batch 256 sequences of 4096 "
               "tokens: choose dp, tp, pp and the ZeRO level (e.g. 'dp 4, tp 4, pp 16, ZeRO-1'). A good plan "
               "exists on 256 GPUs, fits in memory, keeps tp inside a node and the bubble at most 10 % of the step.",
        expected=lambda: "dp 8, tp 8, pp 4, ZeRO-1",
        grade=_grade,
        canon=_canon,
        hint="tp at most 8 (one node); the model states are 16 bytes per parameter divided by tp·pp before "
             "ZeRO; the bubble is (pp - 1)/(m + pp - 1) with m = 256/dp micro-batches of one sequence.",
        wrong=(Wrong("dp 256, tp 1, pp 1, ZeRO-0", "plain data parallelism keeps 16 bytes of every one of the 69 "
                                                    "billion parameters on each GPU"),
               Wrong("dp 16, tp 16, pp 1, ZeRO-1", "tp = 16 spans two nodes: its all-reduces, four per layer, "
                                                    "would cross the NIC"),
               Wrong("dp 2, tp 8, pp 16, ZeRO-1", "16 stages with 128 micro-batches each idle for 15/143 of the "
                                                   "step")),
    ),
    Exercise(
        id="14.6", kind="number", style="formula",
        prompt="By hand, before designing your own: Llama-2-70B (Ψ = 68,976,648,192) on dp 16 × tp 8 × pp 2 with "
               "1F1B, a global batch of 256 sequences, one sequence per micro-batch. What share of the step is "
               "the pipeline's bubble?",
        expected=lambda: float(_hand_bubble()), rel=1e-3,
        hint="each replica runs m = 256/dp micro-batches; the bubble is (pp - 1) idle slots beside m busy ones",
        wrong=(mistaken(mistakes.bubble_over_busy(_HAND["pp"], _HAND["m"])),
               mistaken(mistakes.other_mode(float(_HAND["pp"] - 1) / (256 + _HAND["pp"] - 1),
                                            "the whole batch as one replica's micro-batches"),
                        "that counts all 256 sequences as one replica's: each of the 16 replicas runs 256/16"))),
    Exercise(
        id="14.7", kind="number", style="formula",
        prompt="By hand, the same plan (dp 16 × tp 8 × pp 2) with ZeRO-1 and mixed precision (2 + 2 + 12 bytes "
               "per parameter): how many bytes of model states does each GPU hold?",
        expected=lambda: float(_hand_states()), rel=1e-3,
        hint="tp·pp splits the model: Ψ/16 per GPU; ZeRO-1 then shards the 12 bytes of Adam state over the dp = 16 "
             "replicas and keeps the 2 + 2 bytes of weights and gradients whole",
        wrong=(mistaken(mistakes.other_stage_states("zero1", "ddp", _HAND_PSI, 16),
                        "that is without ZeRO: the optimizer state is sharded over the 16 replicas too"),
               mistaken(mistakes.all_sharded("zero1", _HAND_PSI, 16),
                        "ZeRO-1 shards the optimizer state only; the weights and gradients stay whole on each replica"),
               mistaken(mistakes.whole_for_shard(_hand_states(), 16),
                        "that is the whole model's: tp·pp = 16 ranks split it before ZeRO shards anything"))),
    Exercise(
        id="14.4", kind="choice", style="find-the-bug",
        prompt="`MysteryRing` trained gpt-tiny with cp = 4 (comparison `bug`). Which mistake is in it?",
        options={"a": "it computes the key blocks that lie wholly after its queries, then masks them to nothing, "
                      "instead of skipping them",
                 "b": "it sends every K and V block around the ring twice",
                 "c": "it keeps the whole S x S score matrix of each layer for backward",
                 "d": "it leaves the causal mask off the diagonal block"},
        expected=lambda: "a",
        hint="read each column against its closed form, rank by rank, then the losses.",
        wrong=(Wrong("b", "the ring bytes equal the closed form, 2(cp - 1) blocks forward, on every rank"),
               Wrong("c", "the activation bytes equal fused attention's at S/cp tokens: nothing S x S was saved"),
               Wrong("d", "the losses equal one process's: every query saw exactly the keys at or before it")),
    ),
    Exercise(
        id="14.5", kind="number", style="measure",
        prompt="From `moe` (top-2 routing, 4 experts over ep = 2, one rank per ep position): how many of rank 0's "
               "token rows crossed to the other rank's experts in layer 0's dispatch, last step?",
        expected=lambda moe: _rows(moe, held=False),
        example=_example_moe,
        hint="moe.ranks[0].routing: `sent[0]` is layer 0's rows per micro-batch and expert, `held` the experts "
             "rank 0 keeps; only rows bound elsewhere cross.",
        wrong=(mistaken(mistakes.home_rows_counted, "that counts every row rank 0 routed, with the ones for its "
                        "own experts, which never leave the rank", given=lambda moe: (_rows(moe, None),)),
               mistaken(mistakes.home_rows_only, "those are the rows that stay: they go to the experts rank 0 "
                        "holds itself", given=lambda moe: (_rows(moe, True),))),
    ),
)
