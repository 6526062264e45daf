"""Finding the inputs of `rlprof analyze`: a trace, a manifest, or a run directory in rlprof's, verl's or
MindSpeed-RL's layout (Ascend collections included); each as (file, what its name or manifest row says of it).
A new framework's directory layout goes here (its naming facts in frameworks/)."""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import AnalyzeError

TRACE_SUFFIXES = (".json", ".json.gz", ".pickle")
RUN_CONFIG = "trainer_config.json"  # the reference trainer's settings beside its traces (not a trace)
MODEL_FILE = "model.json"  # a run's model record beside its traces (not a trace: inputs/model_config.py reads it)


def find_inputs(path: str | Path) -> list[tuple[Path, dict]]:
    """(trace file, manifest metadata) pairs for a run directory, a manifest, or one trace."""
    from .manifest import manifest_inputs
    from .salvage import has_leftovers

    path = Path(path)
    if not path.exists():
        raise AnalyzeError(f"{path} does not exist; allowed: a run directory, a manifest.jsonl or a trace file")
    if path.is_file() and path.name.endswith(".jsonl"):
        return manifest_inputs(path)
    if path.is_file():
        return [(path, {})]
    if (path / "manifest.jsonl").exists() or has_leftovers(path):  # an rlprof run, cut short before its manifest
        return manifest_inputs(path / "manifest.jsonl")
    from .mindspeed_output import unparsed, unparsed_message
    from .readers.ascend import is_ascend

    if path.name.endswith("_ascend_pt") or path.name == "ASCEND_PROFILER_OUTPUT":
        return [(path, {})]
    ascend = ascend_collections(path)
    files = sorted(
        p
        for p in path.rglob("*")
        if p.is_file()
        and p.name.endswith(TRACE_SUFFIXES)
        and not p.name.endswith((".summary.json", "analysis.json"))
        and not any(a in p.parents for a in ascend)
        and p.name not in ("trace_view.json", RUN_CONFIG, MODEL_FILE)
    )
    if not ascend and not files and is_ascend(path):
        return [(path, {})]
    raw = unparsed(ascend)
    if raw and len(raw) == len(ascend) and not files:
        raise AnalyzeError(unparsed_message(path, raw, len(ascend)))
    files = [p for p in ascend if p not in raw] + files
    if not files:
        raise AnalyzeError(f"{path} holds no trace files (*.json, *.json.gz), no Ascend output and no manifest.jsonl")
    return directory_inputs(path, files)


def ascend_collections(path: Path) -> list[Path]:
    return sorted(p for p in Path(path).rglob("*_ascend_pt") if p.is_dir())


def directory_inputs(root: Path, files: list[Path]) -> list[tuple[Path, dict]]:
    """Files of a directory without a manifest; those verl's profiler named carry its step/role/stage/rank, those
    torch's or torch_npu's handlers named carry the host that wrote them (where --ray analyses them)."""
    from ...frameworks.torch_profiler import host_of
    from .mindspeed_output import dir_meta
    from .verl_output import file_meta, number_units

    inputs = [(p, file_meta(p, root) or dir_meta(p) or {}) for p in files]
    number_units(inputs)
    for p, meta in inputs:
        host = host_of(p)
        if host:
            meta["where"] = {"host": host, "node_id": None}
    return inputs


def _dangling_links(path) -> list[str]:
    """Trace-named links in a run directory whose target is gone: named, not skipped in silence."""
    path = Path(path)
    if not path.is_dir():
        return []
    return [
        f"{p}: a link to {os.readlink(p)}, which does not exist; skipped"
        for p in sorted(path.rglob("*"))
        if p.name.endswith(TRACE_SUFFIXES) and p.is_symlink() and not p.exists()
    ]


def _unparsed_warning(path) -> list[str]:
    from .mindspeed_output import unparsed, unparsed_message

    path = Path(path)
    if not path.is_dir():
        return []
    ascend = ascend_collections(path)
    raw = unparsed(ascend)
    return [unparsed_message(path, raw, len(ascend))] if raw else []


def is_analysis_file(path: Path) -> bool:
    """An analysis.json written by `rlprof analyze` (rather than a trace)."""
    if not (path.is_file() and path.name.endswith(".json")):
        return False
    with open(path, "rb") as f:
        head = f.read(256)
    return b'"schema_version"' in head and b'"traceEvents"' not in head


def directory_warnings(path) -> list[str]:
    """What a run directory holds that is not analysed: unparsed Ascend collections, links to nothing."""
    return _unparsed_warning(path) + _dangling_links(path) if Path(path).exists() else []


def run_config(path) -> dict | None:
    """The settings of the run that wrote `path`, where it left them beside its traces (rlprof's trainer:
    trainer_config.json in the run directory): {"source", "framework", "reference_pass", "kl_coef", "config",
    "unprofiled"} (`config`: the trainer's whole config, which `rlprof advise --fix` reads the current values from;
    `unprofiled`: the median step and stage times of the run's steady unprofiled steps, from the metrics.jsonl the
    trainer leaves beside it, which predicted savings are scaled to); None where absent."""
    import json

    path = Path(path)
    for d in (path, path.parent) if path.is_dir() else (path.parent,):
        f = d / RUN_CONFIG
        if f.is_file():
            try:
                data = json.loads(f.read_text())
                return {
                    "source": str(f),
                    "framework": data.get("framework"),
                    "reference_pass": bool(data["reference_pass"]),
                    "kl_coef": float(data["kl_coef"]),
                    "config": data.get("config") if isinstance(data.get("config"), dict) else None,
                    "unprofiled": _unprofiled(d / "metrics.jsonl"),
                }
            except (ValueError, KeyError, TypeError):
                return None
    return None


def _unprofiled(metrics) -> dict | None:
    if not Path(metrics).is_file():
        return None
    from .step_metrics import unprofiled_times

    return unprofiled_times(metrics)
