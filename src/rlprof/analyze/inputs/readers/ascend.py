"""Ascend (torch_npu) profiler output, text or db export, in a `*_ascend_pt` directory or given directly:
where its files are and which export to read.

Text: ASCEND_PROFILER_OUTPUT/{trace_view.json, kernel_details.csv, step_trace_time.csv}, read by
readers/ascend_text.py. Db: ascend_pytorch_profiler[_{rank}].db (+ analysis.db) or msprof_*.db, read by
readers/ascend_db.py. Both become one AscendTrace (readers/ascend_trace.py) whose lanes (computing,
communication, communication not overlapped, free) are computed from the device tasks the way torch_npu's step
trace and msprof-analyze compute them, so the two exports of one run give the same rows.
"""

from __future__ import annotations

import json
from pathlib import Path

from ....frameworks import mindspeed
from .ascend_db import read_ascend_db
from .ascend_text import read_text
from .ascend_trace import AscendTrace
from .kineto import NotATrace

__all__ = ["AscendTrace", "find_ascend_files", "is_ascend", "is_unparsed", "read_ascend"]


# ---- where the files are --------------------------------------------------------------------------
def find_ascend_files(path: Path) -> dict[str, Path]:
    """trace_view.json / kernel_details.csv / step_trace_time.csv and the db files under an Ascend output
    directory (keys: the text names, "db" for the profiler db, "analysis.db")."""
    if path.is_file():
        path = path.parent
    found = {}
    for name in mindspeed.TEXT_FILES + (mindspeed.ANALYSIS_DB,):
        hits = sorted(path.rglob(name))
        if hits:
            found[name] = hits[0]
    dbs = sorted(p for p in path.rglob("*.db") if mindspeed.PYTORCH_DB.match(p.name)) or sorted(
        p for p in path.rglob("*.db") if mindspeed.MSPROF_DB.match(p.name)
    )
    if dbs:
        found["db"] = dbs[0]
    return found


def is_ascend_file(name: str) -> bool:
    return name in mindspeed.TEXT_FILES or bool(mindspeed.PYTORCH_DB.match(name) or mindspeed.MSPROF_DB.match(name))


def is_ascend(path: Path) -> bool:
    if path.is_file():
        return is_ascend_file(path.name)
    return (
        path.name.endswith(mindspeed.ASCEND_DIR_SUFFIX)
        or path.name == mindspeed.OUTPUT_DIR
        or bool(find_ascend_files(path))
        and not any(path.glob("*.pt.trace.json*"))
    )


def is_unparsed(path: Path) -> bool:
    """A torch_npu collection not parsed yet (profile_analysis: false): raw PROF_* / FRAMEWORK data only."""
    if not path.is_dir() or find_ascend_files(path):
        return False
    return any(
        p.is_dir() and (p.name in mindspeed.RAW_DIRS or p.name.startswith(mindspeed.RAW_DIR_PREFIX))
        for p in path.iterdir()
    )


def rank_of(path: Path, files: dict[str, Path]) -> int | None:
    """torch_npu's rank: in the db name (ascend_pytorch_profiler_{rank}.db) or profiler_info_{rank}.json."""
    db = files.get("db")
    m = mindspeed.PYTORCH_DB.match(db.name) if db is not None else None
    if m and m.group("rank") is not None:
        return int(m.group("rank"))
    root = path if path.is_dir() else path.parent
    for base in (root, *root.parents[:2]):
        for info in sorted(base.glob("profiler_info*.json")):
            m = mindspeed.PROFILER_INFO.match(info.name)
            if m and m.group("rank") is not None:
                return int(m.group("rank"))
            try:
                rank = json.loads(info.read_text()).get("rank_id")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(rank, int) and rank >= 0:
                return rank
    return None


def read_ascend(path: Path, export: str | None = None) -> AscendTrace:
    """One Ascend output directory (or file). Both exports present: the db, unless export="text"."""
    path = Path(path)
    if is_unparsed(path):
        raise NotATrace(
            f"{path} is a torch_npu collection that was not parsed (profile_analysis: false); parse "
            f"it with: {mindspeed.offline_parse_command(str(path))}"
        )
    files = find_ascend_files(path)
    if path.is_file():  # one named file: that export only
        files = {k: v for k, v in files.items() if v == path or (k == "analysis.db" and path.suffix == ".db")}
    has_text = any(k in files for k in mindspeed.TEXT_FILES)
    if "db" in files and (export == "db" or not (has_text and export == "text")):
        trace = read_ascend_db(files["db"], files.get("analysis.db"))
    elif has_text and export != "db":
        trace = read_text(path, files)
    else:
        raise NotATrace(
            f"{path}: no Ascend output found; allowed: trace_view.json, kernel_details.csv, "
            "step_trace_time.csv, ascend_pytorch_profiler*.db or msprof_*.db"
        )
    trace.rank = rank_of(path, files)
    return trace
