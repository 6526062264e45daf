"""Each captured window beside a normal window of the same stage (the document's `timeline.beside`,
docs/analysis_schema.md): per bucket the two times, the operators that grew most, and the cause of the slow step
with its lever and predicted saving where one applies (analyze/diagnosis/capture_cause.py).

Said step by step: where the trigger saw its step slow, whether the captured step repeated it (`repeat_of`), and
the rollout's samples of both steps where the run recorded them (over_time/rollout_why.py).

The normal window: for a straggler, the healthy rank captured at the same step; else the latest earlier window of
the same stage on the same rank that no trigger flagged as slow (a `baseline` capture, or a step listed in
global_profiler.steps). The stage compared is the one the trigger saw slow (within an end-to-end window, its
range); the whole step when the trigger judged the step."""

from __future__ import annotations

from ...vocab import STAGE_ROLE
from ..window.breakdown import BUCKETS
from ..diagnosis.capture_cause import judge, slow_rank_cause
from .rollout_why import WORKLOAD, captured_samples

SHOWN_BUCKETS = ("wall_ms", "compute_ms", "comm_ms", "idle_ms")
TOP_GREW = 5
MIN_GREW_MS = 0.05  # an operator that grew less is timer noise
# the captured step repeated the spike: its ratio over the baseline grew at least this share of the spike's
REPEATED = 0.5


def attach_beside(doc: dict) -> None:
    """Put `beside` in the document's timeline (where it has one); after the rows, operators and run config."""
    if doc.get("timeline") is not None:
        doc["timeline"]["beside"] = captures_beside(doc)


def _status(normal_ms: float, captured_ms: float) -> str:
    if not normal_ms:
        return "added"
    if not captured_ms:
        return "removed"
    return "slower" if captured_ms > normal_ms else "faster" if captured_ms < normal_ms else "same"


def _straggler_pair(cap: dict, captures: list[dict]) -> dict | None:
    """The healthy rank's window captured at the same step as a straggler's (the trigger takes both)."""
    t = cap["trigger"]
    if t.get("reason") == "straggler" and cap["rank"] == t.get("rank"):
        return next(
            (
                c
                for c in captures
                if c["step"] == cap["step"] and c["rank"] != cap["rank"] and c["stage"] == cap["stage"]
            ),
            None,
        )
    return None


def captures_beside(doc: dict) -> list[dict]:
    timeline = doc.get("timeline") or {}
    captures = [c for c in timeline.get("captures", []) if c["trigger"].get("reason") != "baseline"]
    if not captures:
        return []
    flagged = {c["path"] for c in captures}
    normal_files: dict[tuple, set] = {}  # (rank, stage) -> {(step, file)} of windows no trigger flagged as slow
    for r in doc["rows"]:
        if r.get("unit") is None and r.get("file") is not None and r["file"] not in flagged:
            normal_files.setdefault((r.get("rank"), r.get("stage")), set()).add((r.get("step"), r["file"]))
            if "_e2e_" in str(r["file"]):
                normal_files.setdefault((r.get("rank"), "step"), set()).add((r.get("step"), r["file"]))
    out = []
    for cap in captures:
        t = cap["trigger"]
        if not _judged(cap):
            continue  # the healthy rank captured beside the straggler: it is the normal window
        stage = t.get("stage")
        pair = _straggler_pair(cap, captures)
        if pair is not None:
            normal_file, why = pair["path"], f"rank {pair['rank']} at the same step"
        else:
            earlier = sorted(
                f for f in normal_files.get((cap["rank"], stage), ()) if f[0] is not None and f[0] < cap["step"]
            )
            if not earlier:
                wall = sum(r["wall_ms"] for r in _rows_of(doc, cap["path"], stage))
                why = (
                    "no normal window of this stage on this rank to put it beside (set "
                    "global_profiler.trigger.baseline: true, or list a normal step in steps)"
                )
                cause = judge(window_doc(doc, {cap["path"]}, cap["step"]), None, wall)
                out.append(_beside(cap, stage, None, why) | {"cause": cause})
                continue
            normal_file, why = earlier[-1][1], f"step {earlier[-1][0]} on the same rank"
        new, base = _rows_of(doc, cap["path"], stage), _rows_of(doc, normal_file, stage)
        buckets = {
            b: {"normal_ms": sum(r[b] for r in base), "captured_ms": sum(r[b] for r in new)} for b in SHOWN_BUCKETS
        }
        normal_step = next((r.get("step") for r in base), None)
        slow = (
            slow_rank_cause(window_doc(doc, {cap["path"], normal_file}, cap["step"]), cap["rank"], pair["rank"], stage)
            if pair is not None
            else None
        )
        cause = judge(
            window_doc(doc, {cap["path"]}, cap["step"]),
            window_doc(doc, {normal_file}, normal_step),
            buckets["wall_ms"]["captured_ms"] - buckets["wall_ms"]["normal_ms"],
            slow,
        )
        grew = _grew(doc, cap["path"], normal_file, stage)
        out.append(_beside(cap, stage, normal_file, why) | {"buckets": buckets, "grew": grew, "cause": cause})
    for record, cap in zip(out, [c for c in captures if _judged(c)]):
        said = captured_samples(doc, cap) if record["stage"] in ("rollout_generate", "step", None) else None
        if said is not None:  # the rollout's samples, step by step: the spike's own and the captured step's
            record["samples"] = said
        repeat = repeat_of(cap, record)
        if repeat is not None:
            record["repeat"] = repeat
    return out


def repeat_of(cap: dict, record: dict) -> dict | None:
    """Whether the captured step repeated what the trigger saw at its step (None for a request: nothing was seen).
    On the same step: yes. Else, where the spike's samples say their workload explains it, on the captured step's
    workload over the same baseline steps (`workload`: the longest sample's tokens, or tools); else, beside a normal
    window, on the captured window's wall time over it against the trigger's seconds over its baseline
    (`normal_window`: both windows ran under the profiler); else it cannot be told (`basis` null). Repeated: the
    captured step's ratio grew at least REPEATED of the spike's growth over 1."""
    t = cap["trigger"]
    seen, seconds, baseline = t.get("step"), t.get("seconds"), t.get("baseline_seconds")
    if seen is None or seconds is None or not baseline:
        return None
    out = {"spike_step": seen, "captured_step": cap["step"]}
    if seen == cap["step"]:
        return out | {"repeated": True, "basis": "same_step", "spike_ratio": seconds / baseline, "captured_ratio": None}
    said = record.get("samples") or {}
    spike_why, own_why = (said.get("spike") or {}).get("why") or {}, said.get("why") or {}
    normal_wall = record.get("buckets", {}).get("wall_ms", {}).get("normal_ms")
    if spike_why.get("explained_by") in WORKLOAD and own_why.get("workload_ratio") is not None:
        basis, spike_ratio, ratio = "workload", spike_why["workload_ratio"], own_why["workload_ratio"]
    elif record.get("normal") is not None and normal_wall:
        basis, spike_ratio = "normal_window", seconds / baseline
        ratio = record["buckets"]["wall_ms"]["captured_ms"] / normal_wall
    else:
        return out | {"repeated": None, "basis": None, "spike_ratio": seconds / baseline, "captured_ratio": None}
    repeated = ratio - 1 >= REPEATED * (spike_ratio - 1) if spike_ratio > 1 else None
    return out | {"repeated": repeated, "basis": basis, "spike_ratio": spike_ratio, "captured_ratio": ratio}


def _judged(cap: dict) -> bool:
    """A capture that gets its own `beside` record (a straggler's healthy rank is the other one's normal window)."""
    t = cap["trigger"]
    return not (t.get("reason") == "straggler" and cap["rank"] != t.get("rank"))


def _beside(cap: dict, stage, normal: str | None, why: str) -> dict:
    """The head of a `beside` record: the captured window, the stage compared, and which normal window, why."""
    return {
        "capture": cap["path"],
        "step": cap["step"],
        "rank": cap["rank"],
        "stage": stage,
        "reason": cap["trigger"].get("reason"),
        "normal": normal,
        "why": why,
    }


def _rows_of(doc: dict, file: str, stage) -> list[dict]:
    """A window's stage rows of `stage`, or all of its stage rows where the stage is not one of them (the step)."""
    rs = [r for r in doc["rows"] if r.get("file") == file and r.get("unit") is None]
    return [r for r in rs if r.get("stage") == stage] or rs


def _grew(doc: dict, captured: str, normal: str, stage) -> list[dict]:
    """The operators of the compared stage whose time grew most (CPU operators by self time, kernels by total)."""
    ops_new: dict[tuple, float] = {}
    ops_base: dict[tuple, float] = {}
    for op in doc["ops"]:
        side = ops_new if op.get("file") == captured else ops_base if op.get("file") == normal else None
        if side is not None and (op.get("stage") in (stage, "e2e") or stage == "step"):
            key = (op["kind"], op["name"])
            side[key] = side.get(key, 0.0) + (op["self_ms"] if op["kind"] == "cpu_op" else op["total_ms"])
    grew = []
    for key in set(ops_new) | set(ops_base):
        n, c = ops_base.get(key, 0.0), ops_new.get(key, 0.0)
        if c - n >= MIN_GREW_MS:
            grew.append(
                {
                    "kind": key[0],
                    "name": key[1],
                    "normal_ms": n,
                    "captured_ms": c,
                    "diff_ms": c - n,
                    "status": _status(n, c),
                }
            )
    return sorted(grew, key=lambda o: -o["diff_ms"])[:TOP_GREW]


def window_doc(doc: dict, files: set[str], step) -> dict:
    """A small document of the given windows, for the causes to be judged on them alone: their rows (units and the
    stage rows made from units included), operators, collectives, launches, memory and inputs, the run's config
    without its unprofiled medians (a saving is predicted for the captured step as it ran, not scaled back to the
    run's normal steps), and a wall-only row per stage the windows do not hold from the timeline at that step
    (median over ranks): a stage window alone would otherwise be all of its step (the reward's share of the step,
    for one)."""
    rows = [r for r in doc["rows"] if r.get("file") in files]
    made_from = {(r.get("step"), r.get("role"), r.get("stage"), r.get("rank")) for r in rows}
    rows += [
        r
        for r in doc["rows"]
        if r.get("file") is None
        and r.get("unit") is None
        and (r.get("step"), r.get("role"), r.get("stage"), r.get("rank")) in made_from
    ]
    rows += _context_rows(doc, rows, step)
    names = {str(f) for f in files}
    tagged = lambda key: [x for x in doc.get(key, []) if x.get("file") in names]  # noqa: E731
    run_config = doc.get("run_config")
    return {
        "inputs": [i for i in doc.get("inputs", []) if str(i.get("path", "")).rsplit("/", 1)[-1] in names],
        "rows": rows,
        "ops": tagged("ops"),
        "collectives": tagged("collectives"),
        "launch": tagged("launch"),
        "memory": tagged("memory"),
        "warnings": [],
        "partial": False,
        "run_config": {**run_config, "unprofiled": None} if run_config else None,
    }


def _context_rows(doc: dict, rows: list[dict], step) -> list[dict]:
    per_step = (doc.get("timeline") or {}).get("per_step") or {}
    steps = (doc.get("timeline") or {}).get("steps") or []
    if step not in steps:
        return []
    at = steps.index(step)
    held = {(r.get("stage"), r.get("rank")) for r in rows if r.get("unit") is None}
    ranks = sorted({r.get("rank") for r in rows if r.get("unit") is None}, key=str)
    out = []
    for stage, series in per_step.items():
        seconds = series["median"][at]
        if stage == "step" or stage not in STAGE_ROLE or seconds is None:
            continue
        for rank in ranks:
            if (stage, rank) not in held:
                out.append(
                    {
                        "step": step,
                        "role": STAGE_ROLE[stage],
                        "stage": stage,
                        "rank": rank,
                        "unit": None,
                        "index": None,
                        "file": None,
                        "replica": None,
                        "start_us": None,
                        "from_timeline": True,
                        **{b: 0.0 for b in BUCKETS},
                        "wall_ms": seconds * 1e3,
                    }
                )
    return out
