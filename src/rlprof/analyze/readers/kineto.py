"""Kineto / torch.profiler Chrome traces (.json, .json.gz), read in typed chunks.

Kineto writes one event per top-level array element separated by "},\\n  {" at two-space indent;
that separator cannot occur inside a string (raw newlines are escaped) or a nested object (deeper
indent), so the event array is cut there and each chunk decoded with msgspec into typed events.
Memory stays bounded by the chunk size plus the numeric columns. Other layouts are decoded whole.
Damaged input keeps the events before the damage, with a warning naming the file and byte offset.
"""

from __future__ import annotations

import io
import os
import re
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter
from pathlib import Path

import msgspec
import numpy as np

from ..table import (CPU_OP, DEVICE_KINDS, KIND_OF_CATEGORY, OTHER, PYTHON, RUNTIME, AutoIds, ColumnBuilder,
                     EventTable, Interner, release_free_memory)

CHUNK = 512 << 10  # small pieces: the decoded events of one fit in memory the allocator keeps (fewer page faults)
MAX_US = 1e17  # ~3,000 years of microseconds: beyond it a timestamp or duration is not a time
SEP = b"},\n  {"
ARRAY_KEY = b'"traceEvents"'
ARRAY_END = re.compile(rb"\n  \}\s*\]")  # the last event's brace (indent 2), then the array's bracket
LOOSE_END = re.compile(rb"\}\s*\]")  # any event's closing brace, then a bracket (checked by decoding)


class Args(msgspec.Struct, gc=False):
    total_allocated: float | None = msgspec.field(default=None, name="Total Allocated")
    name: str | None = None  # process_name / thread_name metadata events


class LeanEvent(msgspec.Struct, gc=False):
    """What the hot path reads: an event without its args (skipped by the decoder, not materialised)."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float | str = float("nan")  # missing: dropped (not read as time 0)
    dur: float | str = 0.0
    id: int | str = 0  # flow events ("ac2g": host launch -> device event) pair by id


class Event(LeanEvent, gc=False):
    """An event with its args kept raw: decoded only where needed (memory counters, metadata names)."""

    args: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)

    def decoded_args(self) -> Args:
        try:
            return _decode_args(self.args) if len(self.args) else Args()
        except msgspec.DecodeError:
            return Args()


class ShapeArgs(msgspec.Struct, gc=False):
    input_dims: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw, name="Input Dims")
    total_allocated: float | None = msgspec.field(default=None, name="Total Allocated")


class ShapeEvent(Event, gc=False):
    """An event whose input shapes are kept (compare --by-shape); other args are skipped."""

    args: ShapeArgs = msgspec.field(default_factory=ShapeArgs)

    def decoded_args(self):
        return self.args


class Meta(msgspec.Struct):
    """Top-level keys other than traceEvents (wherever they sit in the object)."""

    distributedInfo: dict | None = None
    baseTimeNanoseconds: int | None = None
    rlprof: dict | None = None
    deviceProperties: list | None = None


class WholeTrace(msgspec.Struct):
    traceEvents: list[Event] = []
    distributedInfo: dict | None = None
    baseTimeNanoseconds: int | None = None
    rlprof: dict | None = None
    deviceProperties: list | None = None


@dataclass
class Trace:
    path: Path
    table: EventTable
    meta: Meta
    warnings: list[str] = field(default_factory=list)
    partial: bool = False
    bytes_read: int = 0

    @property
    def rank(self) -> int | None:
        for source in (self.meta.rlprof or {}, self.meta.distributedInfo or {}):
            if isinstance(source.get("rank"), int):
                return source["rank"]
        return None

    @property
    def has_device(self) -> bool:
        from ..table import DEVICE_KINDS

        return bool(self.table.mask(*DEVICE_KINDS).any())


class NotATrace(ValueError):
    pass


_decode_events = msgspec.json.Decoder(list[Event]).decode
_decode_shape_events = msgspec.json.Decoder(list[ShapeEvent]).decode
_decode_args = msgspec.json.Decoder(Args).decode
_decode_args_list = msgspec.json.Decoder(list[Args]).decode
_decode_lean = msgspec.json.Decoder(list[LeanEvent]).decode
_decode_meta = msgspec.json.Decoder(Meta).decode
_decode_whole = msgspec.json.Decoder(WholeTrace | list[Event]).decode


class WholeShapeTrace(WholeTrace):
    traceEvents: list[ShapeEvent] = []


_decode_whole_shapes = msgspec.json.Decoder(WholeShapeTrace | list[ShapeEvent]).decode


def _num(x) -> float:
    return float(x) if not isinstance(x, str) else float(x.strip() or 0)


_KIND = dict(KIND_OF_CATEGORY, **{"": CPU_OP})  # no category: a CPU op (old Chrome-trace writers)
_PH, _CAT, _NAME, _TS, _DUR, _ID, _ARGS = map(attrgetter, ("ph", "cat", "name", "ts", "dur", "id", "args"))
_PID_TID = attrgetter("pid", "tid")
_X, _FLOW_START, _FLOW_END, _INSTANT = 1, 2, 3, 4
_PHASE = {"X": _X, "s": _FLOW_START, "f": _FLOW_END, "i": _INSTANT}  # the phases read; others are 0
_IS_LAUNCH = {"ac2g": True}  # the flow category that ties a kernel to its launch (dict.get: cheaper than ==)


class _ThreadIds(AutoIds):
    """(pid, tid) -> thread id, in order of first appearance; a thread is its name "pid/tid", so one written
    with a number here and a numeric string there is one thread."""

    __slots__ = ("by_name",)

    def __init__(self, names: list):
        super().__init__(names)
        self.by_name: dict[str, int] = {}

    def __missing__(self, key: tuple) -> int:
        name = f"{key[0]}/{key[1]}"
        i = self.by_name.get(name)
        if i is None:
            i = self.by_name[name] = len(self.names)
            self.names.append(name)
        self[key] = i
        return i


class _NeedArgs(Exception):
    """Events decoded without args hold memory counters, whose args are read."""


class _Sink:
    """Turns decoded events into columns. The hot path of ingestion, so every per-event step runs in C
    (map/attrgetter/compress into numpy.fromiter, dict lookups); Python loops only over distinct values.
    A sink is also what one byte range of a split trace sends back: `absorb` merges sinks in file order into
    exactly the table one sink reading the whole file would build (ids in order of first appearance)."""

    def __init__(self, shapes: bool = False):
        self.cols = ColumnBuilder(shapes)
        self.thread_keys: dict[tuple, int] = _ThreadIds(self.cols.threads.names)  # (pid, tid) -> thread id
        self.runtime_names = Interner()
        self.runtime: list[tuple[np.ndarray, np.ndarray]] = []  # per chunk (name id, dur): summed at build
        self.shapes = shapes
        self.dropped: dict[str, int] = defaultdict(int)  # events dropped for bad values, by reason
        self.complete = self.unknown = 0  # complete events, and those of a category rlprof does not know
        self.unknown_cats: dict[str, int] = defaultdict(int)
        self.flow_starts: list[tuple] = []  # per chunk (ids, ts): where launch flows leave the host
        self.flow_ends: list[tuple] = []  # per chunk (ids, ts, thread): the device events they arrive at

    @property
    def event_type(self) -> type:
        return ShapeEvent if self.shapes else Event

    def add(self, events: list) -> None:
        """One decoded batch, in file order. Ids (names, threads) are given in order of first appearance in the
        file, whatever the batch boundaries: so a file split anywhere merges back into the same table."""
        n = len(events)
        if not n:
            return
        phase = np.fromiter(map(_PHASE.get, map(_PH, events), repeat(0)), np.uint8, n)
        is_x = phase == _X
        x_at = np.flatnonzero(is_x)  # positions in the batch
        if len(x_at) < n:
            flow_end_at = self._add_others(events, phase)
            xs = list(compress(events, is_x.tolist()))
        else:
            flow_end_at, xs = np.zeros(0, np.int64), events
        start, dur = _floats_of(xs, _TS), _floats_of(xs, _DUR)
        with np.errstate(all="ignore"):
            bad_ts = ~np.isfinite(start) | (np.abs(start) > MAX_US)
            bad_dur = ~np.isfinite(dur) | (dur < 0) | (dur > MAX_US)
        if bad_ts.any() or bad_dur.any():  # dropped and counted: no NaN, inf or negative time reaches a table
            self.dropped["missing, non-finite or out-of-range ts"] += int(bad_ts.sum())
            self.dropped["negative, non-finite or out-of-range dur"] += int((bad_dur & ~bad_ts).sum())
            ok = ~(bad_ts | bad_dur)
            xs, start, dur, x_at = list(compress(xs, ok.tolist())), start[ok], dur[ok], x_at[ok]
        end = start + dur
        if xs:
            self.cols.extend_span(float(start.min()), float(end.max()))
            kind = np.fromiter(map(_KIND.get, map(_CAT, xs), repeat(OTHER)), np.uint8, len(xs))
            self.complete += len(xs)
            unknown = kind == OTHER
            if unknown.any():
                self.unknown += int(unknown.sum())
                for cat, count in Counter(map(_CAT, compress(xs, unknown.tolist()))).items():  # for the warning
                    self.unknown_cats[cat] += count
            # runtime API calls are only ever summed (launch overhead): their name and duration, not their place
            runtime = kind == RUNTIME
            if runtime.any():
                ids = self.runtime_names.ids.__getitem__
                names = np.fromiter(map(ids, map(_NAME, compress(xs, runtime.tolist()))), np.int32)
                self.runtime.append((names, end[runtime] - start[runtime]))
            keep = (kind != RUNTIME) & (kind != OTHER) & (kind != PYTHON)
            if not keep.all():
                xs, start, end, kind, x_at = list(compress(xs, keep.tolist())), start[keep], end[keep], kind[keep], \
                    x_at[keep]
        if not xs and not len(flow_end_at):
            return
        # threads of the kept events and of the flow ends, given ids together in file order
        chosen = np.zeros(n, bool)
        chosen[x_at] = True
        chosen[flow_end_at] = True
        threads = np.fromiter(map(self.thread_keys.__getitem__, map(_PID_TID, compress(events, chosen.tolist()))),
                              np.int32)
        rank = np.cumsum(chosen) - 1
        if len(flow_end_at):
            self.flow_ends[-1] += (threads[rank[flow_end_at]],)
        if not xs:
            return
        names = np.fromiter(map(self.cols.names.ids.__getitem__, map(_NAME, xs)), np.int32, len(xs))
        shapes = None
        if self.shapes:
            raw = [bytes(a.input_dims).replace(b" ", b"").decode() for a in map(_ARGS, xs)]
            shapes = _intern(raw, self.cols.shapes)
        self.cols.add(start, end, kind, names, threads[rank[x_at]], shapes)

    def _add_others(self, events: list, phase: np.ndarray) -> np.ndarray:
        """Instant and flow events: memory counters, and the launch flows (ac2g) that tie kernels to the host.
        Returns the batch positions of the flow ends (their threads come after)."""
        is_instant = phase == _INSTANT
        if is_instant.any():  # memory counters (profile_memory traces): their args decoded in one call
            instants = compress(events, is_instant.tolist())
            counters = list(compress(instants, map("[memory]".__eq__, map(_NAME, instants))))
            if counters:
                if not hasattr(counters[0], "args"):
                    raise _NeedArgs  # decoded without args (nothing added yet): the caller decodes them with args
                self._add_memory(counters)
        is_flow = (phase == _FLOW_START) | (phase == _FLOW_END)
        if not is_flow.any():
            return np.zeros(0, np.int64)
        at = np.flatnonzero(is_flow)
        flows = list(compress(events, is_flow.tolist()))
        launch = np.fromiter(map(_IS_LAUNCH.get, map(_CAT, flows), repeat(False)), bool, len(flows))
        is_start = launch & (phase[at] == _FLOW_START)
        is_end = launch & (phase[at] == _FLOW_END)
        if is_start.any():  # kept as arrays per batch: 16-24 bytes a flow, whatever the trace's size
            starts = list(compress(flows, is_start.tolist()))
            self.flow_starts.append((_ids_of(starts), _floats_of(starts, _TS)))
        if not is_end.any():
            return np.zeros(0, np.int64)
        ends = list(compress(flows, is_end.tolist()))
        self.flow_ends.append((_ids_of(ends), _floats_of(ends, _TS)))  # + threads, by add()
        return at[is_end]

    def _add_memory(self, counters: list) -> None:
        raws = [bytes(a) or b"{}" for a in map(_ARGS, counters)]
        try:
            totals = [a.total_allocated for a in _decode_args_list(b"[" + b",".join(raws) + b"]")]
        except msgspec.DecodeError:  # one damaged args object: the others still count
            totals = [e.decoded_args().total_allocated for e in counters]
        ts = _floats_of(counters, _TS)
        for t, total in zip(ts.tolist(), totals):
            if total is not None and np.isfinite(t) and np.isfinite(total):
                self.cols.add_memory(t, total)

    def absorb(self, part: "_Sink") -> None:
        """Append what another sink read after this one (the next byte range of the same file)."""
        name_map = _remap(part.cols.names.names, self.cols.names)
        shape_map = _remap(part.cols.shapes.names, self.cols.shapes)
        runtime_map = _remap(part.runtime_names.names, self.runtime_names)
        thread_map = np.zeros(len(part.thread_keys), np.int32)
        for key, i in part.thread_keys.items():
            thread_map[i] = self.thread_keys[key]
        for chunk in part.cols.take_chunks():
            start, end, kind, name, thread = chunk[:5]
            self.cols.add(start, end, kind, name_map[name], thread_map[thread],
                          shape_map[chunk[5]] if self.shapes else None)
        if part.cols.span is not None:
            self.cols.extend_span(*part.cols.span)
        self.cols.memory_points.extend(part.cols.memory_points)
        self.runtime += [(runtime_map[ids], dur) for ids, dur in part.runtime]
        self.flow_starts += part.flow_starts
        self.flow_ends += [(ids, ts, thread_map[thread]) for ids, ts, thread in part.flow_ends]
        for why, count in part.dropped.items():
            self.dropped[why] += count
        for cat, count in part.unknown_cats.items():
            self.unknown_cats[cat] += count
        self.complete += part.complete
        self.unknown += part.unknown

    def drop_warnings(self, path: Path) -> list[str]:
        out = []
        if self.dropped:
            what = ", ".join(f"{n} with {why}" for why, n in self.dropped.items() if n)
            out.append(f"{path}: dropped {sum(self.dropped.values())} event(s) that carry no usable time ({what})")
        if self.complete and self.unknown > self.complete / 2:  # mostly unread: the numbers would be silently wrong
            cats = ", ".join(f"{c or '(none)'!r}" for c, _ in sorted(self.unknown_cats.items(), key=lambda kv: -kv[1])[:5])
            out.append(f"{path}: {self.unknown} of {self.complete} events have categories rlprof does not know "
                       f"({cats}); they are not counted, so the buckets and operators miss them")
        return out

    def build(self) -> EventTable:
        if self.runtime:  # summed over the whole file at once: the same sums however the file was split
            ids = np.concatenate([r[0] for r in self.runtime])
            dur = np.concatenate([r[1] for r in self.runtime])
            count = np.bincount(ids, minlength=len(self.runtime_names.names))
            total = np.bincount(ids, weights=dur, minlength=len(self.runtime_names.names))
            self.cols.runtime = {name: [int(count[i]), float(total[i])]
                                 for i, name in enumerate(self.runtime_names.names)}
        table = self.cols.build()
        release_free_memory()  # the pieces just concatenated
        table.launch = self._launch_times(table)
        release_free_memory()  # the flows and the launch matching's temporaries
        return table

    def _launch_times(self, t: EventTable) -> np.ndarray | None:
        """Each device event's host launch time, through the trace's ac2g flows: a flow end sits on its device
        event (same thread, same timestamp), its start at the launch. Vectorised: sorted keys + searchsorted."""
        if not self.flow_ends or not self.flow_starts or not len(t):
            return None
        # Each temporary is released as soon as it is used: on a 2 GB trace every array here is ~12 MB.
        starts, ends, self.flow_starts, self.flow_ends = self.flow_starts, self.flow_ends, [], []
        as_text = any(c[0].dtype.kind != "i" for c in starts + ends)  # one writer's string ids: compare as strings

        def ids_of(chunks):
            return np.concatenate([c[0].astype(str) if as_text else c[0] for c in chunks])

        start_id, start_ts = ids_of(starts), np.concatenate([c[1] for c in starts])
        order = np.argsort(start_id, kind="stable")
        start_id, start_ts = start_id[order], start_ts[order]
        del order, starts
        end_id = ids_of(ends)
        pos = np.clip(np.searchsorted(start_id, end_id), 0, len(start_id) - 1)
        found = start_id[pos] == end_id
        del start_id, end_id
        launch_of_end = start_ts[pos]
        launch_of_end[~found] = np.nan
        del start_ts, pos, found
        # device events <- flow ends on the same thread at the same start time
        end_ts = np.concatenate([c[1] for c in ends])
        end_thread = np.concatenate([c[2] for c in ends])
        del ends
        width = float(max(t.end.max(), end_ts.max()) - min(t.start.min(), end_ts.min())) + 1.0
        base = float(min(t.start.min(), end_ts.min()))
        end_key = end_thread * width
        end_key += end_ts - base
        del end_ts, end_thread
        key_order = np.argsort(end_key, kind="stable")
        end_key, launch_of_end = end_key[key_order], launch_of_end[key_order]
        del key_order
        device = np.flatnonzero(np.isin(t.kind, DEVICE_KINDS))
        ev_key = t.thread[device].astype(np.int64) * width + (t.start[device] - base)
        at = np.clip(np.searchsorted(end_key, ev_key), 0, len(end_key) - 1)
        hit = np.abs(end_key[at] - ev_key) < 1e-3
        launch = np.full(len(t), np.nan)
        launch[device[hit]] = launch_of_end[at[hit]]
        return launch if np.isfinite(launch).any() else None


def _floats_of(events: list, field) -> np.ndarray:
    """One numeric field of every event as float64, in C; a writer's numeric strings or junk take the slow path."""
    try:
        return np.fromiter(map(field, events), np.float64, len(events))
    except (ValueError, TypeError, OverflowError):
        return _floats(list(map(field, events)))


def _intern(values: list, interner: Interner) -> np.ndarray:
    """Dense ids for `values`, new ones in order of first appearance; Python runs only for names not seen before."""
    return np.fromiter(map(interner.ids.__getitem__, values), np.int32, len(values))


def _remap(labels: list, interner: Interner) -> np.ndarray:
    """Another interner's ids -> this one's (labels it has not seen are added in their order)."""
    return np.array([interner(label) for label in labels], np.int32).reshape(-1)


def _floats(values: list) -> np.ndarray:
    """Numbers (or numeric strings) as float64; anything unreadable becomes NaN (then dropped and counted)."""
    try:
        return np.array(values, dtype=np.float64)
    except (ValueError, TypeError, OverflowError):
        out = np.full(len(values), np.nan)
        for i, v in enumerate(values):
            try:
                out[i] = float(v)
            except (ValueError, TypeError, OverflowError):
                pass
        return out


def _ids_of(events: list) -> np.ndarray:
    """The flow ids of `events`: in C where they are integers (Kineto's)."""
    try:
        return np.fromiter(map(_ID, events), np.int64, len(events))
    except (ValueError, TypeError, OverflowError):
        return _ids(list(map(_ID, events)))


def _ids(values: list) -> np.ndarray:
    """Flow ids as int64 (Kineto writes integers), as strings where a writer used strings."""
    try:
        return np.array(values, dtype=np.int64)
    except (ValueError, TypeError, OverflowError):
        return np.array([str(v) for v in values])


class _CutTolerantGzip:
    """A gzip stream that hands out every byte it could decompress. gzip.GzipFile raises on a cut or corrupt
    stream and loses the block it was reading; this keeps it, ends the stream there and holds the reason in
    `error`. Multi-member files (concatenated gzip) read through."""

    def __init__(self, path: Path):
        self.f = open(path, "rb")
        self.d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self.pending = b""
        self.error: Exception | None = None
        self.done = False

    def read(self, n: int) -> bytes:
        out, size = [self.pending], len(self.pending)
        self.pending = b""
        while size < n and not self.done:
            raw = self.f.read(1 << 20)
            if not raw:
                if not self.d.eof:
                    self.error = EOFError("compressed file ended before the end-of-stream marker")
                self.done = True
                break
            try:
                piece = self.d.decompress(raw)
                while self.d.eof and self.d.unused_data:  # the next gzip member
                    rest, self.d = self.d.unused_data, zlib.decompressobj(16 + zlib.MAX_WBITS)
                    piece += self.d.decompress(rest)
            except zlib.error as exc:
                self.error, self.done = exc, True
                break
            out.append(piece)
            size += len(piece)
        data = b"".join(out)
        if len(data) > n:
            data, self.pending = data[:n], data[n:]
        return data

    def readinto(self, view) -> int:
        data = self.read(len(view))
        view[:len(data)] = data
        return len(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()
        return False


def _open(path: Path):
    return _CutTolerantGzip(path) if _is_gzip(path) else open(path, "rb")


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def stream_size(path: Path) -> int:
    """The bytes a reader goes through: a gzip file's inflated size (its trailer's, where the file is one member
    under 4 GB), else the file's own size."""
    size = path.stat().st_size
    if path.is_file() and size > 18 and _is_gzip(path):
        with open(path, "rb") as f:
            f.seek(-4, os.SEEK_END)
            size = max(size, int.from_bytes(f.read(4), "little"))
    return size


class _Chunks:
    """CHUNK-sized reads from a stream, optionally only up to `limit` bytes; a stream error ends it and is kept."""

    def __init__(self, f, limit: int | None = None):
        self.f, self.left, self.error = f, limit, None

    def more(self) -> bytearray:
        buf = bytearray(CHUNK)
        with memoryview(buf) as view:
            got = self.more_into(view)
        del buf[got:]
        return buf

    def more_into(self, view: memoryview) -> int:
        """Up to CHUNK bytes into `view` (no new object per read); 0 at the end, or once the stream broke."""
        if self.error is not None or self.left == 0:
            return 0
        want = min(CHUNK, len(view)) if self.left is None else min(CHUNK, len(view), self.left)
        try:
            got = self.f.readinto(view[:want]) or 0
        except (EOFError, OSError, zlib.error) as exc:
            self.error = exc
            return 0
        if self.left is not None:
            self.left -= got
        if not got and getattr(self.f, "error", None) is not None:
            self.error = self.f.error
        return got


@dataclass
class Part:
    """What one reader made of a stretch of the event array: the sink holding its columns, and how it ended."""

    sink: _Sink
    warnings: list[str]
    partial: bool
    end: int  # byte offset just past the last event read
    tail: bytes = b""  # after the array (the final part only): the trace's remaining top-level keys


@dataclass
class Layout:
    """Where a plain trace in Kineto's layout keeps its event array: what byte ranges are cut from."""

    header: bytes  # the top-level keys before traceEvents
    body_start: int  # the first byte after the array's "["
    size: int


def read_kineto(path: str | Path, shapes: bool = False, map_ranges=None, parts: int = 1) -> Trace:
    """`shapes`: also keep each op's input shapes (slower: args are decoded). With `map_ranges` (a map function:
    (fn, list of argument tuples) -> results, e.g. a process pool's) and `parts` > 1, a large plain file in Kineto's
    layout is read as that many byte ranges in parallel; the table is the same as one reader's."""
    path = Path(path)
    layout = kineto_layout(path) if parts > 1 and map_ranges is not None else None
    ranges = byte_ranges(path, layout, parts) if layout else []
    if len(ranges) > 1:
        return assemble(path, layout.header, map_ranges(read_range_job, [(path, lo, hi, shapes) for lo, hi in ranges]))
    sink = _Sink(shapes)
    with _open(path) as f:
        chunks = _Chunks(f)
        buf = bytearray()  # grown in place: a bytes object would be copied whole at every read
        while True:  # the header: everything up to the event array's "["
            data = chunks.more()
            buf += data
            k = buf.find(ARRAY_KEY)
            if k >= 0 and buf.find(b"[", k) >= 0:
                open_at = buf.find(b"[", k)
                header, buf = bytes(buf[:k]), bytes(buf[open_at + 1:])
                break
            if not data:
                return _read_whole(path, bytes(buf), chunks.error, sink)
        if b"\n  {" not in buf[:64] and not buf.lstrip().startswith(b"]"):
            # not Kineto's pretty layout: decode the whole file (small traces from other writers)
            rest = bytearray(buf)
            while data := chunks.more():
                rest += data
            return _read_whole(path, header + ARRAY_KEY + b":[" + rest, chunks.error, sink)
        if map_ranges is not None and parts > 1 and isinstance(f, _CutTolerantGzip):
            # a compressed stream cannot be entered mid-way: this process inflates it and hands out pieces
            return assemble(path, header, _pipelined(path, chunks, buf, open_at + 1, shapes, map_ranges))
        part = _scan(chunks, buf, open_at + 1, sink, True, path)
    return assemble(path, header, [part])


PIECE = 8 << 20  # what one worker decodes of a compressed trace at a time


def _pipelined(path: Path, chunks: "_Chunks", buf: bytes, offset: int, shapes: bool, map_ranges):
    """The parts of a compressed trace: pieces cut at event separators go to the workers (a bounded number in
    flight) while this process inflates the next; the last piece (the array's end, the keys after it, a cut
    stream) is read here with the stream's own state, as one reader ends it."""
    rest: list = []
    buf = bytearray(buf)

    def pieces():
        nonlocal buf, offset
        while True:
            data = chunks.more()
            buf += data
            while len(buf) > PIECE:  # whole events, about PIECE bytes each
                cut = buf.rfind(SEP, 0, PIECE)
                cut = cut if cut >= 0 else buf.find(SEP, PIECE)  # an event longer than a piece
                if cut < 0:
                    break
                yield path, bytes(buf[:cut + 1]), offset, shapes
                del buf[:cut + len(SEP) - 1]
                offset += cut + len(SEP) - 1
            if not data:
                rest.append((bytes(buf), offset))
                return

    for part in map_ranges(read_piece_job, pieces()):
        yield part
        if part.partial:
            return
    yield _scan(chunks, *rest[0], _Sink(shapes), True, path)


def read_piece_job(job: tuple) -> Part:
    """One piece of a compressed trace's event array (whole events), decoded in a worker."""
    path, piece, offset, shapes = job
    return _scan(_Chunks(io.BytesIO(piece)), b"", offset, _Sink(shapes), False, path)


def kineto_layout(path: Path) -> Layout | None:
    """The layout of a plain (uncompressed) file in Kineto's form; None for anything else (read by one reader)."""
    if _is_gzip(path):
        return None
    with open(path, "rb") as f:
        head = f.read(1 << 20)
    k = head.find(ARRAY_KEY)
    open_at = head.find(b"[", k) if k >= 0 else -1
    if open_at < 0 or b"\n  {" not in head[open_at + 1:open_at + 65]:
        return None
    return Layout(head[:k], open_at + 1, path.stat().st_size)


def byte_ranges(path: Path, layout: Layout, parts: int) -> list[tuple[int, int | None]]:
    """About `parts` equal byte ranges of the event array, each cut between two events (at a separator, which
    cannot occur inside a string or a nested object). The last range runs to the end of the file."""
    cuts = []
    with open(path, "rb") as f:
        for i in range(1, parts):
            target = layout.body_start + (layout.size - layout.body_start) * i // parts
            if cuts and target <= cuts[-1]:
                continue
            f.seek(target)
            window = f.read(1 << 20)
            at = window.find(SEP)
            if at < 0 or ARRAY_END.search(window, 0, at):  # no separator near, or the array ends first
                break
            cuts.append(target + at)
    starts = [layout.body_start] + [c + len(SEP) - 1 for c in cuts]
    ends = [c + 1 for c in cuts] + [None]
    return list(zip(starts, ends))


def read_range(path: Path, lo: int, hi: int | None, shapes: bool = False) -> Part:
    """The events in bytes [lo, hi) of a plain trace (hi None: to the end of the array, and the keys after it)."""
    with open(path, "rb") as f:
        f.seek(lo)
        return _scan(_Chunks(f, None if hi is None else hi - lo), b"", lo, _Sink(shapes), hi is None, path)


def read_range_job(job: tuple) -> Part:
    return read_range(*job)


def assemble(path: Path, header: bytes, parts) -> Trace:
    """One trace from its parts in file order (any iterable: each is merged as it arrives, then let go).
    Damage in a part ends the trace there, as it ends one reader."""
    sink, warnings, partial, last = None, [], False, None
    for part in parts:
        if sink is None:
            sink = part.sink
        else:
            sink.absorb(part.sink)
        warnings += part.warnings
        last, tail = part, part.tail
        if part.partial:
            partial = True
            break
    else:
        tail = last.tail
    if hasattr(parts, "close"):  # a generator over worker processes: let them go before the table is built
        parts.close()
    return Trace(path, sink.build(), _meta(header, tail), warnings + sink.drop_warnings(path), partial, last.end)


def _scan(chunks: _Chunks, buf: bytes, offset: int, sink: _Sink, final: bool, path: Path) -> Part:
    """Decode the events of `buf` and what follows it, piece by piece cut at the separator. `offset`: where `buf`
    starts in the stream. `final`: the stretch runs to the end of the array (else it ends on an event's brace)."""
    warnings: list[str] = []
    # One buffer, reused: "[" + the events read so far. A piece is decoded in place, its closing bracket written
    # over the separator's comma; the unfinished event after it moves to the front, behind a new "[".
    space = bytearray(max(2 * CHUNK, len(buf) + CHUNK + 1))
    space[0] = 0x5B  # "["
    space[1:1 + len(buf)] = buf
    fill = 1 + len(buf)
    while True:
        if len(space) - fill < CHUNK:  # an event longer than the buffer
            space += bytes(CHUNK)
        with memoryview(space) as view:
            got = chunks.more_into(view[fill:])
        fill += got
        cut = space.rfind(SEP, 0, fill)
        if got and cut < 0:
            continue
        if not got:
            rest = bytes(space[1:fill])
            if not final:  # a range ends on its last event's closing brace
                good = len(rest) if not rest.strip() or _decode_into(b"[" + rest + b"]", sink) else _salvage(rest, sink)
                if good < len(rest):
                    warnings.append(f"{path}: damaged event near byte {offset + good}; events before it were kept")
                return Part(sink, warnings, good < len(rest), offset + good)
            return _scan_end(chunks, rest, offset, sink, path, warnings)
        space[cut + 1] = 0x5D  # "]"
        with memoryview(space) as view:
            decoded = _decode_into(view[:cut + 2], sink)
        if not decoded:
            good = _salvage(bytes(space[1:cut + 1]), sink)
            warnings.append(f"{path}: damaged event near byte {offset + good}; events before it were kept")
            return Part(sink, warnings, True, offset + good)
        keep = cut + len(SEP) - 2  # the space before the next event's "{": becomes its "["
        space[:fill - keep] = space[keep:fill]
        space[0] = 0x5B
        fill -= keep
        offset += keep


def _scan_end(chunks: _Chunks, buf: bytes, offset: int, sink: _Sink, path: Path, warnings: list[str]) -> Part:
    """The last piece: events up to the array's closing bracket, then the keys after it."""
    close = ARRAY_END.search(buf)
    if close is None:  # a writer whose events end on their own line: the first "}]" that decodes
        loose = next((m for m in LOOSE_END.finditer(buf) if _decodes(b"[" + buf[:m.start() + 1] + b"]")), None)
        if loose is not None:
            ok = _decode_into(b"[" + buf[:loose.start() + 1] + b"]", sink)
            return _ended(chunks, Part(sink, warnings, not ok, offset + loose.start() + 1, buf[loose.end():]), path)
        good = _salvage(buf, sink)
        warnings.append(f"{path}: trace ends early at byte {offset + good} of the decompressed stream "
                        f"({_why(chunks.error) or 'no closing bracket'}); events before it were kept")
        return Part(sink, warnings, True, offset + good)
    body, tail = buf[:close.start() + 4], buf[close.end():]
    end = offset + len(body)
    if body.strip() and not _decode_into(b"[" + body + b"]", sink):
        good = _salvage(body, sink)
        warnings.append(f"{path}: damaged event near byte {offset + good}; events before it kept")
        return Part(sink, warnings, True, offset + good, tail)
    return _ended(chunks, Part(sink, warnings, False, end, tail), path)


def _ended(chunks: _Chunks, part: Part, path: Path) -> Part:
    if chunks.error is not None and not part.partial:  # the array closed, but the stream broke after it
        part.partial = True
        part.warnings.append(f"{path}: {_why(chunks.error)} at byte {part.end}; events before it were kept")
    return part


def _why(exc) -> str | None:
    if exc is None:
        return None
    return f"compressed stream is cut or corrupt ({type(exc).__name__}: {exc})"


def _decodes(data: bytes) -> bool:
    try:
        msgspec.json.decode(data)
        return True
    except (msgspec.DecodeError, UnicodeDecodeError):
        return False


def _decode_into(data, sink: _Sink) -> bool:
    """Decode a JSON array of events (bytes or a view of them) into `sink`; False where it does not parse."""
    try:
        events = (_decode_shape_events if sink.shapes else _decode_lean)(data)
        try:
            sink.add(events)
        except _NeedArgs:  # args are decoded only where they are read
            sink.add(_decode_events(data))
        return True
    except (msgspec.DecodeError, UnicodeDecodeError):  # invalid UTF-8 in a name is damage like any other
        return False


def _salvage(piece: bytes, sink: _Sink) -> int:
    """Decode the events of `piece` one by one up to the first damaged one. Returns where that one starts (the
    whole length when none is): the same byte whatever stretch of the file `piece` began at."""
    pos = 0
    events = []
    while True:
        cut = piece.find(SEP, pos)
        end = len(piece) if cut < 0 else cut + 1
        try:
            events.append(msgspec.json.decode(piece[pos:end].strip().rstrip(b","), type=sink.event_type))
        except (msgspec.DecodeError, UnicodeDecodeError):
            break
        if cut < 0:
            pos = len(piece)
            break
        pos = cut + len(SEP) - 1
    sink.add(events)
    return pos


def _meta(header: bytes, tail: bytes) -> Meta:
    text = header.strip()
    if not text.startswith(b"{"):
        return Meta()
    doc = text + b'"traceEvents":[]' + tail.strip()
    if not doc.endswith(b"}"):
        doc += b"}"
    try:
        return _decode_meta(doc)
    except msgspec.DecodeError:
        try:  # the tail may be cut: the header alone
            return _decode_meta(text + b'"traceEvents":[]}')
        except msgspec.DecodeError:
            return Meta()


def salvage_events(data: bytes, bracket: int, event_type=Event) -> tuple[list, int]:
    """The events of a damaged array in any layout, one by one from its "[" up to the first that does not parse,
    and the byte offset where the last one kept ends (a slow path, taken only on damage)."""
    import json

    text = data.decode("utf-8", errors="replace")
    pos = len(data[:bracket + 1].decode("utf-8", errors="replace"))
    decoder, events, kept = json.JSONDecoder(), [], pos
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            raw, pos = decoder.raw_decode(text, pos)
            events.append(msgspec.json.decode(msgspec.json.encode(raw), type=event_type))
        except (ValueError, msgspec.DecodeError, msgspec.EncodeError, RecursionError):
            break
        kept = pos
    return events, len(text[:kept].encode("utf-8"))


def _salvage_any(path: Path, data: bytes, bracket: int, sink: _Sink, exc) -> Trace:
    events, offset = salvage_events(data, bracket, sink.event_type)
    if not events:
        raise NotATrace(f"{path}: not a readable trace ({exc}); allowed: a Chrome/Kineto trace JSON object "
                        "with traceEvents, or an array of trace events")
    sink.add(events)
    warning = f"{path}: damaged event near byte {offset} ({exc}); the {len(events)} events before it were kept"
    return Trace(path, sink.build(), Meta(), [warning] + sink.drop_warnings(path), True, offset)


def _read_whole(path: Path, data: bytes, stream_error, sink: _Sink) -> Trace:
    if not data.strip():
        raise NotATrace(f"{path}: empty file; allowed: a Chrome/Kineto trace JSON object with traceEvents")
    decode = _decode_whole_shapes if sink.shapes else _decode_whole
    try:
        doc = decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        body = data.strip()
        if body.startswith(b"["):  # the Trace Event Format lets the array form end without its "]"
            try:
                doc = decode(body.rstrip(b",") + b"]")
            except (msgspec.DecodeError, UnicodeDecodeError):
                return _salvage_any(path, data, 0, sink, exc)
        elif b"traceEvents" in data and b"[" in data:
            return _salvage_any(path, data, data.index(b"[", data.index(b"traceEvents")), sink, exc)
        else:
            raise NotATrace(f"{path}: not a readable trace ({exc}); allowed: a Chrome/Kineto trace JSON object "
                            "with traceEvents, or an array of trace events") from None
    if isinstance(doc, list):
        sink.add(doc)
        meta = Meta()
    else:
        if not doc.traceEvents and b"traceEvents" not in data:
            raise NotATrace(f"{path}: JSON without traceEvents; allowed: a Chrome/Kineto trace")
        sink.add(doc.traceEvents)
        meta = Meta(doc.distributedInfo, doc.baseTimeNanoseconds, doc.rlprof, doc.deviceProperties)
    warnings = [f"{path}: {_why(stream_error)}"] if stream_error is not None else []
    return Trace(path, sink.build(), meta, warnings + sink.drop_warnings(path), stream_error is not None, len(data))
