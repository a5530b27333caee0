"""Notebook 06 (an FSDP linear layer by hand): rows per rank, bytes per step, what crosses the
wire per call, and a backward that forgets to average."""
from __future__ import annotations

from ... import shard, theory
from ...theory import mistakes
from . import Exercise, Wrong, mistaken, register

_LAYER = [[(1024, 1024)]]  # a bias-free 1024 x 1024 layer, fp32, N = 8
_ODD = [[(1001, 1024), (1001,)]]  # 1001 rows do not divide by N = 8


def _calls(rank: int, call: str, field: str):
    return lambda ranks: ranks[rank]["calls"][call][field]


def _example_calls() -> dict:
    # 7 x 12 fp32 layer on N = 4 (chunks of 2 rows): what `layer_job` returns per rank
    call = {"forward": {"ring_model": 312.0, "wire": 1176, "messages": 6},
            "backward": {"ring_model": 600.0, "wire": 1896, "messages": 9}, "saved_bytes": 288}
    return {"ranks": [{"rank": r, "calls": call} for r in range(4)]}


register(
    Exercise(
        id="06.1", kind="number", style="formula",
        prompt="A layer with d_out = 10 output rows is sharded on dim 0 over N = 4 ranks. How many rows "
               "does rank 3 hold?",
        expected=lambda: shard.dim0_rows(10, 4, 3).size,
        hint="chunks of c = ceil(d_out/N) whole rows, in rank order; the last rank gets what is left.",
        wrong=(mistaken(mistakes.full_chunk_everywhere(10, 4),
                        "3 is the chunk c = ceil(10/4): ranks 0, 1 and 2 hold 3 rows each"),
               mistaken(mistakes.even_split(10, 4), "rows are not split into fractions: every rank holds whole rows"),
               mistaken(mistakes.floor_rows(10, 4), "floor(10/4) = 2 rows each would leave 2 rows with no owner")),
    ),
    Exercise(
        id="06.2", kind="number", style="formula",
        prompt="A bias-free 1024 x 1024 fp32 FSDP linear layer on N = 8 ranks: how many bytes does each "
               "rank send per training step under the ring model (gather W in forward, gather W again "
               "in backward, reduce-scatter dW)?",
        expected=lambda: theory.exact_comm("fsdp2", _LAYER, 8, recipe="fp32").total(),
        hint="each of the three collectives sends (N-1)/N of the 4·1024·1024-byte buffer.",
        wrong=(mistaken(mistakes.other_stage_comm("fsdp2", "ddp", 1024 ** 2, 8, recipe="fp32"),
                        "that is 2Ψ: DDP's all-reduce, or FSDP without the second all-gather in backward"),
               mistaken(mistakes.ring_factor_dropped("fsdp2", 1024 ** 2, 8, recipe="fp32"),
                        "a ring sends (N-1)/N of each buffer, not all of it"),
               mistaken(mistakes.elements_for_bytes(3 * 7 / 8 * 4 * 1024 ** 2, 4),
                        "that counts elements; fp32 has 4 bytes per element")),
    ),
    Exercise(
        id="06.3", kind="number", style="formula",
        prompt="A 1001 x 1024 fp32 linear layer with a bias, on N = 8 ranks: how many times more parameter bytes "
               "does a DDP rank hold than the last FSDP rank (rank 7), between uses?",
        expected=lambda: (theory.exact_model_states("ddp", _ODD, 8, rank=7, recipe="fp32").param
                          / theory.exact_model_states("fsdp2", _ODD, 8, rank=7, recipe="fp32").param),
        hint="chunks of ceil(1001/8) rows of W and b; how many rows are left for rank 7?",
        wrong=(mistaken(mistakes.even_split, "N is the ratio for a rank with a full chunk; rank 7 holds fewer rows",
                        of=lambda: 1001 / mistakes.even_split(1001, 8).value),
               mistaken(mistakes.full_chunk_everywhere, "126 rows is the chunk of ranks 0 to 6; rank 7 gets the rest",
                        of=lambda: 1001 / mistakes.full_chunk_everywhere(1001, 8).value),
               mistaken(mistakes.upside_down, "upside down: the DDP rank holds more",
                        of=lambda: mistakes.upside_down(1001 / (1001 - 7 * 126)).value)),
    ),
    Exercise(
        id="06.4", kind="choice", style="predict",
        prompt="Before the run: on N = 4 ranks, which of the two layers (7 x 12 weight plus bias) sends "
               "more bytes per training step under the ring model, and by about how much?",
        options={"a": "DDP: its all-reduce sends twice what an all-gather sends",
                 "b": "the same: both move every parameter once per step",
                 "c": "FSDP, about 1.5x: gather, gather again, reduce-scatter against one all-reduce",
                 "d": "FSDP, about N = 4 times: every rank gathers the whole layer from each of the other ranks in turn"},
        expected=lambda: "c",
        hint="an all-reduce is a reduce-scatter plus an all-gather; count FSDP's collectives per step.",
        wrong=(Wrong("a", "DDP's all-reduce is two halves (reduce-scatter + all-gather) of one buffer; FSDP "
                          "runs three such halves: all-gather, all-gather, reduce-scatter"),
               Wrong("b", "FSDP gathers W twice (forward, then again in backward) on top of the "
                          "reduce-scatter"),
               Wrong("d", "gathering the whole layer costs each rank (N-1)/N of it, not N times it")),
    ),
    Exercise(
        id="06.5", kind="number", style="measure",
        prompt="From the per-call measurement of the FSDP layer (`fsdp_calls`): how many bytes of gloo's framing "
               "did rank 3 write during the layer's backward, i.e. its wire bytes minus the ring model of its "
               "payloads?",
        expected=lambda ranks: ranks[3]["calls"]["backward"]["wire"] - ranks[3]["calls"]["backward"]["ring_model"],
        hint="fsdp_calls[3]['calls']['backward'] holds 'wire' (the kernel's count) and 'ring_model'.",
        wrong=(mistaken(mistakes.framing_not_subtracted, "that is the whole wire figure; take the payload away",
                        given=lambda ranks: (_calls(3, "backward", "wire")(ranks),)),
               mistaken(mistakes.framing_left_out, "that is the payload (ring model); the question asks "
                                                   "for what the wire adds to it",
                        given=lambda ranks: (_calls(3, "backward", "ring_model")(ranks),)),
               mistaken(mistakes.other_mode, "that is the forward's framing; the question asks for backward",
                        given=lambda ranks: (ranks[3]["calls"]["forward"]["wire"]
                                             - ranks[3]["calls"]["forward"]["ring_model"], "the forward's framing"))),
        example=_example_calls,
    ),
    Exercise(
        id="06.6", kind="choice", style="find-the-bug",
        prompt="`BrokenFSDPLinear` has one mistake. Compare its bytes (ring model and wire), its losses "
               "and the size of its first SGD update with those of FSDPLinear and of nn.Linear on the "
               "global batch: which mistake is it?",
        options={"a": "its backward keeps the SUM of the gradients over ranks: it never divides by N",
                 "b": "its backward all-reduces dW over all ranks first, then keeps only its own rows of the sum",
                 "c": "its forward saves the gathered W for backward instead of gathering it again",
                 "d": "each rank stores the rows of the next rank"},
        expected=lambda: "a",
        hint="which symptoms would each mistake produce on the wire, in the first loss, in the update size?",
        wrong=(Wrong("b", "an all-reduce would show on the wire: twice the reduce-scatter's bytes, and the "
                          "measured bytes would not match the prediction"),
               Wrong("c", "that sends one all-gather less per step and saves W; the bytes would not match"),
               Wrong("d", "then the forward would compute with permuted rows and the very first loss would "
                          "already differ")),
    ),
)
