"""TEST HARNESS: rewards for DAPO's dynamic sampling in main_ppo, through verl's own reward keys (no verl file
changed): each response scores 1.0 or 0.0 by a hash of its text, so a group of rollout.n samples has rewards all
equal now and then (the filter drops it, the replay buffer refills) and informative otherwise, whatever a tiny
untrained policy writes (GSM8K's rule would score every response 0 and refill without end).

    reward.custom_reward_function.path=bench/verl_dapo_reward.py reward.custom_reward_function.name=compute_score
    algorithm.filter_groups.enable=True algorithm.filter_groups.metric=reward
"""

from __future__ import annotations

import zlib


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return float(zlib.crc32(str(solution_str).encode()) % 2)
