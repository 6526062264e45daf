"""Dialect "legacy trainer": trainer.profile_steps + per-group profiler + NPU block.

Seed-era verl (v0.4.1: one `profiler: {discrete, all_ranks, ranks}` block per role; v0.5: one for the
actor_rollout_ref group, `trainer.npu_profile.options` for Ascend) chose the tool from the machine: NVTX
present (CUDA) -> Nsight Systems capture ranges (nsys), else the npu tool. `ranks: []` profiles no rank.
"""

from __future__ import annotations

from . import checks as c
from .plan import ProfilePlan, RolePlan
from ..frameworks import verl
from .source import get, has
from ..vocab import DEFAULT_SAVE_PATH, LEVELS, ROLE_STAGES, ROLES, STAGES

GROUP_BLOCKS = verl.LEGACY_GROUP_BLOCKS
ROLE_BLOCKS = verl.LEGACY_ROLE_BLOCKS
GROUP_KEYS = verl.LEGACY_BLOCK_KEYS
NPU_KEYS = (
    "save_path",
    "level",
    "record_shapes",
    "with_memory",
    "with_npu",
    "with_cpu",
    "with_module",
    "with_stack",
    "analysis",
    "roles",
)
# with_* switch -> content name, in the order contents are listed
SWITCH_CONTENTS = (
    ("with_npu", "npu"),
    ("with_cpu", "cpu"),
    ("with_memory", "memory"),
    ("record_shapes", "shapes"),
    ("with_stack", "stack"),
    ("with_module", "module"),
)
SWITCH_DEFAULTS = {"with_npu": True, "with_cpu": True}


def detect_keys(data: dict) -> list[str]:
    return [k for k in ("trainer.profile_steps", "trainer.npu_profile", "actor_rollout_ref.profiler") if has(data, k)]


def _npu_block(data: dict) -> dict | None:
    if not has(data, "trainer.npu_profile"):
        return None
    outer = c.mapping("trainer.npu_profile", get(data, "trainer.npu_profile"), ("options",))
    return c.mapping("trainer.npu_profile.options", outer.get("options"), NPU_KEYS)


def _blocks(data: dict) -> dict[str, tuple[str, bool, dict]]:
    """role -> (key, written, block): a group block (v0.5) for its roles, else each role's own (v0.4.1)."""
    out = {}
    for path, roles in GROUP_BLOCKS.items():
        if has(data, path):
            for role in roles:
                out[role] = (path, True, c.mapping(path, get(data, path), GROUP_KEYS))
    for role, path in ROLE_BLOCKS.items():
        if role not in out:
            out[role] = (path, has(data, path), c.mapping(path, get(data, path), GROUP_KEYS))
    return out


def parse(data: dict, *, device: str = "cpu") -> ProfilePlan:
    steps = c.positive_steps("trainer.profile_steps", get(data, "trainer.profile_steps"))
    continuous = c.boolean("trainer.profile_continuous_steps", get(data, "trainer.profile_continuous_steps", False))
    npu = _npu_block(data)
    tool = "nsys" if device == "cuda" else "npu"  # by machine, as verl did (NVTX present -> nsys)
    key = "trainer.npu_profile.options"
    npu = npu or {}
    save_path = c.writable_dir(f"{key}.save_path", npu.get("save_path") or DEFAULT_SAVE_PATH)
    level = c.choice(f"{key}.level", npu.get("level", "level0"), LEVELS) if tool == "npu" else None
    contents = tuple(
        name
        for switch, name in SWITCH_CONTENTS
        if c.boolean(f"{key}.{switch}", npu.get(switch, SWITCH_DEFAULTS.get(switch, False)))
    )
    # the host sampler: with_stack asks for Python stacks; no with_* switch written leaves it on, as its default
    host_stacks = "stack" in contents or not any(switch in npu for switch, _ in SWITCH_CONTENTS)
    if tool != "npu":
        contents = ()
    analysis = c.boolean(f"{key}.analysis", npu.get("analysis", False))
    stage_filter = STAGES
    if npu.get("roles") is not None:
        picked = c.choices(f"{key}.roles", npu["roles"], ("all",) + STAGES)
        stage_filter = STAGES if "all" in picked else picked
    roles = []
    for role, (path, present, block) in _blocks(data).items():
        discrete = c.boolean(f"{path}.discrete", block.get("discrete", False))
        all_ranks = c.boolean(f"{path}.all_ranks", block.get("all_ranks", False))
        raw_ranks = block.get("ranks")
        ranks = c.rank_list(f"{path}.ranks", raw_ranks)
        if raw_ranks is None and not all_ranks:
            ranks = (0,)  # unset: rank 0; an explicit [] profiles no rank
        roles.append(
            RolePlan(
                role=role,
                enabled=present,
                tool=tool,
                ranks=ranks if present else (),
                all_ranks=all_ranks,
                mode="discrete" if discrete else "e2e",
                contents=contents,
                level=level,
                export_type="text" if tool == "npu" else None,
                analysis=analysis,
                schedule=None,
                stages=tuple(s for s in ROLE_STAGES[role] if s in stage_filter),
                steps=steps,
                save_path=save_path,
                host_stacks=host_stacks,
            )
        )
    by_role = {r.role: r for r in roles}
    return ProfilePlan(
        dialect="legacy",
        roles=tuple(by_role[r] for r in ROLES),
        continuous_steps=continuous,
        framework="verl (seed era: trainer.profile_steps)",
    )
