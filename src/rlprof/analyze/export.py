"""The CSV / DuckDB renderer: analysis.json with its tables as CSV or one DuckDB file, and CSV tables of any
document (compare uses it too)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

TABLES = ("rows", "ops", "collectives", "launch", "inputs", "findings", "measures", "stage_limits")


def scalar_columns(records: list[dict]) -> list[str]:
    cols: dict[str, None] = {}
    for r in records:
        for k, v in r.items():
            if not isinstance(v, (list, dict)):
                cols.setdefault(k)
    return list(cols)


def memory_points(doc: dict) -> list[dict]:
    return [
        {"rank": m.get("rank"), "file": m.get("file"), "ts_us": ts, "allocated_bytes": b}
        for m in doc["memory"]
        for ts, b in m.get("timeline", [])
    ]


def sample_step_rows(doc: dict) -> list[dict]:
    """Each step's samples together, flat: the distributions' quantiles, the phases and the engine's counts as columns
    of their own."""
    out = []
    for s in doc.get("sample_steps", []):
        row = {k: v for k, v in s.items() if not isinstance(v, (list, dict))}
        for name in ("duration_ms", "response_tokens"):
            for q, v in (s.get(name) or {}).items():
                row[f"{name}_{q}"] = v
        row.update({f"{phase}_sum": v for phase, v in s.get("phases_ms", {}).items()})
        row.update({f"engine_{k}": v for k, v in (s.get("engine") or {}).items()})  # what its scheduler said
        out.append(row)
    return out


def write_tables(tables: dict[str, list[dict]], out_dir: Path, prefix: str = "") -> list[Path]:
    """One CSV per named table of any document (scalar columns; nested values stay in its JSON)."""
    written = []
    for name, records in tables.items():
        path = out_dir / f"{prefix}{name}.csv"
        cols = scalar_columns(records) or ["empty"]
        # a file name that is not UTF-8 (its bytes surrogate-escaped) is kept, written as \\udcXX escapes
        with open(path, "w", newline="", encoding="utf-8", errors="backslashreplace") as f:
            w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            w.writerows(records)
        written.append(path)
    return written


def analysis_tables(doc: dict) -> dict[str, list[dict]]:
    tables = {name: doc.get(name, []) for name in TABLES} | {"memory": memory_points(doc)}
    if "samples" in doc:  # the rollout sample by sample, where its host recorded it
        tables |= {"samples": doc["samples"], "sample_steps": sample_step_rows(doc)}
    return tables


def write_csv(doc: dict, out_dir: Path) -> list[Path]:
    return write_tables(analysis_tables(doc), out_dir)


def sql_type(values: list) -> str:
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return "BOOLEAN"
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "BIGINT"
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return "DOUBLE"
    return "VARCHAR"


def _text(value) -> str:
    """A value as DuckDB text: a file name that is not UTF-8 as the CSV writes it (\\udcXX escapes)."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def write_duckdb(doc: dict, path: Path) -> Path:
    """One DuckDB file with the same tables as the CSV export (query them with SQL)."""
    import duckdb

    path.unlink(missing_ok=True)
    con = duckdb.connect(str(path))
    try:
        for name, records in analysis_tables(doc).items():
            cols = scalar_columns(records)
            if not cols:
                continue
            types = {c: sql_type([r.get(c) for r in records]) for c in cols}
            con.execute(f'CREATE TABLE "{name}" (' + ", ".join(f'"{c}" {types[c]}' for c in cols) + ")")
            rows = [
                [(_text(r.get(c)) if types[c] == "VARCHAR" and r.get(c) is not None else r.get(c)) for c in cols]
                for r in records
            ]
            con.executemany(f'INSERT INTO "{name}" VALUES (' + ", ".join("?" * len(cols)) + ")", rows)
    finally:
        con.close()
    return path


def write_analysis(doc: dict, out_dir: Path, export: str = "csv", document_json: str | None = None) -> list[Path]:
    """analysis.json (`document_json`: its text as the typed Analysis encodes it, else the document's JSON) and
    its tables."""
    out_dir.mkdir(parents=True, exist_ok=True)
    main = out_dir / "analysis.json"
    main.write_text(document_json if document_json is not None else json.dumps(doc, indent=1))
    if export == "db":
        return [main, write_duckdb(doc, out_dir / "analysis.duckdb")]
    return [main, *write_csv(doc, out_dir)]
