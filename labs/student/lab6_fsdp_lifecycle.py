# GENERATED from labs/source/lab6_fsdp_lifecycle.py (student skeleton: replace each NotImplementedError).
# Regenerate with `python -m zeroedu.labs build`; check with the command in the docstring.
"""Lab 6: the FSDP unit lifecycle: unshard, reshard, prefetch.

ZeRO-3 / FSDP (FSDP paper §3.2) keeps only this rank's 1/N of every unit's parameters (one
Linear layer per unit here, flattened into one padded buffer, FSDP1's FlatParameter). Around
each use a unit goes through:

    pre_forward    unshard: all-gather the full parameters (and wait); with forward_prefetch,
                   also start the NEXT unit's all-gather, asynchronously
    post_forward   reshard, when reshard_after_forward is True (else keep it for backward)
    pre_backward   unshard again; with backward_prefetch, also start the PREVIOUS unit's
                   all-gather, asynchronously, so it travels while this unit computes
    post_backward  reduce-scatter the gradient and reshard (written for you: it calls your reshard)

A prefetch never goes past `limit_all_gathers` units unsharded at once (None: no limit): count
the units that are not SHARDED, the current one included; at the limit, skip the prefetch (that
unit will gather when it is needed).

You write the six functions below; the grader plugs them into the real FSDP1 strategy
(`zeroedu.labs.scaffolds.FSDPLab`, a subclass of `zeroedu.strategies.fsdp1.FSDP1`) and trains a
small MLP on N real ranks with several option sets. What your functions get:

    fsdp.units                the units, in forward order (unit.index is the position)
    fsdp.reshard_after_forward, fsdp.forward_prefetch, fsdp.backward_prefetch, fsdp.limit_all_gathers
    unit.state                SHARDED, UNSHARDING (all-gather issued, not waited) or UNSHARDED
    unit.leaves[0]            the unsharded flat buffer (autograd's leaf); its storage has 0 bytes
                              while sharded: leaf.untyped_storage().resize_(nbytes) gives it memory
                              back, resize_(0) frees it (autograd keeps views of it, so dropping a
                              Python reference would free nothing)
    unit.shards[0]            this rank's shard of the flat buffer
    unit.handles              the handles of the unit's in-flight all-gather (a list)
    unit.wait_unshard()       wait for unit.handles, then state UNSHARDING -> UNSHARDED
    unit.comm.all_gather(out, inp, axis, tag, async_op=True) -> handle
                              concatenate every rank's `inp` into `out`; use out = leaf.data (write
                              the values without bumping the version counter autograd's saved views
                              share), axis = unit.axis, tag = unit.tag(unit.name, "params")

Graded (30 points, on three visible option sets and, with --hidden, on random ones):
  params 6: final parameters equal single-process training (fp32);
  bytes 6: the ledger's bytes per step equal theory.exact_comm("fsdp1", reshard_after_forward=...);
  lifecycle 7: a unit is unsharded (and waited for) when used, resharded as the options say, and
               hooks touch only their own unit and the one they prefetch;
  prefetch 6: the neighbour is prefetched, asynchronously, exactly when the options allow;
  memory 5: no unsharded bytes at the optimizer step, nor after forward when resharding.

Check your work:  python -m zeroedu.labs check 6
"""
from zeroedu.strategies.fsdp_units import SHARDED, UNSHARDED, UNSHARDING  # noqa: F401


def unshard(unit, async_op=False):
    """Give a SHARDED unit its memory back and launch its all-gather (state UNSHARDING); unless
    `async_op`, wait for it (state UNSHARDED). An unsharding unit is only waited for."""
    raise NotImplementedError("write unshard: resize the leaf's storage, launch the all-gather into it, then wait unless async_op")


def reshard(unit):
    """Free the unit's unsharded parameters (state SHARDED); nothing to do if already sharded."""
    raise NotImplementedError('write reshard: wait for any all-gather still writing, free the storage, mark SHARDED')


def prefetch(fsdp, j):
    """Start unit j's all-gather asynchronously, if unit j exists, is SHARDED, and fewer than
    fsdp.limit_all_gathers units are unsharded now (no limit when None)."""
    raise NotImplementedError('write prefetch: the bounds, the state and the limit, then an async unshard')


def pre_forward(fsdp, unit):
    """Before the unit's forward: its parameters must be gathered; prefetch the next unit if asked."""
    raise NotImplementedError('write pre_forward: unshard (and wait), then the forward prefetch of unit.index + 1')


def post_forward(fsdp, unit):
    """After the unit's forward: reshard it, if fsdp.reshard_after_forward."""
    raise NotImplementedError('write post_forward: free the parameters only when reshard_after_forward')


def pre_backward(fsdp, unit):
    """Before the unit's backward: gather it again; prefetch the previous unit if asked."""
    raise NotImplementedError('write pre_backward: unshard (and wait), then the backward prefetch of unit.index - 1')
