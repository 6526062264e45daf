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
import threading
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


class HeldOffClock:
    """How long this process was held off its cores: neither running nor waiting for a core, while it had work.

    A rank stopped from outside (SIGSTOP), frozen (a cgroup freezer) or throttled (a CPU quota) waits for no core:
    its run-queue wait stays low, and the ranks it holds up wait for it in their collectives, so that every rank's
    stage times are alike and nothing tells which rank held the others up. A thread of its own tells: it sleeps TICK
    at a time and, at each wake, counts how much later it woke than asked, less its own wait for a core over the
    same span (its schedstat); a lateness past SLACK is time the process was held. Its interpreter lock held by a
    long call delays its wake too: SLACK keeps a switch interval's hand-over out, and the ranks of one job run the
    same calls, so the trigger compares them (collect/trigger.py). ~100 wakes a second, a pread each: started only
    where a straggler rule compares ranks."""

    TICK_S = 0.01
    SLACK_NS = 12_000_000  # 2.4 interpreter switch intervals (5 ms): a hand-over of the lock is no hold

    def __init__(self):
        self.held_ns = 0  # written by the clock's thread only; read by the step's thread (an int: one GIL'd read)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rlprof-held-off-clock", daemon=True)

    def start(self) -> HeldOffClock:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)

    def _run(self) -> None:
        try:
            fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            return  # the kernel does not say a thread's waits: no clock (held stays 0, the trigger reads NaN)
        tick_ns = int(self.TICK_S * 1e9)
        try:
            t0, w0 = time.monotonic_ns(), int(os.pread(fd, 64, 0).split()[1])
            while not self._stop.wait(self.TICK_S):
                t1, w1 = time.monotonic_ns(), int(os.pread(fd, 64, 0).split()[1])
                late = (t1 - t0) - tick_ns - (w1 - w0)
                if late > self.SLACK_NS:
                    self.held_ns += late
                t0, w0 = t1, w1
        except (OSError, ValueError, IndexError):
            return
        finally:
            os.close(fd)
