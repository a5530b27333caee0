"""Notebook 14 (beyond data parallelism): a ring attention with one plausible mistake.

`MysteryRing` computes every chunk pair against every block that comes round the ring, the
pairs whose keys all lie after their queries included, and masks those to nothing instead of
skipping them. The result is exact (a fully masked block adds exp(-inf) = 0 to every running
sum, in forward and in backward), so the losses equal one process and the ring carries the
same bytes; the activations are those of the correct ring. The symptom is the work: every rank
but the last of a plain split computes more score elements than the closed form (each computes
all cp blocks, S x S / cp scores per head, as if there were no causal mask), and with zig-zag
every rank computes all 4cp chunk pairs instead of 2cp + 1 (still balanced: the saving is lost).
"""
from __future__ import annotations

from ...strategies.context_parallel import RingContext


class MysteryRing(RingContext):
    """Ring attention that computes, then masks, the blocks causal masking empties."""

    def pairs(self, owner: int):
        q_off = 0
        for qc in self.my_chunks():
            k_off = 0
            for kc in self.my_chunks(owner):
                # "simpler": one code path for every pair, the mask does the rest
                kind = "diag" if kc.start == qc.start else "full" if kc.start <= qc.stop - 1 else "future"
                yield slice(q_off, q_off + len(qc)), slice(k_off, k_off + len(kc)), kind
                k_off += len(kc)
            q_off += len(qc)
