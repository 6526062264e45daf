"""The resolved plan for one process, in words or as JSON (`rlprof plan`)."""

from __future__ import annotations

import msgspec

from ..frameworks import verl
from .plan import ProfilePlan, RolePlan, Schedule


def role_json(plan: ProfilePlan, role: RolePlan, rank: int) -> dict:
    return {
        "enabled": role.enabled,
        "collects_on_rank": role.collects_on(rank),
        "tool": role.tool,
        "mode": role.mode,
        "contents": list(role.contents),
        "host_stacks": role.host_stacks,
        "level": role.level,
        "export_type": role.export_type,
        "analysis": role.analysis,
        "steps": list(role.steps),
        "stages": list(role.stages),
        "ranks": list(role.ranks),
        "all_ranks": role.all_ranks,
        "schedule": None
        if role.schedule is None
        else {f: getattr(role.schedule, f) for f in ("unit", "skip_first", "wait", "warmup", "active", "repeat")},
        "save_path": role.save_path,
        "max_bytes_per_window": role.max_bytes_per_window,
        "strict": role.strict,
        "windows_per_process": windows_per_process(plan, role),
        "schedule_stages": None if role.schedule_stages is None else list(role.schedule_stages),
        "token_window": None if role.token_window is None else list(role.token_window),
        "memory": {
            "max_entries": role.memory.max_entries,
            "stack_depth": role.memory.stack_depth,
            "snapshot_steps": role.memory.snapshot_steps,
        }
        if role.tool == "torch_memory"
        else None,
        "finish_hook": None
        if role.finish_hook is None
        else {
            "cmd": role.finish_hook.cmd,
            "all_ranks": role.finish_hook.all_ranks,
            "ranks": list(role.finish_hook.ranks),
            "runs_on_rank": role.finish_hook.runs_on(rank, role.collects_on(rank)),
        },
        "relocate_results": role.relocate_results,
        "verl_plugin": verl_plugin_json(plan, role),
    }


def plan_json(plan: ProfilePlan, *, rank: int = 0, world_size: int = 1, warnings: list[str] = ()) -> dict:
    return {
        "dialect": plan.dialect,
        "framework": plan.framework,
        "rank": rank,
        "world_size": world_size,
        "async_rollout": plan.async_rollout,
        "continuous_steps": plan.continuous_steps,
        "roles": {r.role: role_json(plan, r, rank) for r in plan.roles},
        "trigger": None if plan.trigger is None else msgspec.to_builtins(plan.trigger),
        "warnings": list(warnings),
    }


def trigger_line(plan: ProfilePlan) -> str | None:
    """What the watch and its trigger do, in one line (None without a trigger)."""
    t = plan.trigger
    if t is None:
        return None
    arms = [
        f"a stage or the step over {t.slow.factor:g}x its median of the last {t.window} steps" if t.slow else "",
        f"a rank over {t.straggler.factor:g}x the other ranks at the same step, or held off its cores that much longer"
        if t.straggler
        else "",
        "rlprof capture RUN_DIR requests" if t.request else "",
    ]
    roles = [r.role for r in plan.roles if r.enabled and r.tool and r.stages]
    keep = (
        "the next occurrence is captured"
        if t.keep == "next"
        else f"every occurrence of {', '.join(t.stages) if t.stages else 'the selected stages'} is profiled, only the "
        "slow ones kept (costly)"
    )
    return (
        f"trigger: every step of every rank watched (timeline/rank<R>.bin); armed by "
        f"{'; '.join(a for a in arms if a)}; {keep} with the tool of {', '.join(roles) or 'no role (none enabled)'}"
        f"; at most {t.max_captures} capture(s), {t.cooldown} steps apart; the first {t.warmup_steps} and busy "
        "steps never trigger" + ("; a baseline window after the warm-up" if t.baseline else "")
    )


# ---- micro-batches sampled inside verl's workers (integrations/verl/) ---------------------------------------------
def plugin_stages(plan: ProfilePlan, role: RolePlan) -> tuple[str, ...]:
    """The stages whose micro-batches rlprof's verl plugin samples for this role (empty: the plugin has no part)."""
    if plan.dialect != "global_role" or not role.enabled or role.schedule is None or role.tool not in ("torch", "npu"):
        return ()
    if role.schedule.unit != verl.PLUGIN_UNIT:
        return ()
    return tuple(s for s in role.stages if s in verl.MICRO_BATCH_STAGES)


def kept_units(s: Schedule, shown: int = 6) -> tuple[list[int], bool]:
    """The unit indices (0-based from the stage's start) the schedule keeps: the first `shown` at most, and whether
    more follow (repeat 0: until the stage ends)."""
    first = s.skip_first + s.wait + s.warmup
    kept, cycle = [], 0
    while len(kept) < shown and (s.repeat == 0 or cycle < s.repeat):
        start = first + cycle * s.cycle()
        kept += list(range(start, start + s.active))
        cycle += 1
    more = s.repeat == 0 or len(kept) < s.repeat * s.active
    return kept[:shown], more


def _indices(kept: list[int], more: bool) -> str:
    if len(kept) == 1 and not more:
        return f"micro-batch {kept[0]}"
    if not more and kept == list(range(kept[0], kept[-1] + 1)):
        return f"micro-batches {kept[0]}-{kept[-1]}"
    return "micro-batches " + ", ".join(map(str, kept)) + (", ... (until the stage ends)" if more else "")


def verl_plugin_json(plan: ProfilePlan, role: RolePlan) -> dict | None:
    stages = plugin_stages(plan, role)
    if not stages:
        return None
    kept, more = kept_units(role.schedule)
    return {
        "stages": list(stages),
        "micro_batches": kept,
        "more": more,
        "module": verl.PLUGIN_MODULE,
        "files": "one per stage call and schedule cycle, in save_path, named as verl names its traces",
    }


def verl_plugin_line(plan: ProfilePlan, role: RolePlan) -> str | None:
    """What rlprof's verl plugin keeps inside verl's workers, in words."""
    stages = plugin_stages(plan, role)
    if not stages:
        return None
    kept, more = kept_units(role.schedule)
    whole = "" if role.mode == "discrete" else "; its windows replace verl's whole-step trace"
    return (
        f"in verl's workers (rlprof's verl plugin): {_indices(kept, more)} of each call of {', '.join(stages)} "
        f"(counted from the stage's start, across its mini-batches), each call a file of its own in "
        f"{role.save_path}/ named as verl names its traces{whole}"
    )


def verl_alone(role: RolePlan, release: str | None = None) -> str:
    """What verl's own profiler collects for this role once `unit` is dropped: its meaning of the same counts (update
    mini-batches; verl 0.7.x and its npu tool have no schedule)."""
    s = role.schedule
    legacy = release is not None and release.startswith("0.7.")
    if s is None or s.active == 0 or role.tool != "torch" or legacy:
        return f"{role.role}: each stage in full"
    before = s.skip_first + s.wait + s.warmup
    if role.role not in verl.UPDATE_STAGE_OF_ROLE:  # the reference runs no update: no mini-batch of its own
        return (
            f"{role.role}: not kept (its stage runs before the update's sampled mini-batches)"
            if before and role.mode == "e2e"
            else f"{role.role}: each stage in full"
        )
    rest = (
        "the stages before that window, the log-prob passes included, are not kept"
        if before and role.mode == "e2e"
        else "the log-prob stages in full"
    )
    return (
        f"{role.role}: update mini-batches by the schedule (skip_first {s.skip_first}, wait {s.wait}, warmup "
        f"{s.warmup}, active {s.active}); {rest}"
    )


def windows_per_process(plan: ProfilePlan, role: RolePlan) -> int:
    """Collection windows one selected process of this role opens (before schedule repeats)."""
    if not role.enabled or not role.steps or not role.stages:
        return 0
    groups = len(plan.step_groups(role.steps))
    return groups if role.mode == "e2e" else groups * len(role.stages)


def _files_per_window(role: RolePlan) -> str:
    if role.tool == "nsys":
        return "no files of its own (one capture range each; the outer `nsys profile` writes the report)"
    per = "one directory" if role.tool == "npu" else "one file"
    if role.schedule is None or role.schedule.repeat == 1:
        return per + " each"
    if role.schedule.repeat == 0:
        return per + " per schedule cycle (repeat 0: as many cycles as the window holds)"
    return f"up to {role.schedule.repeat} files each (one per schedule cycle)"


def collecting_ranks(role: RolePlan, world_size: int) -> str:
    if role.all_ranks:
        return f"all {world_size} ranks"
    inside = [r for r in role.ranks if r < world_size]
    outside = [r for r in role.ranks if r >= world_size]
    text = "ranks " + ", ".join(map(str, inside)) if inside else "no rank"
    if outside:
        text += f" (listed {', '.join(map(str, outside))} do not exist at world size {world_size})"
    return text


NOTHING_COLLECTED = "nothing will be collected (no role is enabled with a tool, steps and stages)"
# What turns collection on, per dialect: the smallest complete example (the actor at step 2).
ENABLE_EXAMPLE = {
    "global_role": "global_profiler.tool=torch global_profiler.steps=[2] actor_rollout_ref.actor.profiler.enable=true",
    "legacy": "trainer.profile_steps=[2] actor_rollout_ref.profiler.ranks=[0]",
    "integrated": "profiler_config.integrated.profile=true",
}


def nothing_collected_line(plan: ProfilePlan) -> str:
    """The one line a run prints when its plan records nothing, with what would turn collection on."""
    example = ENABLE_EXAMPLE.get(plan.dialect, ENABLE_EXAMPLE["global_role"])
    return f"rlprof: {NOTHING_COLLECTED}; the run goes on unprofiled (for the actor at step 2: {example})"


def plan_words(plan: ProfilePlan, *, rank: int = 0, world_size: int = 1, warnings: list[str] = ()) -> str:
    meaning = f" with {plan.framework}'s meaning" if plan.framework else ""
    lines = [
        f"dialect: {plan.dialect}{meaning}"
        + (
            "  (async rollout: the rollout runs in server processes of its own, one trace per replica)"
            if plan.async_rollout
            else ""
        )
    ]
    active = [r for r in plan.roles if r.enabled and r.steps and r.stages]
    if plan.collects_nothing:
        lines.append(NOTHING_COLLECTED)
    if plan.trigger is not None:
        lines.append(trigger_line(plan))
    for role in plan.roles:
        if role not in active:
            why = "disabled" if not role.enabled else "no steps selected" if not role.steps else "no stages selected"
            if why == "no steps selected" and plan.trigger is not None and role.tool and role.stages:
                why = (
                    f"no fixed steps; tool {role.tool}, {role.mode}, {collecting_ranks(role, world_size)} when the "
                    "trigger captures"
                )
            lines.append(f"  {role.role:<8} {why}")
            continue
        steps = ", ".join(map(str, role.steps))
        if plan.continuous_steps:
            steps += " (consecutive steps share one window)"
        sched = ""
        if role.token_window is not None:
            start, end = role.token_window
            sched = f"; rollout decode steps [{start}, {end if end is not None else 'end'}) only (token window)"
        elif role.schedule is not None and (
            role.schedule_stages is None or any(st in role.stages for st in role.schedule_stages)
        ):
            s = role.schedule
            sampled = [st for st in role.schedule_stages or () if st in role.stages]
            where = ""
            if sampled and role.mode == "e2e":  # one window: torch keeps only what runs inside its active phase
                before = (
                    "not kept: only the active mini-batches are" if s.skip_first + s.wait + s.warmup else "kept in full"
                )
                where = f" of {', '.join(sampled)} (the stages before the active window are {before})"
            elif sampled:
                where = f" of {', '.join(sampled)} (other stages in full)"
            sched = (
                f"; on {s.unit} ticks{where}: skip_first {s.skip_first}, wait {s.wait}, "
                f"warmup {s.warmup}, active {s.active}, repeat {s.repeat or 'until the window closes'}"
            )
        here = "collects on this rank" if role.collects_on(rank) else "not on this rank"
        unit_of = "replica" if plan.async_rollout and role.role == "rollout" else "rank"
        lines.append(
            f"  {role.role:<8} tool {role.tool}, {role.mode}, steps {steps}; stages {', '.join(role.stages)}; "
            f"{collecting_ranks(role, world_size).replace('rank', unit_of)} ({unit_of} {rank}: {here})"
        )
        detail = []
        if role.contents:
            detail.append("contents " + ", ".join(role.contents))
        if role.tool in ("torch", "markers"):
            detail.append("host stacks " + ("sampled" if role.host_stacks else "off"))
        if role.level:
            detail.append(f"level {role.level}")
        if role.export_type:
            detail.append(f"export {role.export_type}")
        if role.analysis:
            detail.append("analysis after each window (background)")
        if role.max_bytes_per_window:
            detail.append(f"budget {role.max_bytes_per_window} bytes per window")
        if role.tool == "torch_memory":
            m = role.memory
            detail.append(
                f"allocator history {m.max_entries} entries, stack depth {m.stack_depth}, "
                f"snapshot every {m.snapshot_steps} profiled step(s)"
            )
        if sched:
            detail.append(sched.removeprefix("; "))
        if detail:
            lines.append("           " + "; ".join(detail))
        in_verl = verl_plugin_line(plan, role)
        if in_verl:
            lines.append("           " + in_verl)
        hook = role.finish_hook
        if hook is not None:
            who = (
                "all ranks"
                if hook.all_ranks
                else "ranks " + ", ".join(map(str, hook.ranks))
                if hook.ranks
                else "the collecting ranks"
            )
            lines.append(f"           finish hook once after the last profiled step, on {who}: {hook.cmd}")
        n = windows_per_process(plan, role)
        lines.append(
            f"           {n} window(s) per collecting process, {_files_per_window(role)}; "
            f"saved under {role.save_path}/<run_id>/"
        )
    together = [r for r in active if not (plan.async_rollout and r.role == "rollout")]  # async: its own processes
    e2e = [r.role for r in together if r.mode == "e2e"]
    discrete = [r.role for r in together if r.mode == "discrete"]
    if e2e and discrete:
        lines.append(
            f"note: a process hosting {e2e[0]} (e2e) and {', '.join(discrete)} (discrete) has one window "
            f"per step; the discrete stages are marked as ranges inside it"
        )
    if len(e2e) > 1:
        lines.append(
            f"note: in a process hosting several roles, the e2e window follows the settings of the first "
            f"({e2e[0]}); roles in their own processes each follow their own"
        )
    lines.extend(warnings)
    return "\n".join(lines)
