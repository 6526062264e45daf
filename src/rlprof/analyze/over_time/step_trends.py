"""A run's own step metrics over its steps (`rlprof advise METRICS`): the stage that dominates, the outlier steps and
the stages that trend, with response length or the step index. The metrics are read by inputs/step_metrics.py."""

from __future__ import annotations

import statistics

from ..inputs.step_metrics import on_busy_machine, steady_steps

OUTLIER_FACTOR = 1.5  # a step taking this many times the median step is an outlier
TREND_R = 0.7  # correlation of a stage's time with response length (or the step index) that makes a trend
MIN_TREND_STEPS = 5
DOMINANT_SHARE = 0.35  # as diagnosis/causes.py THRESHOLDS["dominant_share"]


def _pearson(x: list[float], y: list[float]) -> float | None:
    if len(x) < 3 or statistics.pstdev(x) == 0 or statistics.pstdev(y) == 0:
        return None
    return statistics.correlation(x, y)


def diagnose_steps(records: list[dict]) -> dict:
    """The stage that dominates, the outlier steps and the stages that trend, from per-step timings. The first
    step is left out of means (it pays compilation, allocation and cache warm-up) where there are others; so are
    the steps recorded on a busy machine (`busy`, inputs/busy_machine.py: a neighbour's timings, not the program's), where
    others remain."""
    unprofiled = [r for r in records if not r.get("profiled")] or records  # the profiler's own cost is no outlier
    busy = [r for r in unprofiled if on_busy_machine(r)]
    steady = steady_steps(records)
    total = lambda r: r["step_s"] if r["step_s"] is not None else sum(r["stages"].values())  # noqa: E731
    stages = sorted({s for r in steady for s in r["stages"]})
    mean_step = statistics.fmean(total(r) for r in steady)
    means = {s: statistics.fmean(r["stages"].get(s, 0.0) for r in steady) for s in stages}
    shares = {s: (v / mean_step if mean_step else 0.0) for s, v in means.items()}
    dominant = max(shares, key=shares.get) if shares else None
    out = {
        "steps": [r["step"] for r in records],
        "mean_step_s": mean_step,
        "stages": [
            {"stage": s, "mean_s": means[s], "share": shares[s]} for s in sorted(stages, key=lambda s: -means[s])
        ],
        "dominant": {"stage": dominant, "share": shares[dominant]}
        if dominant and shares[dominant] >= DOMINANT_SHARE
        else None,
        "outliers": [],
        "trends": [],
        "busy": [{"step": r["step"], **r["load"]} for r in busy],
    }
    median_step = statistics.median(total(r) for r in steady)
    if len(steady) >= 4:
        for r in steady:
            if median_step and total(r) > OUTLIER_FACTOR * median_step:
                grew = {
                    s: r["stages"].get(s, 0.0) - statistics.median(q["stages"].get(s, 0.0) for q in steady)
                    for s in stages
                }
                stage = max(grew, key=grew.get) if grew else None
                extra = total(r) - median_step
                if stage is not None and grew[stage] < 0.5 * extra:  # most of the extra time is in no timed stage
                    stage = None
                out["outliers"].append(
                    {
                        "step": r["step"],
                        "step_s": total(r),
                        "median_step_s": median_step,
                        "stage": stage,
                        "stage_extra_s": grew.get(stage) if stage else None,
                    }
                )
    if len(steady) >= MIN_TREND_STEPS:
        lengths = [r["response_length"] for r in steady]
        for s in stages:
            times = [r["stages"].get(s, 0.0) for r in steady]
            if all(isinstance(v, (int, float)) for v in lengths):
                r_len = _pearson(lengths, times)
                if r_len is not None and r_len >= TREND_R:
                    slope = statistics.linear_regression(lengths, times).slope
                    out["trends"].append(
                        {"stage": s, "with": "response_length", "r": r_len, "s_per_100_tokens": slope * 100}
                    )
                    continue
            r_step = _pearson([float(r["step"]) for r in steady], times)
            if r_step is not None and r_step >= TREND_R:
                out["trends"].append(
                    {
                        "stage": s,
                        "with": "step",
                        "r": r_step,
                        "s_per_step": statistics.linear_regression([float(r["step"]) for r in steady], times).slope,
                    }
                )
    return out
