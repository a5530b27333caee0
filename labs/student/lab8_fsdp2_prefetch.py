# GENERATED from labs/source/lab8_fsdp2_prefetch.py (student skeleton: replace each NotImplementedError).
# Regenerate with `python -m zeroedu.labs build`; check with the command in the docstring.
"""Lab 8: FSDP2 with prefetch: per-parameter shards, the next unit's all-gather in flight while
this unit computes, and an asynchronous reduce-scatter behind it.

FSDP2 (torch's `fully_shard`; FSDP paper, Zhao et al. 2023, §3.2, with per-parameter sharding)
cuts every parameter of shape (d0, ...) on dim 0 into N chunks of c = ceil(d0/N) rows: rank r
keeps rows [r·c, min((r+1)·c, d0)), so the last ranks may keep fewer rows, or none. Nothing is
padded in memory; on the wire every rank sends c rows (its shard padded with zero rows), so an
all-gather of parameter j fills a (N·c, ...) buffer, the unit's leaf j, whose first d0 rows are
the parameter. Per step each unit is gathered for forward, freed, gathered again for backward,
and its gradients reduce-scattered: 3Ψ on the wire (3 × (N-1)/N of the row-padded sizes).

Backward, unit by unit from the last, is where prefetch pays. While unit i computes its
gradients, unit i-1's all-gathers should already be travelling (backward prefetch): issue them
asynchronously in unit i's pre_backward, right after unit i itself is gathered, and wait for
them only in unit i-1's own pre_backward. Gather one unit ahead, never more: the memory
of gathered parameters stays at two units (the one computing, the one arriving). Behind
backward, unit i's reduce-scatters travel while unit i-1 computes: launch them asynchronously in
unit i's post_backward, and finish them (wait, copy this rank's rows out, free the full
gradients) in the next unit's post_backward, before launching its own: one unit's reduce-scatter
in flight at a time, as torch does (reduce_scatter_max_input_buffers = 1). The last unit's is
finished when backward ends.

You write the six functions below; the grader plugs them into the real FSDP2
(`zeroedu.labs.scaffolds.FSDP2Lab`, a subclass of `zeroedu.strategies.fsdp2.FSDP2`, one
collective per parameter) and trains a small MLP (one unit per Linear layer) on N real ranks.
The forward side is the package's: pre_forward calls your unshard (and, with forward_prefetch,
your unshard of the next unit with async_op=True), post_forward your reshard. What you get:

    fsdp.units                 the units, in forward order (unit.index is the position)
    fsdp.backward_prefetch     True when pre_backward should prefetch the previous unit
    fsdp.inflight              yours: whatever you need to finish the in-flight reduce-scatters
                               (None when there is none; must be None when finish_reduce returns)
    fsdp.accumulate            True from the step's second micro-batch: add to the grad shards
    unit.state                 SHARDED, UNSHARDING (all-gathers issued, not waited) or UNSHARDED
    unit.leaves[j]             parameter j's unsharded (N·c_j, ...) buffer, autograd's leaf; 0 bytes
                               of storage while sharded: leaf.untyped_storage().resize_(nbytes)
                               gives it memory, resize_(0) frees it. After the unit's backward,
                               leaf.grad is parameter j's full gradient, (N·c_j, ...) rows
    unit.shards[j]             this rank's rows of parameter j (what shard_rows gave)
    unit.grad_shards[j]        the same rows of the reduced gradient (the optimizer reads them)
    unit.chunk_rows[j]         c_j
    unit.padded_shard(j)       shards[j] with zero rows up to c_j rows (what this rank sends)
    unit.handles, unit.wait_unshard()   the in-flight all-gathers; wait for them, then state
                               UNSHARDING -> UNSHARDED
    unit.free_grads()          drop the unit's full gradients (every leaf.grad)
    unit.comm.all_gather(out, inp, axis, tag, async_op=True) -> handle
    unit.comm.reduce_scatter(out, inp, axis, tag, async_op=True) -> handle (SUM: the optimizer
                               scales by 1/N itself); handle.wait()
                               axis = unit.axis; tags unit.tag(unit.name, "params", f"param{j}")
                               and unit.tag(unit.name, "grads", f"param{j}"); write an all-gather
                               into leaf.data (no version bump for autograd's saved views)

Graded (30 points, on the visible cases and, with --hidden, on random MLPs, N and options):
  params 6: final parameters equal single-process training (fp32), with accumulation too;
  shards 4: every rank keeps FSDP2's rows of every parameter, and the ledger's parameter bytes
            per rank equal theory.exact_model_states("fsdp2", rank=r);
  bytes 5: the ledger's bytes per step equal theory.exact_comm("fsdp2"): 3Ψ;
  memory 5: never more than two neighbouring units' parameters gathered at once (the ledger's
            bytes at every event), none at the optimizer step, no full gradient left alive;
  prefetch 6: on the timeline, in backward unit i-1's all-gathers start before unit i's
              gradients are done and are waited for after (they overlap unit i's compute), and
              unit i's reduce-scatters are still in flight when unit i-1's gradients arrive;
  no_early_free 4: no full gradient dropped before its reduce-scatter was seen finished.

Check your work:  python -m zeroedu.labs check 8
"""
from zeroedu.strategies.fsdp_units import SHARDED, UNSHARDED, UNSHARDING  # noqa: F401


def shard_rows(d0, n, r):
    """(start, end): the rows of a (d0, ...) parameter that rank r of n keeps."""
    raise NotImplementedError('write the dim-0 chunking: chunks of ceil(d0 / n) rows, clipped to d0')


def unshard(unit, async_op=False):
    """Give a SHARDED unit's leaves their memory and launch one all-gather per parameter (state
    UNSHARDING); unless `async_op`, wait for them (state UNSHARDED). An unsharding unit is only
    waited for."""
    raise NotImplementedError('write unshard: resize every leaf, an all-gather of each padded shard into its leaf')


def reshard(unit):
    """Free the unit's gathered parameters (state SHARDED); nothing to do if already sharded."""
    raise NotImplementedError("write reshard: wait for gathers still writing, free every leaf's storage")


def pre_backward(fsdp, unit):
    """Before the unit's backward: gather it (and wait); then, with fsdp.backward_prefetch, start
    the previous unit's all-gathers, asynchronously."""
    raise NotImplementedError('write pre_backward: this unit now, the previous one on its way')


def post_backward(fsdp, unit):
    """The unit's full gradients are in its leaves' .grad: finish the previous unit's
    reduce-scatters, launch this unit's (asynchronously, one per parameter, into buffers of c_j
    rows), keep what finish_reduce needs in fsdp.inflight, and reshard the unit."""
    raise NotImplementedError("write post_backward: the previous finished first, then this unit's in flight")


def finish_reduce(fsdp):
    """If a unit's reduce-scatters are in flight: wait for them, copy (or, with fsdp.accumulate,
    add) this rank's real rows into its grad shards, free its full gradients, and set
    fsdp.inflight to None."""
    raise NotImplementedError('write finish_reduce: wait, copy the real rows out, then free')


def predicted():
    """Your variant's numbers, worked out by hand before you run anything, for the first visible
    case (`python -m zeroedu.labs variant YOUR_ID` prints your N and MLP; without an id: the MLP
    12→20→20→7 at N = 4), fp32, one micro-batch, forward prefetch off:

        step_bytes     bytes each rank sends per optimizer step (two all-gathers and one
                       reduce-scatter of every parameter, row-padded to N·c rows, (N-1)/N each)
        peak_gathered  the most bytes of gathered (row-padded) parameters alive at once

    Write plain numbers: the grader reads them from this file's text, never runs this function."""
    raise NotImplementedError('predict your variant: return {"step_bytes": ..., "peak_gathered": ...} as plain numbers')
