"""Findings: the answer before the tables. Pure functions over an analysis document (SPEC §4b).

Each finding is one sentence with its numbers, the evidence it rests on and the threshold that let it fire
(documented in docs/analysis_schema.md). Nothing fires below its threshold; the list is ranked: a slow rank
first (it holds every other rank up), then the stage that dominates the step, then where the time goes inside a
stage, then step-to-step variance, cut windows, and units that repeat (where sampling one is enough).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from .breakdown import order_key
from .ranks import per_rank, slow_ranks

THRESHOLDS = {
    "dominant_share": 0.35,  # a stage holding at least this share of the step (with 2+ stages marked)
    "stage_share": 0.10,  # stages below this share of the step get no bucket finding of their own
    "idle_share": 0.25,  # idle (device or thread waiting on nothing) at least this share of a stage
    "comm_share": 0.10,  # communication not hidden behind compute at least this share of a stage
    "memcpy_share": 0.10,  # copies overlapped by neither at least this share of a stage
    "min_ms": 0.5,  # below this a bucket is timer noise, whatever its share
    "variance": 0.25,  # (max - min) / mean of a stage's wall over 2+ steps of one rank
    "repeat_units": 4,  # at least this many units of one kind in a stage window
    "repeat_same_ops": 0.8,  # this share of them run the same set of operators
    "repeat_cv": 0.25,  # and their wall times vary by at most this coefficient of variation
}
UNIT_WORDS = {"micro_batch": "micro-batches", "mini_batch": "mini-batches", "decode_step": "decode steps"}
ORDER = ("slow_rank", "dominant_stage", "exposed_comm", "idle", "memcpy", "variance", "truncated", "repeating_units")


def _rank_key(r: dict):
    return r["replica"] if r.get("role") == "rollout" and r.get("replica") is not None else r.get("rank")


def stage_means(doc: dict) -> dict[tuple, dict]:
    """(role, stage) -> the mean per step over ranks of every bucket, with the steps and ranks seen."""
    per: dict[tuple, list[dict]] = defaultdict(list)
    for r in doc["rows"]:
        if r.get("unit") is None:
            per[(r.get("role"), r.get("stage"))].append(r)
    out = {}
    for key, rows in per.items():
        steps = {r.get("step") for r in rows}
        ranks = {_rank_key(r) for r in rows}
        per_step = len(steps) * len(ranks)  # a stage marked twice in a step counts twice
        out[key] = {b: sum(r[b] for r in rows) / per_step
                    for b in ("wall_ms", "compute_ms", "comm_ms", "overlap_ms", "memcpy_ms", "idle_ms")}
        out[key].update(steps=sorted(steps, key=order_key), ranks=len(ranks), rows=len(rows))
    return out


def _where(role, stage) -> str:
    return f"{role}/{stage}" if stage else "the profiled window"


def findings(doc: dict) -> list[dict]:
    """Ranked findings for one analysis document."""
    t = THRESHOLDS
    out: list[dict] = []
    means = stage_means(doc)
    staged = {k: v for k, v in means.items() if k[1] is not None}
    step_total = sum(v["wall_ms"] for v in staged.values())

    for s in slow_ranks(per_rank(doc), doc):
        ev = s["evidence"]
        out.append(_finding("slow_rank", ev["others_wait_ms"] - ev["wait_ms"], ev["summary"], ev,
                            role=s["role"], stage=s["stage"], rank=s["rank"]))

    if len(staged) >= 2 and step_total > 0:
        (role, stage), top = max(staged.items(), key=lambda kv: kv[1]["wall_ms"])
        share = top["wall_ms"] / step_total
        if share >= t["dominant_share"]:
            second = sorted(staged.items(), key=lambda kv: -kv[1]["wall_ms"])[1]
            out.append(_finding(
                "dominant_stage", top["wall_ms"],
                f"{stage} dominates the step: {share:.0%} of the staged time ({top['wall_ms']:.1f} of "
                f"{step_total:.1f} ms per step, mean over {top['ranks']} rank(s)); next is {second[0][1]} "
                f"({second[1]['wall_ms'] / step_total:.0%})",
                {"share": share, "stage_ms": top["wall_ms"], "step_ms": step_total, "next": second[0][1]},
                role=role, stage=stage))

    colls = _collectives_by_stage(doc)
    candidates = staged if staged else means  # an unmarked trace: the whole window
    ranges_only = _ranges_only(doc)
    for (role, stage), m in candidates.items():
        if staged and m["wall_ms"] < t["stage_share"] * step_total or m["wall_ms"] <= 0:
            continue
        if (role, stage) in ranges_only:  # markers windows hold ranges, not work: no bucket to judge
            continue
        for kind, bucket, limit, why in (
                ("exposed_comm", "comm_ms", t["comm_share"], "collectives not hidden behind compute"),
                ("idle", "idle_ms", t["idle_share"], "no operator or kernel running (host overhead, waiting, gaps "
                                                     "between launches)"),
                ("memcpy", "memcpy_ms", t["memcpy_share"], "copies overlapped by neither compute nor communication")):
            share = m[bucket] / m["wall_ms"]
            if share < limit or m[bucket] < t["min_ms"]:
                continue
            label = {"exposed_comm": "exposed communication", "idle": "idle", "memcpy": "memcpy"}[kind]
            text = f"{label} is {share:.0%} of {_where(role, stage)} ({m[bucket]:.1f} of {m['wall_ms']:.1f} ms): {why}"
            ev = {"share": share, "bucket_ms": m[bucket], "wall_ms": m["wall_ms"]}
            if kind == "exposed_comm" and colls.get((role, stage)):
                top = colls[(role, stage)][:3]
                text += " (" + ", ".join(f"{c['name']} {c['ms']:.1f} ms" for c in top) + ")"
                ev["collectives"] = top
            out.append(_finding(kind, m[bucket], text, ev, role=role, stage=stage))

    out += _variance(doc)
    for i in doc.get("inputs", []):
        if i.get("window_status") == "truncated":
            out.append(_finding("truncated", 0.0, f"{i['path']} was cut short by its max_bytes_per_window budget: "
                                "the stage after the cut is missing from it", {"path": i["path"]}))
    out += _repeating_units(doc)
    out.sort(key=lambda f: (ORDER.index(f["kind"]), -f["impact_ms"]))
    return out


def _ranges_only(doc: dict) -> set[tuple]:
    """(role, stage) pairs seen only in windows of the markers tool (ranges, no operators)."""
    markers = {i["path"].rsplit("/", 1)[-1] for i in doc.get("inputs", []) if i.get("tool") == "markers"}
    seen: dict[tuple, bool] = {}
    for r in doc["rows"]:
        key = (r.get("role"), r.get("stage"))
        seen[key] = seen.get(key, True) and r.get("file") in markers
    return {k for k, only in seen.items() if only}


def _finding(kind: str, impact_ms: float, text: str, evidence: dict, **where) -> dict:
    return {"kind": kind, "impact_ms": float(impact_ms), "text": text, "evidence": evidence,
            "role": where.get("role"), "stage": where.get("stage"), "rank": where.get("rank")}


def _collectives_by_stage(doc: dict) -> dict[tuple, list[dict]]:
    total: dict[tuple, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for c in doc.get("collectives", []):
        total[(c.get("role"), c.get("stage"))][c["name"]] += c["total_ms"]
    return {k: sorted(({"name": n, "ms": ms} for n, ms in v.items()), key=lambda c: -c["ms"])
            for k, v in total.items()}


def _variance(doc: dict) -> list[dict]:
    """A stage whose wall time changes by a quarter or more from step to step on one rank."""
    per: dict[tuple, dict] = defaultdict(dict)
    for r in doc["rows"]:
        if r.get("unit") is None and r.get("stage") and r.get("step") is not None:
            per[(r.get("role"), r["stage"], _rank_key(r))][r["step"]] = r["wall_ms"]
    out = []
    for (role, stage, rank), by_step in per.items():
        if len(by_step) < 2:
            continue
        walls = list(by_step.values())
        mean = statistics.fmean(walls)
        spread = max(walls) - min(walls)
        if mean <= 0 or spread / mean < THRESHOLDS["variance"] or spread < THRESHOLDS["min_ms"]:
            continue
        hi = max(by_step, key=by_step.get)
        lo = min(by_step, key=by_step.get)
        out.append(_finding("variance", spread, f"{role}/{stage} on rank {rank} varies {spread / mean:.0%} from step to "
                            f"step ({by_step[lo]:.1f} ms at step {lo}, {by_step[hi]:.1f} ms at step {hi}): profile "
                            "more than one step before trusting one", {"by_step": by_step, "spread_ms": spread},
                            role=role, stage=stage, rank=rank))
    return out


def _repeating_units(doc: dict) -> list[dict]:
    """Units (decode steps, micro-/mini-batches) of one stage window that run the same operators in about the
    same time: sampling one of them tells as much as collecting all."""
    t = THRESHOLDS
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in doc["rows"]:
        if r.get("unit") is not None and r.get("stage"):
            groups[(r.get("role"), r["stage"], r["unit"], r.get("step"), r.get("rank"))].append(r)
    best: dict[tuple, dict] = {}
    for (role, stage, unit, step, rank), units in groups.items():
        if len(units) < t["repeat_units"]:
            continue
        sigs = [u.get("ops_sig") for u in units]
        common = max(sigs.count(s) for s in set(sigs)) if all(sigs) else 0
        walls = [u["wall_ms"] for u in units]
        mean = statistics.fmean(walls)
        cv = statistics.pstdev(walls) / mean if mean else 0.0
        if common / len(units) < t["repeat_same_ops"] or cv > t["repeat_cv"]:
            continue
        key = (role, stage, unit)
        if key not in best or len(units) > best[key]["evidence"]["units"]:
            total = sum(walls)
            best[key] = _finding(
                "repeating_units", total - mean,
                f"the {len(units)} {UNIT_WORDS.get(unit, unit)} of {role}/{stage} run the same operators ({common} of "
                f"{len(units)} alike) at {mean:.2f} ms ± {cv:.0%}: one of them ({{unit: {unit}, active: 1}}) "
                f"represents the rest at 1/{len(units)} of the data",
                {"units": len(units), "same_ops": common, "mean_ms": mean, "cv": cv, "unit": unit, "step": step},
                role=role, stage=stage, rank=rank)
    return list(best.values())
