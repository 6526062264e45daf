"""A run directory after a crash or a fault while collecting: every window the run started, accounted for.

The collector leaves a window's traces on disk in steps (collect/window.py): a hidden mark `.{window}.open` while the
window records, the backend's raw export `.raw-{window}-{random}.json` (`.json.tmp` while torch writes it), the final
trace written as `.{final name}.part` and renamed whole, then the manifest row. A process killed (SIGKILL, the OOM
killer) or cut short by its grace time on SIGTERM stops between any two of them; `rlprof analyze RUN` reads the
manifest *and* the directory, and a window the manifest does not list as written is:

- recovered from the best file the directory holds for it (the final trace, else its complete raw export, else a cut
  export or a cut final trace, of which the reader keeps what was readable), its input flagged `recovered`;
- or named as lost, with why (its failed row's error; open when the run ended, nothing of it written).

The collector imports these names from here (the reading side never imports collect). Nothing here writes: a live
job may still be writing the window, and analysis never changes a run directory.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from ...vocab import ROLES, STAGES

MANIFEST = "manifest.jsonl"
RAW_PREFIX = ".raw-"  # a backend's raw Chrome-trace export, named by its window: .raw-{window}-{random}.json
RAW_CUT_SUFFIX = ".json.tmp"  # torch (Kineto) writes its export here and renames it whole when done
PART_SUFFIX = ".part"  # a final trace being written: .{final name}.part, renamed whole when done
OPEN_SUFFIX = ".open"  # .{window}.open: the window is recording, nothing of it is on disk yet
FINAL_SUFFIXES = (".pt.trace.json.gz", ".timeline.json.gz")  # the final files rlprof finalizes (collect/naming.py)
WINDOW_NAME = re.compile(
    r"^step(?P<step>\d+)_(?P<role>{})_(?P<stage>{}|e2e)_rank(?P<rank>\d+)(?:_w(?P<window>\d+))?$".format(
        "|".join(ROLES), "|".join(STAGES)
    )
)
# The best file first: the final trace is whole (renamed once written), a raw export whole unless torch was cut
# writing it, a .part cut wherever the gzip stream stopped.
SOURCES = ("trace", "raw", "raw_cut", "part")
SOURCE_WORDS = {
    "trace": "its trace, which the manifest lacks",
    "raw": "its raw export (the final trace was never written)",
    "raw_cut": "its raw export, cut while torch wrote it",
    "part": "its final trace, cut while it was written",
}


def raw_prefix(window: str) -> str:
    """The prefix of a window's raw export (a backend adds a random part and `.json`)."""
    return f"{RAW_PREFIX}{window}-"


def part_path(dest: Path) -> Path:
    """Where a final trace is written before it is renamed to `dest`: hidden, and named as unfinished."""
    return dest.with_name(f".{dest.name}{PART_SUFFIX}")


def open_mark(run_dir: Path, window: str) -> Path:
    return Path(run_dir) / f".{window}{OPEN_SUFFIX}"


def classify(name: str) -> tuple[str, str] | None:
    """(what the file is, the window it belongs to) for a file rlprof's collector writes, else None. Kinds: trace,
    raw, raw_cut, part, open."""
    if name.startswith(RAW_PREFIX):
        for suffix, kind in ((RAW_CUT_SUFFIX, "raw_cut"), (".json", "raw")):
            if name.endswith(suffix):
                return kind, name[len(RAW_PREFIX) : -len(suffix)].rpartition("-")[0]
        return None
    if name.startswith(".") and name.endswith(PART_SUFFIX):
        inner = name[1 : -len(PART_SUFFIX)]
        suffix = next((s for s in FINAL_SUFFIXES if inner.endswith(s)), None)
        return ("part", inner[: -len(suffix)]) if suffix else None
    if name.startswith(".") and name.endswith(OPEN_SUFFIX):
        return "open", name[1 : -len(OPEN_SUFFIX)]
    suffix = next((s for s in FINAL_SUFFIXES if name.endswith(s)), None)
    return ("trace", name[: -len(suffix)]) if suffix and not name.startswith(".") else None


def window_key(window: str) -> tuple | None:
    """(step, role, stage, rank, window index) of an rlprof window name; None for another name."""
    m = WINDOW_NAME.match(window)
    if m is None:
        return None
    return int(m["step"]), m["role"], m["stage"], int(m["rank"]), int(m["window"] or 0)


def row_key(row: dict) -> tuple | None:
    try:
        return int(row["step"]), row["role"], row["stage"] or "e2e", int(row["rank"]), int(row.get("window") or 0)
    except (KeyError, TypeError, ValueError):
        return None


def has_leftovers(run_dir: Path) -> bool:
    """Whether a directory holds what rlprof's collection cut short leaves of its windows (an open mark, a raw
    export, a .part, named by an rlprof window: the verl plugin's own leftovers in verl's directory are not)."""
    try:
        return any(
            (c := classify(p.name)) is not None and c[0] != "trace" and window_key(c[1]) is not None
            for p in Path(run_dir).iterdir()
            if p.is_file()
        )
    except OSError:
        return False


def read_manifest(path: Path) -> tuple[list[dict], list[str]]:
    """The rows of a manifest and a warning per line cut by a writer that stopped mid-line. A cut line is read up to
    the cut: a whole row appended right after it on the same line (a later writer) is kept."""
    rows, warnings = [], []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            row = _decode(line)
            if row is None:
                starts = [m.start() for m in re.finditer(rb'\{"', line)][1:]
                row = next((r for r in map(_decode, (line[s:] for s in starts)) if r is not None), None)
                kept = "; the row written after it on the same line is read" if row is not None else ""
                warnings.append(
                    f"{path}: line {number} is cut ({len(line)} bytes; its writer stopped mid-line){kept}; "
                    "the manifest is read up to the cut and on after it"
                )
            if isinstance(row, dict):
                rows.append(row)
    return rows, warnings


def _decode(line: bytes):
    try:
        row = msgspec.json.decode(line)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    return row if isinstance(row, dict) else None


def account(run_dir: Path, rows: list[dict]) -> tuple[list[tuple[Path, dict]], list[dict]]:
    """(inputs to read that the manifest does not give, one record per window recovered or lost) for a run
    directory whose manifest holds `rows`. A record: window, step, role, stage, rank, fate (recovered | lost),
    source (the file read, recovered only) and reason."""
    run_dir = Path(run_dir)
    written, troubled = set(), {}
    for row in rows:
        key = row_key(row)
        if key is None:
            continue
        status = row.get("status")
        if status in ("failed", "partial"):
            troubled.setdefault(key, row)
        else:
            written.add(key)
    listed = {row.get("path") for row in rows if row.get("status") != "partial"}
    files: dict[tuple, dict[str, Path]] = {}
    opened: dict[tuple, str] = {}
    try:
        entries = sorted(p for p in run_dir.iterdir() if p.is_file())
    except OSError:
        entries = []
    for p in entries:
        c = classify(p.name)
        key = window_key(c[1]) if c else None
        if key is None or (c[0] == "trace" and p.name in listed):
            continue
        if c[0] == "open":
            opened.setdefault(key[:4], c[1])
        elif key not in written:
            files.setdefault(key, {}).setdefault(c[0], p)
    inputs, records = [], []
    for key in sorted(set(files) | set(troubled), key=str):
        if key in written:
            continue
        row = troubled.get(key, {})
        found = files.get(key, {})
        window = _name(key)
        if not found:
            reason = row.get("error") or "its manifest row names no file that is still there"
            records.append(_record(window, key, "lost", None, reason))
            continue
        kind = next(k for k in SOURCES if k in found)
        source = found[kind]
        if row.get("status") == "partial":
            reason = f"{row.get('error') or 'written as partial'}; read from {SOURCE_WORDS[kind]}"
        elif row.get("status") == "failed":
            reason = f"marked failed ({row.get('error')}); read from {SOURCE_WORDS[kind]}"
        else:
            reason = f"not in the manifest (the run stopped before its row was written); read from {SOURCE_WORDS[kind]}"
        meta = {
            "step": key[0],
            "role": key[1],
            "stage": key[2],
            "rank": key[3],
            "window": key[4],
            "status": "recovered",
            **{k: row[k] for k in ("steps", "replica") if row.get(k) is not None},
        }
        inputs.append((source, meta))
        records.append(_record(window, key, "recovered", source.name, reason))
    accounted = {k[:4] for k in written | set(files) | set(troubled)}
    for key4, window in sorted(opened.items(), key=str):
        if key4 not in accounted:
            reason = "open when the run ended (the process was killed while it recorded): nothing of it was written"
            records.append(_record(window, (*key4, 0), "lost", None, reason))
    records.sort(key=lambda r: (r["step"], r["rank"], r["role"], r["stage"], r["window"]))
    return inputs, records


def _name(key: tuple) -> str:
    step, role, stage, rank, index = key
    return f"step{step}_{role}_{stage}_rank{rank}" + (f"_w{index}" if index else "")


def _record(window: str, key: tuple, fate: str, source: str | None, reason: str) -> dict:
    step, role, stage, rank, _ = key
    return {
        "window": window,
        "step": step,
        "role": role,
        "stage": stage,
        "rank": rank,
        "fate": fate,
        "source": source,
        "reason": reason,
    }


def salvage_lines(records: list[dict]) -> list[str]:
    """One line per window recovered or lost (the first lines `rlprof analyze` and `rlprof report` print)."""
    return [
        f"window {r['window']} recovered from {r['source']}: {r['reason']}"
        if r["fate"] == "recovered"
        else f"window {r['window']} lost: {r['reason']}"
        for r in records
    ]


def run_accounts(path) -> tuple[list[dict], list[str]]:
    """(the windows recovered or lost, the manifest's cut lines) of a run directory or its manifest; nothing for
    anything else (a trace, verl's or MindSpeed-RL's directory)."""
    path = Path(path)
    run_dir = path.parent if path.is_file() and path.name.endswith(".jsonl") else path
    if not run_dir.is_dir():
        return [], []
    manifest = path if path.is_file() else run_dir / MANIFEST
    if manifest.is_file():
        rows, cut = read_manifest(manifest)
    elif has_leftovers(run_dir):
        rows, cut = [], []
    else:
        return [], []
    return account(run_dir, rows)[1], cut
