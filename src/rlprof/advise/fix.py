"""`rlprof advise RUN --fix`: the next training config: the overrides that apply the first lever of the first cause
the findings rank (or of `--cause`), with the values the run's measures give (analyze/diagnosis/savings.py), and the saving
predicted for them. With `--plan`: the first lever of every cause at once, one consistent config (no key is turned two
ways: frameworks/levers.py), and the plan's saving, each stage's counted once (analyze/diagnosis/plan.py). The causes,
their levers and the measure each is judged on are analyze/diagnosis/causes.py's records."""

from __future__ import annotations

from pathlib import Path

from ..analyze.diagnosis import savings
from ..analyze.diagnosis.causes import CAUSES, predict
from ..analyze.diagnosis.finding import Finding
from ..analyze.diagnosis.prediction import predicted
from ..frameworks.levers import lever_record, levers_for
from .shared import AdviseError, check_dialect, is_metrics_input, nest


def _literal(text: str):
    import yaml

    return yaml.safe_load(text)


def fix_for_run(run: str | Path, dialect: str, cause: str | None = None, plan: bool = False) -> dict:
    """`rlprof advise RUN --fix [--plan]`: the run analysed here, then fix_from (or plan_from)."""
    from ..analyze.pipeline import load_analysis

    check_dialect(dialect)
    if is_metrics_input(run):
        raise AdviseError(
            f"--fix needs a profiled run (its traces say why a step is slow); {run} holds step metrics "
            "only; allowed: a run directory with a manifest, a trace, verl's or MindSpeed-RL's output"
        )
    if plan and cause is not None:
        raise AdviseError("--plan writes every cause's first lever; --cause picks one: give one of them")
    doc = load_analysis(run, workers=1)
    return plan_from(doc, dialect, str(run)) if plan else fix_from(doc, dialect, cause, str(run))


def plan_from(doc: dict, dialect: str, run: str = "") -> dict:
    """The first lever of every cause the findings rank, in `dialect`, with the values the run's measures give: one
    config, a key set once (by the first cause that turns it; no cause turns a key another's way), and the plan's
    saving: each cause's predicted in this dialect, counted once per stage (analyze/diagnosis/plan.py). A cause
    whose lever has no key in the dialect, or whose value the data cannot give, is passed over and said."""
    from ..analyze.diagnosis.findings import prediction_context
    from ..analyze.diagnosis.plan import plan_of, plan_text

    check_dialect(dialect)
    found = [f for f in doc.get("findings", []) if f.get("actionable")]
    if not found:
        return _no_fix(run, dialect, "no cause above its threshold (docs/analysis_schema.md): nothing to fix")
    ctx = prediction_context(doc)
    parts, skipped, overrides = [], [], {}
    for entry in found:
        fixed = _first_fix(ctx, found, entry, dialect, skipped)
        if fixed is None:
            continue
        taken = {k: v for k, v in fixed["overrides"].items() if k in overrides and overrides[k] != v}
        if taken:  # set by a cause ranked before it, the same way (frameworks/levers.py: no key two ways)
            skipped.append(f"{entry['kind']}: {', '.join(taken)} already set by a cause ranked before it")
            continue
        overrides.update(fixed["overrides"])
        parts.append(fixed)
    if not parts:
        return _no_lever(run, dialect, skipped)
    entries = [
        {"kind": p["cause"], "stage": p["stage"], "saving": p["saving"], "levers": {dialect: p["lever_records"]}}
        for p in parts
    ]
    plan = plan_of(ctx, entries)
    saving = {
        "status": "predicted",
        "saving_ms": plan["total_ms"],
        "saving_share": plan["total_share"],
        "by_stage_ms": plan["by_stage_ms"],
        "step_ms": plan["step_ms"],
        "basis": plan["basis"],
        "setting": {},
        "dialect": dialect,
        "assumption": "each cause's first lever as predicted for it, savings on one stage counted once (each takes "
        "its share of what the others leave of the stage): "
        + "; ".join(f"{p['cause']} {p['saving']['saving_ms']:.1f} ms" for p in parts if p["saving"].get("saving_ms")),
    }
    fix = {
        "cause": "plan",
        "causes": [p["cause"] for p in parts],
        "stage": parts[0]["stage"],
        "stages": [s for p in parts for s in p["stages"]],
        "finding": plan_text(plan),
        "dialect": dialect,
        "overrides": overrides,
        "config": nest(overrides),
        "levers": [t for p in parts for t in p["levers"]],
        "saving": saving,
        "measure": None,
        "parts": parts,
        "plan": plan,
    }
    return {"run": run, "dialect": dialect, "fix": fix, "skipped": skipped, "reason": None}


def fix_from(doc: dict, dialect: str, cause: str | None = None, run: str = "") -> dict:
    """The overrides that apply the first lever of the first cause the findings rank (or of `cause`), in `dialect`,
    with the values the run's measures give (analyze/diagnosis/savings.py), and the saving predicted for them. A cause
    whose lever has no key in the dialect, or whose value the data cannot give, is passed over and said."""
    from ..analyze.diagnosis.findings import prediction_context

    check_dialect(dialect)
    found = [f for f in doc.get("findings", []) if f.get("actionable")]
    if cause is not None:
        if cause not in CAUSES:
            raise AdviseError(f"--cause {cause!r} is not a cause; allowed: {', '.join(CAUSES)}")
        found = [f for f in found if f["kind"] == cause]
        if not found:
            return _no_fix(run, dialect, f"no {cause} finding above its threshold in this run: nothing to fix")
    if not found:
        return _no_fix(run, dialect, "no cause above its threshold (docs/analysis_schema.md): nothing to fix")
    ctx = prediction_context(doc)
    skipped: list[str] = []
    for entry in found:
        result = _first_fix(ctx, found, entry, dialect, skipped)
        if result is not None:
            return {"run": run, "dialect": dialect, "fix": result, "skipped": skipped, "reason": None}
    return _no_lever(run, dialect, skipped)


def _first_fix(ctx, found: list[dict], entry: dict, dialect: str, skipped: list[str]) -> dict | None:
    """The fix of one finding: a cause found in several stages stage by stage, its first stage first (micro-batch
    sizes: all its stages at once); a stage whose lever cannot be written is said in `skipped`."""
    from ..analyze.diagnosis.cause_groups import finding_parts

    same = [part for g in found if g["kind"] == entry["kind"] for part in finding_parts(g)]
    for f in finding_parts(entry) if entry["kind"] != "small_units" else [entry]:
        result, why = _fix_one(ctx, f, same, dialect)
        if result is not None:
            return result
        skipped.append(f"{f['kind']} ({f.get('stage')}): {why}")
    return None


def _no_lever(run: str, dialect: str, skipped: list[str]) -> dict:
    return {
        "run": run,
        "dialect": dialect,
        "fix": None,
        "skipped": skipped,
        "reason": f"no cause of this run has a lever in the {dialect} dialect whose value the run gives",
    }


def _fix_one(ctx, f: dict, same: list[dict], dialect: str) -> tuple[dict | None, str]:
    if f["kind"] == "small_units":
        return _fix_sizes(ctx, same, dialect)
    levers = levers_for(f["kind"], dialect, f.get("stage"))
    if not levers:
        return None, f"no key of {dialect} is known to act on it"
    lv = levers[0]
    pred = predict(ctx, Finding.of(f), dialect)
    overrides, why = _lever_values(lv, pred.get("setting") or {}, f.get("stage"))
    if overrides is None:
        return None, why if pred["status"] == "predicted" else f"{why} ({pred['why']})"
    return _fix_record(f, dialect, overrides, pred, [lv]), ""


def _lever_values(lv, setting: dict, stage) -> tuple[dict | None, str]:
    """{key: value} for a lever: its literal value, or the setting it names (raise/lower), and its companions."""
    if lv.set in ("raise", "lower"):
        value = setting.get(lv.value) if lv.value else None
        if isinstance(value, dict):  # per stage (micro-batch sizes)
            value = value.get(stage, next(iter(value.values()), None))
        if value is None:
            return None, f"{lv.key}: the value to {lv.set} it to is not given by this run's data"
        out = {lv.key: value}
    else:
        out = {lv.key: _literal(lv.set)}
    for key, spec in lv.also:
        if spec.startswith("{") and spec.endswith("}"):
            if setting.get(spec[1:-1]) is None:
                return None, f"{key}: not given by this run's data"
            out[key] = setting[spec[1:-1]]
        else:
            out[key] = _literal(spec)
    return out, ""


def _fix_sizes(ctx, same: list[dict], dialect: str) -> tuple[dict | None, str]:
    """Micro-batches too small, wherever found: each stage's first size lever, one size per key for the stages it
    acts on. In rlprof's trainer an unset log-prob size follows the update's: pinned to its value now when only
    the update's size changes."""
    by_key: dict[str, tuple] = {}
    for f in same:
        lv = next((lv for lv in levers_for("small_units", dialect, f.get("stage")) if lv.value), None)
        if lv is not None and lv.key not in by_key:
            by_key[lv.key] = (lv, savings.lever_stages(f["stage"], dialect, ctx))
    if not by_key:
        return None, f"no micro-batch size key of {dialect} is known for {', '.join(f['stage'] for f in same)}"
    overrides, parts, words, used = {}, {}, [], []
    for key, (lv, stages) in by_key.items():
        pred = savings.small_units(ctx, stages)
        if pred["status"] != "predicted":
            return None, pred["why"]
        size = next(iter(pred["setting"]["micro_batch_size"].values()))
        overrides[key] = size
        used.append(lv)
        for s, ms in pred["profiled_ms"].items():
            parts[s] = parts.get(s, 0.0) + ms
        words.append(pred["assumption"].split("; scaled")[0].split("; times of")[0])
    if (
        dialect == "rlprof"
        and "actor.micro_batch_size" in overrides
        and "actor.log_prob_micro_batch_size" not in overrides
    ):
        if ctx.conf("actor.log_prob_micro_batch_size") is None and ctx.conf("actor.micro_batch_size") is not None:
            overrides["actor.log_prob_micro_batch_size"] = ctx.conf("actor.micro_batch_size")
            words.append("actor.log_prob_micro_batch_size kept at its value now (unset, it follows the update's)")
    pred = predicted(ctx, parts, "; ".join(words))
    pred["dialect"] = dialect
    f = same[0]
    return _fix_record(f, dialect, overrides, pred, used, stages=[g["stage"] for g in same]), ""


def _fix_record(f: dict, dialect: str, overrides: dict, pred: dict, levers: list, stages=None) -> dict:
    return {
        "cause": f["kind"],
        "stage": f.get("stage"),
        "stages": stages or [f.get("stage")],
        "finding": f["text"],
        "dialect": dialect,
        "overrides": overrides,
        "config": nest(overrides),
        "levers": [lv.text() for lv in levers],
        "lever_records": [lever_record(lv) for lv in levers],
        "saving": pred,
        "measure": _measure(f["kind"]),
    }


def _measure(kind: str) -> tuple[str, str | None] | None:
    """The measure the cause is judged on and its threshold's key (analyze/diagnosis/causes.py): after the fix the measure
    is to fall below it."""
    cause = CAUSES.get(kind)
    return (cause.measure, cause.threshold) if cause else None


def overrides_line(overrides: dict) -> str:
    """key=value ... as a command line gives them (Hydra style)."""

    def text(v):
        if v is None:
            return "null"
        if isinstance(v, bool):
            return "true" if v else "false"
        return str(v)

    return " ".join(f"{k}={text(v)}" for k, v in overrides.items())


def fix_text(result: dict) -> str:
    """The fix as a YAML file: what it acts on and is predicted to save in comments, then the overrides nested."""
    from omegaconf import OmegaConf

    fx = result["fix"]
    s = fx["saving"]
    what = f"plan: {', '.join(fx['causes'])}" if fx["cause"] == "plan" else f"cause: {fx['cause']}"
    said = (
        f"{s['saving_ms']:.1f} ms per step ({s['saving_share']:.0%} of the step)"
        if s["status"] == "predicted" and s.get("saving_share") is not None
        else "not predictable from this data: " + s.get("why", "")
    )
    lines = [
        f"# rlprof advise --fix ({result['dialect']} dialect) from {result['run']}",
        f"# {what} ({', '.join(str(x) for x in fx['stages'])}): {fx['finding']}",
        f"# lever: {'; '.join(fx['levers'])}",
        f"# predicted saving: {said}",
        f"# as overrides: {overrides_line(fx['overrides'])}",
    ]
    return "\n".join(lines) + "\n" + OmegaConf.to_yaml(OmegaConf.create(fx["config"]))


def _no_fix(run: str, dialect: str, reason: str) -> dict:
    """A --fix result that writes nothing, and why."""
    return {"run": run, "dialect": dialect, "fix": None, "skipped": [], "reason": reason}
