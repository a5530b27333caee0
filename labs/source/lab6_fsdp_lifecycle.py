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
    # BEGIN SOLUTION write unshard: resize the leaf's storage, launch the all-gather into it, then wait unless async_op
    if unit.state == SHARDED:
        for leaf in unit.leaves:
            leaf.untyped_storage().resize_(leaf.numel() * leaf.element_size())
        unit.handles = [unit.comm.all_gather(unit.leaves[0].data, unit.shards[0], unit.axis,
                                             unit.tag(unit.name, "params"), async_op=True)]
        unit.state = UNSHARDING
    if not async_op:
        unit.wait_unshard()
    # END SOLUTION


def reshard(unit):
    """Free the unit's unsharded parameters (state SHARDED); nothing to do if already sharded."""
    # BEGIN SOLUTION write reshard: wait for any all-gather still writing, free the storage, mark SHARDED
    if unit.state == SHARDED:
        return
    unit.wait_unshard()  # never free memory an all-gather is still writing into
    for leaf in unit.leaves:
        leaf.untyped_storage().resize_(0)
    unit.state = SHARDED
    # END SOLUTION


def prefetch(fsdp, j):
    """Start unit j's all-gather asynchronously, if unit j exists, is SHARDED, and fewer than
    fsdp.limit_all_gathers units are unsharded now (no limit when None)."""
    # BEGIN SOLUTION write prefetch: the bounds, the state and the limit, then an async unshard
    if not 0 <= j < len(fsdp.units) or fsdp.units[j].state != SHARDED:
        return
    busy = sum(u.state != SHARDED for u in fsdp.units)
    if fsdp.limit_all_gathers is not None and busy >= fsdp.limit_all_gathers:
        return  # over the limit: unit j gathers when it is needed
    unshard(fsdp.units[j], async_op=True)
    # END SOLUTION


def pre_forward(fsdp, unit):
    """Before the unit's forward: its parameters must be gathered; prefetch the next unit if asked."""
    # BEGIN SOLUTION write pre_forward: unshard (and wait), then the forward prefetch of unit.index + 1
    unshard(unit)
    if fsdp.forward_prefetch:
        prefetch(fsdp, unit.index + 1)  # module order is execution order for these models
    # END SOLUTION


def post_forward(fsdp, unit):
    """After the unit's forward: reshard it, if fsdp.reshard_after_forward."""
    # BEGIN SOLUTION write post_forward: free the parameters only when reshard_after_forward
    if fsdp.reshard_after_forward:
        reshard(unit)
    # END SOLUTION


def pre_backward(fsdp, unit):
    """Before the unit's backward: gather it again; prefetch the previous unit if asked."""
    # BEGIN SOLUTION write pre_backward: unshard (and wait), then the backward prefetch of unit.index - 1
    unshard(unit)
    if fsdp.backward_prefetch:
        # Issued before this unit's reduce-scatter: the previous unit's parameters travel while
        # this unit computes its gradients.
        prefetch(fsdp, unit.index - 1)
    # END SOLUTION
