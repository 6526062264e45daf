"""Small validators. Each names the dotted key, the bad value and what is allowed."""

from __future__ import annotations

import difflib
import os
import tempfile
from contextlib import contextmanager
from typing import Any, Iterable, Mapping

from ..errors import ConfigError, UnknownKeyError

IGNORED_KEYS = frozenset({"_target_"})  # Hydra instantiation hints found in real framework configs


def join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def mapping(key: str, value: Any, known: Iterable[str], *, nullable: bool = True) -> dict:
    """A block of keys; an unknown key inside it is an error (with a did-you-mean hint)."""
    if value is None and nullable:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(key, value, "a mapping of " + ", ".join(sorted(known)), problem="is not a mapping")
    known = list(known)
    out = {}
    for k, v in value.items():
        if k in IGNORED_KEYS:
            continue
        if k not in known:
            close = difflib.get_close_matches(str(k), known, n=1)
            raise UnknownKeyError(join(key, str(k)), v, known, close[0] if close else None)
        out[k] = v
    return out


def boolean(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(key, value, "true or false", problem="is not a boolean")


def integer(key: str, value: Any, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        allowed = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise ConfigError(key, value, allowed, problem="is not an integer")
    if minimum is not None and value < minimum:
        raise ConfigError(key, value, f"an integer >= {minimum}")
    return value


def optional_integer(key: str, value: Any, *, minimum: int | None = None) -> int | None:
    return None if value is None else integer(key, value, minimum=minimum)


def choice(key: str, value: Any, allowed: Iterable[str], *, nullable: bool = False) -> str | None:
    allowed = tuple(allowed)
    if value is None and nullable:
        return None
    if not isinstance(value, str) or value not in allowed:
        shown = ", ".join(allowed) + (", null" if nullable else "")
        raise ConfigError(key, value, shown)
    return value


def string(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, value, "a non-empty string", problem="is not a string")
    return value


def as_list(key: str, value: Any, what: str) -> list:
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ConfigError(key, value, f"a list of {what}", problem="is not a list")


def int_list(key: str, value: Any, *, minimum: int, what: str) -> tuple[int, ...]:
    """A list of integers >= minimum, sorted and de-duplicated; null means empty."""
    if value is None:
        return ()
    items = as_list(key, value, what)
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, int):
            raise ConfigError(f"{key}[{i}]", item, what, problem="is not an integer")
        if item < minimum:
            raise ConfigError(f"{key}[{i}]", item, what)
    return tuple(sorted(set(items)))


def positive_steps(key: str, value: Any) -> tuple[int, ...]:
    """Steps are 1-based; null or [] means collect nothing."""
    return int_list(key, value, minimum=1, what="positive integers (steps are 1-based) or null")


def rank_list(key: str, value: Any) -> tuple[int, ...]:
    return int_list(key, value, minimum=0, what="non-negative integer ranks")


def choices(key: str, value: Any, allowed: Iterable[str]) -> tuple[str, ...]:
    allowed = tuple(allowed)
    items = as_list(key, value, "names from: " + ", ".join(allowed))
    for i, item in enumerate(items):
        if not isinstance(item, str) or item not in allowed:
            raise ConfigError(f"{key}[{i}]", item, ", ".join(allowed))
    return tuple(dict.fromkeys(items))  # keep order, drop repeats


def writable_dir(key: str, path: Any) -> str:
    """A directory that exists and is writable, or could be created (checked without creating it)."""
    path = string(key, path)
    probe = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise ConfigError(
            key,
            path,
            "a directory path that can be created and written",
            problem=f"cannot be created ({probe} is not a directory)",
        )
    try:  # a real write probe: permission bits say nothing for root or on read-only filesystems
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise ConfigError(
            key,
            path,
            "a directory path that can be created and written",
            problem=f"cannot be written ({probe}: {exc.strerror or exc})",
        ) from None
    return path


@contextmanager
def framework_would(what: str):
    """Where rlprof refuses what the framework itself runs, the refusal says in the same line what the framework
    would do with it (`what`: "verl would run and profile nothing ...")."""
    try:
        yield
    except UnknownKeyError:
        raise
    except ConfigError as exc:
        raise ConfigError(exc.key, exc.value, f"{exc.allowed}; {what}", problem=exc.problem) from None
