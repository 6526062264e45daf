"""Scheduling the inputs on this machine: files over worker processes, or one large file's byte ranges over
every core. (The Ray path, `--ray`, is analyze/workers/distributed.py.) A new scheduler goes beside these."""

from __future__ import annotations

import gc
import multiprocessing
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from functools import partial

from ..window.per_file import range_count, run_job


def run_inputs(inputs: list, cores: int, progress=None) -> list[dict]:
    """Per-file results, in input order: in this process (one core, or one small file), a file's byte ranges
    over every core (fewer files than cores, large ones), else one file per worker process."""
    split = len(inputs) < cores and any(range_count(job[0], cores) > 1 for job in inputs)
    results = []
    if split or cores == 1 or len(inputs) <= 1:
        for job in inputs:
            results.append(run_job(job, partial(_pool_map, cores), cores) if split else run_job(job))
            if progress:
                progress()
        return results
    with _pool(min(len(inputs), cores)) as pool:
        for res in pool.map(run_job, inputs):
            results.append(res)
            if progress:
                progress()
    return results


@contextmanager
def _pool(n: int):
    """Worker processes; forked where the platform can (they start in milliseconds with rlprof imported).
    This process's objects are frozen out of the collector meanwhile: a collection in a worker would otherwise
    walk every inherited object, copying each page it touches (measured: 0.2 s on a 300 MB trace)."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    gc.freeze()
    try:
        with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context(method)) as pool:
            yield pool
    finally:
        gc.unfreeze()


def _pool_map(n: int, fn, jobs):
    """`fn` over `jobs` (any iterable, taken lazily: at most n + 1 in flight) on `n` fresh worker processes, results
    in order. The workers exit once the last result is taken (or the reader stops early), before the table is
    built and analysed: they never hold memory during the analysis's own peak."""
    with _pool(n) as pool:
        pending: deque = deque()
        for job in jobs:
            pending.append(pool.submit(fn, job))
            if len(pending) > n:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
