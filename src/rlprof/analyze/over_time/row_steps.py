"""A window whose file names no step (a rollout engine's own trace: verl's `agent_loop_rollout_replica_0/rank0.<ts>.
pt.trace.json.gz`, vLLM's or SGLang's) takes it from what rlprof recorded on the same wall clock, first found first:

- `samples`: the samples that ran inside its time range (half of a sample's life in it or more), all of one step;
- `watch`: the watch's step boundaries (the timeline's `start_unix_s` and step time): the step whose span holds half
  of the window or more;
- `windows`: the windows whose files name their step: the step whose windows' span holds it, or, for a rollout window,
  the step whose first window comes after it with the step before ended (a step's rollout runs before its training).

Each source either names one step, or is silent, or is ambiguous (samples of several steps ran inside it; it spans two
watched steps): ambiguous is said in a warning naming the steps, and the window keeps no step (a guess would put a
capture beside the wrong normal window). The step found goes on every record of that file (its units, operators,
collectives, launch and memory records); its rows say where it came from (`step_source`).

The clocks: a row's `start_us` is its file's (Kineto's events, relative to the file's `baseTimeNanoseconds`), the
samples' are the earliest base's (analyze/diagnosis/samples.py), the watch's are epoch seconds; all are the wall
clock of the host that wrote them.
"""

from __future__ import annotations

from pathlib import Path

from ..diagnosis.samples import clock_base_us
from ..inputs.timeline_file import timeline_ranks

KEYS = ("rows", "ops", "collectives", "launch", "memory")
ROLLOUT = "rollout_generate"


def timeline_dirs(path) -> list[Path]:
    """The run directories under `path` that hold a watch's timeline: itself, or those right under it (a verl
    save_path holds the driver's)."""
    path = Path(path)
    if not path.is_dir():
        return []
    if timeline_ranks(path):
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and timeline_ranks(p))


def place_steps(doc: dict, samples: list[dict], bounds: list[tuple[int, float, float]]) -> list[str]:
    """Give the windows with no step the step the samples, the watch's boundaries or the other windows place them in
    (module doc); returns the warnings of those it could not place without a guess."""
    base = clock_base_us(doc["inputs"])
    if base is None:
        return []  # no trace names its clock: nothing to put on the samples' or the watch's
    offset = {Path(i["path"]).name: (i["clock_base_ns"] / 1e3 - base) for i in doc["inputs"] if i.get("clock_base_ns")}
    windows = [r for r in doc["rows"] if r["unit"] is None and r.get("start_us") is not None and r.get("file")]
    spans = {}
    for r in windows:
        if r["file"] in offset:
            start = r["start_us"] + offset[r["file"]]
            spans.setdefault(r["file"], []).append((r, start, start + r["wall_ms"] * 1e3))
    named = [(r["step"], a, b) for rows in spans.values() for r, a, b in rows if isinstance(r["step"], int)]
    warnings, placed = [], {}
    for file, rows in spans.items():
        if any(r["step"] is not None for r, _, _ in rows):
            continue
        start, end = min(a for _, a, _ in rows), max(b for _, _, b in rows)
        stage = rows[0][0]["stage"]
        for source, steps in (
            ("samples", _by_samples(samples, start, end)),
            ("watch", _by_watch(bounds, (start + base) / 1e6, (end + base) / 1e6)),
            ("windows", _by_windows(named, start, end, stage)),
        ):
            if len(steps) == 1:
                placed[file] = (steps[0], source)
                break
            if len(steps) > 1:
                warnings.append(
                    f"{file}: no step said: its time range holds steps {', '.join(map(str, steps))} by the "
                    f"{'samples that ran inside it' if source == 'samples' else source} (ambiguous, not guessed)"
                )
                break
    for key in KEYS:
        for rec in doc[key]:
            if rec.get("file") in placed and rec.get("step") is None:
                rec["step"] = placed[rec["file"]][0]
                if key == "rows":
                    rec["step_source"] = placed[rec["file"]][1]
    return warnings


def _by_samples(samples: list[dict], start: float, end: float) -> list[int]:
    """The steps of the samples that spent half of their life or more inside [start, end] (the samples' clock)."""
    steps = set()
    for s in samples:
        a, b = s.get("start_us"), s.get("end_us")
        if a is None or b is None:
            continue
        inside = min(b, end) - max(a, start)
        if inside > 0 and inside >= 0.5 * max(b - a, 1.0):
            steps.add(s["step"])
    return sorted(steps)


def _by_watch(bounds: list[tuple[int, float, float]], start_s: float, end_s: float) -> list[int]:
    """The watched steps whose span holds half of [start_s, end_s] or more (epoch seconds)."""
    half = 0.5 * max(end_s - start_s, 1e-6)
    return sorted({step for step, a, b in bounds if min(b, end_s) - max(a, start_s) >= half})


def _by_windows(named: list[tuple[int, float, float]], start: float, end: float, stage: str | None) -> list[int]:
    """The step whose named windows' span holds [start, end]; or, for a rollout window, the step whose first window
    starts after it ends while the step before has ended before it starts."""
    span: dict[int, list[float]] = {}
    for step, a, b in named:
        lo, hi = span.setdefault(step, [a, b])
        span[step] = [min(lo, a), max(hi, b)]
    inside = sorted(step for step, (a, b) in span.items() if a <= start and end <= b)
    if inside or stage != ROLLOUT:
        return inside
    after = sorted((a, step) for step, (a, _) in span.items() if a >= end)
    if not after:
        return []
    step = after[0][1]
    return [step] if all(b <= start for other, (_, b) in span.items() if other < step) else []
