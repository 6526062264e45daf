"""Assembling one analysis document from its inputs' results: the per-file tables joined, directory-level
warnings, stage rows made from units, the findings."""

from __future__ import annotations

from ..errors import AnalyzeError
from .beside import attach_beside
from .breakdown import BUCKETS, UNIT_ARGS, order_key
from .findings import diagnose
from .inputs import directory_warnings, run_config
from .salvage import run_accounts, salvage_lines
from .timeline import run_timeline

SCHEMA_VERSION = 1


def document(path, results: list[dict], warnings: list[str] = ()) -> dict:
    """The analysis document of one path from its per-file results."""
    doc = {
        "schema_version": SCHEMA_VERSION,
        "inputs": [],
        "warnings": [],
        "partial": False,
        "rows": [],
        "ops": [],
        "collectives": [],
        "launch": [],
        "memory": [],
    }
    for res in results:
        doc["inputs"].append(res["input"])
        doc["warnings"].extend(res["warnings"])
        doc["partial"] |= bool(res["input"].get("partial"))
        for key in ("rows", "ops", "collectives"):
            doc[key].extend(res[key])
        for key in ("launch", "memory"):
            if res[key] is not None:
                doc[key].append(res[key])
    doc["warnings"].extend(warnings)
    doc["warnings"].extend(directory_warnings(path))
    doc["warnings"].extend(_same_window_twice(doc["rows"]))
    salvaged, cut_lines = run_accounts(path)  # windows a crash or a fault left (analyze/salvage.py): said first
    doc["warnings"][:0] = salvage_lines(salvaged) + cut_lines
    if salvaged:
        doc["salvage"] = salvaged
    doc["rows"].extend(stage_rows_from_units(doc["rows"]))
    timeline = run_timeline(path)  # the run over time, where the watch wrote one (analyze/timeline.py)
    if timeline is not None:
        doc["timeline"] = timeline
    if not doc["rows"] and timeline is None and not any(m.get("peak_bytes") is not None for m in doc["memory"]):
        raise AnalyzeError("nothing could be read: " + "; ".join(doc["warnings"][:3]))
    doc["rows"].sort(key=lambda r: (order_key(r["step"]), order_key(r["rank"]), r["start_us"] or 0))
    doc["run_config"] = run_config(path)
    doc["measures"], doc["findings"] = diagnose(doc)
    attach_beside(doc)  # each captured window beside a normal one, with its cause (analyze/beside.py)
    return doc


def _same_window_twice(rows: list[dict]) -> list[str]:
    """Two files that hold the same (step, role, stage, rank) window: a copied rank, or two runs in one directory.
    Both are analysed (each is a real file), so per-rank means count that rank twice: said, naming both."""
    first: dict[tuple, str] = {}
    pairs: dict[tuple, None] = {}
    for r in rows:
        if r.get("unit") is not None or r.get("file") is None:
            continue
        key = (str(r.get("step")), r.get("role"), r.get("stage"), str(r.get("rank")), str(r.get("replica")))
        seen = first.setdefault(key, r["file"])
        if seen != r["file"]:
            pairs[(seen, r["file"], key[3])] = None
    return [
        f"{a} and {b} hold the same windows (rank {rank}, same steps and stages): a copied file or two runs in "
        "one directory? both are counted"
        for a, b, rank in pairs
    ]


def stage_rows_from_units(rows: list[dict]) -> list[dict]:
    """A stage collected one unit per file (verl's discrete train_batch traces) has no stage row of its own:
    make one per (step, role, stage, rank) that sums its units' buckets (the time between files is unseen)."""
    have = {(r["step"], r["role"], r["stage"], r["rank"]) for r in rows if r["unit"] is None}
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r["step"], r["role"], r["stage"], r["rank"])
        if r["unit"] is not None and r["stage"] and key not in have:
            groups.setdefault(key, []).append(r)
    out = []
    for units in groups.values():
        first = {k: v for k, v in min(units, key=lambda r: r["start_us"] or 0).items() if k not in UNIT_ARGS}
        sums = {b: sum(r[b] for r in units) for b in BUCKETS}
        if any("unknown_ms" in r for r in units):  # a damaged unit's time its file no longer says (per_file)
            sums["unknown_ms"] = sum(r.get("unknown_ms", 0.0) for r in units)
        out.append({**first, "unit": None, "index": None, "file": None, "units_only": len(units), **sums})
    return out
