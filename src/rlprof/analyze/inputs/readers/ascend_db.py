"""torch_npu's db export (`export_type: db`) with the standard library's sqlite3.

ascend_pytorch_profiler[_{rank}].db (or a CANN msprof_*.db) holds the device timeline as documented in
"Data in ascend_pytorch_profiler_{Rank_ID}.db": TASK (every device task, ns), COMPUTE_TASK_INFO (which tasks
are compute, with op name/type), COMMUNICATION_OP (HCCL collectives), MSTX_EVENTS (mstx ranges and marks),
STEP_TIME, PYTORCH_API / CANN_API (host side), MEMORY_RECORD; every string is an id into STRING_IDS.
analysis.db beside it holds StepTraceTime, torch_npu's per-step overlap analysis.

Buckets follow the Ascend tools: computing = union of compute tasks, communication = union of
COMMUNICATION_OP, exposed communication = communication minus computing, free = the rest of the span.
Reads are column-wise (fetchall into numpy); no per-event Python beyond sqlite's own row decode.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np

from ....frameworks import mindspeed
from ...tables.intervals import Coverage
from ...tables.table import CPU_OP, KERNEL, OTHER, PYTHON, RUNTIME, USER_ANNOTATION, ColumnBuilder
from .ascend_trace import AscendTrace, lanes_of, step_row
from .kineto import NotATrace

NS = 1e-3  # ns -> µs
# Times are kept relative to the file's first timestamp (integer ns): epoch ns as float64 µs would round
# every edge to a quarter µs, and the buckets would drift from the Ascend tools' own.


class _Db:
    """A read-only connection that turns every sqlite failure into one line naming the file."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2.0)
            self.tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.Error as exc:
            raise NotATrace(f"{path}: not a readable sqlite db ({_why(exc)})") from None

    def rows(self, sql: str, *args) -> list[tuple]:
        try:
            return self.conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise NotATrace(f"{self.path}: {_why(exc)} while reading it") from None

    def columns(self, table: str) -> set[str]:
        return {r[1] for r in self.rows(f"PRAGMA table_info({table})")}

    def close(self) -> None:
        self.conn.close()


def _why(exc: sqlite3.Error) -> str:
    text = str(exc)
    if "locked" in text:
        return "the database is locked by another process (is the profiler still writing it?)"
    if "malformed" in text or "not a database" in text:
        return f"the file is damaged or truncated: {text}"
    return text


def read_ascend_db(path: Path, analysis: Path | None = None) -> AscendTrace:
    db = _Db(Path(path))
    try:
        return _Reader(db).read(analysis)
    finally:
        db.close()


class _Reader:
    """One db into one AscendTrace: columns, interned names, times relative to `origin` (ns)."""

    TIMED = ("TASK", "COMMUNICATION_OP", "MSTX_EVENTS", "STEP_TIME", "PYTORCH_API", "CANN_API")

    def __init__(self, db: _Db):
        missing = [t for t in mindspeed.REQUIRED_TABLES if t not in db.tables]
        if missing:
            raise NotATrace(
                f"{db.path}: no {' or '.join(missing)} table; a torch_npu / msprof db export has "
                f"{', '.join(mindspeed.REQUIRED_TABLES)} (found: {', '.join(sorted(db.tables)) or 'none'})"
            )
        self.db, self.cols = db, ColumnBuilder()
        self.launch_parts: list[np.ndarray] = []  # per add(), in table order: each event's host launch (µs, NaN)
        self.linked: tuple[np.ndarray, np.ndarray] | None = None  # connection ids (sorted) -> launch ns
        self.strings = dict(db.rows("SELECT id, value FROM STRING_IDS"))
        starts = [db.rows(f"SELECT MIN(startNs) FROM {t}")[0][0] for t in self.TIMED if t in db.tables]
        self.origin = min((int(v) for v in starts if v is not None), default=0)

    def read(self, analysis: Path | None) -> AscendTrace:
        db, warnings = self.db, []
        backwards = {
            t: db.rows(f"SELECT count(*) FROM {t} WHERE endNs < startNs")[0][0]
            for t in ("TASK", "COMMUNICATION_OP")
            if t in db.tables
        }
        if any(backwards.values()):
            warnings.append(
                f"{db.path}: "
                + ", ".join(f"{n} {t} rows" for t, n in backwards.items() if n)
                + " end before they start (damaged times), dropped; the others were read"
            )
        compute, comm = self.compute_tasks(), self.communication()
        if not len(compute.s) and not len(comm.s):
            warnings.append(f"{db.path.name}: no compute task or communication op (a host-only export)")
        self.host()
        self.mstx()
        self.memory()
        spans = (
            [
                (int(i), float(self.us(s)), float(self.us(e)))
                for i, s, e in db.rows("SELECT id, startNs, endNs FROM STEP_TIME ORDER BY startNs")
            ]
            if "STEP_TIME" in db.tables
            else []
        )
        steps = _step_trace(analysis) if analysis is not None else []
        table = self.cols.build()
        launch = np.concatenate(self.launch_parts) if self.launch_parts else np.zeros(0)
        table.launch = launch if np.isfinite(launch).any() else None
        return AscendTrace(
            db.path,
            table,
            lanes_of(compute, comm),
            steps,
            warnings,
            partial=any(backwards.values()),
            step_spans=spans,
            export="db",
            files=[str(db.path)] + ([str(analysis)] if analysis is not None else []),
            origin_us=self.origin * NS,
            task_span=self.task_span(compute, comm),
        )

    def task_span(self, compute: Coverage, comm: Coverage) -> tuple[float, float] | None:
        """First to last device task of any kind but the profiler's start/stop markers, and every op."""
        markers = [i for i, v in self.strings.items() if v in mindspeed.PROFILER_MARKER_TASKS]
        skip = f" AND taskType NOT IN ({', '.join(str(int(i)) for i in markers)})" if markers else ""
        lo, hi = self.db.rows(f"SELECT MIN(startNs), MAX(endNs) FROM TASK WHERE endNs >= startNs{skip}")[0]
        ends = [(float(c.s[0]), float(c.e[-1])) for c in (compute, comm) if len(c.s)]
        if lo is not None:
            ends.append((float(self.us(int(lo))), float(self.us(int(hi)))))
        return (min(e[0] for e in ends), max(e[1] for e in ends)) if ends else None

    def us(self, ns):
        return (np.asarray(ns, dtype=np.int64) - self.origin) * NS

    def names(self, ids) -> np.ndarray:
        """STRING_IDS ids -> interned name ids, one lookup per distinct id."""
        ids = np.asarray(ids, dtype=object)
        if not len(ids):
            return np.zeros(0, np.int32)
        uniq, inverse = np.unique(np.where(ids == None, -1, ids).astype(np.int64), return_inverse=True)  # noqa: E711
        return np.array([self.cols.names(self.strings.get(int(u), "?")) for u in uniq], np.int32)[inverse]

    def op_type(self, table: str, alias: str, name: str) -> str:
        """The SQL for an operator's type, else its name (where the profiler level records none: "N/A")."""
        if "opType" not in self.db.columns(table):
            return f"{alias}{name}"
        na = next((i for i, v in self.strings.items() if v == mindspeed.NOT_RECORDED), None)
        missing = f"{alias}opType IS NULL" + (f" OR {alias}opType = {int(na)}" if na is not None else "")
        return f"CASE WHEN {missing} THEN {alias}{name} ELSE {alias}opType END"

    def compute_tasks(self) -> Coverage:
        if "COMPUTE_TASK_INFO" not in self.db.tables:
            return Coverage(np.zeros(0), np.zeros(0))
        name = self.op_type("COMPUTE_TASK_INFO", "c.", "name")
        return self.add(
            self.db.rows(
                f"SELECT t.startNs, t.endNs, {name}, t.streamId, t.connectionId "
                "FROM COMPUTE_TASK_INFO c JOIN TASK t ON t.globalTaskId = c.globalTaskId "
                "WHERE t.endNs >= t.startNs"
            ),
            KERNEL,
            "stream/",
        )

    def communication(self) -> Coverage:
        if "COMMUNICATION_OP" not in self.db.tables:
            return Coverage(np.zeros(0), np.zeros(0))
        name = self.op_type("COMMUNICATION_OP", "", "opName")
        linked = ", connectionId" if "connectionId" in self.db.columns("COMMUNICATION_OP") else ""
        return self.add(
            self.db.rows(
                f"SELECT startNs, endNs, {name}, groupName{linked} FROM COMMUNICATION_OP WHERE endNs >= startNs"
            ),
            KERNEL,
            "hccl/",
            comm=True,
        )

    def launches(self) -> tuple[np.ndarray, np.ndarray]:
        """Connection id -> the host launch (ns) of the device work carrying it: the torch op that enqueued it
        (PYTORCH_API through CONNECTION_IDS, trace_view's async_npu flow) where recorded, else the CANN call
        (HostToDevice). Sorted by id, for searchsorted."""
        if self.linked is None:
            found: dict[int, int] = {}
            tables = self.db.tables
            if "CANN_API" in tables and "connectionId" in self.db.columns("CANN_API"):
                found.update(
                    self.db.rows(
                        "SELECT connectionId, MIN(startNs) FROM CANN_API "
                        "WHERE connectionId IS NOT NULL GROUP BY connectionId"
                    )
                )
            if {"PYTORCH_API", "CONNECTION_IDS"} <= tables and "type" in self.db.columns("PYTORCH_API"):
                found.update(
                    self.db.rows(
                        "SELECT ci.connectionId, MIN(CAST(p.startNs AS INTEGER)) FROM PYTORCH_API p JOIN CONNECTION_IDS "
                        "ci ON ci.id = p.connectionId WHERE p.type = ? GROUP BY ci.connectionId",
                        mindspeed.API_TYPE_OP,
                    )
                )
            ids = np.array([k for k, v in found.items() if isinstance(k, int) and v is not None], np.int64)
            at = np.array([int(found[k]) for k in ids.tolist()], np.int64)
            order = np.argsort(ids, kind="stable")
            self.linked = ids[order], at[order]
        return self.linked

    def host(self) -> None:
        if "PYTORCH_API" in self.db.tables:  # torch ops, and apart from them the task queue and Python trace
            typed = "type" in self.db.columns("PYTORCH_API")
            rows = self.db.rows(
                "SELECT startNs, endNs, name, globalTid" + (", type" if typed else "") + " FROM PYTORCH_API"
            )
            for api, kind in ((mindspeed.API_TYPE_TRACE, PYTHON), (mindspeed.API_TYPE_QUEUE, OTHER)):
                self.add([r[:4] for r in rows if typed and r[4] == api], kind, "tid/")
            self.add(
                [r[:4] for r in rows if not typed or r[4] not in (mindspeed.API_TYPE_TRACE, mindspeed.API_TYPE_QUEUE)],
                CPU_OP,
                "tid/",
            )
        if "CANN_API" in self.db.tables:
            self.add(self.db.rows("SELECT startNs, endNs, name, globalTid FROM CANN_API"), RUNTIME, "tid/")

    def mstx(self) -> None:
        """mstx.range_start/range_end pairs (eventType 2): stage ranges by their message."""
        if "MSTX_EVENTS" in self.db.tables:
            self.add(
                self.db.rows(
                    "SELECT startNs, endNs, message, globalTid FROM MSTX_EVENTS WHERE eventType = ? "
                    "AND endNs >= startNs",
                    mindspeed.MSTX_RANGE,
                ),
                USER_ANNOTATION,
                "mstx/",
            )

    def memory(self) -> None:
        """MEMORY_RECORD: allocated bytes over time; the PyTorch allocator's component where it is recorded."""
        if "MEMORY_RECORD" not in self.db.tables:
            return
        rows = self.db.rows("SELECT component, timestamp, totalAllocated FROM MEMORY_RECORD ORDER BY timestamp")
        pta = [r for r in rows if self.strings.get(r[0]) == "PTA"]
        for _, ts, total in pta or rows:
            self.cols.add_memory(float(self.us(ts)), float(total))

    def add(self, rows: list[tuple], kind: int, thread: str, comm: bool = False) -> Coverage:
        if not rows:
            return Coverage(np.zeros(0), np.zeros(0))
        cols, data = self.cols, np.array(rows, dtype=object)
        start, end = self.us(data[:, 0].astype(np.int64)), self.us(data[:, 1].astype(np.int64))
        name = self.names(data[:, 2])
        if comm:  # collectives are recognised by their hcom_ prefix, as HCCL names them in the text export
            uniq, inverse = np.unique(name, return_inverse=True)
            hcom = [cols.names.names[i] for i in uniq]
            name = np.array(
                [cols.names(mindspeed.collective_type(n if n.startswith("hcom_") else "hcom_" + n)) for n in hcom],
                np.int32,
            )[inverse]
        uniq, inverse = np.unique(data[:, 3].astype(str), return_inverse=True)
        lanes = np.array([cols.threads(f"{thread}{v}") for v in uniq], np.int32)
        cols.add(start, end, np.full(len(start), kind, np.uint8), name, lanes[inverse])
        self.launch_parts.append(self.launch_of(data[:, 4]) if data.shape[1] > 4 else np.full(len(start), np.nan))
        return Coverage(start, end)

    def launch_of(self, connection: np.ndarray) -> np.ndarray:
        """The host launch (µs) of each row's connection id; NaN where none is recorded."""
        ids, at = self.launches()
        out = np.full(len(connection), np.nan)
        known = np.array([isinstance(c, int) for c in connection.tolist()], bool)
        if not len(ids) or not known.any():
            return out
        conn = connection[known].astype(np.int64)
        pos = np.clip(np.searchsorted(ids, conn), 0, len(ids) - 1)
        hit = ids[pos] == conn
        out[np.flatnonzero(known)[hit]] = self.us(at[pos[hit]])
        return out


def _step_trace(path: Path) -> list[dict]:
    """analysis.db StepTraceTime: torch_npu's step trace (µs), the db twin of step_trace_time.csv."""
    db = _Db(Path(path))
    try:
        if "StepTraceTime" not in db.tables:
            return []
        rows = db.rows("SELECT step, computing, communication_not_overlapped, overlapped, free FROM StepTraceTime")
    finally:
        db.close()
    return [step_row(step if step is not None else "", *(float(v or 0) for v in rest)) for step, *rest in rows]
