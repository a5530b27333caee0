"""Matplotlib figures drawn from run reports (measured) and from `zeroedu.theory` (predicted).

Every function is pure: it takes a report or closed-form inputs and returns a new
`matplotlib.figure.Figure` built without pyplot, so there is no global figure state, nothing
leaks between calls, and the functions run headless (tests, CLI) as well as inline in Jupyter,
where a returned Figure renders as its PNG.

Generic over strategies: what a strategy shards comes from `zeroedu.catalog` (its ZeRO level on
each mesh axis), how many bytes from `zeroedu.theory`, so a strategy added to the catalog is
drawn without touching this module.

Modules: `theory` (closed-form figures), `runs` (one run's bars, several runs side by side),
`timelines` (memory and collectives over a run), `layouts` (who owns which
element under FSDP1 and FSDP2), `common` (colours, units). Everything is re-exported here.

Figures
    ring_scaling          bytes a rank sends per collective as N grows (ring model)
    sharding_diagram      per-GPU param / grad / optimizer bars, full vs 1/N segments
    theory_memory_bars    bytes per GPU by category for several strategies (closed form)
    theory_comm_bars      bytes sent per GPU per step by collective (closed form)
    memory_bars           one run: predicted vs measured model states by category
    comm_bars             one run: closed form vs ring model vs wire, bytes sent by collective
    memory_timeline       one run: bytes held per rank over time, prediction overlaid
    overlap_timeline      one run: backward interval vs each collective's interval
    trace_figure          one run's Chrome trace (`notebook.trace`): compute and comm tracks per rank
    fsdp_lifecycle        ZeRO-3 / FSDP unit lifecycle: unshard, compute, reshard, reduce-scatter
    loss_curves           one run's losses against the single-process reference
    learning_curves       long runs, one per strategy family, against single-process training (cached)
    ownership_figure      FSDP1 flat vs FSDP2 dim-0: which rank stores which element
    cross_domain_figure   flat ZeRO-3 over M·N vs HSDP vs HFSDP: bytes, cross-domain bytes, time
    axis_bytes_bars       runs' bytes per mesh axis: ring model beside the wire
    accumulation_figure   bytes per optimizer step against the number of micro-batches, per strategy
    activation_bars       activation bytes per micro-batch for runs side by side (e.g. recompute modes)
    update_decomposition  model states + the optimizer update's temporaries, per Adam implementation
    pipeline_schedule     a pipeline's last step per stage, from its timeline, above the closed form's
    bubble_figure         the pipeline bubble against m: the closed form and the measured rows
    scaling_figure        step time and bytes per rank against N, zeroedu and torch, with the
                          closed-form communication time (`scaling_results`, `step_times`)
    tensor_parallel_mlp   a block's MLP over tp ranks: A by columns, B by rows, one all-reduce
                          (with sequence parallelism: an all-gather and a reduce-scatter)
    zigzag_grid           causal attention's blocks per cp rank, plain and zig-zag (`causal_blocks`)
    expert_routing        a run's rows per rank and expert in one MoE layer's dispatch, held ones outlined
"""
from .common import (COLORS, RANK_COLORS, STATE_CATS, TIMELINE_CATS, byte_scale, human_bytes, mesh, new_figure,
                     rank_color)
from .layouts import dim0_ownership, flat_ownership, ownership_figure
from .runs import (accumulation_figure, activation_bars, comm_bars, learning_curves, loss_curves, memory_bars,
                   update_decomposition)
from .model_axes import causal_blocks, expert_routing, tensor_parallel_mlp, zigzag_grid
from .pipeline import bubble_figure, pipeline_schedule
from .timelines import (lifecycle_kind, memory_timeline, overlap_timeline, timeline_axes, trace_figure)
from .theory import (axis_bytes_bars, cross_domain_figure, fsdp_lifecycle, ring_scaling, ring_schedule, ring_steps,
                     scaling_figure,
                     scaling_results, sharding_diagram, step_times, theory_comm,
                     theory_comm_bars, theory_memory, theory_memory_bars)

__all__ = ["causal_blocks", "expert_routing", "tensor_parallel_mlp", "zigzag_grid", "bubble_figure", "pipeline_schedule", "accumulation_figure", "activation_bars", "lifecycle_kind", "axis_bytes_bars", "scaling_figure", "scaling_results", "step_times", "COLORS", "RANK_COLORS", "STATE_CATS", "TIMELINE_CATS", "byte_scale", "human_bytes", "mesh", "new_figure", "rank_color",
           "dim0_ownership", "flat_ownership", "ownership_figure", "comm_bars", "learning_curves", "loss_curves",
           "memory_bars", "memory_timeline", "overlap_timeline", "timeline_axes", "trace_figure", "cross_domain_figure",
           "fsdp_lifecycle", "ring_scaling", "ring_schedule", "ring_steps", "sharding_diagram", "theory_comm", "theory_comm_bars",
           "theory_memory", "theory_memory_bars", "update_decomposition"]
