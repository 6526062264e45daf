"""Turn a backend's raw Chrome-trace JSON into the final .json.gz: rlprof metadata + data budget."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from ..analyze.inputs.salvage import part_path

CHUNK = 1 << 20


def finalize_trace(src: Path, dest: Path, meta: dict, budget: int | None) -> tuple[int, bool]:
    """Write `src` (a JSON object) to gzip `dest` with `"rlprof": meta` as its first key.

    Streams: memory stays flat however large the trace. Returns (bytes on disk, truncated).
    When the result passes `budget`, the trace is cut to the earliest events that fit.
    Written as a hidden `.{dest name}.part` and renamed whole: a fault (a full disk) or a kill midway never leaves
    a cut or empty file under a trace's name, and the .part is removed on a fault.
    """
    part = part_path(dest)
    try:
        _inject(src, part, meta)
        size = part.stat().st_size
        truncated = budget is not None and size > budget
        if truncated:
            size = _cut_to_budget(src, part, meta, budget, size)
        os.replace(part, dest)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return size, truncated


def _inject(src: Path, dest: Path, meta: dict) -> None:
    head = json.dumps(meta, separators=(",", ":")).encode()
    with open(src, "rb") as fin, gzip.open(dest, "wb", compresslevel=3) as out:
        first = fin.read(CHUNK)
        brace = first.find(b"{")
        if brace < 0:
            raise ValueError(f"{src} is not a JSON object")
        rest = first[brace + 1 :]
        empty = rest.lstrip().startswith(b"}")
        out.write(b'{"rlprof":' + head + (b"" if empty else b","))
        out.write(rest)
        while chunk := fin.read(CHUNK):
            out.write(chunk)


def _cut_to_budget(src: Path, dest: Path, meta: dict, budget: int, size: int) -> int:
    with open(src, "rb") as f:
        trace = json.load(f)
    events = trace.get("traceEvents", [])
    keep = [e for e in events if e.get("ph") == "M"]  # process/thread names: always kept
    timed = sorted((e for e in events if e.get("ph") != "M"), key=lambda e: float(e.get("ts", 0) or 0))
    n = int(len(timed) * min(1.0, budget / size) * 0.9)
    while True:
        trace["traceEvents"] = keep + timed[:n]
        trace["rlprof"] = dict(
            meta,
            truncated=True,
            original_bytes=size,
            kept_events=len(trace["traceEvents"]),
            total_events=len(events),
            budget_bytes=budget,
        )
        body = {"rlprof": trace.pop("rlprof"), **trace}
        with gzip.open(dest, "wb", compresslevel=3) as out:
            out.write(json.dumps(body, separators=(",", ":")).encode())
        new_size = dest.stat().st_size
        if new_size <= budget or n == 0:
            return new_size
        n = int(n * min(0.9, budget / new_size))
