"""Assembling one analysis document from its inputs' results: the per-file tables joined, directory-level
warnings, stage rows made from units, the findings."""

from __future__ import annotations

from pathlib import Path

from ..errors import AnalyzeError
from .over_time.beside import attach_beside
from .window.breakdown import BUCKETS, UNIT_ARGS, order_key
from .window.idle_frames import ROW_FIELDS as IDLE_FIELDS, merged as merged_idle_frames
from .diagnosis.findings import diagnose
from .diagnosis.speed_of_light import ROW_FIELDS, speed_of_light
from .diagnosis.plan import document_plan
from .inputs.find import directory_warnings, run_config
from .inputs.model_config import run_model
from .inputs.salvage import run_accounts, salvage_lines
from .inputs.samples_file import read_rollout_records
from .diagnosis.samples import clock_base_us, sample_table, step_summaries
from .over_time.rollout_account import rollout_account
from .over_time.rollout_why import explain_rollout
from .over_time.row_steps import place_steps, timeline_dirs
from .over_time.timeline import run_timeline
from .over_time.watched import step_bounds
from .tables.schema import SCHEMA_VERSION


def document(path, results: list[dict], warnings: list[str] = (), model: dict | None = None) -> dict:
    """The analysis document of one path from its per-file results (`model`: the model the user gave)."""
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
    salvaged, cut_lines = run_accounts(path)  # windows a crash or a fault left (analyze/inputs/salvage.py): said first
    doc["warnings"][:0] = salvage_lines(salvaged) + cut_lines
    if salvaged:
        doc["salvage"] = salvaged
    # the rollout's samples, where its host kept them, and what its engines' schedulers said over each step
    records, engine = read_rollout_records(path) if Path(path).is_dir() else ([], [])
    samples = sample_table(records, clock_base_us(doc["inputs"])) if records else []
    bounds = [b for d in timeline_dirs(path) for b in step_bounds(d)]
    doc["warnings"].extend(place_steps(doc, samples, bounds))  # a file naming no step: the same clock's records say
    doc["rows"].extend(stage_rows_from_units(doc["rows"]))
    timeline = run_timeline(path)  # the run over time, where the watch wrote one (analyze/over_time/timeline.py)
    if timeline is not None:
        doc["timeline"] = timeline
    if not doc["rows"] and timeline is None and not any(m.get("peak_bytes") is not None for m in doc["memory"]):
        raise AnalyzeError("nothing could be read: " + "; ".join(doc["warnings"][:3]))
    doc["rows"].sort(key=lambda r: (order_key(r["step"]), order_key(r["rank"]), r["start_us"] or 0))
    doc["run_config"] = run_config(path)
    if records:
        doc["samples"] = samples
        doc["sample_steps"] = step_summaries(doc["samples"], engine)
        if timeline is not None:  # a slow rollout explained by its samples (analyze/over_time/rollout_why.py)
            explain_rollout(timeline, doc["sample_steps"])
        account = rollout_account(timeline_dirs(path), samples, clock_base_us(doc["inputs"]))
        if account:  # the rollout stage split: generation and the rest (analyze/over_time/rollout_account.py)
            doc["rollout_account"] = account
    # the model the run computed with, and how far each stage ran from its device's limits (diagnosis/speed_of_light.py)
    doc["model"] = run_model(path, [res.get("model") for res in results], doc["run_config"], model)
    doc["stage_limits"] = speed_of_light(doc, doc["model"])
    name_writers(doc)
    doc["measures"], doc["findings"] = diagnose(doc)
    doc["plan"] = document_plan(doc)  # the findings' levers together, savings counted once (analyze/diagnosis/plan.py)
    attach_beside(doc)  # each captured window beside a normal one, with its cause (analyze/over_time/beside.py)
    return doc


def name_writers(doc: dict) -> None:
    """Each row's `writer`, the process that recorded it: `replica K` (a rollout replica or engine), `driver` (a row
    of no replica in a stage replicas ran: the process that handed them the work and waited for it, rlprof's async
    trainer's rank 0), else `rank R` (null where no rank is known)."""
    by_replicas = {r.get("stage") for r in doc["rows"] if r.get("replica") is not None}
    if any(s.get("replica") is not None for s in doc.get("samples", [])) or _async_rollout(doc.get("run_config")):
        by_replicas.add("rollout_generate")
    for r in doc["rows"]:
        if r.get("replica") is not None:
            r["writer"] = f"replica {r['replica']}"
        elif r.get("stage") in by_replicas:
            r["writer"] = "driver"
        else:
            r["writer"] = f"rank {r['rank']}" if r.get("rank") is not None else None


def _async_rollout(config: dict | None) -> bool:
    """rlprof's trainer with its rollout in replicas (rollout.mode=async): its driver's rollout is a wait."""
    if not config or config.get("framework") != "rlprof" or not isinstance(config.get("config"), dict):
        return False
    rollout = config["config"].get("rollout")
    return isinstance(rollout, dict) and rollout.get("mode") == "async"


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


# How a stage row made from its units (stage_rows_from_units) takes each field of theirs: one rule per field, so that
# no field of the first unit stands for the stage (its launch-bound time once read 13.6 of its units' 654.5 ms).
SUMMED = (*BUCKETS, "unknown_ms", "device_gap_ms", "launch_bound_ms", "launch_unlinked_ms", "unlinked_events")
EARLIEST = ("start_us", "host_start_us", "device_start_us")  # the first of the units' (None where none has one)
KEY = ("step", "role", "stage", "rank", "replica")  # the window the units belong to: equal in all of them
ALIKE = ("step_source",)  # where the window's step came from (row_steps.py): its file's, alike in its units
# host_wall_ms: the span of the units' host ranges, first start to last end (the host lane draws that); attribution:
# "launch+time" where any unit placed work by time; units_only: how many units. Not carried: what only a unit says
# (index, ops_sig, UNIT_ARGS) and device_overlap_next_ms (how far the next stage runs into this one: the next stage
# is in another file, or not recorded); call: the whole stage call a sampled window's file records, on the stage row
# that file has (units never carry it, and a stage made from units has no file of its own).
NOT_CARRIED = ("file", "unit", "index", "ops_sig", "device_overlap_next_ms", "call", *UNIT_ARGS)
NAMED_AFTER = ("writer",)  # named on every row once the stage rows are made (name_writers): from its own key
# the work and limits: not assembled, computed for the stage row afterwards from its units' work (speed_of_light)
AFTERWARDS = ROW_FIELDS
MERGED = IDLE_FIELDS  # the frames of the units' idle and host time: summed frame by frame (window/idle_frames.py)


def stage_rows_from_units(rows: list[dict]) -> list[dict]:
    """A stage collected one unit per file (verl's discrete train_batch traces), or sampled by its units (a decode
    window, the first micro-batches) has no stage row of its own: make one per (step, role, stage, rank, replica)
    from its units, each field by its rule above (the buckets summed: the time between the units is unseen)."""
    have = {tuple(r[k] for k in KEY) for r in rows if r["unit"] is None}
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = tuple(r[k] for k in KEY)
        if r["unit"] is not None and r["stage"] and key not in have:
            groups.setdefault(key, []).append(r)
    return [assembled_row(units) for units in groups.values()]


def assembled_row(units: list[dict]) -> dict:
    """The stage row of these units (one window's), field by field (SUMMED, EARLIEST, KEY and the rest above)."""
    row = {k: units[0][k] for k in KEY}
    row.update(file=None, unit=None, index=None)
    row.update({k: units[0][k] for k in ALIKE if k in units[0]})
    for k in EARLIEST:
        if any(k in u for u in units):
            starts = [u[k] for u in units if u.get(k) is not None]
            row[k] = min(starts) if starts else None
    for k in SUMMED:
        if any(k in u for u in units):
            row[k] = sum(u.get(k, 0) for u in units)
    hosts = [u for u in units if u.get("host_start_us") is not None]
    if hosts:
        row["host_wall_ms"] = (
            max(u["host_start_us"] + u["host_wall_ms"] * 1e3 for u in hosts) - row["host_start_us"]
        ) / 1e3
    if any("attribution" in u for u in units):
        row["attribution"] = "launch+time" if any(u.get("attribution") == "launch+time" for u in units) else "launch"
    row["units_only"] = len(units)
    row.update(merged_idle_frames(units))  # the frames of the units' idle, summed by frame (window/idle_frames.py)
    return row
