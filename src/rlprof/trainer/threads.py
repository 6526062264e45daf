"""How many intra-op threads the trainer uses: the cores it may run on that are free now, shared among its ranks.

torch's default is one thread per core. When another process holds a core, the threads of each operator wait for
the one that shares a core with it at every barrier, and a step becomes several times slower (3.9x measured with
one busy loop on 2 cores). Counting only the cores that were idle over a short sample at start keeps the trainer on
the cores it has. `trainer.threads` overrides the choice.
"""

from __future__ import annotations

import os
import time

SAMPLE_S = 0.25  # how long /proc/stat is watched for idle cores


def affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _cpu_times() -> dict[int, tuple[int, int]]:
    """cpu index -> (idle + iowait jiffies, all jiffies) from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                name, *fields = line.split()
                ticks = [int(x) for x in fields]
                out[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks[:8]))
    return out


def free_cores(cpus: list[int], sample_s: float = SAMPLE_S) -> float | None:
    """How many of `cpus` were idle over the sample (1.0 a wholly idle core); None where /proc/stat is absent."""
    try:
        before = _cpu_times()
        time.sleep(sample_s)
        after = _cpu_times()
    except (OSError, ValueError, IndexError):
        return None
    free = 0.0
    for c in cpus:
        if c in before and c in after:
            idle = after[c][0] - before[c][0]
            total = after[c][1] - before[c][1]
            free += idle / total if total > 0 else 1.0
    return free


def choose_threads(local_ranks: int = 1, requested: int | None = None) -> tuple[int, str]:
    """(threads, why): `requested` where given, else the free cores of this process's affinity over its local ranks
    (at least one; never more than its share of the affinity)."""
    if requested is not None:
        return requested, "trainer.threads"
    cpus = affinity()
    share = max(1, len(cpus) // max(1, local_ranks))
    free = free_cores(cpus)
    if free is None:
        return share, f"{len(cpus)} cores in affinity / {local_ranks} local rank(s) (no /proc/stat)"
    threads = max(1, min(share, int(free / max(1, local_ranks) + 0.5)))
    return threads, (
        f"{free:.1f} of {len(cpus)} cores in affinity free over {SAMPLE_S:.2f} s / {local_ranks} local rank(s)"
    )
