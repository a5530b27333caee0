"""DDP with gradient buckets whose all-reduce overlaps the rest of backward.

Algorithm (PyTorch DDP paper, Li et al. 2020, "Gradient Reduction": "Gradient Bucketing" and
"Overlap Computation with Communication"):
  1. set-up: walk the parameters in *reverse* registration order (roughly the order backward
     produces their gradients) and pack them into buckets of about `bucket_bytes`; each bucket
     is one flat gradient buffer and every `p.grad` is a view into it, so autograd's in-place
     accumulation writes straight into the buffer that gets communicated;
  2. backward: a post-accumulate-grad hook on every parameter counts the bucket's pending
     gradients; when a bucket is full, `start_grad_sync` launches an async all-reduce (SUM)
     while autograd keeps computing the gradients of earlier layers. Buckets are launched in
     bucket order on every rank (a bucket waits for the earlier ones), because collectives on
     one process group are matched by issue order;
  3. `finish_grad_sync` (before the optimizer): wait for every bucket;
  4. Adam on every parameter with the summed gradient times 1/(N·K), K = micro-batches
     accumulated since the last step (see `no_sync`).

Gradient accumulation: inside `no_sync()` the hooks do nothing, so K-1 micro-batches only
accumulate into the buffers locally; the next synchronised backward all-reduces the sum.

Memory per rank: same as naive DDP, (P + G + K)Ψ = 16Ψ with `mixed-bf16`; the buckets *are*
the gradients, nothing is duplicated. Communication per rank: Σ over buckets of
2(N-1)/N · bucket bytes = 2(N-1)/N · Ψ·G, the same total as one big all-reduce — bucketing
changes *when* bytes move, not how many.

Time (`theory.schedule.ddp`): bucket i's all-reduce is issued when backward has produced its
last gradient and runs on the link while backward computes the rest; buckets queue on the link
in order; the optimizer waits for the last. One bucket hides nothing (it is ready only when
backward ends); tiny buckets pay a latency α per ring step each.

Frozen parameters (``requires_grad=False``) are left out of the buckets, as torch's Reducer
leaves them out: no gradient, hook, optimizer state or all-reduce. With Ψ_t trainable of Ψ, a
rank holds PΨ + (G + K)Ψ_t and sends 2(N-1)/N · Ψ_t·G, as `ddp`.
"""
from __future__ import annotations

import torch

from ..kinds import EventKind as Ev
from .base import AdamState, Strategy


class Bucket:
    """A flat gradient buffer for a few consecutive (in reverse order) parameters."""

    def __init__(self, index: int, param_ids: list[int], numel: int, dtype, device):
        self.index, self.param_ids = index, param_ids
        self.buffer = torch.zeros(numel, dtype=dtype, device=device)
        self.pending = len(param_ids)
        self.handle = None
        self.launched = False
        self.tag = None  # its collective's tag, made once (`DDPBucketed.__init__`)

    def reset(self) -> None:
        self.pending, self.handle, self.launched = len(self.param_ids), None, False


class DDPBucketed(Strategy):
    name = "ddp_bucketed"
    OPTIONS = {"bucket_bytes": 1024}
    GRADS_IN_PARAM_DTYPE = True
    TRAINS_FROZEN = True  # as torch's Reducer: buckets hold the trainable parameters only

    def __init__(self, model, dist, recipe, adam=None, **options):
        super().__init__(model, dist, recipe, adam, **options)
        bucket_bytes = self.options["bucket_bytes"]
        if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be a positive integer, got {bucket_bytes!r}")
        self.model.to(dist.device, self.param_dtype)
        self.all_params = list(self.model.parameters())
        # Frozen parameters get no bucket slot, hook, optimizer state or all-reduce (torch's
        # Reducer builds its buckets from the parameters that require grad); `param_ids` index
        # this list of the trained ones.
        self.params = [p for p in self.all_params if p.requires_grad]
        for p in self.all_params:
            self.ledger.track(p, "param")
        self.buckets = self._build_buckets(bucket_bytes)
        self.bucket_of = {}
        for b in self.buckets:
            self.ledger.track(b.buffer, "grad")
            b.tag = self.tag(f"bucket{b.index}", "grads")
            off = 0
            for i in b.param_ids:
                p = self.params[i]
                p.grad = b.buffer[off:off + p.numel()].view(p.shape)
                off += p.numel()
                self.bucket_of[i] = b
                p.register_post_accumulate_grad_hook(self._post_accumulate_hook(i))
        self.optim = AdamState(self.params, self.recipe, self.adam, self.ledger)
        self.next_bucket = 0  # buckets launch strictly in order, the same on every rank
        self.ledger.event(Ev.BUILT, note="replicas and buckets")

    def _build_buckets(self, cap: int) -> list[Bucket]:
        """Greedy, in reverse parameter order: close a bucket once it holds >= cap bytes."""
        groups, cur, cur_bytes = [], [], 0
        for i in reversed(range(len(self.params))):
            cur.append(i)
            cur_bytes += self.params[i].numel() * self.grad_dtype.itemsize
            if cur_bytes >= cap:
                groups.append(cur)
                cur, cur_bytes = [], 0
        if cur:
            groups.append(cur)
        return [Bucket(k, ids, sum(self.params[i].numel() for i in ids), self.grad_dtype,
                       self.dist.device) for k, ids in enumerate(groups)]

    # ------------------------------------------------------------------ accumulation
    def before_micro_batch(self):
        if any(b.handle is not None for b in self.buckets):
            # The all-reduces of the last backward are still reading the buckets: accumulating
            # into them now would race. Accumulation goes through no_sync() instead.
            raise RuntimeError("ddp_bucketed: call step() after a synchronised backward "
                               "(accumulate micro-batches inside no_sync())")
        if self.require_sync:
            for b in self.buckets:
                b.reset()
            self.next_bucket = 0

    # ------------------------------------------------------------------ gradient sync
    def _post_accumulate_hook(self, i: int):
        def hook(p):
            if not self.require_sync:
                return
            b = self.bucket_of[i]
            b.pending -= 1
            if b.pending == 0:
                self.ledger.mark(Ev.BUCKET_READY, bucket=b.index)
                self._launch_ready_buckets()
        return hook

    def _launch_ready_buckets(self) -> None:
        while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket].pending == 0:
            self.start_grad_sync(self.buckets[self.next_bucket])
            self.next_bucket += 1

    def start_grad_sync(self, b: Bucket) -> None:
        # SUM now, in the grad dtype (gloo has neither AVG nor PREMUL_SUM); the 1/(N·K) is
        # applied later in fp32 by the optimizer, so a bf16 gradient is rounded once, not twice.
        b.handle = self.comm.all_reduce(b.buffer, self.dist.inner, b.tag, async_op=True)
        b.launched = True

    def finish_grad_sync(self) -> None:
        # A bucket whose parameters got no gradient (unused in forward) is still reduced, so
        # every rank issues the same collectives in the same order.
        for b in self.buckets:
            if not b.launched:
                b.pending = 0
        self._launch_ready_buckets()
        for b in self.buckets:
            b.handle.wait()
            b.handle = None  # the work object keeps the buffer referenced until dropped
        self.ledger.mark(Ev.GRADS_SYNCED)

    # The buckets are zeroed after the update, so Adam scales them in place: through its scratch
    # buffer they would cost a second chunk (`optim.scratch_elements`).
    SCALES_GRADS_IN_PLACE = True

    def grads_for_optimizer(self):
        return [p.grad for p in self.params]

    def after_update(self):
        for b in self.buckets:
            b.buffer.zero_()

    def norm_axes(self):
        return []  # every rank holds the whole summed gradient

    def full_parameters(self):
        return [p.detach().float().cpu().clone() for p in self.all_params]

    def report_extra(self):
        return {"buckets": [{"params": b.param_ids, "bytes": b.buffer.numel() * b.buffer.element_size()}
                            for b in self.buckets]}
