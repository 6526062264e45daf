"""Dialect "global + role" (SPEC §1a): global_profiler + per-role profiler blocks."""

from __future__ import annotations

from typing import Any

from . import checks as c
from .plan import MemoryOptions, ProfilePlan, RolePlan, Schedule
from .source import get
from .vocab import CONTENTS, DEFAULT_CONTENTS, DEFAULT_SAVE_PATH, EXPORT_TYPES, LEVELS, ROLE_STAGES, ROLES, STAGES, TOOLS, UNITS

ROLE_BLOCKS = {
    "actor": "actor_rollout_ref.actor.profiler",
    "rollout": "actor_rollout_ref.rollout.profiler",
    "ref": "actor_rollout_ref.ref.profiler",
    "critic": "critic.profiler",
    "reward": "reward_model.profiler",
}
INHERITS_FROM_ACTOR = ("rollout", "ref")
GLOBAL_KEYS = ("tool", "steps", "save_path", "continuous_steps", "strict", "max_bytes_per_window")
ROLE_KEYS = ("enable", "all_ranks", "ranks", "tool", "tool_config", "stages", "save_path", "strict",
             "max_bytes_per_window")
TOOL_KEYS = {
    "torch": ("discrete", "contents", "schedule", "analysis"),
    "npu": ("discrete", "level", "contents", "analysis", "export_type", "schedule"),
    "torch_memory": ("discrete", "max_entries", "stack_depth", "schedule"),
    "nsys": ("discrete", "schedule"),
    "markers": ("discrete",),
}
SCHEDULE_KEYS = ("unit", "skip_first", "wait", "warmup", "active", "repeat")


def detect_keys(data: dict) -> list[str]:
    found = ["global_profiler"] if "global_profiler" in data else []
    return found + [path for role, path in ROLE_BLOCKS.items() if role in ("actor", "rollout", "ref")
                    and get(data, path) is not None]


def parse_schedule(key: str, raw: Any) -> Schedule | None:
    if raw is None:
        return None
    raw = c.mapping(key, raw, SCHEDULE_KEYS)
    unit = c.choice(f"{key}.unit", raw.get("unit", "step"), UNITS)
    counts = {k: c.integer(f"{key}.{k}", raw[k], minimum=0) for k in SCHEDULE_KEYS[1:] if k in raw}
    schedule = Schedule(unit=unit, **counts)
    if schedule.active < 1:
        raise c.ConfigError(f"{key}.active", schedule.active, "an integer >= 1 (units recorded per cycle)")
    return schedule


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _tool_blocks(key: str, raw: Any) -> dict[str, dict]:
    blocks = c.mapping(key, raw, TOOL_KEYS)
    return {tool: c.mapping(f"{key}.{tool}", blocks.get(tool), TOOL_KEYS[tool]) for tool in TOOL_KEYS}


def _role(role: str, key: str, raw: dict, glob: dict, steps: tuple[int, ...]) -> RolePlan:
    tool = c.choice(f"{key}.tool", raw["tool"], TOOLS, nullable=True) if "tool" in raw else glob["tool"]
    enable = c.boolean(f"{key}.enable", raw.get("enable", False))
    all_ranks = c.boolean(f"{key}.all_ranks", raw.get("all_ranks", False))
    ranks = c.rank_list(f"{key}.ranks", raw.get("ranks"))
    if enable and not all_ranks and not ranks:
        ranks = (0,)  # SPEC: enabled with no ranks listed means rank 0
    stages = ROLE_STAGES[role]
    if raw.get("stages") is not None:
        stages = c.choices(f"{key}.stages", raw["stages"], STAGES)
        for i, stage in enumerate(stages):
            if stage not in ROLE_STAGES[role]:
                raise c.ConfigError(f"{key}.stages[{i}]", stage, f"stages of role {role}: "
                                    + ", ".join(ROLE_STAGES[role]))
    tkey = f"{key}.tool_config"
    blocks = _tool_blocks(tkey, raw.get("tool_config"))
    for name, block in blocks.items():  # validate every block given, not only the active one
        _tool_settings(name, f"{tkey}.{name}", block)
    settings = _tool_settings(tool, f"{tkey}.{tool}", blocks[tool]) if tool else _tool_settings(None, tkey, {})
    save_path = c.writable_dir(f"{key}.save_path", raw["save_path"]) if raw.get("save_path") else glob["save_path"]
    strict = c.boolean(f"{key}.strict", raw["strict"]) if "strict" in raw else glob["strict"]
    budget = (c.optional_integer(f"{key}.max_bytes_per_window", raw["max_bytes_per_window"], minimum=1)
              if "max_bytes_per_window" in raw else glob["max_bytes_per_window"])
    return RolePlan(role=role, enabled=enable and tool is not None, tool=tool, ranks=ranks, all_ranks=all_ranks,
                    stages=stages, steps=steps, save_path=save_path, strict=strict, max_bytes_per_window=budget,
                    **settings)


def _tool_settings(tool: str | None, key: str, block: dict) -> dict:
    discrete = c.boolean(f"{key}.discrete", block.get("discrete", False))
    contents: tuple[str, ...] = ()
    if tool in CONTENTS:
        contents = (c.choices(f"{key}.contents", block["contents"], CONTENTS[tool])
                    if block.get("contents") else DEFAULT_CONTENTS[tool])
    level = export_type = None
    if tool == "npu":
        level = c.choice(f"{key}.level", block.get("level", "level0"), LEVELS)
        export_type = c.choice(f"{key}.export_type", block.get("export_type", "text"), EXPORT_TYPES)
    memory = MemoryOptions()
    if tool == "torch_memory":
        memory = MemoryOptions(
            max_entries=c.integer(f"{key}.max_entries", block.get("max_entries", memory.max_entries), minimum=1),
            stack_depth=c.integer(f"{key}.stack_depth", block.get("stack_depth", memory.stack_depth), minimum=0))
    return dict(mode="discrete" if discrete else "e2e", contents=contents, level=level, export_type=export_type,
                analysis=c.boolean(f"{key}.analysis", block.get("analysis", False)),
                schedule=parse_schedule(f"{key}.schedule", block.get("schedule")), memory=memory)


def parse(data: dict) -> ProfilePlan:
    g = c.mapping("global_profiler", data.get("global_profiler"), GLOBAL_KEYS)
    glob = {
        "tool": c.choice("global_profiler.tool", g.get("tool"), TOOLS, nullable=True),
        "save_path": c.writable_dir("global_profiler.save_path", g.get("save_path") or DEFAULT_SAVE_PATH),
        "strict": c.boolean("global_profiler.strict", g.get("strict", False)),
        "max_bytes_per_window": c.optional_integer("global_profiler.max_bytes_per_window",
                                                   g.get("max_bytes_per_window"), minimum=1),
    }
    steps = c.positive_steps("global_profiler.steps", g.get("steps"))
    continuous = c.boolean("global_profiler.continuous_steps", g.get("continuous_steps", False))
    raw_blocks = {role: c.mapping(path, get(data, path), ROLE_KEYS) for role, path in ROLE_BLOCKS.items()}
    inherited = {k: v for k, v in raw_blocks["actor"].items() if k != "stages"}  # stages are per role
    for role in INHERITS_FROM_ACTOR:  # omitted fields follow the actor's settings
        raw_blocks[role] = _deep_merge(inherited, raw_blocks[role])
    roles = tuple(_role(role, ROLE_BLOCKS[role], raw_blocks[role], glob, steps) for role in ROLES)
    return ProfilePlan(dialect="global_role", roles=roles, continuous_steps=continuous)
