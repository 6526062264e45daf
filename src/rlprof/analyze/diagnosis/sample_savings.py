"""What the levers on the rollout's engine save, read from its samples (and its decode steps where its window holds
them all): the tail left to partial rollout or capped at a response length (never below a high percentile of the
sampled lengths: what a cap cuts is said), a queue emptied (the batch run at once: more KV-cache memory, more slots;
a queue before the engine), slow tools. The formulas of analyze/diagnosis/savings.py's kind: (context, finding,
dialect) -> a prediction (prediction.py's `predicted`), each in docs/analysis_schema.md ("savings")."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

import numpy as np

from .finding import Finding
from .measures import _units_by_stage
from .prediction import MARGIN, ROLLOUT, Cost, PredictionContext, all_of, not_predictable, predicted
from .samples import duration_ms, tail_of


def partial_rollout(ctx: PredictionContext, f: Finding) -> dict:
    """tail_ms: the batch no longer waits for its last few responses (their remaining tokens are decoded in the next
    step, beside its new samples): the tail's time, an upper bound."""
    return all_of(
        ctx,
        f,
        "tail_ms",
        "partial rollout: the step goes on without waiting for its last few responses, which are continued in the "
        "next step beside its new samples (a decode step costs about the same with more rows): the tail's time saved, "
        "an upper bound; no response is cut",
    )


def capped_at_percentile(ctx: PredictionContext, cap: int, batches: list[list[int]]) -> tuple[int, str]:
    """The cap raised to the cap_percentile of each batch's response lengths where it was below it (the largest over
    the batches), and in words why."""
    q = ctx.t["cap_percentile"]
    floor = max((math.ceil(float(np.percentile(b, 100 * q))) for b in batches if b), default=0)
    if cap >= floor:
        return cap, ""
    return floor, (
        f"; the cap that would bring the tail to {MARGIN:.0%} of its threshold ({cap} tokens) cuts more than "
        f"{1 - q:.0%} of the responses: the cap is their p{100 * q:.0f} ({floor} tokens) instead, and the decode steps "
        "past it are what it removes"
    )


def cut_by(lengths: list[int], cap: int) -> dict:
    """What a cap at `cap` tokens cuts from these responses: how many and which share, and the tokens past it."""
    n, total = len(lengths), sum(lengths)
    longer = [L for L in lengths if L > cap]
    tokens = sum(L - cap for L in longer)
    share, token_share = (len(longer) / n if n else 0.0), (tokens / total if total else 0.0)
    return {
        "detail": {
            "responses_cut": share,
            "responses_cut_count": len(longer),
            "tokens_cut": tokens,
            "tokens_cut_share": token_share,
        },
        "words": (
            f"{len(longer)} of this run's {n} responses ({share:.0%}) are longer than {cap} and are cut, "
            f"{tokens} of their {total} tokens ({token_share:.0%}): their reward changes"
        ),
    }


def slow_tools(ctx: PredictionContext, f: Finding, dialect: str) -> dict:
    """tool_ms of each step's slowest sample: its tool calls no longer hold the batch (an upper bound: the sample
    still generates, and the next slowest may take its place)."""
    return all_of(
        ctx,
        f,
        "tool_ms",
        "each step's slowest sample no longer waits on its tools (calls made in parallel, answers cut shorter): all of "
        "its tool time saved, an upper bound (the next slowest sample may then hold the batch)",
    )


def queued(ctx: PredictionContext, f: Finding, dialect: str) -> dict:
    """longest_queue_ms: with enough engine slots or agent workers, no sample waits to start (an upper bound: the
    longest-waiting sample may not be the one the step ends with)."""
    return all_of(
        ctx,
        f,
        "longest_queue_ms",
        "no sample waits for a free slot or worker before its generation: each step's longest wait saved, an upper "
        "bound (the sample that waited longest may not be the one the step ends with)",
    )


def kv_cache(ctx: PredictionContext, f: Finding, dialect: str) -> dict:
    """A KV cache that holds the batch at its response cap: no sample waits for cache memory or is preempted; the
    rollout as the engine would schedule the batch all at once (all_at_once)."""
    return all_at_once(ctx, f, "kv_cache")


def slot_bound(ctx: PredictionContext, f: Finding, dialect: str) -> dict:
    """max_num_seqs raised to the batch: no sample waits for a slot (all_at_once)."""
    return all_at_once(ctx, f, "slots")


def all_at_once(ctx: PredictionContext, f: Finding, lever: str) -> dict:
    """The rollout once its samples run at once (the KV cache or the engine's slots no longer hold them back), per
    batch (step, pass, engine): its engine iterations replayed as a scheduler would run them all at once (one prefill
    of every prompt within the token budget, then one iteration per token of the longest still running), each costing
    what iterations cost now: from the decode steps where the rollout's window holds them all (fit iteration = fixed +
    per_token x tokens), else from the samples (an unpreempted sample's decode time per token: what one iteration
    takes). saving = the batch's time now less that, mean per step. The setting: a KV cache holding the batch at its
    response cap (rlprof's kv_cache_memory_bytes from the bytes a token takes now), max_num_seqs the batch."""
    batches = {k: b for k, b in sample_batches(ctx.doc).items() if all(r.get("response_tokens") for r in b)}
    if not batches:
        return not_predictable("the samples do not say when each ran and how many tokens it generated")
    engine = next((s["engine"] for s in ctx.doc.get("sample_steps") or [] if s.get("engine")), {})
    budget = engine.get("max_num_batched_tokens")
    iterations = _iteration_cost(ctx)
    if iterations is not None:  # the steps whose engine iterations the windows hold
        batches = {k: b for k, b in batches.items() if k[0] in iterations["by_step"]} or batches
        if not any(k[0] in iterations["by_step"] for k in batches):
            iterations = None
    now_by_step: dict = defaultdict(float)
    after_by_step: dict = defaultdict(float)
    for (step, _, _), batch in batches.items():
        prompts = [r.get("prompt_tokens", 0) for r in batch]
        replayed = _replayed(prompts, [r["response_tokens"] for r in batch], budget)
        if iterations is not None:
            after_by_step[step] += sum(iterations["fixed_ms"] + iterations["per_token_ms"] * t for t in replayed)
            continue
        pace = _sample_pace(batch)
        if pace is None:
            return not_predictable("no sample's decode time says what an engine iteration takes")
        prefills = [r["prefill_ms"] for r in batch if r.get("prefill_ms") is not None]
        now_by_step[step] += tail_of(batch)[0]
        after_by_step[step] += (statistics.median(prefills) if prefills else pace) + pace * (len(replayed) - 1)
    if iterations is not None:  # the decode steps' own time per step, all its passes
        now_by_step = {step: iterations["by_step"][step] for step in after_by_step}
    saved = sum(now_by_step[s] - after_by_step[s] for s in after_by_step)
    before_ms = sum(now_by_step.values())
    steps = len({k[0] for k in batches})
    setting, held = _all_at_once_setting(ctx, batches, engine, lever)
    how = (
        f"each iteration {iterations['fixed_ms']:.2f} ms + {iterations['per_token_ms'] * 1e3:.1f} us a token it computes "
        + (
            f"(fitted on the {iterations['units']} decode steps of the rollout's window"
            if iterations["fitted"]
            else f"(the mean of the {iterations['units']} decode steps of the rollout's window: a fit gave a negative part"
        )
        + f"; {iterations['recomputed']} prompt and generated tokens computed again now after preemptions, none then)"
        if iterations is not None
        else "each iteration as long as an unpreempted sample's decode time per token (from its samples); an "
        "iteration with more requests taken to cost the same (a decode reads the weights once an iteration, as on a "
        "GPU): on a CPU engine, where it grows with its requests, an upper bound"
    )
    return predicted(
        ctx,
        {f.stage: saved / steps},
        (
            f"{held}: the batch runs at once, no sample waits or is preempted; the rollout replayed as the engine "
            f"would schedule it then ({(before_ms - saved) / steps:.1f} of {before_ms / steps:.1f} ms per step), {how}"
        ),
        setting,
    )


def _replayed(prompts: list[int], lengths: list[int], budget: int | None) -> list[int]:
    """The tokens of each engine iteration when the batch runs at once: the prompts' prefill in iterations of at most
    `budget` tokens (each prompt's first token sampled there), then one iteration per token while any sample still
    generates (as many tokens as samples running)."""
    total = sum(prompts)
    chunks = max(1, math.ceil(total / budget)) if budget else 1
    out = [total / chunks] * chunks
    for k in range(1, max(lengths)):
        out.append(sum(1 for L in lengths if L > k))
    return out


def _iteration_cost(ctx: PredictionContext) -> dict | None:
    """Where the rollout's window holds its engine iterations whole (decode steps with the tokens they computed):
    iteration = fixed + per_token x tokens fitted over them (both at least 0, else each iteration its mean), each
    pass's iterations summed, and the tokens computed again (prefill tokens past the prompts: recomputation after a
    preemption)."""
    if ROLLOUT in ctx.units_only:
        return None
    units = [u for (_, stage), us in _units_by_stage(ctx.doc, "decode_step").items() if stage == ROLLOUT for u in us]
    units = [u for u in units if u.get("tokens")]
    if len(units) < 2:
        return None
    x = np.array([u["tokens"] for u in units], float)
    y = np.array([u["wall_ms"] for u in units], float)
    per_token, fixed = np.polyfit(x, y, 1) if x.max() > x.min() else (0.0, float(y.mean()))
    fitted = per_token >= 0 and fixed >= 0
    if not fitted:  # a negative part is no cost: each iteration its mean
        per_token, fixed = 0.0, float(y.mean())
    by_step: dict = defaultdict(float)
    for u in units:
        by_step[u.get("step")] += u["wall_ms"]
    prompts = sum(r.get("prompt_tokens", 0) for r in ctx.doc.get("samples", []) if r["step"] in by_step)
    prefill = sum(u.get("prefill_tokens") or 0 for u in units)
    return {
        "fixed_ms": float(fixed),
        "per_token_ms": float(per_token),
        "units": len(units),
        "by_step": dict(by_step),
        "recomputed": max(0, prefill - prompts),
        "fitted": bool(fitted),
    }


def _sample_pace(batch: list[dict]) -> float | None:
    """What one engine iteration takes, from the samples: the median decode time per token of those never
    preempted (a preempted one's decode time holds its wait and recomputation)."""
    paces = [
        r["decode_ms"] / (r["response_tokens"] - 1)
        for r in batch
        if r.get("decode_ms") is not None and r["response_tokens"] > 1 and not r.get("preemptions")
    ]
    return statistics.median(paces) if paces else None


def _all_at_once_setting(ctx: PredictionContext, batches: dict, engine: dict, lever: str) -> tuple[dict, str]:
    """The setting that lets the batch run at once, and the words: max_num_seqs the largest batch (slots), or a KV
    cache holding the largest batch with every response at the run's cap (rlprof's rollout.kv_cache_memory_bytes:
    the bytes a token takes now times those tokens, in whole MiB)."""
    n = max(len(b) for b in batches.values())
    if lever == "slots":
        return {"max_num_seqs": n}, f"max_num_seqs {n} (now {engine.get('max_num_seqs', 'not known')})"
    cap = int(ctx.conf("rollout.max_new_tokens", 0)) or max(r["response_tokens"] for b in batches.values() for r in b)
    block = engine.get("block_size") or 1
    tokens = max(sum(math.ceil((r.get("prompt_tokens", 0) + cap) / block) * block for r in b) for b in batches.values())
    setting = {"kv_cache_tokens": tokens}
    words = f"a KV cache of {tokens} tokens ({n} samples at their cap of {cap} tokens"
    have, now = engine.get("kv_cache_tokens"), ctx.conf("rollout.kv_cache_memory_bytes")
    if have and now:
        setting["kv_cache_memory_bytes"] = math.ceil(now * tokens / have / 2**20) * 2**20
        words += f", {setting['kv_cache_memory_bytes']} bytes at the {now / have:.0f} bytes a token takes now"
    return setting, words + (f", where it holds {have} now)" if have else ")")


def tail_from_samples(ctx: PredictionContext, f: Finding) -> dict:
    """The rollout's tail from its samples: cap responses at C tokens, the longest cap whose tail (samples.tail_of)
    stays at MARGIN of the threshold, never below the cap_percentile of each batch's lengths; each sample keeps its
    own time per token, so a capped sample ends after C of its tokens; saving = each batch's span less its span
    capped (mean per step)."""
    batches = sample_batches(ctx.doc)
    batches = {k: [r for r in b if r.get("response_tokens")] for k, b in batches.items()}
    batches = {k: b for k, b in batches.items() if b}
    if not batches:
        return not_predictable("the samples do not say how many tokens they generated")

    def capped(batch, cap):
        return [
            {**r, "end_us": r["start_us"] + (r["end_us"] - r["start_us"]) * min(1.0, cap / r["response_tokens"])}
            for r in batch
        ]

    limit = MARGIN * ctx.t["tail_share"]
    longest = max(r["response_tokens"] for b in batches.values() for r in b)
    tail_cap = longest
    for c in range(longest, 0, -1):
        spans = [tail_of(capped(b, c)) for b in batches.values()]
        tail_cap = c
        if sum(t for _, t in spans) <= limit * sum(s for s, _ in spans):
            break
    cap, floor_words = capped_at_percentile(
        ctx, tail_cap, [[r["response_tokens"] for r in b] for b in batches.values()]
    )
    steps = len({k[0] for k in batches})
    before = sum(tail_of(b)[0] for b in batches.values())
    after = sum(tail_of(capped(b, cap))[0] for b in batches.values())
    cut = cut_by([r["response_tokens"] for b in batches.values() for r in b], cap)
    prompts = [r["prompt_tokens"] for b in batches.values() for r in b if r.get("prompt_tokens") is not None]
    downstream, words = shorter_responses(ctx, cap, statistics.fmean(prompts) if prompts else None)
    return predicted(
        ctx,
        {f.stage: (before - after) / steps, **downstream},
        (
            f"responses capped at {cap} tokens, each sample keeping its own time per token (from its start and end): the "
            f"batch ends when its longest capped sample does ({(before - after) / steps:.1f} of {before / steps:.1f} ms "
            f"per step){floor_words}; {words}; {cut['words']}"
        ),
        {"max_new_tokens": cap},
        **cut["detail"],
    )


def shorter_responses(ctx: PredictionContext, cap: int, width: float | None) -> tuple[dict[str, float], str]:
    """The per-token time of the response columns past `cap` in every micro-batch pass: a micro-batch is padded to
    its longest row, so its width less the prompt's (`width`: the mean prompt, from the log-prob pass's real tokens
    or the samples' prompt tokens) is its longest response, and a cap cuts its columns past `cap`."""
    if width is None:
        return {}, (
            "the log-prob and update passes would compute shorter rows too, not counted (the prompt width is "
            "not known here): a lower bound"
        )
    parts, how = {}, []
    for stage in ctx.micro_stages():
        cost = Cost(ctx, stage)
        saved = 0.0
        for u in cost.units:
            resp = max(0.0, u["tokens"] / u["seqs"] - width) if u.get("seqs") else 0.0
            saved += cost.per_token * u["seqs"] * max(0.0, resp - cap) / cost.passes
        parts[stage] = saved
        how.append(f"{stage} {saved:.1f} ms ({cost.words()})")
    if not parts:
        return {}, "no micro-batch says its rows and tokens: the log-prob and update passes not counted (a lower bound)"
    return parts, (
        f"the log-prob and update passes then compute at most {cap} response tokens a row, the columns past "
        f"it saved at their per-token time: {'; '.join(how)}"
    )


def engine_iterations(ctx: PredictionContext) -> bool:
    """Whether the rollout's decode steps are an engine's iterations, its requests joining and leaving (vLLM's: they
    say their prefill tokens), and its samples say their lengths: a decode step is then no response's k-th token, and
    a cap is read from the samples."""
    units = [u for (_, stage), us in _units_by_stage(ctx.doc, "decode_step").items() if stage == ROLLOUT for u in us]
    samples = any(r.get("response_tokens") for r in ctx.doc.get("samples", []))
    return samples and any(u.get("prefill_tokens") is not None for u in units)


def sample_batches(doc: dict) -> dict[tuple, list[dict]]:
    """(step, generation pass, replica) -> its timed samples: one batch an engine generated together."""
    batches: dict = defaultdict(list)
    for r in doc.get("samples", []):
        if duration_ms(r) is not None:
            batches[(r["step"], r.get("rollout_pass", 0), r.get("replica"))].append(r)
    return batches
