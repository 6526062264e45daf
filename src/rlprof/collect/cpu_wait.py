"""Was the machine busy while a window was recorded? What the kernel says, sampled at the window's two ends.

- `cpu_ms`, `run_wait_ms`: how long this process's threads ran, and how long they waited for a core while ready to
  run (per-thread scheduler statistics, /proc/self/task/<tid>/schedstat).
- `host_busy_ms`, `host_cpus`: the CPU time the whole host spent on anything (/proc/stat: every state but idle and
  iowait, steal included: a neighbour VM), and how many CPUs it has.
- `job_cpu_ms`: the CPU time of this process and of the other ranks of its job on this host (torchrun's: processes
  with the same parent and the same TORCHELASTIC_RUN_ID), from /proc/<pid>/stat.

A window whose threads waited for a core may have waited on its own job (gloo's threads, the other ranks on the same
cores); it was busy when, besides, other processes used the host (host_busy - job_cpu). The analysis judges it
(analyze/inputs/busy_machine.py). Linux only; {} elsewhere.
"""

from __future__ import annotations

import os
import time

TASKS = "/proc/self/task"
TICK_MS = 1000.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


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


def current_thread_times() -> tuple[int, int] | None:
    """(on-CPU ns, run-queue wait ns) of the calling thread; None where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            fields = f.read().split()
        return int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


def current_thread_wait_ms() -> float | None:
    """The calling thread's run-queue wait so far, in ms; None where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e6
    except (OSError, ValueError, IndexError):
        return None


def _host_busy_ticks() -> int | None:
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != b"cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks) - ticks[3] - ticks[4]


def _process_ticks(pid) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        rest = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
    return int(rest[11]) + int(rest[12])  # utime, stime


def _job_pids() -> list:
    """This process, and under torchrun the other ranks on this host: its parent's other children that carry the
    same TORCHELASTIC_RUN_ID."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if not run_id:
        return ["self"]
    key = (os.getppid(), os.getpid(), run_id)
    found = _SIBLINGS.get(key)
    if found is None:
        found = _siblings(*key)
        if len(found) + 1 >= int(os.environ.get("LOCAL_WORLD_SIZE", 1)):  # all there: kept for the job's life
            _SIBLINGS[key] = found
    return ["self", *found]


_SIBLINGS: dict = {}  # (parent, pid, run id) -> the other ranks' pids: one scan of /proc per process


def _siblings(parent: int, me: int, run_id: str) -> tuple:
    """The parent's other children carrying the same TORCHELASTIC_RUN_ID (a scan of /proc)."""
    marker = f"TORCHELASTIC_RUN_ID={run_id}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(name)
        except (OSError, ValueError, IndexError):
            continue
    return tuple(found)


def _job_ticks(pids: list) -> dict:
    out = {}
    for pid in pids:
        try:
            out[pid] = _process_ticks(pid)
        except (OSError, ValueError, IndexError):
            continue
    return out


def sample(threads_now=thread_times) -> dict | None:
    """The counters now: what since() measures a window from. `threads_now`: whose threads (current_thread_times:
    the calling thread only, as the watch judges the thread that runs the steps)."""
    threads = threads_now()
    if threads is None:
        return None
    pids = _job_pids()
    return {
        "threads": threads,
        "host": _host_busy_ticks(),
        "job": _job_ticks(pids),
        "pids": pids,
        "ns": time.monotonic_ns(),
    }


def since(start: dict | None, threads_now=thread_times) -> dict:
    """{cpu_ms, run_wait_ms, host_busy_ms, job_cpu_ms, host_cpus, span_ms} from `start` (sample()) to now; {} where
    it is unknown. Threads and ranks that ended in between take their time with them: lower bounds."""
    if start is None:
        return {}
    threads = threads_now()
    if threads is None:
        return {}
    out = {
        "cpu_ms": max(0, threads[0] - start["threads"][0]) / 1e6,
        "run_wait_ms": max(0, threads[1] - start["threads"][1]) / 1e6,
        "span_ms": (time.monotonic_ns() - start["ns"]) / 1e6,
    }
    host = _host_busy_ticks()
    if host is not None and start["host"] is not None:
        job = _job_ticks(start["pids"])
        out.update(
            host_busy_ms=max(0, host - start["host"]) * TICK_MS,
            host_cpus=os.cpu_count() or 1,
            job_cpu_ms=sum(max(0, job[p] - start["job"][p]) for p in job if p in start["job"]) * TICK_MS,
        )
    return out
