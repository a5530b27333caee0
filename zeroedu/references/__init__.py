"""torch's own implementations on zeroedu's model and data: the independent oracles.

* `torch_ddp`: `DistributedDataParallel` (mixed-bf16: a bf16 model, Adam on fp32 masters);
* `torch_fsdp2`: `fully_shard` per unit, on a 1-D mesh or a 2-D one (torch's HSDP); memory
  from torch's `FSDPMemTracker`, bytes counted around its collectives;
* `torch_dcp`: `fully_shard` saving to / resuming from `torch.distributed.checkpoint`;
* `torch_memory`: torch's `MemTracker` around a zeroedu run, the check of the ledger's peak,
  with the itemization of what the ledger does not see;
* `bench`: the timed jobs of `benchmarks/` (zeroedu and torch arms in alternating rounds, one
  warm pool) and the loader of their results files (`load_results`, `SCALING_SCHEMA`).

Nothing from zeroedu's strategies, comm or ledger is involved on the torch side, so agreement
is evidence, not tautology.
"""
