"""Findings: the answer before the tables. Pure functions over an analysis document.

Each finding is one sentence with its numbers, the evidence it rests on and the threshold that let it fire
(documented in docs/analysis_schema.md). Nothing fires below its threshold. A finding with a cause (from the RL
measures: a rollout tail, padding, micro-batches too small, an unused reference pass, a slow reward, weight
sync, exposed communication, a launch-bound device, memory left unused, a slow rank) carries `cause`, `levers`:
the config keys that act on it in verl, MindSpeed-RL and rlprof's trainer (frameworks/levers.py), and `saving`:
what turning its first lever is predicted to save per step (analyze/savings.py). Those come first, a slow rank
before the rest (the others' stage times include their wait for it, so their own predictions are not the
program's own until it keeps pace), then by predicted saving, then the causes whose saving the data cannot
predict, by the time they cost; then the descriptive ones: the dominant stage, idle and copies inside a stage, step-to-step variance, cut
windows, and units that repeat (where sampling one is enough).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from ..frameworks.levers import CAUSES, levers
from .breakdown import order_key
from .load import EXTERNAL_SHARE, WAIT_SHARE, machine_load
from .measures import measures
from .ranks import per_rank, slow_ranks
from .savings import attach as attach_savings

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
    "tail_share": 0.30,  # decode-step time in the rollout tail (few rows still active), at least this share
    "padding_share": 0.30,  # tokens computed in micro-batches that are padding, at least this share
    "fixed_share": 0.50,  # micro-batch time that does not grow with tokens, at least this share
    "fixed_units": 4,  # with at least this many micro-batches per pass (fewer: nothing to merge)
    "reward_share": 0.15,  # the reward stage, at least this share of the step (it runs on the critical path)
    "weight_sync_share": 0.15,  # weight sync, at least this share of the step
    "launch_bound_share": 0.25,  # device idle waiting on launches, at least this share of a stage
    "memory_use_low": 0.50,  # peak allocated below this share of the device's memory: room left
}
UNIT_WORDS = {"micro_batch": "micro-batches", "mini_batch": "mini-batches", "decode_step": "decode steps"}
ORDER = ("busy_machine", "slow_rank", "dominant_stage", "exposed_comm", "idle", "memcpy", "variance", "truncated", "repeating_units")
# finding kind -> the cause it names (frameworks/levers.py); the others describe where, not why
CAUSE_OF = {"slow_rank": "slow_rank", "exposed_comm": "exposed_comm", "rollout_tail": "rollout_tail",
            "padding": "padding", "small_units": "small_units", "unused_reference": "unused_reference",
            "slow_reward": "slow_reward", "weight_sync": "weight_sync", "launch_bound": "launch_bound",
            "memory_headroom": "memory_headroom"}


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
    """Ranked findings for one analysis document (and its `measures`). Windows recorded while the machine was busy
    (their threads waited for a core) are said first and, where quieter windows exist, left out of what ranks."""
    busy, quiet_left = busy_windows(doc)
    said = [_busy_finding(i, load, quiet_left) for i, load in busy]
    ranked_doc = ranked_document(doc, busy, quiet_left)
    ranked = findings_of(ranked_doc)
    doc["measures"] = ranked_doc["measures"]
    return said + ranked


def ranked_document(doc: dict, busy=None, quiet_left=None) -> dict:
    """The document the causes are ranked on: without the windows recorded on a busy machine where quieter ones
    exist."""
    if busy is None:
        busy, quiet_left = busy_windows(doc)
    return _without(doc, {_name(i["path"]) for i, _ in busy}) if busy and quiet_left else doc


def prediction_context(doc: dict):
    """What analyze/savings.py predicts from for this document (its ranked windows): savings.Run."""
    from .savings import Run

    ranked = ranked_document(doc)
    means = stage_means(ranked)
    step_total = sum(v["wall_ms"] for k, v in means.items() if k[1] is not None)
    ranked.setdefault("measures", doc.get("measures") or measures(ranked, means))
    return Run(ranked, means, step_total, THRESHOLDS)


def busy_windows(doc: dict) -> tuple[list[tuple[dict, dict]], bool]:
    """([(input, its load)] of the windows recorded on a busy machine, whether any window with that record was
    quiet). The rule is analyze/load.py's: the window's threads waited for a core a quarter of their runnable time
    while other processes (not the job's own ranks) used a fifth of the host's CPUs."""
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


def _busy_finding(i: dict, load: dict, quiet_left: bool) -> dict:
    step = f" (step {i['step']})" if i.get("step") is not None else ""
    rest = ("it is left out of the causes and measures, which come from the quieter windows" if quiet_left else
            "every window was, so the causes below rank timings that are not the program's own: profile again on "
            "a quieter machine, or with fewer threads (rlprof's trainer: trainer.threads)")
    return {**_finding("busy_machine", i["run_wait_ms"],
                       f"the machine was busy while {_name(i['path'])}{step} was recorded: other processes used "
                       f"{load['external_share']:.0%} of its CPUs and this process's threads waited for a core "
                       f"{load['wait_share']:.0%} of the time they were ready to run ({i['run_wait_ms']:.0f} of "
                       f"{i['cpu_ms'] + i['run_wait_ms']:.0f} ms), so its timings are not the program's own; {rest}",
                       {"path": i["path"], "run_wait_ms": i["run_wait_ms"], "cpu_ms": i["cpu_ms"], **load,
                        "thresholds": {"wait_share": WAIT_SHARE, "external_share": EXTERNAL_SHARE}}),
            "cause": None, "levers": {}, "actionable": False, "levers_text": ""}


def _name(path: str) -> str:
    return str(path).rsplit("/", 1)[-1]


def _without(doc: dict, files: set[str]) -> dict:
    """The document without the rows of these files (stage rows made from their units included)."""
    made_from = {(r.get("step"), r.get("role"), r.get("stage"), r.get("rank")) for r in doc["rows"]
                 if r.get("file") in files}
    keep = [r for r in doc["rows"] if r.get("file") not in files
            and not (r.get("file") is None and (r.get("step"), r.get("role"), r.get("stage"), r.get("rank")) in made_from)]
    return {**doc, "rows": keep}


def findings_of(doc: dict) -> list[dict]:
    """Ranked findings for the windows of one analysis document (sets doc["measures"])."""
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
    out = _one_idle_finding(out)

    out += _variance(doc)
    for i in doc.get("inputs", []):
        if i.get("window_status") == "truncated":
            out.append(_finding("truncated", 0.0, f"{i['path']} was cut short by its max_bytes_per_window budget: "
                                "the stage after the cut is missing from it", {"path": i["path"]}))
    out += _repeating_units(doc)
    doc["measures"] = measures(doc, means)
    out += _cause_findings(doc, doc["measures"], means, step_total)
    for f in out:
        cause = CAUSE_OF.get(f["kind"])
        f["cause"] = CAUSES[cause].title if cause else None
        f["levers"] = levers(cause, f.get("stage")) if cause else {}
        f["actionable"] = bool(f["levers"])
        f["levers_text"] = "; ".join(f"{d}: " + ", ".join(lv["text"] for lv in lvs) for d, lvs in f["levers"].items())
    attach_savings(doc, out, means, step_total, t)
    out.sort(key=_rank)
    return out


def _rank(f: dict):
    """Causes first: a slow rank before the rest (the other ranks' stage times hold their wait for it, so what the
    other causes are predicted to save there is not yet the program's own), then by predicted saving per step, then
    those whose saving the data cannot predict, by the time they cost; then the descriptive findings (a busy machine
    is said before all, by findings())."""
    if f["actionable"]:
        saving = f.get("saving_ms")
        return (0, f["kind"] != "slow_rank", saving is None, -(saving if saving is not None else f["impact_ms"]))
    return (1, ORDER.index(f["kind"]) if f["kind"] in ORDER else len(ORDER), -f["impact_ms"])


def _cause_findings(doc: dict, found: list[dict], means: dict, step_total: float) -> list[dict]:
    """Findings from the RL measures, each above its threshold (docs/analysis_schema.md)."""
    t = THRESHOLDS
    out = []
    big = lambda m: step_total <= 0 or _stage_ms(means, m["stage"]) >= t["stage_share"] * step_total  # noqa: E731
    for m in found:
        v, role, stage = m["value"], m["role"], m["stage"]
        if m["status"] != "measured" or v is None:
            continue
        where = _where(role, stage)
        if m["measure"] == "rollout_tail" and v >= t["tail_share"] and big(m) and m["tail_ms"] >= t["min_ms"]:
            out.append(_finding("rollout_tail", m["tail_ms"],
                                f"rollout tail: {v:.0%} of {where}'s decode time is spent with fewer than half of "
                                f"the rows still generating ({m['tail_steps']} of {m['decode_steps']} decode steps; "
                                f"{m['mean_active_share']:.0%} of rows active on average)", m, role=role, stage=stage))
        elif m["measure"] == "padding" and v >= t["padding_share"] and big(m):
            stage_ms = _stage_ms(means, stage)
            out.append(_finding("padding", stage_ms * v,
                                f"padding: {v:.0%} of the tokens {where} computes are pad ({m['real_tokens']} real of "
                                f"{m['tokens']} computed over {m['micro_batches']} micro-batches)", m,
                                role=role, stage=stage))
        elif (m["measure"] == "fixed_cost" and v >= t["fixed_share"] and m["units_per_pass"] >= t["fixed_units"]
              and big(m)):
            out.append(_finding("small_units", m["fixed_ms_per_pass"],
                                f"micro-batches too small: {v:.0%} of {where}'s micro-batch time is a fixed "
                                f"{m['fixed_ms']:.2f} ms per micro-batch that does not grow with tokens "
                                f"({m['units_per_pass']:.0f} micro-batches of {m['mean_seqs']:.1f} rows per pass)", m,
                                role=role, stage=stage))
        elif m["measure"] == "reward_share" and v >= t["reward_share"]:
            out.append(_finding("slow_reward", m["stage_ms"],
                                f"slow reward: {stage} takes {v:.0%} of the step ({m['stage_ms']:.1f} of "
                                f"{m['step_ms']:.1f} ms) on the critical path: generation is done and training "
                                "has not begun while it scores", m, role=role, stage=stage))
        elif m["measure"] == "weight_sync_share" and v >= t["weight_sync_share"]:
            out.append(_finding("weight_sync", m["stage_ms"],
                                f"weight sync takes {v:.0%} of the step ({m['stage_ms']:.1f} of {m['step_ms']:.1f} ms)",
                                m, role=role, stage=stage))
        elif m["measure"] == "launch_bound" and v >= t["launch_bound_share"] and big(m):
            out.append(_finding("launch_bound", m["launch_bound_ms"],
                                f"launch-bound: the device waits on the host to launch work {v:.0%} of {where} "
                                f"({m['launch_bound_ms']:.1f} of {m['wall_ms']:.1f} ms)", m, role=role, stage=stage))
        elif m["measure"] == "memory_use" and v < t["memory_use_low"]:
            out.append(_finding("memory_headroom", 0.0,
                                f"memory headroom: the peak is {v:.0%} of the device's memory ({m['peak_bytes'] / 2**30:.1f}"
                                f" of {m['capacity_bytes'] / 2**30:.1f} GiB) in {m['file']}: larger micro-batches fit",
                                m, role=role, stage=stage, rank=m.get("rank")))
    cfg = doc.get("run_config") or {}
    ref_ms = _stage_ms(means, "ref_compute_log_prob")
    if cfg.get("reference_pass") and cfg.get("kl_coef") == 0 and ref_ms >= t["min_ms"]:
        out.append(_finding("unused_reference", ref_ms,
                            f"unused reference pass: ref_compute_log_prob takes {ref_ms:.1f} ms per step "
                            f"({ref_ms / step_total:.0%}) and the run's KL coefficient is 0 ({cfg['source']}): the "
                            "log-probs it computes change no gradient",
                            {"ref_ms": ref_ms, "kl_coef": cfg["kl_coef"], "source": cfg["source"]},
                            role="ref", stage="ref_compute_log_prob"))
    return out


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


def _one_idle_finding(found: list[dict]) -> list[dict]:
    """Idle in several stages is one finding for the run, its stages inside it (largest idle first): idle is where
    nothing ran, and its stages share the same few reasons, so one sentence per stage only repeats itself."""
    idle = [f for f in found if f["kind"] == "idle"]
    if len(idle) < 2:
        return found
    idle.sort(key=lambda f: -f["evidence"]["bucket_ms"])
    idle_ms = sum(f["evidence"]["bucket_ms"] for f in idle)
    wall_ms = sum(f["evidence"]["wall_ms"] for f in idle)
    stages = [{"role": f["role"], "stage": f["stage"], **f["evidence"]} for f in idle]
    parts = ", ".join(f"{_where(s['role'], s['stage'])} {s['share']:.0%} ({s['bucket_ms']:.1f} of {s['wall_ms']:.1f} ms)"
                      for s in stages)
    text = (f"idle is {idle_ms / wall_ms:.0%} of {len(stages)} stages ({idle_ms:.1f} of {wall_ms:.1f} ms): {parts}: "
            "no operator or kernel running (host overhead, waiting, gaps between launches)")
    merged = _finding("idle", idle_ms, text, {"share": idle_ms / wall_ms, "bucket_ms": idle_ms, "wall_ms": wall_ms,
                                             "stages": stages}, role=idle[0]["role"], stage=idle[0]["stage"])
    return [f for f in found if f["kind"] != "idle"] + [merged]


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
