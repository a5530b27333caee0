# GENERATED from labs/source/lab5_zero2_hooks.py (student skeleton: replace each NotImplementedError).
# Regenerate with `python -m zeroedu.labs build`; check with the command in the docstring.
"""Lab 5: ZeRO-2's backward hooks: allocate the full gradient, reduce-scatter it during backward, free it.

ZeRO-2 (ZeRO paper §5.2, P_os+g) keeps only this rank's 1/N of every gradient between steps. The
full gradient of a unit (one Linear layer here) lives only during backward:

  1. when the unit's first gradient is about to be accumulated, allocate the unit's full flat
     gradient buffer, so autograd accumulates every parameter's gradient straight into it;
  2. when the last parameter of the unit has its gradient, launch an *asynchronous*
     reduce-scatter (SUM) of the buffer into the unit's persistent shard, and let backward go on
     with the earlier layers while it travels;
  3. as soon as a unit's reduce-scatter has finished, free its full buffer: only the shard is
     needed from now on. Never free it before: the collective is still reading it.

You write the four functions below; the grader plugs them into the real ZeRO-2 strategy
(`zeroedu.labs.scaffolds.ZeRO2Lab`, a subclass of `zeroedu.strategies.zero2.ZeRO2`) and trains a
small MLP for a few steps on N real ranks. Everything else is the package's own code: the flat
units, Adam on the shard (it scales the SUM by 1/N itself), the all-gather after the step.

What your functions get:

    zero2.units[k]         unit k, a `zeroedu.strategies.flat.FlatUnit`:
        unit.name              "unit0", ...;  unit.params: its parameters
        unit.grad_buffer       the full flat gradient buffer, or None while there is none
        unit.alloc_grad()      allocate a zeroed full buffer and bind every p.grad as a view of it
        unit.free_grad()       drop the buffer and the p.grad views (really frees the memory)
        unit.grad_shard        this rank's persistent chunk (padded_numel / N elements)
    zero2.pending[k]       parameters of unit k still waiting for their gradient in this backward
                           (reset to len(unit.params) before every backward)
    zero2.inflight         dict: unit index -> handle of its reduce-scatter, until the buffer is freed
    zero2.comm.reduce_scatter(out, inp, axis, tag, async_op=True) -> handle
                           SUM of `inp` over the axis, this rank's chunk into `out`;
                           handle.done() (does not block) and handle.wait()
    zero2.dist.inner       the axis of the N ranks;  zero2.tag(unit.name, "grads"): the tag

Graded (25 points, on the visible case and, with --hidden, on random MLPs and N):
  grads 6: each unit's shard at the first step equals the SUM over ranks of the local gradients;
  params 5: final parameters equal single-process training (fp32);
  bytes 5: the ledger's bytes per step equal theory.exact_comm("zero2", ...);
  freed 4: gradient bytes at each optimizer step equal GΨ/N (the shards only);
  overlap 3: every unit's reduce-scatter starts during backward and, all but the last, is still in
             flight when backward reaches the next unit (on the timeline: runtime.analysis);
  no_early_free 2: no buffer is freed before its reduce-scatter was seen finished.

Check your work:  python -m zeroedu.labs check 5
"""


def pre_accumulate(zero2, unit):
    """Runs (as a tensor hook) each time a gradient of one of `unit`'s parameters is about to be
    accumulated into its p.grad: make sure the unit's full gradient buffer exists."""
    raise NotImplementedError("write step 1: allocate the unit's full gradient buffer once, on its first gradient")


def post_accumulate(zero2, k):
    """Runs (as a post-accumulate-grad hook) after one parameter of unit `k` got its gradient.
    When it was the unit's last one: free what has finished, then launch unit k's reduce-scatter
    and remember its handle in zero2.inflight."""
    raise NotImplementedError("write step 2: count the unit's parameters down; at zero free finished units and launch this one")


def reduce_scatter_unit(zero2, unit):
    """Launch the asynchronous reduce-scatter (SUM) of the unit's full buffer into its shard;
    return the handle."""
    raise NotImplementedError("write the collective: the full buffer in, this rank's shard out, async")


def free_finished(zero2, wait=False):
    """Free the full buffer of every unit in zero2.inflight whose reduce-scatter has finished and
    remove it from zero2.inflight; with `wait`, wait for every one first (all are freed)."""
    raise NotImplementedError('write step 3: free (and forget) each unit whose reduce-scatter is done')
