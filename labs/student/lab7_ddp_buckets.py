# GENERATED from labs/source/lab7_ddp_buckets.py (student skeleton: replace each NotImplementedError).
# Regenerate with `python -m zeroedu.labs build`; check with the command in the docstring.
"""Lab 7: bucketed DDP: all-reduce each bucket as soon as it is full, while backward goes on.

DDP (Li et al. 2020, "Gradient Bucketing" and "Overlap Computation with Communication") packs the
gradients into buckets of about `bucket_bytes`, in reverse parameter order (roughly the order
backward produces them). Every p.grad is a view into its bucket's flat buffer, so autograd writes
straight into what gets communicated. Your hooks make the reduction overlap backward:

  1. after each parameter's gradient is accumulated, count its bucket down; when a bucket has all
     its gradients, launch the *asynchronous* all-reduce (SUM) of every bucket that is ready, in
     bucket order (every rank must issue the same collectives in the same order: that is how a
     process group matches them), and let backward go on with the earlier layers;
  2. inside no_sync() (gradient accumulation: ddp.require_sync is False) do nothing: the
     micro-batches accumulate locally, and the next synchronised backward reduces their sum;
  3. before the optimizer step, launch whatever is left (a bucket whose parameters got no
     gradient is reduced too, so all ranks match) and wait for every bucket.

You write the four functions below; the grader plugs them into the real bucketed DDP
(`zeroedu.labs.scaffolds.DDPBucketedLab`, a subclass of `zeroedu.strategies.ddp_bucketed.DDPBucketed`)
and trains a small MLP for a few steps on N real ranks. Everything else is the package's own
code: the buckets, Adam (it scales the SUM by 1/(N·K) itself), zeroing the buckets after the step.

What your functions get:

    ddp.buckets[k]         bucket k: .index, .buffer (its flat gradients), .param_ids, .pending
                           (its parameters still without a gradient; reset before every
                           synchronised backward)
    ddp.bucket_of[i]       the bucket of trained parameter i
    ddp.next_bucket        the first bucket not launched yet in this backward (reset to 0 with
                           the counters)
    ddp.inflight           dict: bucket index -> handle of its all-reduce, until waited for
    ddp.require_sync       False inside no_sync()
    ddp.comm.all_reduce(t, axis, tag, async_op=True) -> handle   SUM of t over the axis, in place;
                           handle.done() (does not block) and handle.wait()
    ddp.dist.inner         the axis of the N ranks;  ddp.tag(f"bucket{k}", "grads"): bucket k's tag

Graded (25 points, on the visible cases and, with --hidden, on random MLPs, N and bucket sizes):
  params 6: final parameters equal single-process training (fp32), with and without accumulation;
  bytes 5: each bucket all-reduced exactly once per step, 2(N-1)/N of its bytes, in all
           theory.exact_comm("ddp_bucketed", ...);
  order 4: buckets launched in bucket order, each once;
  overlap 6: every bucket's all-reduce starts during backward and, all but the last, is still in
             flight when backward completes the next bucket (on the timeline: runtime.analysis);
  waited 4: every all-reduce was seen finished before the optimizer read the gradients.

Check your work:  python -m zeroedu.labs check 7
"""


def post_accumulate(ddp, i):
    """Runs (as a post-accumulate-grad hook) after trained parameter `i` got its gradient: count
    its bucket down, and launch every bucket that is ready, in order."""
    raise NotImplementedError('write steps 1 and 2: count the bucket down (not inside no_sync), launch the ready ones')


def launch_ready(ddp):
    """Launch, in bucket order from ddp.next_bucket, every bucket whose gradients are all there;
    stop at the first that is not (a later one waits for it, as on every rank)."""
    raise NotImplementedError('write the in-order launch: keep each handle in ddp.inflight')


def all_reduce_bucket(ddp, bucket):
    """Launch the asynchronous all-reduce (SUM) of the bucket's buffer; return the handle."""
    raise NotImplementedError('write the collective: the whole buffer, SUM, async')


def finish(ddp):
    """Before the optimizer step: launch every bucket not launched yet (one whose parameters got
    no gradient counts as ready), then wait for every all-reduce and empty ddp.inflight."""
    raise NotImplementedError('write step 3: launch what is left, then wait for every bucket')


def predicted():
    """Your variant's numbers, worked out by hand before you run anything, for the first visible
    case (`python -m zeroedu.labs variant YOUR_ID` prints your N, MLP and bucket size; without an
    id: the MLP 12→20→20→7 at N = 4 with buckets of 512 bytes), fp32, one micro-batch:

        step_bytes   bytes each rank sends per optimizer step (ring all-reduces, to the byte)
        buckets      how many buckets the parameters fill (reverse order, a bucket closes once
                     it holds at least bucket_bytes)

    Write plain numbers: the grader reads them from this file's text, never runs this function."""
    raise NotImplementedError('predict your variant: return {"step_bytes": ..., "buckets": ...} as plain numbers')
