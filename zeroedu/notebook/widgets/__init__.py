"""ipywidgets dashboards: the closed forms under sliders, and real runs behind a button.

* `memory_explorer()`: Ψ, N, M, recipe, strategy, GPU memory, TP/PP and offload sliders; bars of
  device bytes per GPU by category and of bytes sent per step by collective, for every
  strategy in the catalog, plus a table (memory, communication, time, "does it fit?"). Pure
  arithmetic on `zeroedu.theory`, redrawn on every change.
* `run_panel()`: strategy, N, recipe, steps and a "Run on N ranks" button that trains on the warm
  rank pool (`zeroedu.train.run`) while ledger events stream back; a live memory-timeline plot
  per rank with the prediction overlaid, a progress bar, then the predicted-vs-measured table.

* `cross_domain_widget()`: M, N, NICs per node, achieved NIC bandwidth and the reading of the
  flat ring (one lockstep ring or striped over the NICs) over flat ZeRO-3 vs HSDP vs HFSDP.
* `activation_explorer()`: S, B, L, H, A and recompute over activations + model states +
  gathered unit per strategy, and whether it fits.
* `planner_widget()`: GPUs, node size, HBM, batch and share of peak over the 5-D planner
  (`theory.planner`, Llama-2-70B), and the design exercise graded as a plan is typed.

One module per dashboard; `common` holds what they share. All are plain objects holding their widgets: `update()` / `run()` are ordinary methods, so a test
drives them without a browser, and the observers only call them. Bad input never raises into
the notebook: it is clamped or rejected, and a visible message says so.

The explorer's bars are HTML/CSS (a redraw costs microseconds, so they follow a dragged slider);
the run panel's timeline is a matplotlib PNG in an `ipywidgets.Image`, redrawn at most every
`redraw_every` seconds while events stream, which updates in JupyterLab from inside a running
callback and needs no particular matplotlib backend.
"""
from .activation_explorer import ActivationExplorer, activation_explorer
from .collective_explorer import CollectiveExplorer, collective_explorer
from .common import DEFAULT_RECIPE, bar_chart_html
from .cross_domain import CrossDomainWidget, cross_domain_widget
from .memory_explorer import MemoryExplorer, memory_explorer
from .planner import PlannerWidget, planner_widget
from .run_panel import RunPanel, run_panel

__all__ = ["CollectiveExplorer", "collective_explorer", "bar_chart_html", "MemoryExplorer", "memory_explorer",
           "RunPanel", "run_panel", "DEFAULT_RECIPE", "CrossDomainWidget", "cross_domain_widget",
           "ActivationExplorer", "activation_explorer", "PlannerWidget", "planner_widget"]
