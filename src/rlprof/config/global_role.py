"""Dialect "global + role": verl 0.9's profiler config, key for key and with verl's meaning.

A whole verl trainer YAML loads (its non-profiler keys are not looked at; `_target_` keys are ignored and
OmegaConf interpolations were resolved by the loader). verl's meaning: the torch `schedule` samples update
mini-batches (`active: 0` = off, `repeat: 0` = until the window closes, one window per step in e2e mode);
`profile_token_start/end` pick rollout decode steps [start, end); the ref stages of verl's combined
actor_rollout_ref worker follow the actor's profiler; rollout `ranks` are global GPU ranks mapped to
replicas (0.9.1 on) or replica indices (0.9.0). advantage_compute runs on verl's driver, outside every
worker's profiler: it stays in the actor's stages for rlprof's own trainer, and the plan says verl has no trace of it. rlprof's own additions (`unit`, `max_bytes_per_window`,
`strict`, `stages`, the `markers` tool) extend it; keys rlprof takes but verl refuses resolve with a warning.

Over 400 lines because it is one dialect, key for key, with the checks that are its meaning.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..frameworks import verl
from . import checks as c
from .plan import FinishHook, MemoryOptions, ProfilePlan, RolePlan, Schedule
from .source import get
from .trigger import parse_trigger
from ..vocab import DEFAULT_CONTENTS, DEFAULT_SAVE_PATH, EXPORT_TYPES, HOST_STACKS, LEVELS, ROLE_STAGES, ROLES, STAGES
from ..vocab import TOOLS, UNITS, wants_host_stacks

ROLE_BLOCKS = verl.ROLE_BLOCKS
RLPROF_ROLE_KEYS = ("stages", "strict", "max_bytes_per_window")
RLPROF_GLOBAL_KEYS = ("continuous_steps", "strict", "max_bytes_per_window", "trigger")
# rlprof's extensions inside verl's tool blocks: key -> what verl makes of it
TOOL_EXTENSIONS = {
    "torch": ("analysis",),
    "npu": ("export_type", "schedule"),
    "nsys": ("schedule",),
    "torch_memory": ("max_entries", "discrete", "schedule"),
    "precision_debugger": (),
}
TOOL_KEYS = {tool: verl.TOOL_CONFIG_KEYS[tool] + TOOL_EXTENSIONS[tool] for tool in verl.TOOL_CONFIG_KEYS}
TOOL_KEYS["markers"] = ("discrete", "name", "contents")
ALL_TOOLS = TOOLS + tuple(t for t in verl.TOOLS if t not in TOOLS)
SCHEDULE_KEYS = verl.SCHEDULE_KEYS + ("unit",)
OPEN_END = 2**31 - 1  # a token window without an end: active until the window closes


def detect_keys(data: dict) -> list[str]:
    found = ["global_profiler"] if "global_profiler" in data else []
    return found + [
        path
        for role, path in ROLE_BLOCKS.items()
        if role in ("actor", "rollout", "ref") and get(data, path) is not None
    ]


def detect_version(data: dict) -> str:
    """The verl release a config comes from. A whole generated trainer YAML (its global_profiler has `_target_`)
    without 0.9.1's finish-hook keys is 0.9.0; with them and torch_memory's memory_snapshot_num_steps, 0.9.1;
    anything else reads as the current head (frameworks/verl.py)."""
    g = data.get("global_profiler")
    if isinstance(g, dict) and "_target_" in g:
        if not any(k in g for k in verl.KEYS_SINCE_0_9_1):
            return "0.9.0"
        memory = get(g, "global_tool_config.torch_memory")
        if isinstance(memory, dict) and any(k in memory for k in verl.KEYS_UNTIL_0_9_1):
            return "0.9.1"
    return verl.CURRENT_VERSION


class _Reader:
    """One config's parse: the collected warnings live here, not in globals."""

    def __init__(self, data: dict, version: str):
        self.data, self.version = data, version
        self.warnings: list[str] = []

    def extension(self, key: str, value: Any, what: str) -> None:
        self.warnings.append(
            f"{key} = {value!r} is an rlprof extension ({what}); verl {self.version} itself "
            f"refuses this key, so this config only runs under rlprof"
        )

    def wants_host_stacks(self, key: str, contents: tuple[str, ...]) -> bool:
        if HOST_STACKS in contents:
            self.extension(key, HOST_STACKS, "the host's Python stacks sampled in each window")
        return wants_host_stacks(contents)

    # ---- schedule and token window -----------------------------------------------------------
    def schedule(self, key: str, raw: Any, mode: str) -> Schedule | None:
        if raw is None:
            return None
        raw = c.mapping(key, raw, SCHEDULE_KEYS)
        counts = {k: c.integer(f"{key}.{k}", raw[k], minimum=0) for k in SCHEDULE_KEYS[:5] if k in raw}
        if "unit" in raw:  # rlprof's extension: any unit, rlprof's defaults (active 1, repeat 1)
            unit = c.choice(f"{key}.unit", raw["unit"], UNITS)
            if counts.get("repeat") == 0 and mode == "e2e":
                counts["repeat"] = 1  # verl's meaning of repeat 0 in e2e mode: one schedule window (per stage call)
            schedule = Schedule(unit=unit, **counts)
            if schedule.active < 1:
                raise c.ConfigError(f"{key}.active", schedule.active, "an integer >= 1 (units recorded per cycle)")
            return schedule
        if counts.get("active", 0) == 0:
            return None  # verl: scheduling only takes effect when active > 0
        if counts.get("repeat", 0) == 0 and mode == "e2e":
            counts["repeat"] = 1  # verl caps a continuous (e2e) window at one schedule window per step
        counts.setdefault("repeat", 0)
        return Schedule(unit=verl.SCHEDULE_UNIT, **counts)

    def token_window(self, key: str, block: dict) -> tuple[int, int | None] | None:
        start, end = block.get("profile_token_start"), block.get("profile_token_end")
        if start is None and end is None:
            return None
        start = 0 if start is None else c.integer(f"{key}.profile_token_start", start, minimum=0)
        if end is not None:
            end = c.integer(f"{key}.profile_token_end", end, minimum=0)
            if end <= start:
                raise c.ConfigError(
                    f"{key}.profile_token_end",
                    end,
                    f"an integer > profile_token_start ({start}); decode steps [start, end) are collected",
                )
        return start, end

    # ---- tool blocks ---------------------------------------------------------------------------
    def tool_settings(self, tool: str | None, key: str, block: dict, glob: dict, role: str) -> dict:
        for ext in TOOL_EXTENSIONS.get(tool or "", ()):
            if ext in block and not (ext == "schedule" and block[ext] is None):
                self.extension(f"{key}.{ext}", block[ext], f"{tool} {ext}")
        discrete_raw = block.get("discrete")
        if tool == "nsys" and discrete_raw is None:  # ${oc.select:...nsys.discrete} resolving to null
            discrete_raw = glob["tool_config"]["nsys"].get("discrete")
        discrete = c.boolean(f"{key}.discrete", False if discrete_raw is None else discrete_raw)
        mode = "discrete" if discrete else "e2e"
        contents: tuple[str, ...] = ()
        host_stacks = True  # the host sampler: on unless the plan lists contents without it
        if tool in ("torch", "npu"):
            allowed = verl.CONTENTS[tool] + (("module",) if tool == "torch" else ()) + (HOST_STACKS,)
            contents = c.choices(f"{key}.contents", block.get("contents") or [], allowed)
            if "module" in contents and tool == "torch":
                self.extension(f"{key}.contents", "module", "torch module hierarchy")
            host_stacks = self.wants_host_stacks(f"{key}.contents", contents)
            contents = tuple(x for x in contents if x != HOST_STACKS)
            if tool == "torch":  # empty = everything verl collects (CPU + CUDA)
                contents = contents or DEFAULT_CONTENTS["torch"]
            if "cpu" not in contents:  # verl records CPU activity whatever contents says; npu [] is CPU only
                contents = contents + ("cpu",)
        elif tool == "markers" and "contents" in block:
            listed = c.choices(f"{key}.contents", block["contents"] or [], (HOST_STACKS,))
            host_stacks = HOST_STACKS in listed  # rlprof's own tool: its contents say it, [] turns it off
        level = export_type = None
        analysis = False
        if tool == "npu":
            level = c.choice(f"{key}.level", block.get("level", "level0"), LEVELS)
            export_type = c.choice(f"{key}.export_type", block.get("export_type", "db"), EXPORT_TYPES)
            analysis = c.boolean(f"{key}.analysis", block.get("analysis", True))  # the YAML's default
        elif tool == "torch":
            analysis = c.boolean(f"{key}.analysis", block.get("analysis", False))
        memory = MemoryOptions()
        if tool == "torch_memory":
            g = glob["tool_config"]["torch_memory"]

            def pick(name: str, default: int, *alts: str) -> int:
                """The role's value, else global_tool_config's (verl's YAML interpolates it), else the default."""
                for where, b in ((key, block), ("global_profiler.global_tool_config.torch_memory", g)):
                    for k in (name, *alts):
                        if b.get(k) is not None:
                            return c.integer(f"{where}.{k}", b[k], minimum=1)
                return default

            memory = MemoryOptions(
                max_entries=pick("trace_alloc_max_entries", memory.max_entries, "max_entries"),
                stack_depth=pick("stack_depth", memory.stack_depth),
                snapshot_steps=pick("memory_snapshot_num_steps", 1),
            )
        token_window = None
        if tool in ("torch", "npu"):
            token_window = self.token_window(key, block)
            if token_window is not None and role != "rollout":
                self.warnings.append(
                    f"{key}.profile_token_start/end apply to the rollout role only; verl ignores them for {role}"
                )
                token_window = None
        schedule = self.schedule(f"{key}.schedule", block.get("schedule"), mode)
        if token_window is not None:
            if schedule is not None:
                raise c.ConfigError(
                    f"{key}.schedule",
                    block.get("schedule"),
                    "no schedule beside profile_token_start/end (the token window is the rollout's schedule)",
                    problem="conflicts with the token window",
                )
            start, end = token_window
            schedule = Schedule(
                unit=verl.TOKEN_WINDOW_UNIT,
                skip_first=start,
                active=(end - start) if end is not None else OPEN_END,
                repeat=1,
            )
        schedule_stages = verl.SCHEDULED_STAGES if schedule is not None and schedule.unit == "mini_batch" else None
        if tool == "precision_debugger":
            self.precision_debugger(key, block)
        return dict(
            mode=mode,
            contents=contents,
            level=level,
            export_type=export_type,
            analysis=analysis,
            schedule=schedule,
            memory=memory,
            token_window=token_window,
            schedule_stages=schedule_stages,
            host_stacks=host_stacks,
        )

    def precision_debugger(self, key: str, block: dict) -> None:
        if block.get("config_path") is not None:
            c.string(f"{key}.config_path", block["config_path"])
        if block.get("steps") is not None:
            c.positive_steps(f"{key}.steps", block["steps"])
            self.warnings.append(f"{key}.steps is deprecated in verl; global_profiler.steps decides the steps")
        if block.get("stages") is not None:
            c.choices(f"{key}.stages", block["stages"], verl.PRECISION_STAGES)
        c.boolean(f"{key}.strict", block.get("strict", False))

    def tool_blocks(self, key: str, raw: Any) -> dict[str, dict]:
        blocks = c.mapping(key, raw, TOOL_KEYS)
        return {tool: c.mapping(f"{key}.{tool}", blocks.get(tool), TOOL_KEYS[tool]) for tool in TOOL_KEYS}

    def global_tool_config(self, key: str, raw: Any) -> dict[str, dict]:
        blocks = c.mapping(key, raw, verl.GLOBAL_TOOL_CONFIG_KEYS)
        out = {}
        for tool, keys in verl.GLOBAL_TOOL_CONFIG_KEYS.items():
            block = c.mapping(f"{key}.{tool}", blocks.get(tool), keys)
            for name, allowed in verl.TORCH_MEMORY_CHOICES.items():
                if tool == "torch_memory" and name in block:
                    c.choice(f"{key}.{tool}.{name}", block[name], allowed)
            for name in ("controller_nsight_options", "worker_nsight_options", "kw_args"):
                if block.get(name) is not None and not isinstance(block[name], dict):
                    raise c.ConfigError(f"{key}.{tool}.{name}", block[name], "a mapping", problem="is not a mapping")
            if tool == "nsys" and block.get("discrete") is not None:
                c.boolean(f"{key}.nsys.discrete", block["discrete"])
            if tool == "precision_debugger":
                self.precision_debugger(f"{key}.{tool}", block)
            out[tool] = block
        return out

    # ---- roles -----------------------------------------------------------------------------------
    def finish_hook(self, key: str, raw: dict, glob: dict) -> FinishHook | None:
        pick = lambda name: raw[name] if name in raw else glob[name]  # noqa: E731
        all_ranks = pick("finish_hook_all_ranks")
        all_ranks = c.boolean(f"{key}.finish_hook_all_ranks", False if all_ranks is None else all_ranks)
        ranks = c.rank_list(f"{key}.finish_hook_ranks", pick("finish_hook_ranks"))
        cmd = pick("finish_hook_cmd")
        if cmd is None:
            return None
        return FinishHook(cmd=c.string(f"{key}.finish_hook_cmd", cmd), all_ranks=all_ranks, ranks=ranks)

    def role(self, role: str, key: str, raw: dict, glob: dict, steps: tuple[int, ...]) -> RolePlan:
        with c.framework_would(verl.RUNS_UNKNOWN_TOOL):
            tool = c.choice(f"{key}.tool", raw["tool"], ALL_TOOLS, nullable=True) if "tool" in raw else glob["tool"]
        enable = c.boolean(f"{key}.enable", raw.get("enable", False))
        all_ranks = c.boolean(f"{key}.all_ranks", raw.get("all_ranks", False))
        ranks = c.rank_list(f"{key}.ranks", raw.get("ranks"))
        if enable and not all_ranks and not ranks:
            ranks = (0,)  # verl: enabled with no ranks listed means rank 0
        stages = ROLE_STAGES[role]
        if raw.get("stages") is not None:
            stages = c.choices(f"{key}.stages", raw["stages"], STAGES)
            for i, stage in enumerate(stages):
                if stage not in ROLE_STAGES[role]:
                    raise c.ConfigError(
                        f"{key}.stages[{i}]", stage, f"stages of role {role}: " + ", ".join(ROLE_STAGES[role])
                    )
        if "global_tool_config" in raw:
            self.global_tool_config(f"{key}.global_tool_config", raw["global_tool_config"])
        tkey = f"{key}.tool_config"
        blocks = self.tool_blocks(tkey, raw.get("tool_config"))
        active = None
        for name, block in blocks.items():  # validate every block given, not only the active one
            if name == tool:
                active = self.tool_settings(name, f"{tkey}.{name}", block, glob, role)
            elif block:  # verl builds only the active tool's config: a bad value elsewhere is said, not refused
                try:
                    self.tool_settings(name, f"{tkey}.{name}", block, glob, role)
                except c.ConfigError as exc:
                    used = f"verl reads only the {tool} block while the tool is {tool}" if tool else "no tool is set"
                    self.warnings.append(f"{str(exc).removeprefix('config error: ')} (not used: {used})")
        if active is None:
            active = self.tool_settings(None, tkey, {}, glob, role)
        save_path = c.writable_dir(f"{key}.save_path", raw["save_path"]) if raw.get("save_path") else glob["save_path"]
        strict = c.boolean(f"{key}.strict", raw["strict"]) if "strict" in raw else glob["strict"]
        budget = (
            c.optional_integer(f"{key}.max_bytes_per_window", raw["max_bytes_per_window"], minimum=1)
            if "max_bytes_per_window" in raw
            else glob["max_bytes_per_window"]
        )
        relocate = c.boolean(
            f"{key}.relocate_results",
            raw["relocate_results"] if "relocate_results" in raw else glob["relocate_results"],
        )
        return RolePlan(
            role=role,
            enabled=enable and tool is not None,
            tool=tool,
            ranks=ranks,
            all_ranks=all_ranks,
            stages=stages,
            steps=steps,
            save_path=save_path,
            strict=strict,
            max_bytes_per_window=budget,
            finish_hook=self.finish_hook(key, raw, glob),
            relocate_results=relocate,
            **active,
        )


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _same_as_actor(actor: RolePlan, ref: RolePlan) -> bool:
    fields = ("enabled", "tool", "ranks", "all_ranks", "mode", "contents", "level")
    return all(getattr(actor, f) == getattr(ref, f) for f in fields)


def parse(data: dict, *, version: str | None = None) -> ProfilePlan:
    version = version or detect_version(data)
    reader = _Reader(data, version)
    graw = data.get("global_profiler")
    known = verl.GLOBAL_KEYS + RLPROF_GLOBAL_KEYS
    if isinstance(graw, dict) and "_target_" in graw:  # a whole trainer YAML: verl reads global_profiler key by key
        ignored = [k for k in graw if k not in known and k not in c.IGNORED_KEYS]
        reader.warnings += [
            f"global_profiler.{k} is not a key verl reads; it ignores it (keys: {', '.join(verl.GLOBAL_KEYS)})"
            for k in ignored
        ]
        graw = {k: v for k, v in graw.items() if k not in ignored}
    g = c.mapping("global_profiler", graw, known)
    with c.framework_would(verl.RUNS_UNKNOWN_TOOL):
        tool = c.choice("global_profiler.tool", g.get("tool"), ALL_TOOLS, nullable=True)
    glob = {
        "tool": tool,
        "save_path": c.writable_dir("global_profiler.save_path", g.get("save_path") or DEFAULT_SAVE_PATH),
        "strict": c.boolean("global_profiler.strict", g.get("strict", False)),
        "max_bytes_per_window": c.optional_integer(
            "global_profiler.max_bytes_per_window", g.get("max_bytes_per_window"), minimum=1
        ),
        "relocate_results": c.boolean("global_profiler.relocate_results", g.get("relocate_results", False)),
        "finish_hook_cmd": g.get("finish_hook_cmd"),
        "finish_hook_all_ranks": g.get("finish_hook_all_ranks", False),
        "finish_hook_ranks": g.get("finish_hook_ranks"),
        "tool_config": reader.global_tool_config("global_profiler.global_tool_config", g.get("global_tool_config")),
    }
    reader.finish_hook("global_profiler", {}, glob)  # validate the global hook even if no role uses it
    with c.framework_would(verl.RUNS_BAD_STEPS):
        steps = c.positive_steps("global_profiler.steps", g.get("steps"))
    ckey = "profile_continuous_steps" if "profile_continuous_steps" in g else "continuous_steps"
    continuous = c.boolean(f"global_profiler.{ckey}", g.get(ckey, False))
    trigger = parse_trigger("global_profiler.trigger", g.get("trigger"))
    known = verl.ROLE_KEYS + RLPROF_ROLE_KEYS
    raw_blocks = {role: c.mapping(path, get(data, path), known) for role, path in ROLE_BLOCKS.items()}
    inherited = {k: v for k, v in raw_blocks["actor"].items() if k != "stages"}  # stages are per role
    raw_blocks["rollout"] = _deep_merge(inherited, raw_blocks["rollout"])  # verl's YAML: rollout follows actor
    own_ref = raw_blocks["ref"]
    raw_blocks["ref"] = _deep_merge(inherited, {k: v for k, v in own_ref.items() if k == "stages"})
    roles = {}
    for role in ROLES:
        said = len(reader.warnings)
        roles[role] = reader.role(role, ROLE_BLOCKS[role], raw_blocks[role], glob, steps)
        if role == "ref":  # the actor's block read again for the ref's stages: its warnings were said for the actor
            del reader.warnings[said:]
        elif role == "rollout":  # what the rollout inherits from the actor's block was said for the actor
            earlier = set(reader.warnings[:said])
            reader.warnings[said:] = [
                w
                for w in reader.warnings[said:]
                if w.replace(ROLE_BLOCKS["rollout"], ROLE_BLOCKS["actor"]) not in earlier
            ]
    own_schedule = get(data, f"{ROLE_BLOCKS['rollout']}.tool_config.{roles['rollout'].tool}.schedule")
    if isinstance(own_schedule, dict) and "unit" not in own_schedule and (own_schedule.get("active") or 0) > 0:
        reader.warnings.append(
            f"{ROLE_BLOCKS['rollout']}.tool_config.{roles['rollout'].tool}.schedule samples update "
            f"mini-batches ({', '.join(verl.SCHEDULED_STAGES)}); the rollout has none, so verl "
            "ignores it (profile_token_start/end pick its decode steps)"
        )
    # a generated YAML's default (its block carries _target_) is no user's choice; a written block or override is
    written = "_target_" not in (get(data, ROLE_BLOCKS["ref"]) or {})
    if written and own_ref.get("enable") is False and roles["ref"].enabled and roles["ref"].stages:
        reader.warnings.append(
            f"{ROLE_BLOCKS['ref']}.enable = False has no effect: the ref stage runs in verl's combined "
            "actor_rollout_ref worker, whose profiler follows the actor's; to leave it out, "
            f"{ROLE_BLOCKS['ref']}.stages=[] (rlprof's extension; verl itself cannot)"
        )
    if own_ref.get("enable"):  # the combined actor_rollout_ref worker builds its profiler from the actor's block
        written = reader.role("ref", ROLE_BLOCKS["ref"], _deep_merge(inherited, own_ref), glob, steps)
        if not _same_as_actor(roles["ref"], written):
            reader.warnings.append(
                f"{ROLE_BLOCKS['ref']} differs from the actor's profiler and is not used: the ref "
                "stages run in verl's combined actor_rollout_ref worker, which follows the actor's"
            )
    for role, rp in roles.items():
        if rp.enabled and rp.tool in verl.ALL_RANKS_TOOLS and not rp.all_ranks:
            reader.warnings.append(
                f"{ROLE_BLOCKS[role]}: tool {rp.tool} leaves rank selection to its own config; verl "
                f"opens every rank for it, and so does this plan (ranks {list(rp.ranks)} not used)"
            )
            roles[role] = msgspec.structs.replace(rp, all_ranks=True)
    roles["rollout"] = _as_rollout_servers_do(roles["rollout"], reader.warnings)
    driver = [s for s in verl.DRIVER_STAGES if any(rp.enabled and s in rp.stages for rp in roles.values())]
    if driver:
        reader.warnings.append(
            f"note: {', '.join(driver)} runs on verl's driver, outside every worker's profiler: "
            "verl's traces never hold it (rlprof's own trainer records it in the actor's process)"
        )
    for tool, what in verl.FOREIGN_TOOLS.items():
        users = [role for role, rp in roles.items() if rp.enabled and rp.tool == tool]
        if users:
            reader.warnings.append(
                f"tool {tool} ({', '.join(users)}) is {what}; rlprof resolves the plan but has nothing to record for it"
            )
    modules = get(data, verl.RUNTIME_ENV_VARS + "." + verl.EXTERNAL_MODULES_ENV)
    modules = tuple(m.strip() for m in modules.split(",") if m.strip()) if isinstance(modules, str) else ()
    return ProfilePlan(
        dialect="global_role",
        roles=tuple(roles[r] for r in ROLES),
        continuous_steps=continuous,
        framework=f"verl {version}",
        warnings=tuple(dict.fromkeys(reader.warnings)),
        external_modules=modules,
        trigger=trigger,
    )


def _as_rollout_servers_do(rollout: RolePlan, warnings: list[str]) -> RolePlan:
    """verl's rollout runs in its agent-loop servers: a profiler only for torch and npu (rlprof's own markers tool
    is kept: it is rlprof's extension), and never the finish hook (frameworks/verl.py)."""
    key = ROLE_BLOCKS["rollout"]
    if rollout.enabled and rollout.tool not in verl.ROLLOUT_SERVER_TOOLS + ("markers",):
        warnings.append(
            f"{key}: tool {rollout.tool} is off for the rollout: verl's rollout servers profile with "
            f"{' or '.join(verl.ROLLOUT_SERVER_TOOLS)} only (set {key}.tool=torch to profile rollout)"
        )
        return msgspec.structs.replace(rollout, enabled=False)
    if rollout.enabled and rollout.finish_hook is not None and not verl.ROLLOUT_RUNS_FINISH_HOOK:
        warnings.append(
            f"{key}: the finish hook does not run for the rollout: verl's rollout servers never run it, "
            "only the training workers do (their hook covers the shared save_path)"
        )
        return msgspec.structs.replace(rollout, finish_hook=None)
    return rollout


def rollout_replicas(plan: ProfilePlan, data: dict) -> tuple[RolePlan, str | None]:
    """verl 0.9.1 maps the rollout role's global GPU ranks to replicas (rank // (tp*dp*pp)); 0.9.0 took replica
    indices. Returns the rollout plan with replica indices, and a line saying what was mapped."""
    rollout = plan.role("rollout")
    if rollout.all_ranks or not rollout.ranks:
        return rollout, None
    if plan.framework not in {f"verl {v}" for v in verl.GLOBAL_ROLLOUT_RANKS}:
        return rollout, f"rollout ranks {list(rollout.ranks)} are replica indices ({plan.framework})"
    size = 1
    for key in verl.ROLLOUT_PARALLEL_KEYS:
        value = get(data, key)
        size *= c.integer(key, value, minimum=1) if value is not None else 1
    replicas = tuple(sorted({r // size for r in rollout.ranks}))
    note = (
        f"rollout ranks {list(rollout.ranks)} are global GPU ranks; with tp*dp*pp = {size} per replica they "
        f"select replica(s) {', '.join(map(str, replicas))} ({plan.framework})"
    )
    return msgspec.structs.replace(rollout, ranks=replicas), note
