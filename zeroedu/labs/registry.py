"""The lab catalogue: what each lab teaches, what it needs first, how long it takes, how it is scored.

Every lab is graded by *criteria* (`Test`s), each worth fixed points. A criterion is checked on
every case the grader runs (the visible ones, plus hidden randomized ones when asked) and earns its
points only when it holds on all of them, so an answer hard-coded for the visible case loses the
points of every criterion a hidden case breaks. A lab's maximum never depends on which cases ran.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Test:
    id: str  # stable: part of the JSON schema
    title: str
    points: int


@dataclass(frozen=True)
class Lab:
    number: int
    file: str  # labs/student/<file>; the quiz cards name a lab by this file's stem
    title: str
    objective: str
    notebook: str  # the prerequisite notebook
    minutes: int  # expected time for a student who did the notebook
    tests: tuple[Test, ...]
    functions: tuple[str, ...]  # what the student writes

    @property
    def name(self) -> str:
        return self.file[:-3]

    @property
    def points(self) -> int:
        return sum(t.points for t in self.tests)

    @property
    def function(self) -> str:  # the first (for labs 1-4, the only) function the student writes
        return self.functions[0]

    @property
    def command(self) -> str:
        return f"python -m zeroedu.labs check {self.number}"


LABS: dict[int, Lab] = {lab.number: lab for lab in [
    Lab(1, "lab1_ring_reduce_scatter.py", "ring reduce-scatter from send/recv",
        "build a reduce-scatter from point-to-point sends around a ring and see why it sends "
        "(N-1)/N of the buffer", "notebooks/01_collectives.ipynb", 20,
        (Test("values", "every rank ends with its chunk of the sum", 6),
         Test("bytes", "bytes sent equal the ring model (N-1)/N·S", 3),
         Test("input", "the input tensor is left untouched", 1)),
        ("ring_reduce_scatter",)),
    Lab(2, "lab2_zero2_grad_shard.py", "ZeRO-2 gradient sharding",
        "pad a flat gradient buffer, reduce-scatter it and keep this rank's averaged chunk, "
        "using zeroedu.shard's index math", "notebooks/05_zero2.ipynb", 20,
        (Test("range", "the shard range is zeroedu.shard.shard_range", 2),
         Test("values", "the shard holds the average over ranks of this rank's chunk", 5),
         Test("bytes", "one reduce-scatter of the padded buffer, no all-reduce", 3)),
        ("shard_gradients",)),
    Lab(3, "lab3_fsdp_linear.py", "FSDP linear backward",
        "write the backward of a dim-0-sharded linear layer: gather W, local dX, "
        "reduce-scatter dW to this rank's rows", "notebooks/06_fsdp_linear.ipynb", 30,
        (Test("dx", "dX = dY W on the local batch", 4),
         Test("dw", "this rank's rows of the mean over ranks of dYᵀX", 7),
         Test("bytes", "one all-gather of W plus one reduce-scatter of dW", 4)),
        ("fsdp_linear_backward",)),
    Lab(4, "lab4_hfsdp_memory.py", "HFSDP memory estimate",
        "count HFSDP's model-state bytes per GPU from the recipe and the two shard factors",
        "notebooks/10_hybrid_sharding.ipynb", 10,
        (Test("param", "parameter bytes PΨ/N", 2),
         Test("grad", "gradient bytes GΨ/N", 2),
         Test("optim", "optimizer bytes KΨ/(N·M)", 4),
         Test("total", "total = param + grad + optim", 2)),
        ("hfsdp_bytes_per_gpu",)),
    Lab(5, "lab5_zero2_hooks.py", "ZeRO-2 backward hooks",
        "write ZeRO-2's backward hooks (allocate a unit's full gradient buffer, launch its "
        "reduce-scatter into the shard while backward goes on, free the buffer once the "
        "collective finished) inside the real ZeRO-2 strategy, trained on real ranks",
        "notebooks/05_zero2.ipynb", 45,
        (Test("grads", "the reduced gradient shards equal the sum over ranks of the local gradients", 6),
         Test("params", "final parameters equal single-process training (fp32)", 5),
         Test("bytes", "the ledger's bytes sent equal theory.exact_comm('zero2')", 5),
         Test("freed", "only the shards are alive at the optimizer step: grad bytes = GΨ/N", 4),
         Test("overlap", "every unit's reduce-scatter is launched during backward and hides behind it", 3),
         Test("no_early_free", "no full buffer is freed before its reduce-scatter finished", 2)),
        ("pre_accumulate", "post_accumulate", "reduce_scatter_unit", "free_finished")),
    Lab(6, "lab6_fsdp_lifecycle.py", "FSDP unit lifecycle",
        "write FSDP's unit lifecycle (unshard, reshard, prefetch and the forward/backward hooks "
        "that call them) inside the real FSDP1 strategy, trained on real ranks",
        "notebooks/07_zero3_fsdp.ipynb", 60,
        (Test("params", "final parameters equal single-process training (fp32)", 6),
         Test("bytes", "the ledger's bytes sent equal theory.exact_comm('fsdp1')", 6),
         Test("lifecycle", "units are unsharded when used and resharded as the options say", 7),
         Test("prefetch", "forward/backward prefetch issued when allowed, never past the limit", 6),
         Test("memory", "no unsharded bytes at the optimizer step (or after forward, when resharding)", 5)),
        ("unshard", "reshard", "prefetch", "pre_forward", "post_forward", "pre_backward")),
    Lab(7, "lab7_ddp_buckets.py", "bucketed DDP with overlap",
        "write bucketed DDP's gradient hooks (count each bucket down, all-reduce every ready bucket "
        "in order while backward goes on, nothing inside no_sync, wait for all before the step) "
        "inside the real bucketed DDP, trained on real ranks",
        "notebooks/02_ddp.ipynb", 45,
        (Test("params", "final parameters equal single-process training (fp32), with accumulation too", 6),
         Test("bytes", "each bucket all-reduced once per step: theory.exact_comm('ddp_bucketed')", 5),
         Test("order", "buckets launched in bucket order, each once", 4),
         Test("overlap", "every bucket's all-reduce starts during backward and hides behind it", 6),
         Test("waited", "every all-reduce seen finished before the optimizer reads the gradients", 4),
         Test("predict", "predicted(): bytes per step and buckets, by hand, == the closed forms for the first case", 3)),
        ("post_accumulate", "launch_ready", "all_reduce_bucket", "finish")),
    Lab(8, "lab8_fsdp2_prefetch.py", "FSDP2 with prefetch",
        "write FSDP2's per-parameter shard rows, unshard and reshard, the backward prefetch of the "
        "previous unit and an asynchronous reduce-scatter finished by the next unit, inside the real "
        "FSDP2, trained on real ranks", "notebooks/08_fsdp1_vs_fsdp2.ipynb", 60,
        (Test("params", "final parameters equal single-process training (fp32), with accumulation too", 6),
         Test("shards", "every rank keeps FSDP2's rows; parameter bytes per rank == theory.exact_model_states", 4),
         Test("bytes", "the ledger's bytes per step equal theory.exact_comm('fsdp2'): 3Ψ", 5),
         Test("memory", "at most two neighbouring units gathered at once, none at the step, no full gradient left", 5),
         Test("prefetch", "on the timeline, the previous unit's all-gather and this unit's reduce-scatter overlap "
                          "backward's compute", 6),
         Test("no_early_free", "no full gradient dropped before its reduce-scatter was seen finished", 4),
         Test("predict", "predicted(): bytes per step and the gathered peak, by hand, == the closed forms for "
                         "the first case", 3)),
        ("shard_rows", "unshard", "reshard", "pre_backward", "post_backward", "finish_reduce")),
]}

TOTAL_POINTS = sum(lab.points for lab in LABS.values())


def get_lab(lab) -> Lab:
    try:
        return LABS[int(lab)]
    except (KeyError, ValueError, TypeError):
        raise ValueError(f"unknown lab {lab!r}; labs are {', '.join(map(str, LABS))}") from None


__all__ = ["LABS", "Lab", "Test", "TOTAL_POINTS", "get_lab"]
