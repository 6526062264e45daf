"""Actor and reference workers: log-probs over micro-batches, and the policy update."""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch

from .algorithms import aggregate, clipped_surrogate, entropy_from_logits, kl_k3
from .rollout import Rollout, positions


def _no_unit(**_):
    return nullcontext()


def trim(batch: Rollout) -> Rollout:
    """The micro-batch without the columns that are padding in every row (a collator padding to the longest
    row of the micro-batch, not of the whole batch): prompt columns on the left, response columns on the right."""
    p_keep = int(batch.prompt_mask.any(0).nonzero().min()) if batch.prompt_mask.any() else 0
    r_real = batch.response_mask.any(0).nonzero()
    r_keep = int(r_real.max()) + 1 if len(r_real) else 1
    return Rollout(
        batch.prompt_ids[:, p_keep:],
        batch.prompt_mask[:, p_keep:],
        batch.response_ids[:, :r_keep],
        batch.response_mask[:, :r_keep],
    )


def unit_args(mb: Rollout) -> dict:
    """What a micro-batch holds, for its unit range: rows, tokens computed (rows x width), real tokens, and the
    query-key pairs its attention scores on real tokens (each row's real length squared, summed)."""
    rows, width = mb.input_ids.shape
    lengths = mb.attention_mask.sum(1).tolist()
    return {
        "seqs": rows,
        "tokens": rows * width,
        "real_tokens": int(sum(lengths)),
        "query_key_pairs": int(sum(n * n for n in lengths)),
    }


def plan_micro_batches(batch: Rollout, idx: torch.Tensor, size: int, dynamic: bool, max_tokens: int) -> list:
    """Index groups of `idx`: fixed `size` rows each, or (dynamic) rows sorted by real length and packed while
    rows x the longest row stays within `max_tokens` (verl's use_dynamic_bsz idea: like lengths together)."""
    if not dynamic:
        return list(torch.split(idx, size))
    lengths = batch.attention_mask[idx].sum(1)
    order = idx[torch.argsort(lengths, stable=True)]
    sorted_len = lengths.sort(stable=True).values.tolist()
    groups, start = [], 0
    for i in range(1, len(order) + 1):
        if i == len(order) or (i - start + 1) * sorted_len[i] > max_tokens:
            groups.append(order[start:i])
            start = i
    return groups


def response_log_probs(model, batch: Rollout, temperature: float, with_entropy: bool = False):
    """Log-prob (and entropy) of each response token under `model`: (B, T) each, computed on the trimmed
    micro-batch and padded back to the batch's response width."""
    width = batch.response_ids.shape[1]
    batch = trim(batch)
    ids, attn = batch.input_ids, batch.attention_mask
    logits = model(input_ids=ids, attention_mask=attn, position_ids=positions(attn), use_cache=False).logits
    t = batch.response_ids.shape[1]
    logits = logits[:, -t - 1 : -1].float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1).gather(-1, batch.response_ids[..., None]).squeeze(-1)
    pad = lambda x: torch.nn.functional.pad(x, (0, width - t))  # noqa: E731
    return pad(log_probs), (pad(entropy_from_logits(logits)) if with_entropy else None)


@torch.no_grad()
def batched_log_probs(
    model,
    batch: Rollout,
    micro_batch_size: int,
    temperature: float,
    unit=_no_unit,
    *,
    dynamic: bool = False,
    max_tokens: int = 0,
):
    """Inference log-probs in micro-batches (old policy, reference), one micro_batch unit each."""
    n = batch.response_ids.shape[0]
    out = torch.zeros(batch.response_ids.shape, dtype=torch.float32, device=batch.response_ids.device)
    for idx in plan_micro_batches(batch, torch.arange(n), micro_batch_size, dynamic, max_tokens):
        mb = batch.select(idx)
        with unit(**unit_args(trim(mb))):
            out[idx] = response_log_probs(model, mb, temperature)[0]
    return out


def _set_grad_sync(model, enabled: bool) -> None:
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2: reduce-scatter only on the last micro-batch
        model.set_requires_gradient_sync(enabled)


def busy_compute(ms: float, device) -> None:
    """Real work for `ms` milliseconds (matmuls, so a trace shows compute, not a sleep)."""
    x = torch.full((256, 256), 0.01, device=device)  # no RNG draw: training stays reproducible
    deadline = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < deadline:
        x = torch.tanh(x @ x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def policy_update(
    model,
    optimizer,
    batch: Rollout,
    old_log_probs,
    ref_log_probs,
    advantages,
    *,
    cfg,
    generator,
    mini_batch=_no_unit,
    micro_batch=_no_unit,
    slow_ms: float = 0.0,
    lr_schedule=None,
) -> dict:
    """ppo_epochs x mini-batches x micro-batches with gradient accumulation, clipping and AdamW (its learning rate
    stepped by `lr_schedule` after each optimizer step, where given)."""
    a = cfg.actor
    clip_high, kl_coef, agg = cfg.clip_high(), cfg.kl_coef(), cfg.loss_agg()
    n = batch.response_ids.shape[0]
    stats = {"pg_loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "entropy": 0.0, "grad_norm": 0.0, "lr": 0.0}
    tokens_seen = micro_batches = updates = 0
    params = [p for p in model.parameters() if p.requires_grad]
    for _ in range(a.ppo_epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, a.mini_batch_size):
            with mini_batch():
                idx = order[start : start + a.mini_batch_size]
                mask_all = batch.response_mask[idx]
                total_tokens, total_seqs = float(mask_all.sum()), float(len(idx))
                optimizer.zero_grad(set_to_none=True)
                chunks = plan_micro_batches(batch, idx, a.micro_batch_size, a.use_dynamic_bsz, a.max_token_len)
                for k, j in enumerate(chunks):
                    mb = batch.select(j)
                    with micro_batch(**unit_args(trim(mb))):
                        _set_grad_sync(model, k == len(chunks) - 1)
                        mask = mb.response_mask.float()
                        log_probs, entropy = response_log_probs(model, mb, cfg.rollout.temperature, True)
                        pg, clipped = clipped_surrogate(
                            log_probs, old_log_probs[j], advantages[j], a.clip_ratio_low, clip_high
                        )
                        per_token = pg
                        kl = kl_k3(log_probs, ref_log_probs[j]) if ref_log_probs is not None else None
                        if kl is not None and kl_coef:
                            per_token = per_token + kl_coef * kl
                        loss = aggregate(per_token, mask, agg, total_tokens=total_tokens, total_seqs=total_seqs)
                        if slow_ms:
                            busy_compute(slow_ms, log_probs.device)  # the debug knob: this rank computes slower
                        loss.backward()
                        with torch.no_grad():
                            tokens = float(mask.sum())
                            tokens_seen += tokens
                            micro_batches += 1
                            stats["pg_loss"] += float((pg * mask).sum())
                            stats["clip_frac"] += float((clipped * mask).sum())
                            stats["entropy"] += float((entropy * mask).sum())
                            if kl is not None:
                                stats["kl"] += float((kl * mask).sum())
                grad_norm = torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
                if hasattr(grad_norm, "full_tensor"):
                    grad_norm = grad_norm.full_tensor()
                stats["grad_norm"] += float(grad_norm)
                stats["lr"] = optimizer.param_groups[0]["lr"]  # the rate this update used
                optimizer.step()
                if lr_schedule is not None:
                    lr_schedule.step()
                updates += 1
    for key in ("pg_loss", "clip_frac", "entropy", "kl"):
        stats[key] /= max(tokens_seen, 1.0)
    stats["grad_norm"] /= max(updates, 1)
    stats["micro_batches"] = micro_batches
    stats["optimizer_steps"] = updates
    return stats
