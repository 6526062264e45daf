"""`trigger` (rlprof's extension: catching the slow step): the watch and what arms a capture while the job
runs. Read from `global_profiler.trigger` in the global+role dialect and from `<prefix>.trigger` in the others."""

from __future__ import annotations

from typing import Any

from . import checks as c
from .plan import SlowRule, TriggerPlan
from ..errors import ConfigError
from ..vocab import STAGES

KEYS = (
    "slow",
    "straggler",
    "request",
    "max_captures",
    "cooldown",
    "keep",
    "warmup_steps",
    "window",
    "stages",
    "baseline",
)
RULE_KEYS = ("factor", "min_seconds")
KEEP = ("next", "slow_only")


def _number(key: str, value: Any, *, above: float | None = None, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(key, value, "a number", problem="is not a number")
    if above is not None and not value > above:
        raise ConfigError(key, value, f"a number > {above}")
    if minimum is not None and value < minimum:
        raise ConfigError(key, value, f"a number >= {minimum}")
    return float(value)


def _rule(key: str, raw: Any) -> SlowRule | None:
    if raw is None or raw is False:
        return None
    block = c.mapping(key, raw, RULE_KEYS, nullable=False)
    if "factor" not in block:
        raise ConfigError(f"{key}.factor", None, "a number > 1 (times the baseline)", problem="is missing")
    rule = SlowRule(factor=_number(f"{key}.factor", block["factor"], above=1.0))
    if "min_seconds" in block:
        rule = SlowRule(factor=rule.factor, min_seconds=_number(f"{key}.min_seconds", block["min_seconds"], minimum=0))
    return rule


def parse_trigger(key: str, raw: Any) -> TriggerPlan | None:
    """The trigger block at `key`, validated; None when absent. Every bad value is one ConfigError naming it."""
    if raw is None:
        return None
    b = c.mapping(key, raw, KEYS, nullable=False)
    stages = c.choices(f"{key}.stages", b["stages"], STAGES) if b.get("stages") is not None else None
    trigger = TriggerPlan(
        slow=_rule(f"{key}.slow", b.get("slow")),
        straggler=_rule(f"{key}.straggler", b.get("straggler")),
        request=c.boolean(f"{key}.request", b.get("request", False)),
        max_captures=c.integer(f"{key}.max_captures", b.get("max_captures", 3), minimum=1),
        cooldown=c.integer(f"{key}.cooldown", b.get("cooldown", 5), minimum=0),
        keep=c.choice(f"{key}.keep", b.get("keep", "next"), KEEP),
        warmup_steps=c.integer(f"{key}.warmup_steps", b.get("warmup_steps", 3), minimum=0),
        window=c.integer(f"{key}.window", b.get("window", 20), minimum=3),
        stages=stages,
        baseline=c.boolean(f"{key}.baseline", b.get("baseline", False)),
    )
    if trigger.slow is None and trigger.straggler is None and not trigger.request:
        raise ConfigError(
            key,
            raw,
            "at least one of slow: {factor: ...}, straggler: {factor: ...}, request: true",
            problem="arms nothing",
        )
    if trigger.keep == "slow_only" and trigger.slow is None and trigger.straggler is None:
        raise ConfigError(
            f"{key}.keep",
            "slow_only",
            "next, or slow_only beside a slow or straggler rule (it keeps the windows those rules find slow)",
        )
    return trigger
