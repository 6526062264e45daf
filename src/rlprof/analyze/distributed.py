"""`rlprof analyze --ray`: the same per-file work as Ray tasks (RAY_ADDRESS selects a cluster)."""

from __future__ import annotations

import os


def ray_map(fn, jobs: list) -> list:
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, include_dashboard=False, configure_logging=False,
                 log_to_driver=False)
    try:
        task = ray.remote(fn)
        return ray.get([task.remote(job) for job in jobs])
    finally:
        if started_here:
            ray.shutdown()
