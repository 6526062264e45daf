"""Rule-based verifier of the sum_mod10 task (reward in [0, 1]).

Shaped so that a tiny policy trained from scratch gets signal early: 0.1 for stopping (EOS),
+0.3 when what came before EOS is a single digit, +0.6 when that digit is the right answer.
"""

from __future__ import annotations

import torch


def verify(response_ids: torch.Tensor, response_mask: torch.Tensor, answers: list[str], tokenizer) -> torch.Tensor:
    rewards = torch.zeros(len(answers))
    for i, answer in enumerate(answers):
        ids = response_ids[i][response_mask[i].bool()].tolist()
        if tokenizer.eos_id not in ids:
            continue
        text = tokenizer.decode(ids)
        score = 0.1
        if len(text) == 1 and text.isdigit():
            score += 0.3 + (0.6 if text == answer else 0.0)
        rewards[i] = score
    return rewards


def exact_match(response_ids: torch.Tensor, response_mask: torch.Tensor, answers: list[str], tokenizer) -> float:
    hits = [tokenizer.decode(response_ids[i][response_mask[i].bool()].tolist()) == a for i, a in enumerate(answers)]
    return sum(hits) / max(1, len(hits))
