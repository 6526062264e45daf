"""TEST HARNESS: an injected slowdown for main_ppo, through verl's own reward keys (no verl file changed).

    reward.custom_reward_function.path=bench/verl_slow_reward.py reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs={slow_from_step: K, slow_seconds: S, calls_per_step: C,
                                                  counter: /some/file}

Scores as verl's default (GSM8K's rule). Every call counts itself in `counter` (under a lock: verl's reward workers
are several processes); the first call of each step from step K on sleeps `slow_seconds`, so each of those steps
waits that long once for its rewards, however verl spreads the calls. The trigger is told nothing of K.
"""

from __future__ import annotations

import fcntl
import os
import time


def _count(path: str) -> int:
    """This call's number (1-based) in the run."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        n = int(os.read(fd, 32) or b"0") + 1
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, str(n).encode())
        return n
    finally:
        os.close(fd)


def compute_score(
    data_source,
    solution_str,
    ground_truth,
    extra_info=None,
    *,
    slow_from_step: int = 0,
    slow_seconds: float = 0.0,
    calls_per_step: int = 1,
    counter: str = "",
    **kwargs,
):
    from verl.utils.reward_score import default_compute_score

    if counter and slow_from_step > 0:
        n = _count(counter)
        step = (n - 1) // calls_per_step + 1
        if step >= slow_from_step and (n - 1) % calls_per_step == 0:
            time.sleep(slow_seconds)
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
