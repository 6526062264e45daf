"""Dialect "legacy trainer" (SPEC §1b): trainer.profile_steps + per-group profiler + NPU block.

Older releases of the framework chose the tool from the machine: the NPU block means the npu tool,
otherwise Nsight Systems capture ranges (nsys).
"""

from __future__ import annotations

from . import checks as c
from .plan import ProfilePlan, RolePlan
from .source import get, has
from .vocab import DEFAULT_SAVE_PATH, LEVELS, ROLE_STAGES, ROLES, STAGES

GROUP_BLOCKS = {"actor_rollout_ref.profiler": ("actor", "rollout", "ref"), "critic.profiler": ("critic",)}
GROUP_KEYS = ("discrete", "all_ranks", "ranks")
NPU_KEYS = ("save_path", "level", "record_shapes", "with_memory", "with_npu", "with_cpu", "with_module",
            "with_stack", "analysis", "roles")
# with_* switch -> content name, in the order contents are listed
SWITCH_CONTENTS = (("with_npu", "npu"), ("with_cpu", "cpu"), ("with_memory", "memory"),
                   ("record_shapes", "shapes"), ("with_stack", "stack"), ("with_module", "module"))
SWITCH_DEFAULTS = {"with_npu": True, "with_cpu": True}


def detect_keys(data: dict) -> list[str]:
    return [k for k in ("trainer.profile_steps", "trainer.npu_profile", "actor_rollout_ref.profiler") if has(data, k)]


def _npu_block(data: dict) -> dict | None:
    if not has(data, "trainer.npu_profile"):
        return None
    outer = c.mapping("trainer.npu_profile", get(data, "trainer.npu_profile"), ("options",))
    return c.mapping("trainer.npu_profile.options", outer.get("options"), NPU_KEYS)


def parse(data: dict) -> ProfilePlan:
    steps = c.positive_steps("trainer.profile_steps", get(data, "trainer.profile_steps"))
    npu = _npu_block(data)
    tool = "npu" if npu is not None else "nsys"
    key = "trainer.npu_profile.options"
    npu = npu or {}
    save_path = c.writable_dir(f"{key}.save_path", npu.get("save_path") or DEFAULT_SAVE_PATH)
    level = c.choice(f"{key}.level", npu.get("level", "level0"), LEVELS) if tool == "npu" else None
    contents = tuple(name for switch, name in SWITCH_CONTENTS
                     if c.boolean(f"{key}.{switch}", npu.get(switch, SWITCH_DEFAULTS.get(switch, False))))
    if tool != "npu":
        contents = ()
    analysis = c.boolean(f"{key}.analysis", npu.get("analysis", False))
    stage_filter = STAGES
    if npu.get("roles") is not None:
        picked = c.choices(f"{key}.roles", npu["roles"], ("all",) + STAGES)
        stage_filter = STAGES if "all" in picked else picked
    by_role: dict[str, RolePlan] = {}
    for path, roles in GROUP_BLOCKS.items():
        present = has(data, path)
        block = c.mapping(path, get(data, path), GROUP_KEYS)
        discrete = c.boolean(f"{path}.discrete", block.get("discrete", False))
        all_ranks = c.boolean(f"{path}.all_ranks", block.get("all_ranks", False))
        ranks = c.rank_list(f"{path}.ranks", block.get("ranks")) or (() if all_ranks else (0,))
        for role in roles:
            by_role[role] = RolePlan(
                role=role, enabled=present, tool=tool, ranks=ranks if present else (), all_ranks=all_ranks,
                mode="discrete" if discrete else "e2e", contents=contents, level=level,
                export_type="text" if tool == "npu" else None, analysis=analysis, schedule=None,
                stages=tuple(s for s in ROLE_STAGES[role] if s in stage_filter), steps=steps, save_path=save_path)
    roles = tuple(by_role.get(r) or RolePlan(
        role=r, enabled=False, tool=tool, ranks=(), all_ranks=False, mode="e2e", contents=contents, level=level,
        export_type="text" if tool == "npu" else None, analysis=analysis, schedule=None,
        stages=ROLE_STAGES[r], steps=steps, save_path=save_path) for r in ROLES)
    return ProfilePlan(dialect="legacy", roles=roles)
