"""Dialect "integrated" (SPEC §1c, MindSpeed-RL style): one profiler_config.integrated block.

Each selected stage is its own window (discrete), as in the framework this dialect comes from.
`profile_with_npu` means device activity: the npu tool on Ascend machines, torch (CUDA) elsewhere.
"""

from __future__ import annotations

from . import checks as c
from .plan import ProfilePlan, RolePlan
from .vocab import (DEFAULT_INTEGRATED_SAVE_PATH, EXPORT_TYPES, INTEGRATED_STAGE_NAMES, LEVELS, ROLE_STAGES,
                    ROLES, STAGES)

KEYS = ("profile", "mstx", "stage", "profile_save_path", "profile_export_type", "profile_step_start",
        "profile_step_end", "profile_level", "profile_with_memory", "profile_record_shapes", "profile_with_cpu",
        "profile_with_npu", "profile_with_module", "profile_with_stack", "profile_analysis", "profile_ranks")
PREFIX = "profiler_config.integrated"


def detect_keys(data: dict) -> list[str]:
    return ["profiler_config"] if "profiler_config" in data else []


def _stages(value) -> tuple[str, ...]:
    key = f"{PREFIX}.stage"
    names = ("all",) + tuple(INTEGRATED_STAGE_NAMES) + tuple(s for s in STAGES if s not in INTEGRATED_STAGE_NAMES)
    picked = (c.choice(key, value, names),) if isinstance(value, str) or value is None else c.choices(key, value, names)
    if "all" in picked:
        return STAGES
    return tuple(dict.fromkeys(INTEGRATED_STAGE_NAMES.get(s, s) for s in picked))


def parse(data: dict, *, device: str) -> ProfilePlan:
    outer = c.mapping("profiler_config", data.get("profiler_config"), ("integrated",))
    b = c.mapping(PREFIX, outer.get("integrated"), KEYS)
    k = lambda name: f"{PREFIX}.{name}"  # noqa: E731
    flag = lambda name, default: c.boolean(k(name), b.get(name, default))  # noqa: E731
    profile = flag("profile", False)
    mstx = flag("mstx", False)
    start = c.integer(k("profile_step_start"), b.get("profile_step_start", 1), minimum=1)
    end = c.integer(k("profile_step_end"), b.get("profile_step_end", start + 1), minimum=1)
    if end <= start:
        raise c.ConfigError(k("profile_step_end"), end, f"an integer > profile_step_start ({start}); "
                            "the range [start, end) is collected")
    ranks_raw = b.get("profile_ranks", "all")
    all_ranks = ranks_raw == "all"
    ranks = () if all_ranks else c.rank_list(k("profile_ranks"), ranks_raw)
    if not all_ranks and not isinstance(ranks_raw, (list, tuple)):
        raise c.ConfigError(k("profile_ranks"), ranks_raw, '"all" or a list of integer ranks')
    stages = _stages(b.get("stage", "all"))
    save_path = c.writable_dir(k("profile_save_path"), b.get("profile_save_path") or DEFAULT_INTEGRATED_SAVE_PATH)
    level = c.choice(k("profile_level"), b.get("profile_level", "level0"), LEVELS)
    export_type = c.choice(k("profile_export_type"), b.get("profile_export_type", "text"), EXPORT_TYPES)
    tool = "markers" if mstx else ("npu" if device == "npu" else "torch")
    switches = [("profile_with_cpu", True, "cpu"), ("profile_with_npu", True, "npu" if tool == "npu" else "cuda"),
                ("profile_with_memory", False, "memory"), ("profile_record_shapes", False, "shapes"),
                ("profile_with_stack", False, "stack"), ("profile_with_module", False, "module")]
    contents = tuple(name for key, default, name in switches if flag(key, default))
    analysis = flag("profile_analysis", False)
    if tool == "markers":
        contents = ()
    roles = []
    for role in ROLES:
        role_stages = tuple(s for s in ROLE_STAGES[role] if s in stages)
        roles.append(RolePlan(
            role=role, enabled=profile and bool(role_stages), tool=tool if profile else None, ranks=ranks,
            all_ranks=all_ranks, mode="discrete", contents=contents, level=level, export_type=export_type,
            analysis=analysis, schedule=None, stages=role_stages, steps=tuple(range(start, end)),
            save_path=save_path))
    return ProfilePlan(dialect="integrated", roles=tuple(roles), framework="MindSpeed-RL")
