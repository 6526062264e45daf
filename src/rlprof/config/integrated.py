"""Dialect "integrated" (MindSpeed-RL style): one profiler_config.integrated block.

With MindSpeed-RL's meaning: `stage: all` opens ONE profiler per process over steps [start, end)
(`schedule(skip_first=start, active=end-start)`): one window spanning those steps, every stage inside it.
A stage (or a list of stages) opens one window per listed stage per step (`active=1` at each call).
`profile_with_npu` means device activity: the npu tool on Ascend machines, torch (CUDA) elsewhere. `mstx: true`
adds MindSpeed-RL's mstx ranges; it changes neither the activities nor the level (frameworks/mindspeed.py).
"""

from __future__ import annotations

from contextlib import nullcontext

from . import checks as c
from .trigger import parse_trigger
from .plan import ProfilePlan, RolePlan
from ..frameworks import mindspeed
from ..vocab import DEFAULT_INTEGRATED_SAVE_PATH, EXPORT_TYPES, LEVELS, ROLE_STAGES, ROLES, STAGES

# rlprof's extensions: trigger (config/trigger.py), and a switch in MindSpeed-RL's profile_with_* style for the host
# sampler (collect/host_stacks.py), on by default
HOST_STACKS_SWITCH = "profile_with_host_stacks"
KEYS = mindspeed.KEYS + ("trigger", HOST_STACKS_SWITCH)
PREFIX = "profiler_config.integrated"


def detect_keys(data: dict) -> list[str]:
    return ["profiler_config"] if "profiler_config" in data else []


def _stages(value) -> tuple[str, ...] | None:
    """Canonical stages picked, or None for `all` (MindSpeed-RL's one window over the steps)."""
    key = f"{PREFIX}.stage"
    names = ("all",) + tuple(mindspeed.STAGES) + tuple(s for s in STAGES if s not in mindspeed.STAGES)
    picked = (c.choice(key, value, names),) if isinstance(value, str) or value is None else c.choices(key, value, names)
    if "all" in picked:
        return None
    return tuple(dict.fromkeys(mindspeed.STAGES.get(s, s) for s in picked))


def _role_stages(role: str, picked: tuple[str, ...] | None) -> tuple[str, ...]:
    own = ROLE_STAGES[role] + tuple(s for s, r in mindspeed.EXTRA_STAGE_ROLE.items() if r == role)
    return ROLE_STAGES[role] if picked is None else tuple(s for s in own if s in picked)


def parse(data: dict, *, device: str) -> ProfilePlan:
    outer = c.mapping("profiler_config", data.get("profiler_config"), ("integrated",))
    b = c.mapping(PREFIX, outer.get("integrated"), KEYS)
    k = lambda name: f"{PREFIX}.{name}"  # noqa: E731
    flag = lambda name, default: c.boolean(k(name), b.get(name, default))  # noqa: E731
    profile = flag("profile", False)
    mstx = flag("mstx", False)
    with c.framework_would(mindspeed.RUNS_UNKNOWN_STAGE):
        picked = _stages(b.get("stage", "all"))
    # with stage lists MindSpeed-RL checks each iteration against [start, end): none passes. With `all` the range
    # becomes its schedule's `active` (end - start); what torch_npu does with one below 1 is not claimed here.
    with c.framework_would(mindspeed.RUNS_EMPTY_STEPS) if picked is not None else nullcontext():
        start = c.integer(k("profile_step_start"), b.get("profile_step_start", 1), minimum=1)
        end = c.integer(k("profile_step_end"), b.get("profile_step_end", start + 1), minimum=1)
        if end <= start:
            raise c.ConfigError(
                k("profile_step_end"),
                end,
                f"an integer > profile_step_start ({start}); the range [start, end) is collected",
            )
    ranks_raw = b.get("profile_ranks", "all")
    all_ranks = ranks_raw == "all"
    warnings: list[str] = []
    if isinstance(ranks_raw, str) and not all_ranks:
        raise c.ConfigError(
            k("profile_ranks"),
            ranks_raw,
            '"all" or a list of integer ranks',
            problem="is a string: MindSpeed-RL would run and profile no rank (it compares each "
            "rank with the string's characters)",
        )
    if isinstance(ranks_raw, int) and not isinstance(ranks_raw, bool):
        ranks = mindspeed.RANKS_FALLBACK
        warnings.append(
            f"{k('profile_ranks')} = {ranks_raw} is not a list: MindSpeed-RL falls back to rank "
            f"{ranks[0]}, and so does this plan (write [{ranks_raw}] for rank {ranks_raw})"
        )
    else:
        ranks = () if all_ranks else c.rank_list(k("profile_ranks"), ranks_raw)
    save_path = c.writable_dir(k("profile_save_path"), b.get("profile_save_path") or DEFAULT_INTEGRATED_SAVE_PATH)
    level = c.choice(k("profile_level"), b.get("profile_level", "level0"), LEVELS)
    export_type = c.choice(k("profile_export_type"), b.get("profile_export_type", "text"), EXPORT_TYPES)
    tool = "npu" if device == "npu" else "torch"
    switches = [
        ("profile_with_cpu", True, "cpu"),
        ("profile_with_npu", True, "npu" if tool == "npu" else "cuda"),
        ("profile_with_memory", False, "memory"),
        ("profile_record_shapes", False, "shapes"),
        ("profile_with_module", False, "module"),
    ]
    contents = tuple(name for key, default, name in switches if flag(key, default))
    host_stacks = flag(HOST_STACKS_SWITCH, True)
    analysis = flag("profile_analysis", False)
    if mstx and profile:
        warnings.append(
            f"{k('mstx')} = true adds MindSpeed-RL's mstx ranges (msprof_tx) to what the profile_with_* "
            "switches and profile_level record; rlprof's stage ranges are recorded with or without it"
        )
    warnings += [
        f"{PREFIX}.stage: {s} (MindSpeed-RL's vision-encoder pass) is a stage rlprof's own trainer "
        "does not run; its windows come only from a host that marks it"
        for s in picked or ()
        if s in mindspeed.EXTRA_STAGE_ROLE
    ]
    roles = []
    for role in ROLES:
        role_stages = _role_stages(role, picked)
        roles.append(
            RolePlan(
                role=role,
                enabled=profile and bool(role_stages),
                tool=tool if profile else None,
                ranks=ranks,
                all_ranks=all_ranks,
                mode="e2e" if picked is None else "discrete",
                contents=contents,
                level=level,
                export_type=export_type,
                analysis=analysis,
                schedule=None,
                stages=role_stages,
                steps=tuple(range(start, end)),
                save_path=save_path,
                host_stacks=host_stacks,
            )
        )
    return ProfilePlan(
        dialect="integrated",
        roles=tuple(roles),
        framework="MindSpeed-RL",
        continuous_steps=picked is None,
        warnings=tuple(warnings),
        trigger=parse_trigger(k("trigger"), b.get("trigger")),
    )
