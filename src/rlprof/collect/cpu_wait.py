"""How long this process's threads ran, and how long they waited for a core while ready to run.

The kernel's per-thread scheduler statistics (/proc/self/task/<tid>/schedstat: on-CPU ns, run-queue wait ns,
timeslices) say it exactly. A window whose threads spent a large share of their runnable time waiting was recorded
while other processes held the cores: its timings are not the program's own. Linux only; None elsewhere.
"""

from __future__ import annotations

import os

TASKS = "/proc/self/task"


def thread_times() -> tuple[int, int] | None:
    """(on-CPU ns, run-queue wait ns) summed over the threads alive now; None where the kernel does not say."""
    try:
        tids = os.listdir(TASKS)
    except OSError:
        return None
    ran = waited = 0
    seen = False
    for tid in tids:
        try:
            with open(f"{TASKS}/{tid}/schedstat", "rb") as f:
                fields = f.read().split()
            ran += int(fields[0])
            waited += int(fields[1])
            seen = True
        except (OSError, ValueError, IndexError):  # a thread that ended since the listing
            continue
    return (ran, waited) if seen else None


def since(start: tuple[int, int] | None) -> dict:
    """{"cpu_ms", "run_wait_ms"} from `start` (thread_times()) to now; {} where either end is unknown. Threads that
    ended in between take their time with them: a lower bound of both."""
    end = thread_times()
    if start is None or end is None:
        return {}
    return {"cpu_ms": max(0, end[0] - start[0]) / 1e6, "run_wait_ms": max(0, end[1] - start[1]) / 1e6}
