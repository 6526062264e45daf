"""Unit tests of each algorithm piece of the reference trainer."""

import math

import pytest
import torch

from rlprof.trainer.algorithms import (
    aggregate,
    clipped_surrogate,
    group_advantages,
    informative_groups,
    kl_k3,
    overlong_penalty,
)


def test_group_advantages_normalise_within_each_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0, 5.0, 5.0, 5.0])
    adv = group_advantages(rewards, n=4)
    g0 = torch.tensor([1.0, 0.0, 0.0, 1.0])
    expected = (g0 - g0.mean()) / (g0.std() + 1e-6)
    assert torch.allclose(adv[:4], expected)
    assert torch.allclose(adv[4:], torch.zeros(4))  # equal rewards: no signal
    assert abs(float(adv[:4].mean())) < 1e-6


def test_clipped_surrogate_symmetric_and_clip_higher():
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[0.5, 1.1, 1.5]]))  # ratios 0.5, 1.1, 1.5
    pos = torch.tensor([1.0])
    loss, clipped = clipped_surrogate(new, old, pos, 0.2, 0.2)
    # positive advantage: min(r, clip(r)) -> 0.5 (unclipped below), 1.1, 1.2 (clipped above)
    assert torch.allclose(-loss, torch.tensor([[0.5, 1.1, 1.2]]))
    assert clipped.tolist() == [[0.0, 0.0, 1.0]]
    loss_high, clipped_high = clipped_surrogate(new, old, pos, 0.2, 0.28)  # DAPO clip-higher
    assert torch.allclose(-loss_high, torch.tensor([[0.5, 1.1, 1.28]]))
    neg = torch.tensor([-1.0])
    loss_neg, clipped_neg = clipped_surrogate(new, old, neg, 0.2, 0.28)
    # negative advantage: min(-r, -clip(r)) -> -0.8 (clipped at 1 - low), -1.1, -1.5
    assert torch.allclose(-loss_neg, torch.tensor([[-0.8, -1.1, -1.5]]))
    assert clipped_neg.tolist() == [[1.0, 0.0, 0.0]]


def test_clipped_surrogate_gradient_vanishes_outside_the_range():
    new = torch.log(torch.tensor([[1.5]])).requires_grad_(True)
    loss, _ = clipped_surrogate(new, torch.zeros(1, 1), torch.tensor([1.0]), 0.2, 0.2)
    loss.sum().backward()
    assert float(new.grad) == 0.0


def test_kl_k3_estimator():
    lp = torch.log(torch.tensor([0.2, 0.5, 0.9]))
    ref = torch.log(torch.tensor([0.4, 0.5, 0.3]))
    d = ref - lp
    assert torch.allclose(kl_k3(lp, ref), torch.exp(d) - d - 1)
    assert float(kl_k3(lp, lp).abs().max()) == 0.0
    assert bool((kl_k3(lp, ref) >= 0).all())
    # unbiased: E_p[k3] = KL(p || q) for samples from p
    p = torch.tensor([0.7, 0.2, 0.1])
    q = torch.tensor([0.3, 0.3, 0.4])
    k3 = kl_k3(torch.log(p), torch.log(q))
    assert math.isclose(float((p * k3).sum()), float((p * (p / q).log()).sum()), rel_tol=1e-5)


def test_token_vs_sequence_aggregation():
    loss = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert float(aggregate(loss, mask, "token-mean")) == pytest.approx(8.0 / 5)  # every token the same weight
    assert float(aggregate(loss, mask, "seq-mean-token-mean")) == pytest.approx((1.0 + 4.0) / 2)
    assert float(aggregate(loss, mask, "seq-mean-token-sum")) == pytest.approx((4.0 + 4.0) / 2)


def test_micro_batch_accumulation_equals_the_mini_batch_loss():
    torch.manual_seed(0)
    loss = torch.rand(8, 5)
    mask = (torch.rand(8, 5) > 0.3).long()
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        whole = aggregate(loss, mask, mode)
        parts = sum(
            aggregate(loss[i : i + 2], mask[i : i + 2], mode, total_tokens=float(mask.sum()), total_seqs=8.0)
            for i in range(0, 8, 2)
        )
        assert float(parts) == pytest.approx(float(whole), rel=1e-6), mode


def test_dynamic_sampling_keeps_informative_groups():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.5, 0.4, 0.5])
    assert informative_groups(rewards, 3).tolist() == [False, False, True]


def test_overlong_penalty_is_soft():
    lengths = torch.tensor([2, 6, 7, 8])
    pen = overlong_penalty(lengths, max_len=8, buffer=2, factor=1.0)
    assert pen.tolist() == [0.0, 0.0, -0.5, -1.0]
