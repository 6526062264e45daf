"""`rlprof advise`: the next profiling config, from what a run showed.

The loop people run by hand (markers first, then the bottleneck stage, then the suspect ranks, sampled inside
the stage so the data stays small), as one command: the findings say which stage, step and ranks; the size
model says how many units (decode steps, micro-/mini-batches) fit the budget; the config is written in the
user's dialect and resolved back through rlprof's own parser, so the prediction is made on the plan the next
run will really follow. `advise --check NEW_RUN` holds the prediction against what NEW_RUN wrote.

Sizes: bytes per stage window and per unit, from the run itself where it holds a torch trace of that stage,
else from the calibration table that bench/calibrate.py measures on the reference trainer (torch tool, CPU).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .analyze.findings import UNIT_WORDS
from .vocab import STAGE_ROLE
from .errors import RLProfError
from .frameworks import mindspeed, verl

DIALECTS = ("verl", "mindspeed", "rlprof")
CALIBRATION = Path(__file__).with_name("calibration.json")
# The unit each dialect can sample a stage by (None: the stage is collected whole).
UNITS = {
    "rlprof": {"rollout_generate": "decode_step", "actor_update": "micro_batch", "critic_update": "micro_batch",
               "actor_compute_log_prob": "micro_batch"},
    "verl": {"rollout_generate": verl.TOKEN_WINDOW_UNIT, **{s: verl.SCHEDULE_UNIT for s in verl.SCHEDULED_STAGES}},
    "mindspeed": {},  # MindSpeed-RL profiles a stage whole
}
# A stage the calibration did not sample by unit, measured through a stage running the same code per unit.
UNIT_PROXY = {"ref_compute_log_prob": "actor_compute_log_prob", "critic_compute_values": "actor_compute_log_prob",
              "critic_update": "actor_update"}
# The block that profiles a role: verl's ref follows the actor's profiler (one actor_rollout_ref worker).
ROLE_BLOCK = {**verl.ROLE_BLOCKS, "ref": verl.ROLE_BLOCKS["actor"]}
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|k|mb|m|gb|g|kib|mib|gib)?\s*$", re.IGNORECASE)
UNIT_BYTES = {None: 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "kib": 2**10,
              "mib": 2**20, "gib": 2**30}


class AdviseError(RLProfError):
    pass


def parse_size(text: str) -> int:
    m = SIZE.match(str(text))
    if not m or float(m.group(1)) <= 0:
        raise AdviseError(f"--budget {text!r} is not a size; allowed: a positive number with B, KB, MB, GB "
                          "(or KiB, MiB, GiB), e.g. 2MB")
    return int(float(m.group(1)) * UNIT_BYTES[(m.group(2) or "b").lower()])


@dataclass
class Target:
    stage: str
    role: str
    step: int
    ranks: list[int]
    why: list[str] = field(default_factory=list)


def choose_target(doc: dict) -> Target:
    """What the findings point at: the slow rank's stage (that rank and a healthy one), else the dominant stage,
    else the longest stage; the last profiled step (later steps are past the one-time costs)."""
    found = [f for f in doc.get("findings", []) if f.get("stage") in STAGE_ROLE]
    stages: dict[tuple, float] = {}
    for r in doc["rows"]:  # stages rlprof can write a config for (its canonical names)
        if r.get("unit") is None and r.get("stage") in STAGE_ROLE:
            key = (STAGE_ROLE[r["stage"]], r["stage"])
            stages[key] = stages.get(key, 0.0) + r["wall_ms"]
    if not stages:
        raise AdviseError("the run has no stage windows to target (no stage ranges were marked); allowed: a run "
                          "profiled by rlprof (markers mode is enough), verl's or MindSpeed-RL's output with stages")
    ranks_seen = sorted({r["rank"] for r in doc["rows"] if r.get("rank") is not None}) or [0]
    steps_seen = sorted({r["step"] for r in doc["rows"] if isinstance(r.get("step"), int)})
    step = steps_seen[-1] if steps_seen else 2
    slow = next((f for f in found if f["kind"] == "slow_rank"), None)
    dominant = next((f for f in found if f["kind"] == "dominant_stage"), None)
    if slow:
        healthy = [r for r in ranks_seen if r != slow["rank"]][:1]
        return Target(slow["stage"], STAGE_ROLE[slow["stage"]], step,
                      [slow["rank"], *healthy],
                      [f"stage {slow['stage']}: rank {slow['rank']} holds the others up there ({slow['text']})",
                       f"ranks {slow['rank']} (slow) and {healthy[0] if healthy else '-'} (healthy, to compare)"])
    if dominant:
        stage, role, why = dominant["stage"], STAGE_ROLE[dominant["stage"]], f"stage {dominant['stage']}: {dominant['text']}"
    else:
        (role, stage), ms = max(stages.items(), key=lambda kv: kv[1])
        why = f"stage {stage}: the longest stage ({ms:.1f} ms in the run), though none dominates"
    return Target(stage, role, step, ranks_seen[:1],
                  [why, f"rank {ranks_seen[0]}: no rank stands out, one is representative"])


class SizeModel:
    """Bytes of a torch window (CPU contents): a whole stage, or `overhead + k * per_unit` for k units of it."""

    def __init__(self, calibration: dict, run_windows: list[dict]):
        self.cal = calibration
        self.full = {s: v["full_bytes"] for s, v in calibration["stages"].items()}
        self.scale: dict[str, float] = {}
        self.source: dict[str, str] = {s: "calibration" for s in self.full}
        for w in run_windows:  # the run's own whole-stage torch windows rescale that stage
            stage = w.get("stage")
            if w.get("tool") == "torch" and w.get("status") == "complete" and stage in self.full and not w.get("unit"):
                self.scale[stage] = w["bytes"] / max(1.0, self.full[stage])
                self.source[stage] = "this run's own trace"

    def whole(self, stage: str) -> float:
        return self.full.get(stage, 0.0) * self.scale.get(stage, 1.0)  # a stage never measured wrote nothing

    def sampled(self, stage: str, unit: str, k: int) -> float:
        per = self.cal["units"].get(f"{stage}/{unit}") or self.cal["units"].get(f"{UNIT_PROXY.get(stage)}/{unit}")
        if per is None:
            return self.whole(stage)
        s = self.scale.get(stage, 1.0)
        return (per["overhead_bytes"] + k * per["per_unit_bytes"]) * s


def load_calibration() -> dict:
    return json.loads(CALIBRATION.read_text())


def run_windows(path: Path) -> list[dict]:
    """The manifest rows of a run directory (any depth), or [] for output rlprof did not write."""
    import msgspec

    rows = []
    for manifest in sorted(Path(path).rglob("manifest.jsonl")) if Path(path).is_dir() else []:
        for line in manifest.read_bytes().splitlines():
            try:
                rows.append(msgspec.json.decode(line))
            except msgspec.DecodeError:
                continue
    return rows


# ---- configs in each dialect -------------------------------------------------------------------------
def _nest(flat: dict) -> dict:
    out: dict = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def config_for(t: Target, dialect: str, unit: str | None, active: int | None, save_path: str) -> dict:
    """The next config as data, in `dialect`."""
    if dialect == "mindspeed":
        name = next((m for m, c in mindspeed.STAGES.items() if c == t.stage), "all")
        return _nest({f"profiler_config.integrated.{k}": v for k, v in {
            "profile": True, "mstx": False, "stage": name, "profile_save_path": save_path,
            "profile_export_type": "db", "profile_step_start": t.step, "profile_step_end": t.step + 1,
            "profile_level": "level1", "profile_with_cpu": True, "profile_with_npu": True,
            "profile_ranks": t.ranks}.items()})
    block = ROLE_BLOCK[t.role]
    torch_cfg: dict = {"discrete": True, "contents": ["cpu"]}
    flat = {"global_profiler.tool": "torch", "global_profiler.steps": [t.step],
            "global_profiler.save_path": save_path, f"{block}.enable": True, f"{block}.all_ranks": False,
            f"{block}.ranks": t.ranks}
    if dialect == "verl":
        if unit == verl.TOKEN_WINDOW_UNIT and active:
            torch_cfg.update(profile_token_start=0, profile_token_end=active)
        elif unit == verl.SCHEDULE_UNIT and active:
            torch_cfg["schedule"] = {"wait": 0, "warmup": 0, "active": active, "repeat": 1}
    else:
        if STAGE_ROLE.get(t.stage) == t.role and t.role != "ref":
            flat[f"{block}.stages"] = [t.stage]  # rlprof's extension: this stage only
        if unit and active:
            torch_cfg["schedule"] = {"unit": unit, "active": active}
    flat[f"{block}.tool_config.torch"] = torch_cfg
    if block != ROLE_BLOCK["actor"]:  # the reference trainer's default profiles the actor; the target is elsewhere
        flat[f"{ROLE_BLOCK['actor']}.enable"] = False
    if block != ROLE_BLOCK["rollout"]:  # verl's rollout block inherits the actor's unless told otherwise
        flat[f"{ROLE_BLOCK['rollout']}.enable"] = False
    return _nest(flat)


def predict(plan, model: SizeModel, ranks: int) -> list[dict]:
    """Bytes per window the plan will write on one process, per collecting rank: [{role, stage, bytes, how}]."""
    out = []
    for role in plan.roles:
        if not role.enabled or not role.steps or not role.stages:
            continue
        for step_group in plan.step_groups(role.steps):
            windows = [None] if role.mode == "e2e" else list(role.stages)
            for stage in windows:
                parts = role.stages if stage is None else (stage,)
                total, how = 0.0, []
                for s in parts:
                    sched = role.schedule_for(s)
                    window = role.token_window if s == "rollout_generate" else None
                    if sched is not None and sched.unit != "step" and (role.schedule_stages is None or
                                                                        s in role.schedule_stages):
                        k = sched.active * max(1, sched.repeat)
                        total += model.sampled(s, sched.unit, k)
                        how.append(f"{s}: {k} {sched.unit}(s)")
                    elif window is not None and window[1] is not None:
                        k = window[1] - window[0]
                        total += model.sampled(s, "decode_step", k)
                        how.append(f"{s}: decode steps [{window[0]}, {window[1]})")
                    else:
                        total += model.whole(s)
                        how.append(f"{s}: whole")
                out.append({"role": role.role, "stage": stage or "e2e", "steps": list(step_group), "ranks": ranks,
                            "bytes": total, "how": "; ".join(how)})
    return out


def is_metrics_input(path: str | Path) -> bool:
    """A run's step metrics rather than its traces: a .jsonl / .log / .txt file other than a manifest, or a
    directory with a metrics.jsonl and no rlprof manifest (the trainer's outputs/train/<run_id>)."""
    p = Path(path)
    if p.is_file():
        return p.name != "manifest.jsonl" and p.suffix in (".jsonl", ".log", ".txt")
    return p.is_dir() and (p / "metrics.jsonl").is_file() and not any(p.rglob("manifest.jsonl"))


def advise(run: str | Path, budget: int, dialect: str, save_path: str = "outputs/profile") -> dict:
    """The advice for a run on disk: from its traces (analysed here), or from its step metrics alone."""
    from .analyze.engine import load_analysis

    if dialect not in DIALECTS:
        raise AdviseError(f"--dialect {dialect!r} is unknown; allowed: {', '.join(DIALECTS)}")
    if is_metrics_input(run):
        return advise_from_metrics(run, budget, dialect, save_path)
    return advise_from(load_analysis(run, workers=1), run_windows(Path(run)), budget, dialect, save_path, str(run))


def metrics_target(diag: dict) -> Target:
    """What the step metrics point at: an outlier step's stage at that step, else the dominant stage (at the
    last step where it grows with response length or over steps, else at a steady step), else the longest."""
    steps = diag["steps"]
    steady = steps[1:] or steps
    ours = [s for s in diag["stages"] if s["stage"] in STAGE_ROLE]
    if not ours:
        raise AdviseError("the metrics time no stage rlprof can target (timing_s/gen, update_actor, ...); allowed: "
                          "verl's or rlprof's step metrics with per-stage timings")
    outlier = next((o for o in diag["outliers"] if o["stage"] in STAGE_ROLE), None)
    if outlier:
        return Target(outlier["stage"], STAGE_ROLE[outlier["stage"]], outlier["step"], [0],
                      [f"step {outlier['step']} took {outlier['step_s']:.2f} s against a median of "
                       f"{outlier['median_step_s']:.2f} s; {outlier['stage']} grew most (+{outlier['stage_extra_s']:.2f}"
                       " s): profile that stage at that step",
                       "rank 0: the metrics are the driver's, per step, not per rank"])
    dom = diag["dominant"]
    stage = dom["stage"] if dom and dom["stage"] in STAGE_ROLE else ours[0]["stage"]
    trend = next((t for t in diag["trends"] if t["stage"] == stage), None)
    step = steps[-1] if trend else steady[len(steady) // 2]
    share = next(s["share"] for s in diag["stages"] if s["stage"] == stage)
    why = [f"{stage} {'dominates' if dom and dom['stage'] == stage else 'is the longest stage of'} the step: "
           f"{share:.0%} of the mean step ({diag['mean_step_s']:.2f} s) over steps {steady[0]}-{steady[-1]}"]
    if trend:
        why.append(f"{stage} grows with {trend['with'].replace('_', ' ')} (r = {trend['r']:.2f}): profile the last "
                   f"step seen, {step}")
    return Target(stage, STAGE_ROLE[stage], step, [0], why + ["rank 0: the metrics are the driver's, not per rank"])


def advise_from_metrics(path: str | Path, budget: int, dialect: str, save_path: str = "outputs/profile") -> dict:
    """Advice from step metrics alone (no trace): the stage and step they point at, in `dialect`."""
    from .analyze.step_metrics import diagnose_steps, read_step_metrics

    fmt, records = read_step_metrics(path)
    diag = diagnose_steps(records)
    target = metrics_target(diag)
    result = _advise_for(target, [], budget, dialect, save_path, str(path), None)
    result["metrics"] = {"format": fmt, **diag}
    return result


def advise_from(doc: dict, windows: list[dict], budget: int, dialect: str, save_path: str = "outputs/profile",
                run: str = "") -> dict:
    """The advice: target, chosen unit count, config (data), predicted windows, reasons."""
    target = choose_target(doc)
    unit = UNITS[dialect].get(target.stage)
    return _advise_for(target, windows, budget, dialect, save_path, run, _units_in_run(doc, target, unit))


def _advise_for(target: Target, windows: list[dict], budget: int, dialect: str, save_path: str, run: str,
                available: int | None) -> dict:
    from .config import resolve_plan

    model = SizeModel(load_calibration(), windows)
    unit = UNITS[dialect].get(target.stage)
    reasons = list(target.why)
    ranks = len(target.ranks)

    def attempt(k):
        cfg = config_for(target, dialect, unit, k, save_path)
        plan = resolve_plan(cfg, device="cpu")
        return cfg, plan, predict(plan, model, ranks)

    cfg, plan, wins = attempt(None)
    whole = sum(w["bytes"] for w in wins)
    active = None
    if unit and whole > budget:
        best = None
        for k in range(1, (available or 64) + 1):
            cfg_k, plan_k, wins_k = attempt(k)
            if sum(w["bytes"] for w in wins_k) <= budget:
                best = (k, cfg_k, plan_k, wins_k)
            else:
                break
        if best is None:
            best = (1, *attempt(1))
            reasons.append(f"even one of the {UNIT_WORDS.get(unit, unit)} is predicted above the budget: collecting "
                           "one anyway")
        active, cfg, plan, wins = best
        reasons.append(f"{active} {UNIT_WORDS.get(unit, unit)} of {target.stage}"
                       + (f" of the {available} the run showed" if available else "")
                       + f": the most that fit {budget / 1e6:.2f} MB with the other windows of the plan")
    elif unit:
        reasons.append(f"the whole {target.stage} fits the budget ({whole / 1e6:.2f} of {budget / 1e6:.2f} MB): no "
                       "sampling needed")
    else:
        reasons.append(f"{dialect} cannot sample inside {target.stage}: the stage is collected whole")
    total = sum(w["bytes"] * w["ranks"] for w in wins)
    if total > budget * ranks:
        reasons.append(f"predicted {total / 1e6:.2f} MB is over the budget: the plan's other windows alone are "
                       "that large in this dialect")
    sources = sorted({f"{s}: {model.source.get(s, 'calibration')}" for w in wins for s in
                      (plan.role(w["role"]).stages if w["stage"] == "e2e" else [w["stage"]])})
    return {"target": target.__dict__, "dialect": dialect, "budget_bytes": budget, "unit": unit, "active": active,
            "config": cfg, "windows": wins, "predicted_bytes": total, "reasons": reasons, "size_sources": sources,
            "run": str(run)}


def _units_in_run(doc: dict, t: Target, unit: str | None) -> int | None:
    counts = {}
    for r in doc["rows"]:
        if r.get("unit") == unit and r.get("stage") == t.stage:
            key = (r.get("step"), r.get("rank"))
            counts[key] = counts.get(key, 0) + 1
    return max(counts.values()) if counts else None


def check(new_run: str | Path, advice: dict) -> dict:
    """Predicted vs what NEW_RUN wrote, per window and in total, with what to change when they part."""
    rows = [w for w in run_windows(Path(new_run)) if w.get("status") in ("complete", "truncated")]
    if not rows:
        raise AdviseError(f"{new_run} holds no rlprof manifest with collected windows; allowed: the run directory "
                          "that `rlprof train NEXT.yaml` wrote")
    actual = sum(w["bytes"] for w in rows)
    predicted = advice["predicted_bytes"]
    ratio = actual / predicted if predicted else None
    notes = []
    if actual > advice["budget_bytes"] * max(1, len(advice["target"]["ranks"])):
        notes.append(f"over the budget: lower {advice['unit'] or 'the steps or ranks'} "
                     f"({advice['active'] or 'whole'} now)")
    if ratio is not None and not 0.7 <= ratio <= 1.3:
        notes.append("the size model is off by more than 30% for this run: re-run `rlprof advise` on this run "
                     "(its own traces now calibrate the stage)")
    return {"predicted_bytes": predicted, "actual_bytes": actual, "ratio": ratio,
            "windows": [{k: w.get(k) for k in ("step", "role", "stage", "rank", "bytes", "status")} for w in rows],
            "notes": notes or ["within 30% of the prediction and inside the budget"]}


# ---- the fix: the overrides that apply a cause's first lever, with values from the run ------------------------
def _literal(text: str):
    import yaml

    return yaml.safe_load(text)


def fix_for_run(run: str | Path, dialect: str, cause: str | None = None) -> dict:
    """`rlprof advise RUN --fix`: the run analysed here, then fix_from."""
    from .analyze.engine import load_analysis

    if dialect not in DIALECTS:
        raise AdviseError(f"--dialect {dialect!r} is unknown; allowed: {', '.join(DIALECTS)}")
    if is_metrics_input(run):
        raise AdviseError(f"--fix needs a profiled run (its traces say why a step is slow); {run} holds step metrics "
                          "only; allowed: a run directory with a manifest, a trace, verl's or MindSpeed-RL's output")
    return fix_from(load_analysis(run, workers=1), dialect, cause, str(run))


def fix_from(doc: dict, dialect: str, cause: str | None = None, run: str = "") -> dict:
    """The overrides that apply the first lever of the first cause the findings rank (or of `cause`), in `dialect`,
    with the values the run's measures give (analyze/savings.py), and the saving predicted for them. A cause
    whose lever has no key in the dialect, or whose value the data cannot give, is passed over and said."""
    from .analyze.findings import CAUSE_OF, prediction_context
    from .frameworks.levers import CAUSES

    if dialect not in DIALECTS:
        raise AdviseError(f"--dialect {dialect!r} is unknown; allowed: {', '.join(DIALECTS)}")
    found = [f for f in doc.get("findings", []) if f.get("actionable")]
    if cause is not None:
        if cause not in CAUSES:
            raise AdviseError(f"--cause {cause!r} is not a cause; allowed: {', '.join(CAUSES)}")
        found = [f for f in found if CAUSE_OF.get(f["kind"]) == cause]
        if not found:
            return {"run": run, "dialect": dialect, "fix": None, "skipped": [],
                    "reason": f"no {cause} finding above its threshold in this run: nothing to fix"}
    if not found:
        return {"run": run, "dialect": dialect, "fix": None, "skipped": [],
                "reason": "no cause above its threshold (docs/analysis_schema.md): nothing to fix"}
    ctx = prediction_context(doc)
    skipped = []
    for f in found:
        result, why = _fix_one(ctx, f, [g for g in found if g["kind"] == f["kind"]], dialect, CAUSES[f["kind"]])
        if result is not None:
            return {"run": run, "dialect": dialect, "fix": result, "skipped": skipped, "reason": None}
        skipped.append(f"{f['kind']} ({f.get('stage')}): {why}")
    return {"run": run, "dialect": dialect, "fix": None, "skipped": skipped,
            "reason": f"no cause of this run has a lever in the {dialect} dialect whose value the run gives"}


def _fix_one(ctx, f: dict, same: list[dict], dialect: str, cause) -> tuple[dict | None, str]:
    from .analyze import savings

    if f["kind"] == "small_units":
        return _fix_sizes(ctx, same, dialect, cause)
    levers = cause.levers_for(dialect, f.get("stage"))
    if not levers:
        return None, f"no key of {dialect} is known to act on it"
    lv = levers[0]
    pred = savings.predict(ctx, f, dialect)
    overrides, why = _lever_values(lv, pred.get("setting") or {}, f.get("stage"))
    if overrides is None:
        return None, why if pred["status"] == "predicted" else f"{why} ({pred['why']})"
    return _fix_record(f, dialect, overrides, pred, [lv.text()]), ""


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


def _fix_sizes(ctx, same: list[dict], dialect: str, cause) -> tuple[dict | None, str]:
    """Micro-batches too small, wherever found: each stage's first size lever, one size per key for the stages it
    acts on. In rlprof's trainer an unset log-prob size follows the update's: pinned to its value now when only
    the update's size changes."""
    from .analyze import savings

    by_key: dict[str, tuple] = {}
    for f in same:
        lv = next((lv for lv in cause.levers_for(dialect, f.get("stage")) if lv.value), None)
        if lv is not None and lv.key not in by_key:
            by_key[lv.key] = (lv, savings.lever_stages(f["stage"], dialect, ctx))
    if not by_key:
        return None, f"no micro-batch size key of {dialect} is known for {', '.join(f['stage'] for f in same)}"
    overrides, parts, words, texts = {}, {}, [], []
    for key, (lv, stages) in by_key.items():
        pred = savings.small_units(ctx, stages)
        if pred["status"] != "predicted":
            return None, pred["why"]
        size = next(iter(pred["setting"]["micro_batch_size"].values()))
        overrides[key] = size
        texts.append(lv.text())
        for s, ms in pred["profiled_ms"].items():
            parts[s] = parts.get(s, 0.0) + ms
        words.append(pred["assumption"].split("; scaled")[0].split("; times of")[0])
    if dialect == "rlprof" and "actor.micro_batch_size" in overrides and "actor.log_prob_micro_batch_size" not in overrides:
        if ctx.conf("actor.log_prob_micro_batch_size") is None and ctx.conf("actor.micro_batch_size") is not None:
            overrides["actor.log_prob_micro_batch_size"] = ctx.conf("actor.micro_batch_size")
            words.append("actor.log_prob_micro_batch_size kept at its value now (unset, it follows the update's)")
    pred = savings.predicted(ctx, parts, "; ".join(words))
    pred["dialect"] = dialect
    f = same[0]
    return _fix_record(f, dialect, overrides, pred, texts, stages=[g["stage"] for g in same]), ""


def _fix_record(f: dict, dialect: str, overrides: dict, pred: dict, levers: list[str], stages=None) -> dict:
    return {"cause": f["kind"], "stage": f.get("stage"), "stages": stages or [f.get("stage")], "finding": f["text"],
            "dialect": dialect, "overrides": overrides, "config": _nest(overrides), "levers": levers,
            "saving": pred, "measure": CAUSE_MEASURE.get(f["kind"])}


# The measure each cause is diagnosed from and its threshold (analyze/findings.py THRESHOLDS), for the fix's
# check: after the fix the measure is to fall below it.
CAUSE_MEASURE = {"rollout_tail": ("rollout_tail", "tail_share"), "padding": ("padding", "padding_share"),
                 "small_units": ("fixed_cost", "fixed_share"), "slow_reward": ("reward_share", "reward_share"),
                 "weight_sync": ("weight_sync_share", "weight_sync_share"), "launch_bound": ("launch_bound",
                                                                                             "launch_bound_share"),
                 "exposed_comm": ("comm_share", "comm_share"), "unused_reference": ("ref_ms", "min_ms"),
                 "slow_rank": ("slow_rank", None), "memory_headroom": ("memory_use", "memory_use_low")}


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
    said = (f"{s['saving_ms']:.1f} ms per step ({s['saving_share']:.0%} of the step)"
            if s["status"] == "predicted" and s.get("saving_share") is not None else
            "not predictable from this data: " + s.get("why", ""))
    lines = [f"# rlprof advise --fix ({result['dialect']} dialect) from {result['run']}",
             f"# cause: {fx['cause']} ({', '.join(str(x) for x in fx['stages'])}): {fx['finding']}",
             f"# lever: {'; '.join(fx['levers'])}",
             f"# predicted saving: {said}",
             f"# as overrides: {overrides_line(fx['overrides'])}"]
    return "\n".join(lines) + "\n" + OmegaConf.to_yaml(OmegaConf.create(fx["config"]))
