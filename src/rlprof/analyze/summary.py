"""Terminal summary of an analysis (rich tables)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .breakdown import BUCKETS


def print_analysis(doc: dict, max_rows: int = 40) -> None:
    console = Console(width=max(120, Console().width))
    rows = [r for r in doc["rows"] if r["unit"] is None][:max_rows]
    table = Table(title="time per window (ms)" + ("  [partial input]" if doc["partial"] else ""))
    for col in ("step", "role", "stage", "rank") + BUCKETS:
        table.add_column(col.replace("_ms", ""), justify="right")
    for r in rows:
        table.add_row(*(str(r[c]) if r[c] is not None else "-" for c in ("step", "role", "stage", "rank")),
                      *(f"{r[b]:.2f}" for b in BUCKETS))
    console.print(table)
    ops = Table(title="top operators and kernels (by self time)")
    for col in ("rank", "kind", "name", "count", "self ms", "total ms", "share"):
        ops.add_column(col)
    for op in sorted(doc["ops"], key=lambda o: -o["self_ms"])[:15]:
        ops.add_row(str(op["rank"]), op["kind"], op["name"][:70], str(op["count"]), f"{op['self_ms']:.2f}",
                    f"{op['total_ms']:.2f}", f"{100 * op['share']:.1f}%")
    console.print(ops)
