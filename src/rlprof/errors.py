"""Errors that reach users as one line (the CLI turns them into exit code 2)."""

from __future__ import annotations


class RLProfError(Exception):
    """Base class: anything rlprof reports to a user as a single clear line."""


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class ConfigError(RLProfError):
    """A bad configuration value: names the key, the value and what is allowed."""

    def __init__(self, key: str, value: object, allowed: str, *, problem: str | None = None):
        self.key, self.value, self.allowed, self.problem = key, value, allowed, problem
        what = problem or "is not allowed"
        super().__init__(f"config error: {key} = {_show(value)} {what}; allowed: {allowed}")


class UnknownKeyError(ConfigError):
    def __init__(self, key: str, value: object, known: list[str], hint: str | None = None):
        allowed = ", ".join(sorted(known)) if known else "(no keys here)"
        if hint:
            allowed = f"{allowed} (did you mean {hint}?)"
        super().__init__(key, value, allowed, problem="is an unknown key")


class CollectError(RLProfError):
    """A backend failure while collecting, raised only when the plan is strict."""


class AnalyzeError(RLProfError):
    """An input `rlprof analyze` cannot read at all (missing, empty, nothing recognisable in it)."""
