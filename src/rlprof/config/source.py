"""Read a config: a YAML file, then Hydra-style `key=value` overrides, merged in that order."""

from __future__ import annotations

import os
from typing import Any, Sequence

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..errors import ConfigError


def split_config_args(args: list[str]) -> tuple[str | None, list[str]]:
    """[CONFIG] [key=value ...]: the first argument is a config file unless it is an override."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def _override_pairs(overrides: Sequence[str]) -> list[tuple[str, bool]]:
    """(key=value, whether it adds: `+` or `++`) per override."""
    pairs = []
    for raw in overrides:
        item = raw[2:] if raw.startswith("++") else raw[1:] if raw.startswith("+") else raw
        key, sep, _ = item.partition("=")
        if not sep or not key or key.startswith("~"):
            raise ConfigError("override", raw, "key=value, +key=value or ++key=value (Hydra style)",
                              problem="is not an override")
        pairs.append((item, raw.startswith("+")))
    return pairs


def _holds(data: Any, dotted: str) -> bool:
    node = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _closed(path, config) -> dict | None:
    """The file's keys when it is a whole verl trainer config: Hydra loads it as a structured config, closed to
    keys it does not hold (frameworks/verl.py: STRUCTURED_MARKER)."""
    from ..frameworks.verl import STRUCTURED_MARKER

    plain = OmegaConf.to_container(config, resolve=False) if path is not None else None
    return plain if isinstance(plain, dict) and _holds(plain, STRUCTURED_MARKER) else None


def load_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Merged plain-dict config. Interpolations (${...}) are resolved."""
    layers = []
    if path is not None:
        if not os.path.isfile(path):
            raise ConfigError("config", str(path), "a readable YAML file", problem="does not exist")
        try:
            layers.append(OmegaConf.load(path))
        except yaml.YAMLError as exc:
            raise ConfigError("config", str(path), "a YAML mapping",
                              problem=f"does not parse: {_yaml_problem(exc)}") from None
        except (OmegaConfBaseException, ValueError, OSError) as exc:
            raise ConfigError("config", str(path), "a YAML mapping",
                              problem=f"could not be read ({_first_line(exc)})") from None
    closed = _closed(path, layers[0]) if layers else None
    added: set[str] = set()
    for pair, adds in _override_pairs(overrides):
        key = pair.partition("=")[0]
        if closed is not None and not adds and key not in added and not _holds(closed, key):
            raise ConfigError("override", pair, f"+{pair} to add it (verl then ignores a key its dataclasses lack)",
                              problem=f"names a key {os.path.basename(path)} does not hold: Hydra refuses it in a whole "
                                      "verl config (Key not in struct)")
        if adds:
            added.add(key)
        try:
            layers.append(OmegaConf.from_dotlist([pair]))
        except yaml.YAMLError as exc:  # `ranks=[0,`, or `key="a" b` as a pasted `"$X" $@` line makes
            what = getattr(exc, "problem", None) or _first_line(exc)
            raise ConfigError("override", pair, "key=value with a YAML value (quote a value that holds spaces, "
                              "brackets or quotes: 'key=\"a b\"')",
                              problem=f"has a value that is not YAML ({what})") from None
        except (OmegaConfBaseException, ValueError, TypeError) as exc:
            raise ConfigError("override", pair, "key=value with a YAML value",
                              problem=f"could not be parsed ({_first_line(exc)})") from None
    if not layers:
        return {}
    try:
        merged = OmegaConf.merge(*layers)
        data = OmegaConf.to_container(merged, resolve=True)
    except (OmegaConfBaseException, ValueError) as exc:
        raise ConfigError("config", str(path or "overrides"), "a consistent YAML mapping",
                          problem=f"could not be merged ({_first_line(exc)})") from None
    if not isinstance(data, dict):
        raise ConfigError("config", data, "a YAML mapping at the top level", problem="is not a mapping")
    return data


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """'line L, column C: what' (1-based, as editors count)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    what = getattr(exc, "problem", None) or _first_line(exc)
    return f"line {mark.line + 1}, column {mark.column + 1}: {what}" if mark is not None else what


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def get(data: dict, dotted: str, default: Any = None) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def has(data: dict, dotted: str) -> bool:
    sentinel = object()
    return get(data, dotted, sentinel) is not sentinel
