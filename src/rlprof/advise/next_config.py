"""`rlprof advise RUN`: the next profiling config, from what a run showed.

The loop people run by hand (markers first, then the bottleneck stage, then the suspect ranks, sampled inside
the stage so the data stays small), as one command: the findings say which stage, step and ranks; the size
model says how many units (decode steps, micro-/mini-batches) fit the budget; the config is written in the
user's dialect and resolved back through rlprof's own parser, so the prediction is made on the plan the next
run will really follow.

Sizes: bytes per stage window and per unit, from the run itself where it holds a torch trace of that stage,
else from the calibration table that bench/calibrate.py measures on the reference trainer (torch tool, CPU).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..analyze.diagnosis.causes import UNIT_WORDS
from ..frameworks import mindspeed, verl
from ..vocab import STAGE_ROLE
from .shared import AdviseError, check_dialect, is_metrics_input, nest, run_windows

CALIBRATION = Path(__file__).parent.parent / "calibration.json"
# The unit each dialect can sample a stage by (None: the stage is collected whole).
UNITS = {
    "rlprof": {
        "rollout_generate": "decode_step",
        "actor_update": "micro_batch",
        "critic_update": "micro_batch",
        "actor_compute_log_prob": "micro_batch",
    },
    "verl": {"rollout_generate": verl.TOKEN_WINDOW_UNIT, **{s: verl.SCHEDULE_UNIT for s in verl.SCHEDULED_STAGES}},
    "mindspeed": {},  # MindSpeed-RL profiles a stage whole
}
# A stage the calibration did not sample by unit, measured through a stage running the same code per unit.
UNIT_PROXY = {
    "ref_compute_log_prob": "actor_compute_log_prob",
    "critic_compute_values": "actor_compute_log_prob",
    "critic_update": "actor_update",
}
# The block that profiles a role: verl's ref follows the actor's profiler (one actor_rollout_ref worker).
ROLE_BLOCK = {**verl.ROLE_BLOCKS, "ref": verl.ROLE_BLOCKS["actor"]}
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|k|mb|m|gb|g|kib|mib|gib)?\s*$", re.IGNORECASE)
UNIT_BYTES = {
    None: 1,
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "m": 1e6,
    "mb": 1e6,
    "g": 1e9,
    "gb": 1e9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
}


def parse_size(text: str) -> int:
    m = SIZE.match(str(text))
    if not m or float(m.group(1)) <= 0:
        raise AdviseError(
            f"--budget {text!r} is not a size; allowed: a positive number with B, KB, MB, GB "
            "(or KiB, MiB, GiB), e.g. 2MB"
        )
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
        raise AdviseError(
            "the run has no stage windows to target (no stage ranges were marked); allowed: a run "
            "profiled by rlprof (markers mode is enough), verl's or MindSpeed-RL's output with stages"
        )
    ranks_seen = sorted({r["rank"] for r in doc["rows"] if r.get("rank") is not None}) or [0]
    steps_seen = sorted({r["step"] for r in doc["rows"] if isinstance(r.get("step"), int)})
    step = steps_seen[-1] if steps_seen else 2
    slow = next((f for f in found if f["kind"] == "slow_rank"), None)
    dominant = next((f for f in found if f["kind"] == "dominant_stage"), None)
    if slow:
        healthy = [r for r in ranks_seen if r != slow["rank"]][:1]
        return Target(
            slow["stage"],
            STAGE_ROLE[slow["stage"]],
            step,
            [slow["rank"], *healthy],
            [
                f"stage {slow['stage']}: rank {slow['rank']} holds the others up there ({slow['text']})",
                f"ranks {slow['rank']} (slow) and {healthy[0] if healthy else '-'} (healthy, to compare)",
            ],
        )
    if dominant:
        stage, role, why = (
            dominant["stage"],
            STAGE_ROLE[dominant["stage"]],
            f"stage {dominant['stage']}: {dominant['text']}",
        )
    else:
        (role, stage), ms = max(stages.items(), key=lambda kv: kv[1])
        why = f"stage {stage}: the longest stage ({ms:.1f} ms in the run), though none dominates"
    return Target(
        stage, role, step, ranks_seen[:1], [why, f"rank {ranks_seen[0]}: no rank stands out, one is representative"]
    )


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


def config_for(t: Target, dialect: str, unit: str | None, active: int | None, save_path: str) -> dict:
    """The next config as data, in `dialect`."""
    if dialect == "mindspeed":
        name = next((m for m, c in mindspeed.STAGES.items() if c == t.stage), "all")
        return nest(
            {
                f"profiler_config.integrated.{k}": v
                for k, v in {
                    "profile": True,
                    "mstx": False,
                    "stage": name,
                    "profile_save_path": save_path,
                    "profile_export_type": "db",
                    "profile_step_start": t.step,
                    "profile_step_end": t.step + 1,
                    "profile_level": "level1",
                    "profile_with_cpu": True,
                    "profile_with_npu": True,
                    "profile_ranks": t.ranks,
                }.items()
            }
        )
    block = ROLE_BLOCK[t.role]
    torch_cfg: dict = {"discrete": True, "contents": ["cpu"]}
    flat = {
        "global_profiler.tool": "torch",
        "global_profiler.steps": [t.step],
        "global_profiler.save_path": save_path,
        f"{block}.enable": True,
        f"{block}.all_ranks": False,
        f"{block}.ranks": t.ranks,
    }
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
    return nest(flat)


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
                    if (
                        sched is not None
                        and sched.unit != "step"
                        and (role.schedule_stages is None or s in role.schedule_stages)
                    ):
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
                out.append(
                    {
                        "role": role.role,
                        "stage": stage or "e2e",
                        "steps": list(step_group),
                        "ranks": ranks,
                        "bytes": total,
                        "how": "; ".join(how),
                    }
                )
    return out


def advise(run: str | Path, budget: int, dialect: str, save_path: str = "outputs/profile") -> dict:
    """The advice for a run on disk: from its traces (analysed here), or from its step metrics alone."""
    from ..analyze.pipeline import load_analysis

    check_dialect(dialect)
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
        raise AdviseError(
            "the metrics time no stage rlprof can target (timing_s/gen, update_actor, ...); allowed: "
            "verl's or rlprof's step metrics with per-stage timings"
        )
    outlier = next((o for o in diag["outliers"] if o["stage"] in STAGE_ROLE), None)
    if outlier:
        return Target(
            outlier["stage"],
            STAGE_ROLE[outlier["stage"]],
            outlier["step"],
            [0],
            [
                f"step {outlier['step']} took {outlier['step_s']:.2f} s against a median of "
                f"{outlier['median_step_s']:.2f} s; {outlier['stage']} grew most (+{outlier['stage_extra_s']:.2f}"
                " s): profile that stage at that step",
                "rank 0: the metrics are the driver's, per step, not per rank",
            ],
        )
    dom = diag["dominant"]
    stage = dom["stage"] if dom and dom["stage"] in STAGE_ROLE else ours[0]["stage"]
    trend = next((t for t in diag["trends"] if t["stage"] == stage), None)
    step = steps[-1] if trend else steady[len(steady) // 2]
    share = next(s["share"] for s in diag["stages"] if s["stage"] == stage)
    why = [
        f"{stage} {'dominates' if dom and dom['stage'] == stage else 'is the longest stage of'} the step: "
        f"{share:.0%} of the mean step ({diag['mean_step_s']:.2f} s) over steps {steady[0]}-{steady[-1]}"
    ]
    if trend:
        why.append(
            f"{stage} grows with {trend['with'].replace('_', ' ')} (r = {trend['r']:.2f}): profile the last "
            f"step seen, {step}"
        )
    return Target(stage, STAGE_ROLE[stage], step, [0], why + ["rank 0: the metrics are the driver's, not per rank"])


def advise_from_metrics(path: str | Path, budget: int, dialect: str, save_path: str = "outputs/profile") -> dict:
    """Advice from step metrics alone (no trace): the stage and step they point at, in `dialect`."""
    from ..analyze.inputs.step_metrics import read_step_metrics
    from ..analyze.over_time.step_trends import diagnose_steps

    fmt, records = read_step_metrics(path)
    diag = diagnose_steps(records)
    target = metrics_target(diag)
    result = _advise_for(target, [], budget, dialect, save_path, str(path), None)
    result["metrics"] = {"format": fmt, **diag}
    return result


def advise_from(
    doc: dict, windows: list[dict], budget: int, dialect: str, save_path: str = "outputs/profile", run: str = ""
) -> dict:
    """The advice: target, chosen unit count, config (data), predicted windows, reasons."""
    target = choose_target(doc)
    unit = UNITS[dialect].get(target.stage)
    return _advise_for(target, windows, budget, dialect, save_path, run, _units_in_run(doc, target, unit))


def _advise_for(
    target: Target, windows: list[dict], budget: int, dialect: str, save_path: str, run: str, available: int | None
) -> dict:
    from ..config import resolve_plan

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
            reasons.append(
                f"even one of the {UNIT_WORDS.get(unit, unit)} is predicted above the budget: collecting one anyway"
            )
        active, cfg, plan, wins = best
        reasons.append(
            f"{active} {UNIT_WORDS.get(unit, unit)} of {target.stage}"
            + (f" of the {available} the run showed" if available else "")
            + f": the most that fit {budget / 1e6:.2f} MB with the other windows of the plan"
        )
    elif unit:
        reasons.append(
            f"the whole {target.stage} fits the budget ({whole / 1e6:.2f} of {budget / 1e6:.2f} MB): no sampling needed"
        )
    else:
        reasons.append(f"{dialect} cannot sample inside {target.stage}: the stage is collected whole")
    total = sum(w["bytes"] * w["ranks"] for w in wins)
    if total > budget * ranks:
        reasons.append(
            f"predicted {total / 1e6:.2f} MB is over the budget: the plan's other windows alone are "
            "that large in this dialect"
        )
    sources = sorted(
        {
            f"{s}: {model.source.get(s, 'calibration')}"
            for w in wins
            for s in (plan.role(w["role"]).stages if w["stage"] == "e2e" else [w["stage"]])
        }
    )
    return {
        "target": target.__dict__,
        "dialect": dialect,
        "budget_bytes": budget,
        "unit": unit,
        "active": active,
        "config": cfg,
        "windows": wins,
        "predicted_bytes": total,
        "reasons": reasons,
        "size_sources": sources,
        "run": str(run),
    }


def _units_in_run(doc: dict, t: Target, unit: str | None) -> int | None:
    counts = {}
    for r in doc["rows"]:
        if r.get("unit") == unit and r.get("stage") == t.stage:
            key = (r.get("step"), r.get("rank"))
            counts[key] = counts.get(key, 0) + 1
    return max(counts.values()) if counts else None
