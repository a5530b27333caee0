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
