"""Predicted saving per cause: what turning a cause's first lever saves per step, from the measures it was
diagnosed from (each formula in docs/analysis_schema.md, "savings").

Pure functions over the analysis document (rows, measures, run_config). One formula per cause that has one, named
by the cause's record in analyze/diagnosis/causes.py; each takes (context, finding, dialect) and returns
{status: "predicted", saving_ms, saving_share, assumption, setting, lever} or {status: "not predictable", why}.
`setting` is the value the prediction is made for, computed from the run (the cap on response length, the
micro-batch size, the token budget, the reward workers); `rlprof advise --fix` writes it into the dialect's keys
(frameworks/levers.py: Lever.value). A setting aims the cause's measure at MARGIN of its threshold, with the least
change that gets there (the next run's lengths and timings vary around this one's).

What the formulas read, and the cost model they share, are analyze/diagnosis/prediction.py's.

Over 400 lines because it holds one formula per cause that has one, beside the helpers several of them share.
"""

from __future__ import annotations

import math
from collections import defaultdict


from ...frameworks.levers import levers_for
from .finding import Finding
from .measures import TAIL_ACTIVE, _units_by_stage
from .sample_savings import (
    capped_at_percentile,
    cut_by,
    engine_iterations,
    partial_rollout,
    shorter_responses,
    tail_from_samples,
)
from .prediction import (
    MARGIN,
    all_of,
    Cost,
    PredictionContext,
    dynamic_groups,
    fixed_groups,
    not_predictable,
    predicted,
    rows_of,
    stratified,
)

# stages where the actor's FSDP-sharded weights are gathered for a forward
ACTOR_FORWARD_STAGES = ("rollout_generate", "actor_compute_log_prob", "actor_update")


def slow_reward(ctx: PredictionContext, f: Finding, dialect: str) -> dict:
    """reward_ms x (1 - ceil(N / W) / ceil(N / W0)): W workers score ceil(N / W) samples one after another. W: the
    fewest workers that bring the reward to MARGIN of its threshold share of the step (on the unprofiled times)."""
    r = f.evidence["stage_ms"]
    w0 = int(ctx.conf("reward.workers", 1) or 1)
    n = _samples(ctx)
    r_now = r * ctx.scale(f.stage)
    rest = max(0.0, ctx.step_basis() - r_now)
    share = MARGIN * ctx.t["reward_share"]
    target = share / (1 - share) * rest  # the reward's time at MARGIN of the threshold share
    if n:
        rounds_now = math.ceil(n / w0)
        per_sample = r_now / rounds_now
        rounds = max(1, int(target // per_sample)) if per_sample > 0 else 1
        w = min(n, max(w0 + 1, math.ceil(n / rounds)))
        kept = math.ceil(n / w) / rounds_now
        how = f"{n} samples, {per_sample:.2f} ms each"
    else:
        w = max(w0 + 1, math.ceil(w0 * r_now / target)) if target > 0 else 2 * w0
        kept = w0 / w
        how = "the samples not known: the reward's time taken to fall as 1/workers"
    return predicted(
        ctx,
        {f.stage: r * (1 - kept)},
        (
            f"each sample's scoring waits (a sandbox, a remote judge) and {w} workers wait at once, so the reward takes "
            f"ceil(N/{w}) sample times instead of ceil(N/{w0}) ({how}); a verifier that computes in Python holds the GIL "
            "and would not speed up in threads"
        ),
        {"workers": w},
        reward_after_ms=r_now * kept,
    )


def _samples(ctx: PredictionContext) -> int | None:
    """Rows scored per step on one rank: the rows the decode steps generated, else the log-prob pass's rows."""
    if ctx.lengths:
        return max(len(v) for v in ctx.lengths.values())
    c = Cost(ctx, "actor_compute_log_prob")
    return int(round(c.rows)) or None


def unused_reference(ctx: PredictionContext, f: Finding, dialect: str) -> dict:
    """ref_ms: the reference pass is skipped whole."""
    return predicted(
        ctx,
        {"ref_compute_log_prob": f.evidence["ref_ms"]},
        "the reference pass is skipped whole (its KL term had coefficient 0); the update's KL term, a few "
        "elementwise operations a token, is no longer computed either, not counted",
    )


def slow_rank(ctx: PredictionContext, f: Finding, dialect: str) -> dict:
    """min(excess, others_wait - wait): when the slow rank keeps pace the others stop waiting for it; they lose no
    more than they waited, and it holds them up by no more than its excess compute. Not scaled to the unprofiled
    steps: both are differences between ranks profiled alike (every rank of the stage runs the same operators under
    the same profiler), so the profiler's per-operator cost is not in them."""
    ev = f.evidence
    wait = ev["others_wait_ms"] - ev["wait_ms"]
    saved = min(ev["excess_ms"], wait)
    return predicted(
        ctx,
        {f.stage: saved},
        f"rank {f.rank} keeps pace with the others: the smaller of its excess compute "
        f"({ev['excess_ms']:.1f} ms) and the others' extra wait for it in collectives ({wait:.1f} ms) in "
        f"{f.stage} is saved",
        scaled=False,
    )


def rollout_tail(ctx: PredictionContext, f: Finding, dialect: str) -> dict:
    """The dialect's first lever: partial rollout where it has one (it changes no response), else a cap on the
    responses at C tokens: the longest cap whose tail stays at MARGIN of the threshold, but never below the
    cap_percentile of the sampled lengths (a cap cuts responses and changes their reward: a few, said, not a third of
    the batch); saving = the decode steps past C + the per-token time of the response tokens past C in the log-prob
    and update passes."""
    first = levers_for("rollout_tail", dialect, f.stage)
    if first and first[0].value != "max_new_tokens":
        return partial_rollout(ctx, f)
    if f.evidence.get("basis") == "samples" or engine_iterations(ctx):
        return tail_from_samples(ctx, f)
    passes = _decode_passes(ctx.doc)
    if not passes:
        return not_predictable("the decode steps do not say how many rows were active")
    limit = MARGIN * ctx.t["tail_share"]
    tail_cap = min(_tail_cap(p, limit) for p in passes)
    lengths = [L for v in ctx.lengths.values() for L in v]
    cap, floor_words = capped_at_percentile(ctx, tail_cap, list(ctx.lengths.values()))
    removed = sum(sum(u["wall_ms"] for u in p[cap:]) for p in passes) / len(passes)
    rows = rows_of(ctx)
    downstream, words = shorter_responses(ctx, cap, rows[1] if rows else None)
    cut = cut_by(lengths, cap)
    return predicted(
        ctx,
        {"rollout_generate": removed, **downstream},
        (
            f"a decode step costs the same with finished rows as with active ones (the engine computes the batch), so a "
            f"cap of {cap} tokens removes the decode steps past it ({removed:.1f} of {_decode_ms(passes):.1f} ms in the "
            f"profiled step){floor_words}; {words}; {cut['words']}"
        ),
        {"max_new_tokens": cap},
        **cut["detail"],
    )


def rollout_outside(ctx: PredictionContext, f: Finding, dialect: str) -> dict:
    """release_ms: verl's first lever keeps the engine awake between steps (free_cache_engine=False): what the stage
    spends after the batch is handed over, putting the replicas to sleep, is saved (their wake-up before the next
    step too, outside this stage: not counted, a lower bound). Not predictable where the host does not say it."""
    release = f.evidence.get("release_ms")
    if release is None:
        return not_predictable(
            "the rollout's host does not say what its stage does after its samples (verl's driver does, with "
            "global_profiler.trigger): rlprof cannot tell the engine's sleep from the rest"
        )
    return all_of(
        ctx,
        f,
        "release_ms",
        "the engine kept awake between steps: the stage's time after the batch is handed over (its replicas put to "
        "sleep) saved; their wake-up before the next step, outside this stage, not counted (a lower bound); more memory "
        "held by the engine",
    )


def dynamic_sampling(ctx: PredictionContext, f: Finding, dialect: str) -> dict:
    """The refill passes' share of the rollout's generation time (`value`) of the stage's time: with no refill pass
    (rlprof: dapo.max_sampling_retries=0; MindSpeed-RL: its filter_groups_max_batches at 1; verl: the refills
    dispatched beside the first batch, max_inflight_gen_batches raised, where their generation overlaps it) that
    share of the rollout is saved. The share, not the profiled refill time, is carried to the unprofiled steps: the
    profiled stage holds the profiler's own cost outside generation, which the refills do not scale with. The batch
    then keeps the first pass's informative groups and fills up with filtered ones (zero advantage): it changes what
    the step trains on."""
    words = (
        "the refill passes' generation time saved (no pass after the first, or refills overlapping it): their share of "
        f"the generation ({f.evidence['value']:.0%}) of the stage's time; the batch then trains on the first pass's "
        "informative groups and filtered ones filling it (zero advantage): it changes the experiment"
    )
    if (ctx.unprofiled().get("stage_ms") or {}).get(f.stage):
        return predicted(ctx, {f.stage: f.evidence["value"] * ctx.stage_ms(f.stage)}, words)
    return all_of(ctx, f, "refill_ms", words)


def _decode_ms(passes: list[list[dict]]) -> float:
    return sum(u["wall_ms"] for p in passes for u in p) / len(passes)


def _decode_passes(doc: dict) -> list[list[dict]]:
    """The decode steps of each generation pass (a stage window), in order."""
    per: dict[tuple, list[dict]] = defaultdict(list)
    for (_, stage), units in _units_by_stage(doc, "decode_step").items():
        for u in units:
            if u.get("active") is not None and u.get("seqs"):
                per[(stage, u.get("step"), u.get("rank"), u.get("replica"), u.get("file"))].append(u)
    return [sorted(us, key=lambda u: (u.get("index") or 0, u.get("start_us") or 0.0)) for us in per.values()]


def _tail_cap(steps: list[dict], limit: float) -> int:
    """The largest number of decode steps whose tail share (steps with fewer than TAIL_ACTIVE of rows active)
    stays at or below `limit`."""
    best, total, tail = 1, 0.0, 0.0
    for k, u in enumerate(steps):
        total += u["wall_ms"]
        tail += u["wall_ms"] if u["active"] < TAIL_ACTIVE * u["seqs"] else 0.0
        if total > 0 and tail / total <= limit:
            best = k + 1
    return best


def padding(ctx: PredictionContext, f: Finding, dialect: str) -> dict:
    """verl / MindSpeed-RL pack (use_remove_padding); rlprof's trainer packs by token budget."""
    return padding_budget(ctx) if dialect == "rlprof" else padding_removed(ctx)


def padding_removed(ctx: PredictionContext) -> dict:
    """Packing (verl's and MindSpeed-RL's use_remove_padding): per_token x (tokens - real_tokens) of every
    micro-batch pass, no pad computed."""
    parts, fitted = {}, True
    for s in ctx.micro_stages():
        cost = Cost(ctx, s)
        pad = (
            sum(
                u["tokens"] - (u.get("real_tokens") if u.get("real_tokens") is not None else u["tokens"])
                for u in cost.units
            )
            / cost.passes
        )
        parts[s] = cost.per_token * pad
        fitted &= cost.fitted
    how = (
        "the per-token part of the fitted micro-batch cost"
        if fitted
        else "all of a micro-batch's time taken to grow with its tokens where no fixed part could be fitted (an upper "
        "bound)"
    )
    return predicted(
        ctx,
        parts,
        f"packing computes the real tokens only: the pad tokens' time is saved, at {how}; "
        "micro-batches keep their number",
    )


def padding_budget(ctx: PredictionContext) -> dict:
    """rlprof's actor.use_dynamic_bsz with the token budget B that minimises the predicted time of every
    micro-batch pass: sum over passes of cost(now) - cost(groups(B))."""
    rows = rows_of(ctx)
    if rows is None:
        return not_predictable(
            "the rows' lengths are not in this data (rlprof's trainer records them on its decode "
            "steps and micro-batches)"
        )
    lengths, width = rows
    costs = {s: Cost(ctx, s) for s in ctx.micro_stages()}
    costs = {s: c for s, c in costs.items() if c.count}
    # now: the log-prob passes as measured (their rows in batch order); the update's random mini-batches modelled as
    # the budget's are, each an even spread of the batch's lengths, so that the two compare like with like
    before = {
        s: (_fixed_size_time(c, max(1, int(round(c.seqs_now))), rows, spread=True) if c.has_minis else c.now())
        for s, c in costs.items()
    }
    ceiling = max(u["tokens"] for c in costs.values() for u in c.units)  # no micro-batch larger than now
    floor = width + max(lengths)
    best = None
    b = float(ceiling)
    while b >= floor:
        parts, ok = {}, True
        for s, c in costs.items():
            groups, tokens = _budget_groups(c, lengths, width, b)
            if not c.fitted and groups > c.count + 1e-9:
                ok = False  # the fixed cost per micro-batch is not known: no more micro-batches than now
                break
            parts[s] = before[s] - c.time(groups, tokens)
        if ok and (best is None or sum(parts.values()) > sum(best[1].values()) + 1e-9):
            best = (int(b), parts)
        b = math.floor(b * 0.97) if b > 40 else b - 1
    if best is None:
        return not_predictable("no token budget keeps the micro-batches as few as now")
    budget, parts = best
    words = "; ".join(f"{s}: {c.words()}" for s, c in costs.items())
    return predicted(
        ctx,
        parts,
        (
            f"micro-batches of rows of like length under a budget of {budget} tokens (no micro-batch larger than the "
            f"largest now), formed from this run's response lengths and a prompt of {width:.1f} tokens, each padded to its "
            f"longest row; {words}"
        ),
        {"max_token_len": budget},
    )


def _budget_groups(c: Cost, lengths: list[int], width: float, budget: float) -> tuple[float, float]:
    """Each mini-batch (the update's; a log-prob pass is one) packed on its own, its rows a spread of the batch's."""
    g, t = dynamic_groups(stratified(lengths, _size_limit(c)), width, budget)
    return g * c.minis, t * c.minis


def small_units(ctx: PredictionContext, stages: list[str], sizes: list[int] | None = None) -> dict:
    """One micro-batch size M for `stages` (one key acts on them), the one that minimises the predicted time
    sum(cost(groups(M))): the fixed cost of the micro-batches it removes, less the pad it adds."""
    rows = rows_of(ctx)
    costs = {s: Cost(ctx, s) for s in stages}
    costs = {s: c for s, c in costs.items() if c.count}
    if not costs:
        return not_predictable("no micro-batch of these stages says how many rows and tokens it holds")
    m0 = max(1, int(round(min(c.seqs_now for c in costs.values()))))
    limit = min(_size_limit(c) for c in costs.values())
    most, memory = _memory_limit(ctx, list(costs), m0)
    candidates = sizes or [
        m for m in _sizes(m0, limit) if all(_fits(c, m) for c in costs.values()) and (most is None or m <= most)
    ]
    if not candidates:
        return not_predictable(f"no micro-batch size larger than {m0} divides the mini-batch and fits ({memory})")

    def parts(m):
        return {s: _fixed_size_time(c, m0, rows) - _fixed_size_time(c, m, rows) for s, c in costs.items()}

    scored = [(m, parts(m)) for m in candidates]
    top = max(sum(p.values()) for _, p in scored)
    m, best = next((m, p) for m, p in scored if sum(p.values()) >= top - 0.01 * abs(top))  # the smallest near best
    pad = (
        "the rows' lengths from the decode steps, rows in random order of length"
        if rows
        else "the rows' lengths not known: tokens computed taken as unchanged (no pad added)"
    )
    words = "; ".join(
        f"{s}: {c.words()}, {c.count:.0f} micro-batches of {c.seqs_now:.1f} rows" for s, c in costs.items()
    )
    return predicted(
        ctx,
        best,
        (f"micro-batches of {m} rows instead of {m0}: {words}; each padded to its longest row ({pad}); {memory}"),
        {"micro_batch_size": {s: m for s in costs}},
    )


MEMORY_LIMIT = 0.9  # a larger micro-batch keeps the stage's peak memory under this share of the device's


def _memory_limit(ctx: PredictionContext, stages: list[str], m0: int) -> tuple[int | None, str]:
    """The largest micro-batch whose peak memory stays under MEMORY_LIMIT of the device's, where the stages' peak and
    the device's capacity were recorded: the peak taken to grow with the rows (an upper bound: the weights and
    optimizer state do not); else None, said."""
    held = [
        m
        for m in ctx.doc.get("measures", [])
        if m["measure"] == "memory_use" and m["status"] == "measured" and m.get("stage") in stages
    ]
    if not held:
        return None, "memory not checked (no peak against the device's capacity recorded for these stages)"
    m = max(held, key=lambda m: m["value"])
    most = max(m0, int(m0 * MEMORY_LIMIT * m["capacity_bytes"] / m["peak_bytes"]))
    return most, (
        f"memory: the peak {m['peak_bytes'] / 2**30:.2f} of {m['capacity_bytes'] / 2**30:.1f} GiB ({m['stage']}) at "
        f"{m0} rows, taken to grow with the rows (the weights do not: an upper bound), stays under "
        f"{MEMORY_LIMIT:.0%} of the device's up to {most} rows"
    )


def _size_limit(c: Cost) -> int:
    return max(1, int(round(c.rows / c.minis)))  # one micro-batch per mini-batch (or the whole pass)


def _fits(c: Cost, m: int) -> bool:
    per_mini = _size_limit(c)
    return m <= per_mini and (not c.has_minis or per_mini % m == 0)  # the update: a divisor of the mini-batch


def _sizes(m0: int, limit: int) -> list[int]:
    out = set()
    m = m0 * 2
    while m < limit:
        out.add(m)
        m *= 2
    out |= {d for d in range(m0 + 1, limit + 1) if limit % d == 0}
    out.add(limit)
    return sorted(x for x in out if x > m0)


def _fixed_size_time(c: Cost, m: int, rows, spread: bool = False) -> float:
    """Predicted time of the stage's micro-batches at m rows each; `spread`: each mini-batch's rows an even spread
    of the batch's lengths (as _budget_groups packs them, so that the two compare like with like), else drawn at
    random from the batch."""
    per_mini = _size_limit(c)
    if rows:
        lengths, width = rows
        g, t = fixed_groups(stratified(lengths, per_mini) if spread else lengths, width, per_mini, m)
    else:
        g, t = math.ceil(per_mini / m), c.tokens / c.minis
    return c.time(g * c.minis, t * c.minis)


def weight_sync(ctx: PredictionContext, f: Finding, dialect: str) -> dict:
    """rlprof's rollout.share_actor_weights: sync_ms - decode steps x the actor's exposed all-gather per forward (the
    rollout gathers the shards each decode step, as one micro-batch of the log-prob pass does)."""
    if dialect != "rlprof":
        return not_predictable(
            "larger transfer buckets save a part of each transfer's overhead, which this data does "
            "not separate from the bytes moved"
        )
    sync = f.evidence["stage_ms"]
    lp = Cost(ctx, "actor_compute_log_prob")
    comm = ctx.stage_mean("actor_compute_log_prob", "comm_ms")
    passes = _decode_passes(ctx.doc)
    if not lp.count or comm <= 0 or not passes:
        return not_predictable(
            "the actor's all-gather per forward was not measured (no log-prob micro-batches with "
            "communication, or no decode steps): the cost the rollout takes on is not known"
        )
    per_forward = comm / lp.count
    steps = sum(len(p) for p in passes) / len(passes)
    added = steps * per_forward
    return predicted(
        ctx,
        {f.stage: sync - added * ctx.scale("actor_compute_log_prob") / ctx.scale(f.stage)},
        (
            f"the rollout reads the actor's shards: no full copy ({sync:.1f} ms in the profiled step), and each of its "
            f"{steps:.0f} decode steps gathers the shards as one micro-batch of the log-prob pass does ({per_forward:.2f} ms "
            f"exposed, {added:.1f} ms in all, taken from the sync's saving: the rollout takes them on)"
        ),
    )


def exposed_comm(ctx: PredictionContext, f: Finding, dialect: str) -> dict:
    if dialect != "rlprof":
        return predicted(
            ctx,
            {f.stage: f.evidence["bucket_ms"]},
            (
                f"overlap (prefetching the next all-gather) hides the exposed communication of {f.stage} at best: "
                "all of it saved, an upper bound"
            ),
        )
    return keep_gathered(ctx)


def keep_gathered(ctx: PredictionContext) -> dict:
    """rlprof's actor.reshard_after_forward=false: the actor's weights stay gathered after a forward until a
    backward reshards them, so the re-gathers are saved: the rollout's after its first decode step (when it runs on
    the actor's shards), the log-prob pass's (all of them after such a rollout, else all but its first
    micro-batch's), and of the update's 2u all-gathers over u micro-batches (a forward's and the backward's again)
    u + 1: every backward's, and the first forward's, which finds the weights the log-prob pass left gathered."""
    parts, words = {}, []
    shared = ctx.stage_mean("rollout_generate", "comm_ms") > 0 and ctx.stage_ms("weight_sync") <= 0
    for stage in ACTOR_FORWARD_STAGES:
        comm = ctx.stage_mean(stage, "comm_ms")
        if comm <= 0:
            continue
        if stage == "rollout_generate":
            passes = _decode_passes(ctx.doc)
            k = (sum(len(p) for p in passes) / len(passes)) if passes else 1
            part = comm * (k - 1) / k
        elif stage == "actor_update":
            # u micro-batches: 2u gathers now (forward, and backward again); kept, the first forward uses the
            # weights the log-prob pass left gathered and each backward those of its forward: u - 1 remain
            u = max(1.0, Cost(ctx, stage).count)
            part = comm * _gather_share(ctx.doc, stage) * (u + 1) / (2 * u)
        else:
            n = Cost(ctx, stage).count or 1
            part = comm if shared else comm * (n - 1) / n
        parts[stage] = part
        words.append(f"{stage} {part:.1f} of {comm:.1f} ms")
    if not parts:
        return not_predictable("no exposed communication in the actor's forward stages")
    return predicted(
        ctx,
        parts,
        (
            "the actor's gathered weights are kept from a forward until a backward reshards them, so the re-gathers are "
            f"saved ({'; '.join(words)} exposed in the profiled step: the rollout's decode steps after the first, the "
            "log-prob pass's forwards, the update's (u + 1) of its 2u all-gathers over u micro-batches: every backward's "
            "and the first forward's); more memory held"
        ),
    )


def _gather_share(doc: dict, stage: str) -> float:
    """The all-gathers' share of a stage's collective time (by name)."""
    gather = total = 0.0
    for c in doc.get("collectives", []):
        if c.get("stage") != stage:
            continue
        total += c["total_ms"]
        if "allgather" in c["name"].lower().replace("_", ""):
            gather += c["total_ms"]
    return gather / total if total > 0 else 1.0


def launch_bound(ctx: PredictionContext, f: Finding, dialect: str) -> dict:
    """launch_bound_ms: the device gaps the host had not yet launched into, all recovered (an upper bound)."""
    return all_of(
        ctx,
        f,
        "launch_bound_ms",
        "the device's launch-bound gaps are all filled (CUDA graphs, fused kernels, larger micro-batches): "
        "an upper bound",
    )


def small_units_lever(ctx: PredictionContext, f: Finding, dialect: str) -> dict:
    """small_units for the stages the first micro-batch-size lever of the finding's stage acts on in `dialect`."""
    return small_units(ctx, lever_stages(f.stage, dialect, ctx))


def lever_stages(stage: str, dialect: str, ctx: PredictionContext) -> list[str]:
    """The stages the first micro-batch-size lever of `stage` acts on in `dialect` (rlprof's one log-prob size
    acts on the reference and the old-log-prob passes at once)."""
    lv = next((lv for lv in levers_for("small_units", dialect, stage) if lv.value), None)
    acts = lv.stages if lv and lv.stages else (stage,)
    return [s for s in ctx.micro_stages() if s in acts] or [stage]
