"""The runtime: ranks, the network, and what each rank measures.

* `cluster`: start N local ranks (gloo on CPU | NCCL on GPUs) in a warm pool, run jobs on them,
  name the rank that failed; `rank`: what runs inside each rank process, and torchrun.
* `comm`: the ONLY code that talks to the network; records every collective in the ledger.
* `ledger`: per-rank memory by category, the event timeline and the comm records, as plain data.
* `analysis`: reading a timeline back (how much communication hid behind backward).
* `collectives`, `faults`: jobs that exercise the collectives and the failure handling;
  `errors`: the failures a rank reports by type (`CollectiveError`).

Nothing here imports a strategy, the training loop or the notebook helpers: the layers above
use the runtime, never the other way round.
"""
