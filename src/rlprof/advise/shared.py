"""What the three modes of `rlprof advise` share: the dialects, the one-line error, the manifest rows of a run
and whether a path holds step metrics rather than traces, and nesting dotted keys into a config."""

from __future__ import annotations

from pathlib import Path

from ..errors import RLProfError

DIALECTS = ("verl", "mindspeed", "rlprof")


class AdviseError(RLProfError):
    pass


def check_dialect(dialect: str) -> None:
    if dialect not in DIALECTS:
        raise AdviseError(f"--dialect {dialect!r} is unknown; allowed: {', '.join(DIALECTS)}")


def run_windows(path: Path) -> list[dict]:
    """The manifest rows of a run directory (any depth), or [] for output rlprof did not write."""
    import msgspec

    rows = []
    for manifest in sorted(Path(path).rglob("manifest.jsonl")) if Path(path).is_dir() else []:
        for line in manifest.read_bytes().splitlines():
            try:
                rows.append(msgspec.json.decode(line))
            except msgspec.DecodeError:
                continue
    return rows


def nest(flat: dict) -> dict:
    out: dict = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def is_metrics_input(path: str | Path) -> bool:
    """A run's step metrics rather than its traces: a .jsonl / .log / .txt file other than a manifest, or a
    directory with a metrics.jsonl and no rlprof manifest (the trainer's outputs/train/<run_id>)."""
    p = Path(path)
    if p.is_file():
        return p.name != "manifest.jsonl" and p.suffix in (".jsonl", ".log", ".txt")
    return p.is_dir() and (p / "metrics.jsonl").is_file() and not any(p.rglob("manifest.jsonl"))
