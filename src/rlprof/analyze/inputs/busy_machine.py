"""Was the machine busy? The rule, over what rlprof's collector records for a window or a trainer step
(collect/cpu_wait.py): the process's threads' on-CPU time and run-queue wait, the host's busy CPU time, the CPU
time of the job's own ranks on the host, the host's CPU count and the span.

Busy: the threads waited for a core at least WAIT_SHARE of the time they were ready to run (and WAIT_MS at least),
and other processes (the host's busy time less the job's own) used at least EXTERNAL_SHARE of the host's CPU
capacity over the span. The second condition tells a neighbour from the job's own contention: two ranks on two cores
with gloo's threads wait on each other a quarter of the time with nothing else running; those timings are the
program's own.

Contention explains a slowness (a straggler, a slow step) where the ranks it held up waited for a core, inside the
slow stage (the watch times each stage's wait and its time on a core), beyond the wait their time on a core there
would have had at their usual share of their ready time (`expected_wait_ms`; the usual share: the other ranks' at that
step for a straggler, each rank's own median over the baseline's steps for a slow step), summed over the busy ranks
(a synchronous job's step waits for each rank's delay at its next collective), CONTENTION_SHARE of the excess or more.
A job that does more work on a host busy alike waits in proportion, at its usual share: its excess stays the job's;
so does a rank stopped or slowed by anything else, which waits, when it runs, at the others' share. The live trigger
(collect/trigger.py) and the run over time (analyze/over_time/timeline.py) apply it alike.
"""

from __future__ import annotations

WAIT_SHARE = 0.25
WAIT_MS = 5.0
EXTERNAL_SHARE = 0.20


def machine_load(rec: dict) -> dict | None:
    """{wait_share, external_share, busy} of a record with the collector's load fields; None where they are absent
    (traces of other tools, older rlprof)."""
    cpu, wait = rec.get("cpu_ms"), rec.get("run_wait_ms")
    host, job, cpus, span = (rec.get(k) for k in ("host_busy_ms", "job_cpu_ms", "host_cpus", "span_ms"))
    numbers = (cpu, wait, host, job, cpus, span)
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) for v in numbers) or cpu + wait <= 0 or span <= 0:
        return None
    wait_share = wait / (cpu + wait)
    external_share = max(0.0, host - job) / (span * cpus)
    busy = wait_share >= WAIT_SHARE and wait >= WAIT_MS and external_share >= EXTERNAL_SHARE
    return {"wait_share": wait_share, "external_share": external_share, "busy": busy}


CONTENTION_SHARE = 0.5


def expected_wait_ms(cpu_ms: float, usual_share: float) -> float:
    """The wait for a core a thread that ran `cpu_ms` would have had at `usual_share` of its ready time (NaN: 0)."""
    share = min(max(usual_share, 0.0), 0.95) if usual_share == usual_share else 0.0
    return cpu_ms * share / (1 - share)


def explains(extra_wait_ms: float, excess_s: float) -> bool:
    """Whether an extra wait for a core (ms, summed as above) explains an excess of `excess_s` seconds."""
    return extra_wait_ms == extra_wait_ms and extra_wait_ms / 1e3 >= CONTENTION_SHARE * excess_s
