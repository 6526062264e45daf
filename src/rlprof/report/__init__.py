"""HTML report, local viewer and trace slicing. Reads files only: no torch, no trainer."""

from __future__ import annotations

import html
from pathlib import Path

from .page import build_page, page_for, write_report

__all__ = ["build_page", "write_report", "show", "Report"]


class Report:
    """The report of a run, shown inline by Jupyter (in a sandboxed iframe, so its scripts stay its own)."""

    def __init__(self, page: str, height: int = 900):
        self.page, self.height = page, height

    def _repr_html_(self) -> str:
        return (
            f'<iframe srcdoc="{html.escape(self.page, quote=True)}" sandbox="allow-scripts" '
            f'style="width:100%;height:{self.height}px;border:1px solid #ddd"></iframe>'
        )

    def save(self, path: str | Path) -> Path:
        Path(path).write_text(self.page, encoding="utf-8")
        return Path(path)


def show(path: str | Path, baseline: str | None = None, height: int = 900) -> Report:
    """`rlprof.report.show(run_dir)` as the last line of a notebook cell renders the report inline."""
    return Report(page_for(path, baseline), height)
