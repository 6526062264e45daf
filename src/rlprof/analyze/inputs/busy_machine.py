"""Was the machine busy? The rule, over what rlprof's collector records for a window or a trainer step
(collect/cpu_wait.py): the process's threads' on-CPU time and run-queue wait, the host's busy CPU time, the CPU
time of the job's own ranks on the host, the host's CPU count and the span.

Busy: the threads waited for a core at least WAIT_SHARE of the time they were ready to run (and WAIT_MS at least),
and other processes (the host's busy time less the job's own) used at least EXTERNAL_SHARE of the host's CPU
capacity over the span. The second condition tells a neighbour from the job's own contention: two ranks on two cores
with gloo's threads wait on each other a quarter of the time with nothing else running; those timings are the
program's own.
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
