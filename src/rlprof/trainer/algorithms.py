"""The algorithm pieces of GRPO and DAPO, as plain tensor functions (each unit-tested)."""

from __future__ import annotations

import torch

LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def group_advantages(rewards: torch.Tensor, n: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: (r - mean of its group) / (std of its group + eps); groups are n consecutive samples."""
    groups = rewards.view(-1, n)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True) if n > 1 else torch.zeros_like(mean)
    return ((groups - mean) / (std + eps)).view(-1)


def kl_k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || ref) per token: exp(d) - d - 1 with d = ref - policy (>= 0)."""
    d = ref_log_probs - log_probs
    return torch.exp(d) - d - 1


def clipped_surrogate(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped objective as a per-token loss, with DAPO's asymmetric range [1 - low, 1 + high].

    advantages: (B,) per sequence or (B, T) per token. Returns (loss per token, clipped per token).
    """
    adv = advantages if advantages.dim() == 2 else advantages[:, None]
    ratio = torch.exp(log_probs - old_log_probs)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    was_clipped = (clipped < unclipped).float()
    return loss, was_clipped


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    total_tokens: float | None = None,
    total_seqs: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    token-mean: every token of the (mini-)batch weighs the same (DAPO's token-level loss).
    seq-mean-token-mean: every sequence weighs the same (GRPO's original form).
    seq-mean-token-sum: sum over a sequence's tokens, mean over sequences.
    total_tokens / total_seqs: the denominators of the whole mini-batch, so that micro-batches
    accumulated with backward() add up to exactly the mini-batch loss.
    """
    mask = mask.to(per_token.dtype)
    if mode == "token-mean":
        denom = mask.sum() if total_tokens is None else total_tokens
        return (per_token * mask).sum() / max(float(denom), 1.0)
    seq_tokens = mask.sum(dim=1).clamp(min=1)
    per_seq = (per_token * mask).sum(dim=1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / seq_tokens
    elif mode != "seq-mean-token-sum":
        raise ValueError(f"loss aggregation {mode!r}; allowed: {', '.join(LOSS_AGGREGATIONS)}")
    denom = per_token.shape[0] if total_seqs is None else total_seqs
    return per_seq.sum() / max(float(denom), 1.0)


def informative_groups(rewards: torch.Tensor, n: int) -> torch.Tensor:
    """DAPO dynamic sampling: True for groups whose rewards are not all equal (they carry a gradient)."""
    groups = rewards.view(-1, n)
    return (groups.max(dim=1).values - groups.min(dim=1).values) > 1e-8


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float) -> torch.Tensor:
    """DAPO soft overlong punishment: 0 up to max_len - buffer, then linear down to -factor at max_len."""
    start = max_len - buffer
    over = (lengths.float() - start).clamp(min=0)
    return -(over / max(buffer, 1)).clamp(max=1.0) * factor


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)
