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


def _parsed_overrides(overrides: Sequence[str]) -> list[tuple[str, str, Any, bool]]:
    """(the override as given, key, value, whether it adds: `+` or `++`) per override, read with Hydra's own override grammar (the one verl
    and MindSpeed-RL's entry points parse their command lines with), so what Hydra refuses is refused here."""
    if not overrides:
        return []
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    parser = OverridesParser.create()
    out = []
    for raw in overrides:
        if not isinstance(raw, str) or "=" not in raw or raw.startswith("~"):
            raise ConfigError(
                "override", raw, "key=value, +key=value or ++key=value (Hydra style)", problem="is not an override"
            )
        try:
            parsed = parser.parse_override(raw)
        except Exception as exc:  # Hydra's grammar error (OverrideParseException and its kin)
            raise ConfigError(
                "override",
                raw,
                "key=value with a value in Hydra's override grammar (quote a value "
                "that holds spaces or quotes: 'key=\"a b\"')",
                problem=f"does not parse as Hydra parses it ({_first_line(exc)})",
            ) from None
        if parsed.is_sweep_override():
            raise ConfigError(
                "override",
                raw,
                "one value; a list is written [a,b]",
                problem="is a sweep (a,b): Hydra refuses it outside --multirun (Ambiguous value)",
            )
        out.append(
            (raw, parsed.key_or_group, parsed.value(), parsed.type in (OverrideType.ADD, OverrideType.FORCE_ADD))
        )
    return out


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
            raise ConfigError(
                "config", str(path), "a YAML mapping", problem=f"does not parse: {_yaml_problem(exc)}"
            ) from None
        except (OmegaConfBaseException, ValueError, OSError) as exc:
            raise ConfigError(
                "config", str(path), "a YAML mapping", problem=f"could not be read ({_first_line(exc)})"
            ) from None
    closed = _closed(path, layers[0]) if layers else None
    added: set[str] = set()
    for raw, key, value, adds in _parsed_overrides(overrides):
        if closed is not None and not adds and key not in added and not _holds(closed, key):
            raise ConfigError(
                "override",
                raw,
                f"+{raw} to add it (verl then ignores a key its dataclasses lack)",
                problem=f"names a key {os.path.basename(path)} does not hold: Hydra refuses it in a "
                "whole verl config (Key not in struct)",
            )
        if adds:
            added.add(key)
        layer = OmegaConf.create()
        try:
            OmegaConf.update(layer, key, value, force_add=True)
        except (OmegaConfBaseException, ValueError, TypeError) as exc:
            raise ConfigError(
                "override", raw, "key=value with a dotted key", problem=f"could not be set ({_first_line(exc)})"
            ) from None
        layers.append(layer)
    if not layers:
        return {}
    try:
        merged = OmegaConf.merge(*layers)
        data = OmegaConf.to_container(merged, resolve=True)
    except (OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(
            "config",
            str(path or "overrides"),
            "a consistent YAML mapping",
            problem=f"could not be merged ({_first_line(exc)})",
        ) from None
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
