"""Why a rollout was slow, from its samples: for each spike, level shift or drift of rollout_generate in the run over
time, whether the step's workload explains it (its longest sample generated more tokens, or waited longer on tools,
in proportion to the time) or not (each token, or each turn, took longer), with the samples that held the batch.

The rule (docs/analysis_schema.md, "timeline"): the rollout's time grew `seconds_ratio` times over its baseline (the
judged steps before it: a spike's previous WINDOW, a level shift's steps before it, a drift's first quarter); its
workload grew `workload_ratio` times (the longest sample's response tokens, or its tool time where the host records
tools, over the baseline steps' median); the workload explains it where it grew at least EXPLAINED of the time's
growth (ratios over 1), else the time per token rose (`ms_per_token`, the rollout's span over its longest sample's
tokens: a batch decodes as long as its longest sample). The rollout's time is its span less the time it waited for a
core where the watch says it (the slowest rank's run-queue wait in the stage, as much of it as must have fallen
inside the span): on a busy host the wait is the host's, neither the workload's nor the time per token's. A decode
step reads every token cached before it, so a longer sample costs more per token: where the samples say their prompt
lengths, the workload also explains a time per token that grew no more than the longest sample's mean context did
(`context_tokens`: its prompt and half its response).
"""

from __future__ import annotations

import statistics

from ...frameworks.levers import levers
from ..diagnosis.causes import THRESHOLDS
from .timeline import WINDOW

EXPLAINED = 0.75
WORKLOAD = ("response_tokens", "tool_time")  # the `explained_by` that say the workload explains a slow rollout
STAGE = "rollout_generate"


def stage_waits(timeline: dict | None) -> dict[int, tuple[float | None, float | None]]:
    """Each watched step's (rollout stage seconds, its slowest rank's wait for a core there in ms), where the run over
    time kept them (analyze/over_time/timeline.py)."""
    series = ((timeline or {}).get("per_step") or {}).get(STAGE) or {}
    if "wait_ms" not in series:
        return {}
    return dict(zip(timeline["steps"], zip(series["max"], series["wait_ms"])))


def _workload(s: dict, waits: dict | None = None) -> dict:
    slowest = s["slowest"][0] if s.get("slowest") else {}
    longest = (s.get("response_tokens") or {}).get("max")
    span = s.get("span_ms")
    out = {"step": s["step"], "longest_tokens": longest, "span_ms": span, "tail_share": s.get("tail_share")}
    if "tool_ms" in slowest:
        out["tool_ms"] = slowest["tool_ms"]
    stage_s, wait = (waits or {}).get(s["step"], (None, None))
    if span and stage_s is not None and wait is not None:
        # the wait that must have fallen inside the span: the rest of the stage could hold only so much of it
        out["wait_ms"] = max(0.0, min(span, wait - max(0.0, stage_s * 1e3 - span)))
    out["ran_ms"] = span - out.get("wait_ms", 0.0) if span else span
    if longest and out["ran_ms"]:
        out["ms_per_token"] = out["ran_ms"] / longest
    prompt = (s.get("prompt_tokens") or {}).get("max")
    if longest and prompt is not None:
        out["context_tokens"] = prompt + longest / 2  # the mean context a decode step of the longest sample reads
    return out


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _why(now: list[dict], base: list[dict]) -> dict | None:
    """The comparison of the flagged steps' samples with the baseline steps'; None where either has none timed."""
    now = [w for w in now if w["ran_ms"]]
    base = [w for w in base if w["ran_ms"]]
    if not now or not base:
        return None
    get = lambda ws, k: _median(w.get(k) for w in ws)  # noqa: E731
    out = {
        "steps": [w["step"] for w in now],
        "baseline_steps": [w["step"] for w in base],
        "span_ms": get(now, "span_ms"),
        "baseline_span_ms": get(base, "span_ms"),
        "longest_tokens": get(now, "longest_tokens"),
        "baseline_longest_tokens": get(base, "longest_tokens"),
        "ms_per_token": get(now, "ms_per_token"),
        "baseline_ms_per_token": get(base, "ms_per_token"),
    }
    if get(now, "tool_ms") is not None and get(base, "tool_ms") is not None:
        out["tool_ms"], out["baseline_tool_ms"] = get(now, "tool_ms"), get(base, "tool_ms")
    if get(now, "wait_ms") is not None and get(base, "wait_ms") is not None:
        out["wait_ms"], out["baseline_wait_ms"] = get(now, "wait_ms"), get(base, "wait_ms")
    ran, baseline_ran = get(now, "ran_ms"), get(base, "ran_ms")
    ratios = [
        out[k] / out["baseline_" + k]
        for k in ("longest_tokens", "tool_ms")
        if out.get(k) is not None and out.get("baseline_" + k)
    ]
    seconds = ran / baseline_ran if baseline_ran else None
    workload = max(ratios) if ratios else None
    out["seconds_ratio"], out["workload_ratio"] = seconds, workload
    context, baseline_context = get(now, "context_tokens"), get(base, "context_tokens")
    if context is not None and baseline_context:
        out["context_tokens"], out["baseline_context_tokens"] = context, baseline_context
    per_token = (
        out["ms_per_token"] / out["baseline_ms_per_token"]
        if out["ms_per_token"] is not None and out["baseline_ms_per_token"]
        else None
    )
    # each token slower by no more than its longer context reads: still the workload
    within_context = per_token is not None and "context_tokens" in out and per_token <= context / baseline_context
    if seconds is None or workload is None:
        out["explained_by"] = None
    elif seconds > 1 and (workload - 1 >= EXPLAINED * (seconds - 1) or (workload > 1 and within_context)):
        grew_tools = len(ratios) > 1 and ratios[1] >= ratios[0]
        out["explained_by"] = "tool_time" if grew_tools else "response_tokens"
    else:
        out["explained_by"] = "time_per_token"
    tail = _median(w.get("tail_share") for w in now)
    cause = {"response_tokens": "rollout_tail", "tool_time": "slow_tools"}.get(out["explained_by"])
    if cause == "rollout_tail" and (tail is None or tail < THRESHOLDS["tail_share"]):
        cause = None  # more tokens for every sample: no tail to cut
    if cause:  # the cause the samples point at, with its levers (analyze/diagnosis/causes.py)
        out["cause"], out["levers"] = cause, levers(cause, STAGE)
    return out


def explain_rollout(timeline: dict, sample_steps: list[dict]) -> None:
    """Adds `why` to each spike, level shift and drift of rollout_generate where the run recorded its samples, and
    the flagged step's slowest samples."""
    waits = stage_waits(timeline)
    by_step = {s["step"]: _workload(s, waits) for s in sample_steps}
    if not by_step:
        return
    flagged = steps_not_the_jobs(timeline)
    judged = [s for s in timeline["steps"] if s not in flagged and s in by_step]
    slowest = {s["step"]: s.get("slowest", []) for s in sample_steps}
    for spike in (e for e in timeline["spikes"] if e["stage"] == STAGE and e["step"] in by_step):
        before = [s for s in judged if s < spike["step"]][-WINDOW:]
        why = _why([by_step[spike["step"]]], [by_step[s] for s in before])
        if why:
            spike["why"] = {**why, "slowest": slowest[spike["step"]]}
    for shift in (e for e in timeline.get("level_shifts", []) if e["stage"] == STAGE):
        before = [s for s in judged if s < shift["from_step"]][-WINDOW:]
        after = [s for s in judged if s >= shift["from_step"]][:WINDOW] or [shift["from_step"]]
        why = _why([by_step[s] for s in after if s in by_step], [by_step[s] for s in before])
        if why:
            shift["why"] = {**why, "slowest": slowest.get(shift["from_step"], [])}
    for drift in (e for e in timeline["drift"] if e["stage"] == STAGE):
        quarter = max(1, len(judged) // 4)
        why = _why([by_step[s] for s in judged[-quarter:]], [by_step[s] for s in judged[:quarter]])
        if why:
            drift["why"] = {**why, "slowest": slowest.get(judged[-1], [])}


def captured_samples(doc: dict, cap: dict) -> dict | None:
    """A captured step's samples, said step by step: the captured step's own (on the captured rank where the host
    says the rank): its slowest, the decode steps where its slowest sample ran alone (after the next longest had
    finished) and how many of those the captured window kept, its `why` against the judged steps before the spike;
    and, where the trigger saw the spike at an earlier step whose samples were recorded (the watch records every
    watched step's), that step's own under `spike`: its slowest, where its slowest ran alone, and its `why` (the
    captured step ran under the profiler, whose own cost is in its samples' times: the spike's are the program's).
    None where the run has no samples of either step."""
    steps = {s["step"]: s for s in doc.get("sample_steps", [])}
    seen = cap["trigger"].get("step")
    if cap["step"] not in steps and seen not in steps:
        return None
    timeline = doc.get("timeline") or {}
    flagged = steps_not_the_jobs(timeline)
    at = seen if seen in steps else cap["step"]
    waits = stage_waits(timeline)
    before = [_workload(steps[s], waits) for s in sorted(steps) if s < at and s not in flagged][-WINDOW:]
    kept = sorted(
        r["index"]
        for r in doc["rows"]
        if r.get("file") == cap["path"] and r.get("unit") == "decode_step" and isinstance(r.get("index"), int)
    )
    out = (
        _step_samples(doc, steps[cap["step"]], cap.get("rank"), before, kept, waits)
        if cap["step"] in steps
        else {"step": cap["step"], "samples": 0, "slowest": []}
    )
    if seen in steps and seen != cap["step"]:
        out["spike"] = _step_samples(doc, steps[seen], cap.get("rank"), before, None, waits)
    return out


def _step_samples(doc: dict, summary: dict, rank, before: list[dict], kept: list[int] | None, waits: dict) -> dict:
    """One step's samples as a capture says them (`kept`: the captured window's decode steps, None for a step no
    window holds)."""
    step = summary["step"]
    mine = [
        s for s in doc["samples"] if s["step"] == step and (s.get("rank") is None or rank is None or s["rank"] == rank)
    ]
    out: dict = {"step": step, "samples": len(mine), "slowest": summary["slowest"]}
    decoded = sorted((s for s in mine if "last_decode_step" in s), key=lambda s: -s["last_decode_step"])
    if len(decoded) >= 2 and decoded[0]["last_decode_step"] > decoded[1]["last_decode_step"]:
        first, last = decoded[1]["last_decode_step"] + 1, decoded[0]["last_decode_step"]
        inside = [k for k in kept or () if first <= k <= last]
        out["alone"] = {
            "sample": decoded[0]["sample"],
            "response_tokens": decoded[0].get("response_tokens"),
            "next_longest_tokens": decoded[1].get("response_tokens"),
            "decode_steps": [first, last],
            "kept": [inside[0], inside[-1]] if inside else None,
            "window": [kept[0], kept[-1]] if kept else None,
        }
    why = _why([_workload(summary, waits)], before)
    if why:
        out["why"] = why
    return out


def steps_not_the_jobs(timeline: dict) -> set:
    """The steps whose times are not the job's own, left out of a baseline: the warm-up, the captured and profiled
    steps (the profiler's cost is in them), those contention slowed (the trigger's flag, the run over time's records);
    a busy step whose time contention did not explain is the job's."""
    out = set(timeline.get("warmup_steps", [])) | set(timeline.get("captured_steps", []))
    out |= set(timeline.get("profiled_steps", [])) | set(timeline.get("contention_steps", []))
    return out | {s for c in timeline.get("contention", []) for s in c["steps"]}
