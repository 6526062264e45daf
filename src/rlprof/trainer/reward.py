"""Rule-based verifier of the sum_mod10 task (reward in [0, 1]).

Shaped so that a tiny policy trained from scratch gets signal early: 0.1 for stopping (EOS),
+0.3 when what came before EOS is a single digit, +0.6 when that digit is the right answer.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch


def score(ids: list[int], answer: str, tokenizer, cost_ms: float = 0.0) -> float:
    """One sample's reward. cost_ms: the wait of a verifier that is not local arithmetic (a code sandbox, a
    remote judge): time spent waiting, not computing, as such calls spend it."""
    if cost_ms:
        time.sleep(cost_ms / 1e3)
    if tokenizer.eos_id not in ids:
        return 0.0
    text = tokenizer.decode(ids)
    if len(text) == 1 and text.isdigit():
        return 0.4 + (0.6 if text == answer else 0.0)
    return 0.1


_POOLS: dict[int, ThreadPoolExecutor] = {}


def _pool(workers: int) -> ThreadPoolExecutor:
    """The reward workers, kept from step to step as a reward loop's workers are (a new pool per batch would pay
    its threads' start every step)."""
    if workers not in _POOLS:
        _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="rlprof-reward")
    return _POOLS[workers]


def close_pools() -> None:
    while _POOLS:
        _POOLS.popitem()[1].shutdown(wait=True)


def verify(
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    answers: list[str],
    tokenizer,
    *,
    cost_ms: float = 0.0,
    workers: int = 1,
    timings: list | None = None,
) -> torch.Tensor:
    """Rewards of a batch, scored by `workers` threads at once. `timings` (where the samples are recorded): filled
    with each sample's scoring time in ns, in the batch's order."""
    samples = [(response_ids[i][response_mask[i].bool()].tolist(), a) for i, a in enumerate(answers)]
    one = (
        (lambda s: score(*s, tokenizer, cost_ms))
        if timings is None
        else (lambda s: _timed(score, *s, tokenizer, cost_ms))
    )
    scores = list(_pool(workers).map(one, samples)) if workers > 1 else [one(s) for s in samples]
    if timings is not None:
        timings += [ns for _, ns in scores]
        scores = [r for r, _ in scores]
    return torch.tensor(scores, dtype=torch.float32)


def _timed(fn, *args) -> tuple:
    t0 = time.perf_counter_ns()
    out = fn(*args)
    return out, time.perf_counter_ns() - t0


def exact_match(response_ids: torch.Tensor, response_mask: torch.Tensor, answers: list[str], tokenizer) -> float:
    hits = [tokenizer.decode(response_ids[i][response_mask[i].bool()].tolist()) == a for i, a in enumerate(answers)]
    return sum(hits) / max(1, len(hits))
