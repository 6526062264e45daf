"""A run's own step metrics, read without any trace: the cheapest answer to "which stage, which steps".

Three formats, told apart line by line:
- verl's file logger (verl/utils/tracking.py FileLogger): JSONL `{"step": N, "data": {"timing_s/gen": ...}}`;
- verl's console logger: text lines `step:N - key:value - key:value ...` (what users paste from their logs);
- rlprof's trainer: metrics.jsonl `{"step": N, "stage_ms": {...}, "step_ms": ..., "response_length": ...}`.
Times become seconds per stage under rlprof's stage names (frameworks/verl.py TIMING_STAGES). The steady steps and
their median times (what predicted savings scale to) are read here; the trends over the steps are
over_time/step_trends.py's.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

from ...errors import AnalyzeError
from ...frameworks import verl
from .busy_machine import machine_load

CONSOLE_STEP = re.compile(r"step:(\d+)\s+-\s+(.*)$")
CONSOLE_PAIR = re.compile(r"([\w/@.\-]+):((?:np\.\w+\()?[-+0-9.eE]+|nan|inf)\)?")


def _number(text: str) -> float | None:
    text = re.sub(r"^np\.\w+\(", "", text).rstrip(")")
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _from_verl(step: int, data: dict) -> dict:
    stages = {}
    for key, value in data.items():
        if key.startswith(verl.TIMING_PREFIX) and isinstance(value, (int, float)) and math.isfinite(value):
            name = key[len(verl.TIMING_PREFIX) :]
            if name in verl.TIMING_STAGES:
                stages[verl.TIMING_STAGES[name]] = float(value)
    step_s = data.get(verl.TIMING_PREFIX + "step")
    length = data.get(verl.RESPONSE_LENGTH_KEY)
    return {
        "step": step,
        "stages": stages,
        "step_s": float(step_s) if isinstance(step_s, (int, float)) else None,
        "response_length": float(length) if isinstance(length, (int, float)) else None,
    }


def read_step_metrics(path: str | Path) -> tuple[str, list[dict]]:
    """(format, [{step, stages: {stage: s}, step_s, response_length}]) from a metrics file; a line that is none
    of the formats is skipped, a file with no step at all is refused."""
    path = Path(path)
    if path.is_dir():
        found = sorted(path.rglob("metrics.jsonl"))
        if not found:
            raise AnalyzeError(
                f"{path} holds no metrics.jsonl; allowed: verl's file-logger JSONL, a verl console "
                "log, rlprof's metrics.jsonl"
            )
        path = found[0]
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        raise AnalyzeError(f"{path}: {exc.strerror}; allowed: a readable metrics file") from None
    kinds, out = set(), {}
    for line in lines:
        line = line.strip()
        rec = None
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("step"), int) and isinstance(obj.get("data"), dict):
                rec, kind = _from_verl(obj["step"], obj["data"]), "verl file logger"
            elif isinstance(obj, dict) and isinstance(obj.get("step"), int) and isinstance(obj.get("stage_ms"), dict):
                rec = {
                    "step": obj["step"],
                    "stages": {k: v / 1e3 for k, v in obj["stage_ms"].items() if isinstance(v, (int, float))},
                    "step_s": obj["step_ms"] / 1e3 if isinstance(obj.get("step_ms"), (int, float)) else None,
                    "response_length": obj.get("response_length"),
                    "profiled": bool(obj.get("profiled")),
                    "load": machine_load(obj),
                }
                kind = "rlprof metrics"
        elif (m := CONSOLE_STEP.search(line)) is not None:
            pairs = {k: _number(v) for k, v in CONSOLE_PAIR.findall(m.group(2))}
            rec, kind = _from_verl(int(m.group(1)), {k: v for k, v in pairs.items() if v is not None}), "verl console"
        if rec is not None and (rec["stages"] or rec["step_s"] is not None):
            kinds.add(kind)
            out[rec["step"]] = rec  # a step logged twice (a resumed run): the last
    if not out:
        raise AnalyzeError(
            f"{path} holds no step metrics with stage timings; allowed: verl's file-logger JSONL "
            '({"step": N, "data": {"timing_s/gen": ...}}), verl console lines (step:N - '
            "timing_s/gen:...), rlprof's metrics.jsonl"
        )
    return " + ".join(sorted(kinds)), [out[k] for k in sorted(out)]


def on_busy_machine(record: dict) -> bool:
    """Whether the step ran on a busy machine (analyze/inputs/busy_machine.py's rule over the trainer's per-step host fields)."""
    return bool((record.get("load") or {}).get("busy"))


def steady_steps(records: list[dict]) -> list[dict]:
    """The steps a run's own timings are read from: unprofiled (the profiler's own cost left out) where any is,
    after the first of those (compilation, allocation, warm-up) where others remain, and not busy (a neighbour's
    timings left out) where any is not."""
    unprofiled = [r for r in records if not r.get("profiled")] or records
    later = unprofiled[1:] or unprofiled
    return [r for r in later if not on_busy_machine(r)] or later


def unprofiled_times(path: str | Path) -> dict | None:
    """The median step and stage times (ms) of a run's steady unprofiled steps (steady_steps), from its rlprof
    metrics.jsonl; None where the file is absent, unreadable or holds no unprofiled step."""
    try:
        _, records = read_step_metrics(path)
    except AnalyzeError:
        return None
    unprofiled = [r for r in records if not r.get("profiled")]
    if not unprofiled:
        return None
    steady = steady_steps(unprofiled)
    stages = sorted({s for r in steady for s in r["stages"]})
    steps = [r["step_s"] for r in steady if r["step_s"] is not None]
    return {
        "source": str(path),
        "steps": [r["step"] for r in steady],
        "step_ms": statistics.median(steps) * 1e3 if steps else None,
        "stage_ms": {s: statistics.median(r["stages"].get(s, 0.0) for r in steady) * 1e3 for s in stages},
    }
