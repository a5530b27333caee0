"""Deliberately broken strategies for the notebooks' "find the bug" exercises.

Each class is a strategy with one plausible mistake (one module per notebook: `nb03`, ...). A
notebook runs it on real ranks with `RunConfig(strategy, N, strategy_class="zeroedu.notebook.
bugs.nb03:ClassName")`: the report's predicted-vs-measured table, the losses against single-process
training and the wire show the symptom; the learner says what is wrong. Notebook 14's is a ring
attention context (`RingContext`), run by `train.run(RunConfig(..., cp=4, ring_class=...))`. Never used outside a
notebook or its test.
"""
