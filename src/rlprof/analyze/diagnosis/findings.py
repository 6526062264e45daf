"""Findings: the answer before the tables. Pure functions over an analysis document that return new values.

Each finding is one sentence with its numbers, the evidence it rests on and the threshold that let it fire
(documented in docs/analysis_schema.md). Nothing fires below its threshold. The causes (a rollout tail, padding,
micro-batches too small, an unused reference pass, a slow reward, weight sync, exposed communication, a
launch-bound device, memory left unused, a slow rank) are the records of analyze/diagnosis/causes.py, which say when each
fires; a cause's finding carries `cause`, `levers`: the config keys that act on it in verl, MindSpeed-RL and
rlprof's trainer (frameworks/levers.py), and `saving`: what turning its first lever is predicted to save per step
(analyze/diagnosis/savings.py). Those come first, a slow rank before the rest (the others' stage times include their wait
for it, so their own predictions are not the program's own until it keeps pace), then by predicted saving, then
the causes whose saving the data cannot predict, by the time they cost; then the descriptive ones: the dominant
stage, idle and copies inside a stage, step-to-step variance, cut windows, and units that repeat (where sampling
one is enough).

The functions here compute Finding values (analyze/diagnosis/finding.py); their sentences are made by analyze/diagnosis/sentences.py
when the document's findings are assembled (diagnose).

Over 400 lines because it finds every kind of finding (the causes judged on measures, the stage buckets, idle,
variance, repeating units, busy windows) beside the one ranking they share.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import NamedTuple

from ...frameworks.levers import levers
from ..window.breakdown import order_key
from ..window.idle_frames import idle_said
from ..inputs.busy_machine import EXTERNAL_SHARE, WAIT_SHARE, machine_load
from .cause_groups import one_per_cause, one_per_root
from .causes import CAUSES, ORDER, THRESHOLDS, UNIT_WORDS, Judging, predict
from .finding import Finding
from .measures import measures
from .ranks import per_rank, slow_ranks
from .prediction import PredictionContext, not_predictable
from .sentences import render

__all__ = [
    "THRESHOLDS",
    "UNIT_WORDS",
    "Diagnosis",
    "diagnose",
    "findings",
    "findings_of",
    "stage_means",
    "prediction_context",
    "ranked_document",
    "ranked_findings",
    "busy_windows",
]


class Diagnosis(NamedTuple):
    """What the findings add to a document: its RL measures and its ranked findings (rendered)."""

    measures: list[dict]
    findings: list[dict]


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
        out[key] = {
            b: sum(r[b] for r in rows) / per_step
            for b in ("wall_ms", "compute_ms", "comm_ms", "overlap_ms", "memcpy_ms", "idle_ms")
        }
        out[key].update(steps=sorted(steps, key=order_key), ranks=len(ranks), rows=len(rows))
    return out


def diagnose(doc: dict) -> Diagnosis:
    """The measures and ranked findings of one analysis document, the findings rendered (analyze/diagnosis/sentences.py) once
    all is computed. Windows recorded while the machine was busy (their threads waited for a core) are said first
    and, where quieter windows exist, left out of what ranks."""
    busy, quiet_left = busy_windows(doc)
    said = [_busy_finding(i, load, quiet_left) for i, load in busy]
    found_measures, ranked = ranked_findings(ranked_document(doc, busy, quiet_left))
    return Diagnosis(found_measures, [render(f) for f in said] + [render(f, saving) for f, saving in ranked])


def findings(doc: dict) -> list[dict]:
    """The ranked findings of one analysis document (diagnose's, without the measures)."""
    return diagnose(doc).findings


def findings_of(doc: dict) -> list[dict]:
    """The ranked findings of every window of one analysis document (no window left out as busy), rendered."""
    return [render(f, saving) for f, saving in ranked_findings(doc)[1]]


def ranked_findings(doc: dict) -> tuple[list[dict], list[tuple[Finding, dict | None]]]:
    """(the RL measures, [(finding, its predicted saving or None)] ranked) over every window of `doc`."""
    means = stage_means(doc)
    step_total = sum(v["wall_ms"] for k, v in means.items() if k[1] is not None)
    found_measures = measures(doc, means)
    found = find(doc, means, found_measures)
    ctx = PredictionContext({**doc, "measures": found_measures}, means, step_total, THRESHOLDS)
    pairs = [(f, _saving(ctx, f) if actionable(f) else None) for f in found]
    return found_measures, sorted(one_per_root(one_per_cause(pairs, _rank)), key=lambda pair: _rank(*pair))


def actionable(f: Finding) -> bool:
    """A cause with a lever for its stage in some framework."""
    return f.kind in CAUSES and bool(levers(f.kind, f.stage))


def _saving(ctx: PredictionContext, f: Finding) -> dict:
    try:
        return predict(ctx, f)
    except (KeyError, ValueError, ZeroDivisionError, TypeError) as exc:  # data a formula did not expect
        return not_predictable(f"the data does not fit the formula ({type(exc).__name__}: {exc})")


def ranked_document(doc: dict, busy=None, quiet_left=None) -> dict:
    """The document the causes are ranked on: without the windows recorded on a busy machine where quieter ones
    exist."""
    if busy is None:
        busy, quiet_left = busy_windows(doc)
    return _without(doc, {_name(i["path"]) for i, _ in busy}) if busy and quiet_left else doc


def prediction_context(doc: dict) -> PredictionContext:
    """What analyze/diagnosis/savings.py predicts from for this document (its ranked windows)."""
    ranked = ranked_document(doc)
    means = stage_means(ranked)
    step_total = sum(v["wall_ms"] for k, v in means.items() if k[1] is not None)
    found_measures = doc["measures"] if "measures" in doc else measures(ranked, means)
    return PredictionContext({**ranked, "measures": found_measures}, means, step_total, THRESHOLDS)


def busy_windows(doc: dict) -> tuple[list[tuple[dict, dict]], bool]:
    """([(input, its load)] of the windows recorded on a busy machine, whether any window with that record was
    quiet). The rule is analyze/inputs/busy_machine.py's: the window's threads waited for a core a quarter of their
    runnable time while other processes (not the job's own ranks) used a fifth of the host's CPUs."""
    busy, quiet = [], False
    for i in doc.get("inputs", []):
        load = machine_load(i)
        if load is None:
            continue
        if load["busy"]:
            busy.append((i, load))
        else:
            quiet = True
    return busy, quiet


def _busy_finding(i: dict, load: dict, quiet_left: bool) -> Finding:
    return Finding(
        "busy_machine",
        i["run_wait_ms"],
        {
            "path": i["path"],
            "run_wait_ms": i["run_wait_ms"],
            "cpu_ms": i["cpu_ms"],
            **load,
            "thresholds": {"wait_share": WAIT_SHARE, "external_share": EXTERNAL_SHARE},
        },
        said={"name": _name(i["path"]), "step": i.get("step"), "quiet_left": quiet_left},
    )


def _name(path: str) -> str:
    return str(path).rsplit("/", 1)[-1]


def _without(doc: dict, files: set[str]) -> dict:
    """The document without the rows of these files (stage rows made from their units included), and without the
    samples of the steps only they recorded (a busy step's samples are as slowed as its windows)."""
    made_from = {
        (r.get("step"), r.get("role"), r.get("stage"), r.get("rank")) for r in doc["rows"] if r.get("file") in files
    }
    keep = [
        r
        for r in doc["rows"]
        if r.get("file") not in files
        and not (r.get("file") is None and (r.get("step"), r.get("role"), r.get("stage"), r.get("rank")) in made_from)
    ]
    out = {**doc, "rows": keep}
    gone = {step for step, *_ in made_from} - {r.get("step") for r in keep}
    if gone and doc.get("samples"):
        out["samples"] = [r for r in doc["samples"] if r["step"] not in gone]
        out["sample_steps"] = [s for s in doc.get("sample_steps", []) if s["step"] not in gone]
    return out


def find(doc: dict, means: dict, found_measures: list[dict]) -> list[Finding]:
    """Every finding of the windows of `doc`, unranked, in the order they are looked for."""
    staged = {k: v for k, v in means.items() if k[1] is not None}
    step_total = sum(v["wall_ms"] for v in staged.values())
    out = _slow_ranks(doc)
    out += _dominant_stage(staged, step_total)
    out += _one_idle_finding(_stage_buckets(doc, means, staged, step_total))
    out += _variance(doc)
    out += [
        Finding("truncated", 0.0, {"path": i["path"]})
        for i in doc.get("inputs", [])
        if i.get("window_status") == "truncated"
    ]
    out += _repeating_units(doc)
    out += _measured_causes(found_measures, means, step_total)
    out += _unused_reference(doc, means, step_total)
    return out


def _slow_ranks(doc: dict) -> list[Finding]:
    out = []
    for s in slow_ranks(per_rank(doc), doc):
        ev = s["evidence"]
        out.append(Finding("slow_rank", ev["others_wait_ms"] - ev["wait_ms"], ev, s["role"], s["stage"], s["rank"]))
    return out


def _dominant_stage(staged: dict, step_total: float) -> list[Finding]:
    if len(staged) < 2 or step_total <= 0:
        return []
    (role, stage), top = max(staged.items(), key=lambda kv: kv[1]["wall_ms"])
    share = top["wall_ms"] / step_total
    if share < THRESHOLDS["dominant_share"]:
        return []
    second = sorted(staged.items(), key=lambda kv: -kv[1]["wall_ms"])[1]
    return [
        Finding(
            "dominant_stage",
            top["wall_ms"],
            {"share": share, "stage_ms": top["wall_ms"], "step_ms": step_total, "next": second[0][1]},
            role,
            stage,
            said={"ranks": top["ranks"], "next_share": second[1]["wall_ms"] / step_total},
        )
    ]


# bucket findings: (kind, bucket, its threshold)
BUCKET_KINDS = (
    ("exposed_comm", "comm_ms", "comm_share"),
    ("idle", "idle_ms", "idle_share"),
    ("memcpy", "memcpy_ms", "memcpy_share"),
)


def _stage_buckets(doc: dict, means: dict, staged: dict, step_total: float) -> list[Finding]:
    """Exposed communication, idle and copies, each at least its threshold share of a stage large enough to
    matter (of the whole window in an unmarked trace)."""
    t = THRESHOLDS
    out = []
    colls = _collectives_by_stage(doc)
    candidates = staged if staged else means  # an unmarked trace: the whole window
    ranges_only = _ranges_only(doc)
    for (role, stage), m in candidates.items():
        if staged and m["wall_ms"] < t["stage_share"] * step_total or m["wall_ms"] <= 0:
            continue
        if (role, stage) in ranges_only:  # markers windows hold ranges, not work: no bucket to judge
            continue
        for kind, bucket, limit in BUCKET_KINDS:
            share = m[bucket] / m["wall_ms"]
            if share < t[limit] or m[bucket] < t["min_ms"]:
                continue
            ev = {"share": share, "bucket_ms": m[bucket], "wall_ms": m["wall_ms"]}
            if kind == "exposed_comm" and colls.get((role, stage)):
                ev["collectives"] = colls[(role, stage)][:3]
            if kind == "idle":  # the frames the host was in meanwhile, where its stacks were sampled
                ev.update(idle_said([r for r in doc["rows"] if (r.get("role"), r.get("stage")) == (role, stage)]))
            out.append(Finding(kind, m[bucket], ev, role, stage))
    return out


def _measured_causes(found_measures: list[dict], means: dict, step_total: float) -> list[Finding]:
    """The causes judged on a measure (causes.py: `judge`), each measured record against its cause's rule."""
    judging = Judging(
        THRESHOLDS,
        lambda m: step_total <= 0 or _stage_ms(means, m["stage"]) >= THRESHOLDS["stage_share"] * step_total,
        lambda stage: _stage_ms(means, stage),
    )
    by_measure: dict[str, list] = defaultdict(list)  # a measure may be judged by several causes (a queue: where held)
    for c in CAUSES.values():
        if c.judge is not None:
            by_measure[c.measure].append(c)
    out = []
    for m in found_measures:
        if m["status"] != "measured" or m["value"] is None:
            continue
        for cause in by_measure.get(m["measure"], ()):
            impact = cause.judge(m, judging)
            if impact is not None:
                out.append(Finding(cause.name, impact, m, m["role"], m["stage"], m.get("rank")))
    return out


def _unused_reference(doc: dict, means: dict, step_total: float) -> list[Finding]:
    """The reference pass runs and the run's own config says its KL coefficient is 0."""
    cfg = doc.get("run_config") or {}
    ref_ms = _stage_ms(means, "ref_compute_log_prob")
    if not (cfg.get("reference_pass") and cfg.get("kl_coef") == 0 and ref_ms >= THRESHOLDS["min_ms"]):
        return []
    return [
        Finding(
            "unused_reference",
            ref_ms,
            {"ref_ms": ref_ms, "kl_coef": cfg["kl_coef"], "source": cfg["source"]},
            "ref",
            "ref_compute_log_prob",
            said={"step_share": ref_ms / step_total},
        )
    ]


# The causes not judged on a measure record, and the function here that finds each.
FOUND_BY = {"slow_rank": _slow_ranks, "exposed_comm": _stage_buckets, "unused_reference": _unused_reference}


def _rank(f: Finding, saving: dict | None):
    """Causes first: a slow rank before the rest (the other ranks' stage times hold their wait for it, so what the
    other causes are predicted to save there is not yet the program's own), then by predicted saving per step, then
    those whose saving the data cannot predict, by the time they cost; then the descriptive findings (a busy machine
    is said before all, by diagnose())."""
    if actionable(f):
        ms = saving.get("saving_ms") if saving else None
        return (0, f.kind != "slow_rank", ms is None, -(ms if ms is not None else f.impact_ms))
    return (1, ORDER.index(f.kind) if f.kind in ORDER else len(ORDER), -f.impact_ms)


def _stage_ms(means: dict, stage) -> float:
    return sum(v["wall_ms"] for k, v in means.items() if k[1] == stage)


def _ranges_only(doc: dict) -> set[tuple]:
    """(role, stage) pairs seen only in windows of the markers tool (ranges, no operators)."""
    markers = {i["path"].rsplit("/", 1)[-1] for i in doc.get("inputs", []) if i.get("tool") == "markers"}
    seen: dict[tuple, bool] = {}
    for r in doc["rows"]:
        key = (r.get("role"), r.get("stage"))
        seen[key] = seen.get(key, True) and r.get("file") in markers
    return {k for k, only in seen.items() if only}


def _one_idle_finding(found: list[Finding]) -> list[Finding]:
    """Idle in several stages is one finding for the run, its stages inside it (largest idle first): idle is where
    nothing ran, and its stages share the same few reasons, so one sentence per stage only repeats itself."""
    idle = [f for f in found if f.kind == "idle"]
    if len(idle) < 2:
        return found
    idle.sort(key=lambda f: -f.evidence["bucket_ms"])
    idle_ms = sum(f.evidence["bucket_ms"] for f in idle)
    wall_ms = sum(f.evidence["wall_ms"] for f in idle)
    stages = [{"role": f.role, "stage": f.stage, **f.evidence} for f in idle]
    merged = Finding(
        "idle",
        idle_ms,
        {"share": idle_ms / wall_ms, "bucket_ms": idle_ms, "wall_ms": wall_ms, "stages": stages},
        idle[0].role,
        idle[0].stage,
    )
    return [f for f in found if f.kind != "idle"] + [merged]


def _collectives_by_stage(doc: dict) -> dict[tuple, list[dict]]:
    total: dict[tuple, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for c in doc.get("collectives", []):
        total[(c.get("role"), c.get("stage"))][c["name"]] += c["total_ms"]
    return {k: sorted(({"name": n, "ms": ms} for n, ms in v.items()), key=lambda c: -c["ms"]) for k, v in total.items()}


def _variance(doc: dict) -> list[Finding]:
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
        out.append(
            Finding(
                "variance",
                spread,
                {"by_step": by_step, "spread_ms": spread},
                role,
                stage,
                rank,
                said={
                    "spread_share": spread / mean,
                    "low_step": lo,
                    "low_ms": by_step[lo],
                    "high_step": hi,
                    "high_ms": by_step[hi],
                },
            )
        )
    return out


def _repeating_units(doc: dict) -> list[Finding]:
    """Units (decode steps, micro-/mini-batches) of one stage window that run the same operators in about the
    same time: sampling one of them tells as much as collecting all."""
    t = THRESHOLDS
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in doc["rows"]:
        if r.get("unit") is not None and r.get("stage"):
            groups[(r.get("role"), r["stage"], r["unit"], r.get("step"), r.get("rank"))].append(r)
    best: dict[tuple, Finding] = {}
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
        if key not in best or len(units) > best[key].evidence["units"]:
            total = sum(walls)
            best[key] = Finding(
                "repeating_units",
                total - mean,
                {"units": len(units), "same_ops": common, "mean_ms": mean, "cv": cv, "unit": unit, "step": step},
                role,
                stage,
                rank,
            )
    return list(best.values())
