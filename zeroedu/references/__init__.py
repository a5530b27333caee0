"""torch's own implementations on zeroedu's model and data: the independent oracles.

* `torch_ddp`: `DistributedDataParallel` (and the DDP benchmark job);
* `torch_fsdp2`: `fully_shard` per unit (memory from torch's `FSDPMemTracker`, bytes counted
  around its collectives; the FSDP benchmark job);
* `torch_dcp`: `fully_shard` saving to / resuming from `torch.distributed.checkpoint`.

Nothing from zeroedu's strategies, comm or ledger is involved on the torch side, so agreement
is evidence, not tautology.
"""
