"""The rollout stage accounted for, step by step: where the host timed its rollout stage (the watch: verl's `gen`
timer, rlprof's `rollout_generate`) and recorded its samples, the stage's time split into the samples' generation
(each generation pass's first start to last end, summed over the passes) and the rest, outside generation: the time
before the first sample started and after the last ended, and what rlprof can name inside (verl's driver says when
its gen timer began and ended and when the replay buffer handed the batch over, `timeline/rollout.jsonl`: the wait
after the last sample for the buffer to see it, and the replicas put to sleep, with the rollout profiler stopped
and its trace written on a profiled step). With DAPO's dynamic sampling, the time its refills added: rlprof's trainer
numbers its passes (the refill passes' spans); verl's driver notes when its replay buffer dispatched each refill
(the generation that went on after the last sample started before the first refill had ended), and how many groups
its filter dropped.

A step the plan or a capture profiled carries the profiler's own start and stop in its stage: it is accounted for
and marked, and left out of the share the finding judges (analyze/diagnosis/measures.py: `outside_share`).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from ..inputs.timeline_file import CAPTURED, PROFILED, read_rollout_windows
from .watched import Loaded

STAGE = "rollout_generate"


def rollout_account(run_dirs: list[Path], samples: list[dict], clock_base_us: float | None) -> list[dict]:
    """One record per watched step whose samples were recorded (module doc); [] where none was."""
    if not samples:
        return []
    base = clock_base_us or 0.0  # the samples' clock: epoch µs less the traces' base
    by_step: dict = defaultdict(list)
    for s in samples:
        if s.get("start_us") is not None and s.get("end_us") is not None:
            by_step[s["step"]].append(s)
    out = []
    for run_dir in run_dirs:
        t = Loaded(run_dir)
        if STAGE not in t.stages or not len(t.steps):
            continue
        windows: dict = defaultdict(list)
        for w in read_rollout_windows(run_dir):
            windows[w["step"]].append(w)
        with np.errstate(all="ignore"):
            stage_s = np.fmax.reduce(t.stages[STAGE], axis=0)
        for i, step in enumerate(int(s) for s in t.steps):
            rows = by_step.get(step)
            if not rows or not np.isfinite(stage_s[i]):
                continue
            rec = _account(step, float(stage_s[i]) * 1e3, rows, base, windows.get(step, []))
            rec["profiled"] = bool(t.flags[i] & (CAPTURED | PROFILED)) or any(
                w.get("profiled") for w in windows.get(step, [])
            )
            out.append(rec)
    return sorted(out, key=lambda r: r["step"])


def _account(step: int, stage_ms: float, rows: list[dict], base: float, windows: list[dict]) -> dict:
    passes: dict = defaultdict(list)
    for r in rows:
        passes[r.get("rollout_pass", 0)].append(r)
    generation = sum((max(r["end_us"] for r in p) - min(r["start_us"] for r in p)) / 1e3 for p in passes.values())
    first = (min(r["start_us"] for r in rows) + base) / 1e6  # epoch seconds
    last = (max(r["end_us"] for r in rows) + base) / 1e6
    rec = {
        "step": step,
        "stage_ms": stage_ms,
        "generation_ms": generation,
        "outside_ms": max(0.0, stage_ms - generation),
        "outside_share": max(0.0, stage_ms - generation) / stage_ms if stage_ms > 0 else None,
        "samples": len(rows),
        "passes": len(passes),
    }
    if len(passes) > 1:  # the host numbered its passes (rlprof's trainer): each refill pass after the first
        rec["refill_ms"] = sum(
            (max(r["end_us"] for r in p) - min(r["start_us"] for r in p)) / 1e3 for k, p in passes.items() if k > 0
        )
    refills = sorted(t for w in windows for t, _ in w.get("refills", []))
    if refills:  # verl's replay buffer refilled: the samples started after its first refill are the refills'
        first_refill = (refills[0] * 1e6) - base
        first_batch = [r for r in rows if r["start_us"] < first_refill]
        ended = max((r["end_us"] for r in first_batch), default=first_refill)
        rec["refill_ms"] = max(0.0, (max(r["end_us"] for r in rows) - ended) / 1e3)
        rec["refill_samples"] = len(rows) - len(first_batch)
        rec["refills"] = len(refills)
    filtered = sum(w.get("filtered_groups", 0) for w in windows)
    if filtered:
        rec["filtered_groups"] = filtered
    if windows:
        start = min(w["start_unix_s"] for w in windows)
        end = max(w["end_unix_s"] for w in windows)
        sampled = max(w.get("sampled_unix_s", w["end_unix_s"]) for w in windows)
        rec["before_ms"] = (first - start) * 1e3  # negative: generation began before the stage (prompts sent earlier)
        rec["after_ms"] = (end - last) * 1e3
        rec["handover_ms"] = max(0.0, (sampled - last) * 1e3)  # the last sample done, the batch not yet handed over
        rec["release_ms"] = (end - sampled) * 1e3  # after the handover: replicas to sleep, a profiler stopped
    return rec
