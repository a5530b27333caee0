"""Notebook 01 (collectives): the ring's bytes by formula, and what the wire shows for gloo's own
collectives and for zeroedu's ring.

Context the measure exercises read (notebook 01's `wire`): {N: [per-rank result of
`zeroedu.runtime.collectives.wire_collectives_job`]}, i.e. wire[N][rank][implementation]
[collective] = {"wire": [bytes per repeat], "model": ring-model bytes, "messages": ...}.
"""
from __future__ import annotations

from ...kinds import Implementation
from ... import theory
from ...theory import mistakes
from ...runtime.wire import FRAMING_PER_MESSAGE
from . import Exercise, Wrong, mistaken, register

S = 3 << 20  # the payload of notebook 01's wire run: 3 MiB of fp32


def _fig(wire, impl, op, n=4, rank=0):
    return wire[n][rank][impl][op]


def _example():
    """A context shaped like notebook 01's, with N = 4 figures from the ring model and gloo's
    message counts (12 for its all-reduce and reduce-scatter, 6 for its all-gather, 3 for each
    ring call), so the answers are those the real run gives."""
    def fig(op, impl, msgs):
        model = int(theory.sent_bytes(op, S, 4))
        payload = 2 * model if impl == Implementation.BACKEND and op == "reduce_scatter" else model
        return {"wire": [payload + FRAMING_PER_MESSAGE * msgs] * 3, "model": model, "messages": msgs}

    rank = {"backend": {"all_reduce": fig("all_reduce", "backend", 12),
                        "reduce_scatter": fig("reduce_scatter", "backend", 12),
                        "all_gather": fig("all_gather", "backend", 6)},
            "ring": {"all_reduce": fig("all_reduce", "ring", 12),
                     "reduce_scatter": fig("reduce_scatter", "ring", 3),
                     "all_gather": fig("all_gather", "ring", 3)}}
    return {"wire": {4: [rank] * 4}}


register(
    Exercise(
        id="01.1", kind="number", style="formula",
        prompt="Bytes one rank sends in a ring all-reduce of a 1 GB gradient over N = 8 ranks?",
        expected=lambda **_: theory.sent_bytes("all_reduce", 1e9, 8),
        hint="an all-reduce is a reduce-scatter then an all-gather, each (N-1)/N of S",
        wrong=(mistaken(mistakes.whole_buffer_sent("all_reduce", 1e9, 8),
                        "2S is the limit for very large N; at N = 8 each half sends 7/8 of S, not all of it"),
               mistaken(mistakes.one_pass_of_allreduce(1e9, 8)),
               mistaken(mistakes.naive_root_sends(1e9, 8)))),
    Exercise(
        id="01.2", kind="number", style="formula",
        prompt="Bytes one rank sends in a ring all-gather whose output is 1 GB, over N = 8 ranks?",
        expected=lambda **_: theory.sent_bytes("all_gather", 1e9, 8),
        hint="N-1 steps, one chunk of S/N each",
        wrong=(mistaken(mistakes.allreduce_for("all_gather", 1e9, 8),
                        "that is an all-reduce; an all-gather only forwards chunks, it has no reduce-scatter half"),
               mistaken(mistakes.one_chunk_only(1e9, 8)),
               mistaken(mistakes.whole_buffer_sent("all_gather", 1e9, 8),
                        "a rank never sends the chunk it would receive back: N-1 of the N chunks"))),
    Exercise(
        id="01.3", kind="number", style="formula",
        prompt="With N = 1000 ranks, how many bytes does one rank send in a ring all-reduce of 1 GB? "
               "(four significant digits)",
        expected=lambda **_: theory.sent_bytes("all_reduce", 1e9, 1000), rel=1e-4,
        hint="2 (N-1)/N · S: almost, but not quite, 2S",
        wrong=(mistaken(mistakes.whole_buffer_sent("all_reduce", 1e9, 1000),
                        "2S is the limit; at N = 1000 the factor is 2·999/1000"),
               mistaken(mistakes.one_pass_of_allreduce(1e9, 1000), "that is one half of the ring"))),
    Exercise(
        id="01.4", kind="choice", style="predict",
        prompt="Before the run: on N = 4 ranks with S = 3 MiB, how many payload bytes will each rank "
               "put on the wire for a ring reduce-scatter (zeroedu's, built from send/recv like the "
               "all-gather above)?",
        options={"a": "(N-1)/N · S: N-1 steps, one chunk of S/N each",
                 "b": "2(N-1)/N · S, as much as an all-reduce",
                 "c": "S/N, one chunk",
                 "d": "(N-1) · S, like the root of a naive scheme"},
        expected=lambda **_: "a",
        hint="count what one rank sends in each of the N-1 steps of the ring above",
        wrong=(Wrong("b", "that is an all-reduce: a reduce-scatter is its first pass round the ring, the "
                          "all-gather its second"),
               Wrong("c", "a ring reduce-scatter passes on a partial sum in each of its N-1 steps, not one "
                          "chunk in all"),
               Wrong("d", "no rank acts as a root: each sends one chunk a step to its right neighbour"))),
    Exercise(
        id="01.5", kind="number", style="measure",
        prompt="Your prediction, measured: from the wire table, N = 4, zeroedu's ring reduce-scatter, rank 0's "
               "bytes on the wire divided by the buffer's size S? (A fraction.)",
        expected=lambda wire, **_: _fig(wire, "ring", "reduce_scatter")["wire"][0] / S,
        rel=1e-2, example=_example,
        hint="each rank passes on N-1 chunks of S/N",
        wrong=(mistaken(mistakes.whole_buffer_sent("reduce_scatter", 1, 4)),
               mistaken(mistakes.one_chunk_only(1, 4)),
               mistaken(mistakes.allreduce_for("reduce_scatter", 1, 4),
                        "that is an all-reduce's share, 2(N-1)/N: what gloo's own reduce-scatter sends, not the "
                        "ring's"))),
)

