"""Configuration: three YAML dialects -> one validated, immutable ProfilePlan. Never imports torch."""

from __future__ import annotations

import importlib.util
import os
from typing import Sequence

import msgspec

from ..errors import ConfigError
from ..frameworks import verl
from . import global_role, integrated, legacy
from .plan import MemoryOptions, ProfilePlan, RolePlan, Schedule, disabled_plan
from .source import get, has, load_config
from ..vocab import ROLES, STAGES, TOOLS, UNITS

__all__ = [
    "ProfilePlan",
    "RolePlan",
    "Schedule",
    "MemoryOptions",
    "load_plan",
    "resolve_plan",
    "load_config",
    "detect_dialect",
    "machine_device",
    "machine_warnings",
    "ROLES",
    "STAGES",
    "TOOLS",
    "UNITS",
]

DIALECTS = {"global_role": global_role, "legacy": legacy, "integrated": integrated}
ROLLOUT_MODE_KEYS = ("actor_rollout_ref.rollout.mode", "rollout.mode")


# What `rlprof train` / `rlprof demo` collect when their config has no profiling keys at all.
DEFAULT_PROFILE = (
    "global_profiler.tool=torch",
    "global_profiler.steps=[2]",
    "actor_rollout_ref.actor.profiler.enable=true",
)


def with_default_profile(data: dict) -> dict:
    if detect_dialect(data) is not None:
        return data
    merged = load_config(None, DEFAULT_PROFILE)
    return {**data, **merged}


def machine_device() -> str:
    """'npu', 'cuda' or 'cpu', judged without importing torch (a dry run must stay cheap)."""
    if importlib.util.find_spec("torch_npu") is not None:
        return "npu"
    return "cuda" if os.path.exists("/dev/nvidiactl") else "cpu"


def detect_dialect(data: dict) -> str | None:
    found = {name: mod.detect_keys(data) for name, mod in DIALECTS.items()}
    present = {name: keys for name, keys in found.items() if keys}
    if (
        set(present) == {"global_role", "legacy"}
        and "global_profiler" not in data
        and has(data, "trainer.profile_steps")
    ):
        return "legacy"  # v0.4.1's layout: per-role profiler blocks beside trainer.profile_steps
    if len(present) > 1:
        (a, ka), (b, kb) = list(present.items())[:2]
        raise ConfigError(
            "config",
            f"{ka[0]} + {kb[0]}",
            "keys of one dialect only (global_role: global_profiler "
            "+ role profilers; legacy: trainer.profile_steps; integrated: profiler_config)",
            problem=f"mixes the {a} and {b} dialects",
        )
    if present:
        return next(iter(present))
    if get(data, "critic.profiler") is not None or get(data, "reward_model.profiler") is not None:
        return "global_role"
    return None


def _async_rollout(data: dict) -> bool:
    for key in ROLLOUT_MODE_KEYS:
        mode = get(data, key)
        if mode is not None:
            if mode not in ("sync", "async"):
                raise ConfigError(key, mode, "sync, async")
            return mode == "async"
    return False


def resolve_plan(data: dict, *, device: str | None = None, verl_version: str | None = None) -> ProfilePlan:
    """Validate a merged config dict and normalise it into a ProfilePlan.

    `verl_version`: read a verl config with that release's meaning (default: detected, else the current one)."""
    if verl_version is not None and verl_version not in verl.VERSIONS:
        raise ConfigError("--verl-version", verl_version, ", ".join(verl.VERSIONS))
    dialect = detect_dialect(data)
    device = device or machine_device()
    if dialect is None:
        plan = disabled_plan()
    elif dialect == "integrated":
        plan = integrated.parse(data, device=device)
    elif dialect == "global_role":
        plan = global_role.parse(data, version=verl_version)
    else:
        plan = DIALECTS[dialect].parse(data, device=device)
    if not _async_rollout(data):
        return plan
    rollout = plan.role("rollout")
    warnings = list(plan.warnings)
    if rollout.enabled and rollout.mode != "discrete":
        key = {
            "global_role": f"actor_rollout_ref.rollout.profiler.tool_config.{rollout.tool}.discrete",
            "legacy": "actor_rollout_ref.profiler.discrete",
        }.get(plan.dialect, "rollout discrete")
        if get(data, verl.ROLLOUT_MODE_KEY) is None:  # rlprof's own trainer: refuse
            raise ConfigError(
                key,
                False,
                "true: async rollout (agent loop) profiles each replica in its own "
                "process, so the rollout role needs discrete mode",
            )
        # verl runs such a config and simply does not profile its engines
        warnings.append(
            f"rollout: async rollout (agent loop) profiles the inference engines in discrete mode only; "
            f"{key} is false, so verl runs this config without profiling its rollout engines"
        )
        rollout = msgspec.structs.replace(rollout, enabled=False)
    elif plan.dialect == "global_role" and rollout.enabled:
        rollout, note = global_role.rollout_replicas(plan, data)
        if note:
            warnings.append("note: " + note)
    roles = tuple(rollout if r.role == "rollout" else r for r in plan.roles)
    return msgspec.structs.replace(plan, roles=roles, async_rollout=True, warnings=tuple(warnings))


def load_plan(
    path: str | os.PathLike | None = None,
    overrides: Sequence[str] = (),
    *,
    device: str | None = None,
    verl_version: str | None = None,
) -> ProfilePlan:
    """Read YAML + Hydra-style overrides and resolve the plan. Raises ConfigError on bad input."""
    return resolve_plan(load_config(path, overrides), device=device, verl_version=verl_version)


def machine_warnings(plan: ProfilePlan, device: str | None = None) -> list[str]:
    """What this machine could not collect (a dry run still resolves the plan)."""
    device = device or machine_device()
    tools = {r.tool for r in plan.roles if r.enabled}
    warnings = []
    if "npu" in tools and device != "npu":
        warnings.append("warning: tool npu needs torch_npu, which this machine lacks; collection here would fail")
    if "nsys" in tools and device != "cuda":
        warnings.append("warning: tool nsys needs CUDA, which this machine lacks; collection here would fail")
    if "torch_memory" in tools and device != "cuda":
        warnings.append("warning: tool torch_memory needs CUDA; on this machine it only prints a notice")
    return (
        [w if w.startswith(("warning:", "note:")) else "warning: " + w for w in plan.warnings]
        + warnings
        + verl_plugin_warnings(plan)
    )


def verl_plugin_warnings(plan: ProfilePlan, environ=None) -> list[str]:
    """Whether the verl installed here would run rlprof's verl plugin for a plan that samples micro-batches in verl's
    workers: one line, a note when it would, a warning naming what verl collects instead when it would not. Nothing
    where verl is not installed here (the plan may be for rlprof's own trainer), and verl is never imported."""
    from .describe import plugin_stages, verl_alone

    sampling = [r for r in plan.roles if plugin_stages(plan, r)]
    if not sampling or importlib.util.find_spec("verl") is None:
        return []
    import importlib.metadata as md

    environ = os.environ if environ is None else environ
    try:
        release = md.version("verl")
    except md.PackageNotFoundError:
        release = "unknown"
    instead = "; ".join(verl_alone(r, release) for r in sampling)
    major_minor = ".".join(release.split(".")[:2])
    if major_minor not in verl.PLUGIN_RELEASES:
        return [
            f"warning: verl {release} here is not a release rlprof's verl plugin knows "
            f"({', '.join(verl.PLUGIN_RELEASES)}.x): it will sample no micro-batch (one warning in each worker), "
            f"and verl collects instead: {instead}"
        ]
    listed = ",".join((environ.get(verl.EXTERNAL_MODULES_ENV, ""), *plan.external_modules))
    if verl.PLUGIN_MODULE in [m.strip() for m in listed.split(",")]:
        return [
            f"note: micro-batches are sampled inside verl's workers by rlprof's verl plugin "
            f"({verl.EXTERNAL_MODULES_ENV} imports it; verl {release} here)"
        ]
    if major_minor not in verl.ENTRY_POINT_RELEASES:
        return [
            f"warning: verl {release} here loads no entry-point plugins: set {verl.EXTERNAL_MODULES_ENV}="
            f"{verl.PLUGIN_MODULE} in the workers' environment (+ray_kwargs.ray_init.runtime_env.env_vars."
            f"{verl.EXTERNAL_MODULES_ENV}=...; actor_rollout_ref.model.external_lib is imported too late). "
            f"Without it {verl.refuses_unit(release)}; without the key verl collects instead: {instead}"
        ]
    found = [ep for ep in md.entry_points(group=verl.PLUGIN_GROUP) if ep.value == verl.PLUGIN_MODULE]
    policy = environ.get(verl.PLUGINS_POLICY_ENV, "auto").strip().lower()
    allowed = policy == "auto" or (
        policy != "none" and any(ep.name in {p.strip() for p in policy.split(",")} for ep in found)
    )
    if not found or not allowed:
        why = (
            f"rlprof's entry point ({verl.PLUGIN_GROUP}: {verl.PLUGIN_NAME}) is not installed in this environment"
            if not found
            else f"{verl.PLUGINS_POLICY_ENV}={environ.get(verl.PLUGINS_POLICY_ENV)} keeps verl from loading it"
        )
        return [
            f"warning: rlprof's verl plugin will not run in verl's workers: {why}. Without it {verl.refuses_unit(release)}; "
            f"without the key verl collects instead: {instead}"
        ]
    return [
        f"note: micro-batches are sampled inside verl's workers by rlprof's verl plugin (entry point "
        f"{verl.PLUGIN_GROUP}: {verl.PLUGIN_NAME}; verl {release} here)"
    ]
