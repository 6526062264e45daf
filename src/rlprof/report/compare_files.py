"""What `rlprof compare` writes: compare.json, one CSV per table and compare.html, the fragment the report
embeds."""

from __future__ import annotations

import json
from pathlib import Path

from ..analyze.export import write_tables
from ..compare import TABLES
from .fragments import compare_html


def write_compare(doc: dict, out_dir: Path) -> list[Path]:
    """compare.json, one CSV per table (compare_stages.csv, ...) and compare.html, the fragment the report embeds."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "compare.json"]
    written[0].write_text(json.dumps(doc, indent=1))
    written += write_tables({name: doc[name] for name in TABLES}, out_dir, prefix="compare_")
    html_path = out_dir / "compare.html"
    html_path.write_text(compare_html(doc))
    return written + [html_path]
