"""Notebook 08 (FSDP1 vs FSDP2): uneven dim-0 shards, padding on the wire, batched collectives,
and a batched FSDP2 that reads its gradients from the wrong offsets."""
from __future__ import annotations

from ... import shard, theory
from ...reports import RunReport
from ...theory import mistakes
from . import Exercise, Wrong, mistaken, example_report, register


def _total(report: RunReport, rank: int) -> int:
    return report.ranks[rank].measured.total


def _per_parameter_collectives(n: int = 3) -> int:
    """The closed forms' collectives per step of per-parameter FSDP2 on gpt-small (`theory.exact_comm`)."""
    from ...models import get_model, unit_shapes  # torch is imported only when an answer is checked

    return len(theory.exact_comm("fsdp2", unit_shapes(get_model("gpt-small").build()), n, recipe="fp32").ops)


def _example_states() -> dict:
    # gpt-small, fp32, N = 3 (16 bytes per element): FSDP2's ranks hold 1,085,237 / 1,085,237 / 1,071,607
    return {"report": example_report(*({"measured": {"total": 16 * e}} for e in (1085237, 1085237, 1071607)))}


register(
    Exercise(
        id="08.1", kind="choice", style="predict",
        prompt="Before the run: gpt-small on N = 3 ranks, fp32. How will the model-state bytes of FSDP2's ranks "
               "compare with those of FSDP1's ranks (which are all equal)?",
        options={"a": "FSDP2's ranks 0 and 1 hold more than any FSDP1 rank; its rank 2 holds less",
                 "b": "every FSDP2 rank holds less than an FSDP1 rank: FSDP2 stores no padding",
                 "c": "FSDP2's ranks 0 and 1 hold exactly what an FSDP1 rank holds; its rank 2 holds less",
                 "d": "FSDP2's rank 2 holds the most: it takes the rows left over"},
        expected=lambda: "a",
        hint="a 256-row parameter gives ranks 0 and 1 ceil(256/3) = 86 rows each; compare with 256/3.",
        wrong=(Wrong("b", "FSDP2 stores no padding in all, but every parameter rounds the first ranks' chunks up "
                          "to whole rows: they hold more than Ψ/N"),
               Wrong("c", "FSDP1's chunk is Ψ/N plus at most a few padding elements per unit; FSDP2's first ranks "
                          "hold up to a row more of every parameter"),
               Wrong("d", "the rows are handed out in chunks of ceil(d0/N) from rank 0 on: the last rank gets "
                          "what is left, which is less")),
    ),
    Exercise(
        id="08.2", kind="number", style="measure",
        prompt="Read the FSDP2 run's report (`r2`): how many bytes of model states does rank 0 hold more "
               "than rank 2 (measured)?",
        expected=lambda report: _total(report, 0) - _total(report, 2),
        hint="report.ranks[r].measured.total for r = 0 and 2.",
        wrong=(mistaken(mistakes.sign_flipped, "the sign: rank 2 holds less",
                        given=lambda report: (_total(report, 0) - _total(report, 2),)),
               mistaken(mistakes.assumed_equal("difference"), "that is FSDP1, whose flat chunks are all the same size")),
        example=_example_states,
    ),
    Exercise(
        id="08.3", kind="choice", style="predict",
        prompt="Before the run: FSDP2 with batched collectives (one all-gather and one reduce-scatter per "
               "unit) against per-parameter collectives, on the same model and N. What will the bytes show?",
        options={"a": "batched sends fewer ring-model bytes: it pads once per unit instead of once per parameter, so the padding of every short shard stays off the wire",
                 "b": "the same ring-model bytes; per-parameter writes a little more to the wire, one framing "
                      "header per message of its many more messages",
                 "c": "per-parameter sends about N times more",
                 "d": "batched sends more: it copies every shard into a buffer first"},
        expected=lambda: "b",
        hint="the batched buffer is the row-padded shards side by side; what changes is how many collectives "
             "carry them.",
        wrong=(Wrong("a", "the batched buffer holds each parameter's row-padded shard: the same padding, "
                          "the same elements"),
               Wrong("c", "every element still travels (N-1)/N times per collective, whatever the grouping"),
               Wrong("d", "the copies are local memory traffic; they put nothing on the wire")),
    ),
    Exercise(
        id="08.4", kind="number", style="predict",
        prompt="Before the run: gpt-small's 54 parameters in 6 units, FSDP2 with one collective per parameter "
               "(`batched=False`), resharding after forward, N = 3. How many collectives will rank 0 issue in one "
               "training step?",
        expected=lambda: float(_per_parameter_collectives()),
        hint="per parameter and step: what is gathered before forward, gathered again before backward, and "
             "reduced after it?",
        wrong=(mistaken(mistakes.per_unit_for_per_parameter(6),
                        "18 is the batched variant: two all-gathers and one reduce-scatter per unit"),
               mistaken(mistakes.one_per_parameter(54), "one per parameter is not enough: each parameter is gathered "
                                                        "twice and reduce-scattered once per step"),
               mistaken(mistakes.messages_for_collectives,
                        "that counts point-to-point messages (N - 1 = 2 per ring collective), not collectives",
                        given=lambda: (_per_parameter_collectives(), 3))),
    ),
    Exercise(
        id="08.5", kind="choice", style="find-the-bug",
        prompt="`BrokenFSDP2` is batched FSDP2 with one mistake. Run it for one step and read its bytes, "
               "its memory, its first loss and, after the step, which ranks' rows differ from single-process "
               "training. Which mistake is it?",
        options={"a": "the all-gather's copy-out splits the gathered buffer with the wrong column widths",
                 "b": "the reduce-scatter's copy-out walks the output by each shard's real size instead of "
                      "its row-padded size",
                 "c": "short shards are not zero-padded before the all-gather, so the gathered buffer holds stale rows where the padding should be",
                 "d": "the reduce-scatter sums the gradients in bf16"},
        expected=lambda: "b",
        hint="which of these touches the forward? Which rank's shards are the only short ones at N = 3?",
        wrong=(Wrong("a", "then the forward would compute with scrambled parameters on every rank and the very "
                          "first loss would already differ"),
               Wrong("c", "wire padding is dropped after the all-gather and never reaches a gradient shard: "
                          "nothing would change"),
               Wrong("d", "a bf16 reduce of fp32 gradients halves the reduce-scatter's bytes: the wire would "
                          "not match")),
    ),
    Exercise(
        id="08.6", kind="number", style="formula",
        prompt="A unit with one parameter of shape (10, 4) on N = 4 ranks with mixed-bf16 (16 bytes of model "
               "state per element): how many bytes does rank 3 hold under FSDP2?",
        expected=lambda: theory.exact_model_states("fsdp2", [[(10, 4)]], 4, rank=3, recipe="mixed-bf16").total,
        hint="chunks of ceil(10/4) = 3 rows of 4 elements; what is left for the last rank?",
        wrong=(mistaken(mistakes.even_split(10, 4, per_row=4 * 16),
                        "40 elements / 4 ranks is FSDP1's even split; FSDP2 cuts whole rows"),
               mistaken(mistakes.full_chunk_everywhere(10, 4, per_row=4 * 16),
                        "3 rows is the chunk of ranks 0 to 2; rank 3 gets the rest"),
               mistaken(mistakes.elements_for_bytes(64, 16), "that counts elements; each costs 16 bytes")),
    ),
    Exercise(
        id="08.7", kind="number", style="formula",
        prompt="The same (10, 4) parameter on N = 4: how many elements does one FSDP2 all-gather of it move "
               "(the buffer, padded on the wire)?",
        expected=lambda: theory.exact_comm("fsdp2", [[(10, 4)]], 4, recipe="fp32").ops[0].nbytes / 4,
        hint="every rank contributes a chunk of ceil(10/4) rows, padded if short.",
        wrong=(mistaken(mistakes.unpadded_buffer(10, 4, per_row=4),
                        "40 is the parameter itself (and FSDP1's buffer, already a multiple of 4): the short "
                        "last chunk is padded to 3 rows"),
               mistaken(mistakes.one_padded_chunk(10, 4, per_row=4),
                        "12 is one rank's padded chunk; the all-gather's buffer holds N of them")),
    ),
    Exercise(
        id="08.8", kind="set", style="formula",
        prompt="With N = 8, which ranks hold nothing of a (7,) bias under FSDP2? (A list of ranks.)",
        expected=lambda: [r for r in range(8) if shard.dim0_shard_numel((7,), 8, r) == 0],
        hint="chunks of ceil(7/8) = 1 row, in rank order.",
        wrong=(Wrong([], "7 rows for 8 ranks: one rank must go without"),
               Wrong([0], "rows are handed out from rank 0 on; the shortfall falls on the last rank")),
    ),
)
