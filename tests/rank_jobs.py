"""Rank jobs only the tests use (ranks import them by name, as `tests.rank_jobs:<job>`)."""
from __future__ import annotations

import sys
import time


def chatty(ctx, mib: int, marker: str) -> int:
    """Print `mib` MiB to stdout in 64 KiB lines, then the marker; then give the log's watcher
    time to look (it checks four times a second)."""
    line = "x" * (64 * 1024 - 1)
    for _ in range(mib * 16):
        print(line)
    print(marker, flush=True)
    sys.stdout.flush()
    time.sleep(1.0)
    return ctx.rank


def own_error_in_transport_words(ctx, bad_rank: int = 1) -> float:
    """Rank `bad_rank` leaves the process group (its peers' all-reduce then fails with gloo's
    "Connection closed by peer"), then raises an error of its own whose words are a transport's.
    The cause is `bad_rank`'s own exception, whatever its message says."""
    import torch
    import torch.distributed as dist

    from zeroedu.runtime.comm import Comm
    from zeroedu.runtime.ledger import Ledger

    if ctx.rank == bad_rank:
        dist.destroy_process_group()
        time.sleep(0.3)
        raise RuntimeError("Gloo connection closed by peer (ProcessGroup): words only, a bug of this rank")
    t = torch.ones(4)
    Comm(Ledger(ctx.rank)).all_reduce(t, ctx.world_axis(), tag="faults/probe")
    return t.sum().item()
