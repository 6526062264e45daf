"""Shaping documents into the lines every renderer shows (terminal, HTML, CSV read the same lines)."""

from __future__ import annotations

from collections import defaultdict

PIVOT_COLUMNS = (
    "step",
    "role",
    "stage",
    "baseline_ms",
    "new_ms",
    "diff_ms",
    "ratio",
    "compute",
    "comm",
    "overlap",
    "memcpy",
    "idle",
)
OP_COLUMNS = ("status", "role", "stage", "kind", "name", "baseline_ms", "new_ms", "diff_ms")
SIGNED = ("diff_ms", "compute", "comm", "overlap", "memcpy", "idle", "diff_mb")


def fmt(v, signed: bool = False) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:+.3f}" if signed else f"{v:.3f}"
    return str(v)


def stage_pivot(doc: dict) -> list[dict]:
    """A compare document, one line per matched window: wall before/after and the change of every bucket; `per`
    says what the line's numbers are per (the window, or a unit) and `units` the windows' unit counts."""
    lines: dict[tuple, dict] = {}
    for r in doc["stages"]:
        line = lines.setdefault(
            (r["step"], r["role"], r["stage"]), {"step": r["step"], "role": r["role"], "stage": r["stage"]}
        )
        if r["bucket"] == "wall":
            line.update(baseline_ms=r["baseline_ms"], new_ms=r["new_ms"], diff_ms=r["diff_ms"], ratio=r["ratio"])
            line["per"] = r["unit"] if r.get("basis") == "per_unit" else "window"
            if r.get("baseline_units") is not None:
                line["units"] = f"{r['baseline_units']:g} -> {r['new_units']:g}"
        else:
            line[r["bucket"]] = r["diff_ms"]
    return list(lines.values())


def units_differ(doc: dict) -> list[dict]:
    """The compare document's windows whose two sides hold different numbers of units."""
    return [u for u in doc.get("units", []) if u["baseline_units"] != u["new_units"]]


def pivot_columns(doc: dict) -> tuple[str, ...]:
    """The per-stage columns: today's, and what a line is per and its unit counts where some window's counts
    differ (where all are equal the table is as it always was)."""
    if not units_differ(doc):
        return PIVOT_COLUMNS
    return PIVOT_COLUMNS[:3] + ("per", "units") + PIVOT_COLUMNS[3:]


def op_columns(doc: dict) -> tuple[str, ...]:
    """The operator table's columns: `per` where some operators are compared per unit, `shape` with --by-shape."""
    per = ("per",) if any(o.get("per", "window") != "window" for o in doc["ops"]) else ()
    return OP_COLUMNS[:5] + per + OP_COLUMNS[5:] + (("shape",) if doc["by_shape"] else ())


UNIT_COLUMNS = (
    "step",
    "role",
    "stage",
    "unit",
    "basis",
    "baseline_units",
    "new_units",
    "baseline_unit_ms",
    "baseline_unit_std_ms",
    "baseline_unit_min_ms",
    "baseline_unit_max_ms",
    "new_unit_ms",
    "new_unit_std_ms",
    "new_unit_min_ms",
    "new_unit_max_ms",
    "unit_ratio",
    "within_spread",
    "baseline_window_ms",
    "new_window_ms",
    "window_ratio",
)


def ops_by_stage(ops: list[dict]) -> list[dict]:
    """Operators summed over steps and ranks per (role, stage, kind, name): one row per key, never a name twice
    without the stage that tells the rows apart."""
    total: dict[tuple, dict] = defaultdict(lambda: {"count": 0, "self_ms": 0.0, "total_ms": 0.0})
    for op in ops:
        agg = total[(op.get("role"), op.get("stage"), op["kind"], op["name"])]
        agg["count"] += op["count"]
        agg["self_ms"] += op["self_ms"]
        agg["total_ms"] += op["total_ms"]
    return sorted(
        ({"role": k[0], "stage": k[1], "kind": k[2], "name": k[3], **v} for k, v in total.items()),
        key=lambda o: -o["self_ms"],
    )


def where(role, stage) -> str:
    return f"{role}/{stage}" if stage else "-"


def writer_words(row: dict) -> str:
    """Who recorded a row, as the tables say it (analyze/document.py names it; a document written before, from its
    replica or rank)."""
    writer = row.get("writer")
    if writer is None:
        replica, rank = row.get("replica"), row.get("rank")
        writer = f"replica {replica}" if replica is not None else f"rank {rank}" if rank is not None else "-"
    return "driver (waiting)" if writer == "driver" else writer  # its rollout: waiting on the replicas


def writers_differ(rows: list[dict]) -> bool:
    """Whether a row's writer says more than its rank (a replica or a driver wrote some): then it is a column."""
    return any(writer_words(r) != (f"rank {r['rank']}" if r.get("rank") is not None else "-") for r in rows)
