"""Rollout: batched sampling with a KV cache, one decode_step per generated token."""

from __future__ import annotations

import inspect
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor  # (B, P)
    response_ids: torch.Tensor  # (B, T) right-padded with pad
    response_mask: torch.Tensor  # (B, T) 1 for generated tokens (EOS included)
    engine_log_probs: torch.Tensor | None = None  # (B, T) the engine's log-prob of each sampled token (vLLM)

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    def to(self, device) -> "Rollout":
        lp = self.engine_log_probs
        return Rollout(
            self.prompt_ids.to(device),
            self.prompt_mask.to(device),
            self.response_ids.to(device),
            self.response_mask.to(device),
            None if lp is None else lp.to(device),
        )

    def select(self, idx: torch.Tensor) -> "Rollout":
        lp = self.engine_log_probs
        return Rollout(
            self.prompt_ids[idx],
            self.prompt_mask[idx],
            self.response_ids[idx],
            self.response_mask[idx],
            None if lp is None else lp[idx],
        )


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that start at 0 on the first real token of each left-padded row."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None):
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:  # nucleus: keep the smallest set of tokens whose mass reaches top_p
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def kv_cache_keyword(model) -> str:
    """The KV cache's argument (and output field) name: transformers 5.2x renamed `past_key_values` to `cache` and
    warns at every call that uses the old one."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def decode_work(t: int, lengths: list[int], done: list[bool], width: int, use_cache: bool) -> dict:
    """What decode step `t` computes, for its unit range: `seqs` rows, `active` rows still generating, `tokens`
    computed (padding and finished rows included), and of the real work (the active rows' own tokens): `real_tokens`,
    the prefill's rows and tokens, `context_tokens` (the tokens each real row attends to, summed: the KV cache read)
    and `query_key_pairs` (tokens computed x tokens attended to, summed). Step 0, and every step without the KV cache,
    computes each row's whole sequence so far; a cached step one token per row."""
    real = [n + t for n, d in zip(lengths, done) if not d]  # each active row's length once this step has run
    whole = not use_cache or t == 0
    out = {"active": len(real), "seqs": len(lengths), "tokens": len(lengths) * (width if whole else 1)}
    if whole:
        tokens = sum(real)
        return {
            **out,
            "real_tokens": tokens,
            "prefill_seqs": len(real),
            "prefill_tokens": tokens,
            "context_tokens": tokens,
            "query_key_pairs": sum(n * n for n in real),
        }
    return {
        **out,
        "real_tokens": len(real),
        "prefill_seqs": 0,
        "prefill_tokens": 0,
        "context_tokens": sum(real),
        "query_key_pairs": sum(real),
    }


def generate(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    ignore_eos: bool = False,
    generator: torch.Generator | None = None,
    decode_step=lambda **_: nullcontext(),
    use_cache: bool = True,
    clock: list | None = None,
    hold_eos: list[int] | None = None,
    hold_tokens: int | None = None,
) -> Rollout:
    """Sample up to max_new_tokens per row. `decode_step(active=, seqs=)` wraps each token (rlprof's unit range +
    tick), told how many rows are still generating. `clock` (a list, where the samples are recorded): the wall clock
    in ns at the start, then perf_counter_ns at the start and after each decode step (trainer/sample_records.py).
    `hold_eos`: rows that cannot stop before max_new_tokens (their EOS is never sampled: trainer.debug.long_sample,
    a test aid); with `hold_tokens` they generate that many tokens, past max_new_tokens if larger, while every other
    row stops at max_new_tokens: the batch then decodes for them alone."""
    device = prompt_ids.device
    batch = prompt_ids.shape[0]
    attn = prompt_mask.clone()
    seqs = prompt_ids
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    tokens, masks = [], []
    cache = None
    cache_keyword = kv_cache_keyword(model)
    logits = None
    if clock is not None:
        clock += [time.time_ns(), time.perf_counter_ns()]
    steps = max(max_new_tokens, hold_tokens) if hold_eos and hold_tokens else max_new_tokens
    held = torch.zeros(batch, dtype=torch.bool, device=device)
    held[hold_eos or []] = True
    lengths = prompt_mask.sum(1).tolist()
    for t in range(steps):
        if t == max_new_tokens:  # past the budget only the held rows generate
            finished = finished | ~held
        with decode_step(**decode_work(t, lengths, finished.tolist(), seqs.shape[1], use_cache)):
            if use_cache:
                step_ids = seqs if cache is None else seqs[:, -1:]
                pos = positions(attn) if cache is None else positions(attn)[:, -1:]
                out = model(
                    input_ids=step_ids, attention_mask=attn, position_ids=pos, use_cache=True, **{cache_keyword: cache}
                )
                cache = getattr(out, cache_keyword)
            else:  # the reference path: recompute the whole sequence every token
                out = model(input_ids=seqs, attention_mask=attn, position_ids=positions(attn), use_cache=False)
            logits = out.logits[:, -1]
            if hold_eos:
                logits = logits.clone()
                logits[hold_eos, eos_id] = float("-inf")
            nxt = sample_next(logits, temperature, top_p, generator)
            nxt = torch.where(finished, torch.full_like(nxt, pad_id), nxt)
            active = ~finished  # rows still generating: this token is real (EOS included)
            tokens.append(nxt)
            masks.append(active)
            if not ignore_eos:
                finished = finished | (nxt == eos_id)
            seqs = torch.cat([seqs, nxt[:, None]], dim=1)
            attn = torch.cat([attn, active.long()[:, None]], dim=1)
            done = not ignore_eos and bool(finished.all())
            if clock is not None:
                clock.append(time.perf_counter_ns())
            if done:
                break
    return Rollout(prompt_ids, prompt_mask, torch.stack(tokens, 1), torch.stack(masks, 1).long())
