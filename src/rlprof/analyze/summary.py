"""Terminal summary of an analysis (rich tables): findings first, then the windows, then operators per stage."""

from __future__ import annotations

from collections import defaultdict

from rich.console import Console
from rich.table import Table

from .breakdown import BUCKETS


def print_findings(console: Console, found: list[dict], limit: int = 6) -> None:
    if not found:
        console.print("[bold]findings:[/] none above their thresholds (docs/analysis_schema.md)")
        return
    console.print("[bold]findings[/] (ranked; thresholds in docs/analysis_schema.md):")
    for k, f in enumerate(found[:limit], 1):
        console.print(f"  {k}. {f['text']}", highlight=False, soft_wrap=True)
    if len(found) > limit:
        console.print(f"  ... and {len(found) - limit} more in analysis.json (findings)")


def ops_by_stage(ops: list[dict]) -> list[dict]:
    """Operators summed over steps and ranks per (role, stage, kind, name): one row per key, never a name twice
    without the stage that tells the rows apart."""
    total: dict[tuple, dict] = defaultdict(lambda: {"count": 0, "self_ms": 0.0, "total_ms": 0.0})
    for op in ops:
        agg = total[(op.get("role"), op.get("stage"), op["kind"], op["name"])]
        agg["count"] += op["count"]
        agg["self_ms"] += op["self_ms"]
        agg["total_ms"] += op["total_ms"]
    return sorted(({"role": k[0], "stage": k[1], "kind": k[2], "name": k[3], **v} for k, v in total.items()),
                  key=lambda o: -o["self_ms"])


def print_analysis(doc: dict, max_rows: int = 40) -> None:
    console = Console(width=max(120, Console().width))
    print_findings(console, doc.get("findings", []))
    rows = [r for r in doc["rows"] if r["unit"] is None][:max_rows]
    table = Table(title="time per window (ms)" + ("  [partial input]" if doc["partial"] else ""))
    for col in ("step", "role", "stage", "rank") + BUCKETS:
        table.add_column(col.replace("_ms", ""), justify="right")
    for r in rows:
        table.add_row(*(str(r[c]) if r[c] is not None else "-" for c in ("step", "role", "stage", "rank")),
                      *(f"{r[b]:.2f}" for b in BUCKETS))
    console.print(table)
    if not doc["ops"]:
        console.print("no operators in these windows (ranges only, e.g. the markers tool)")
        return
    ops = Table(title="top operators and kernels per stage (self time, summed over steps and ranks)")
    for col in ("stage", "kind", "name", "count", "self ms", "total ms"):
        ops.add_column(col)
    for op in ops_by_stage(doc["ops"])[:15]:
        where = f"{op['role']}/{op['stage']}" if op["stage"] else "-"
        ops.add_row(where, op["kind"], op["name"][:70], str(op["count"]), f"{op['self_ms']:.2f}",
                    f"{op['total_ms']:.2f}")
    console.print(ops)
