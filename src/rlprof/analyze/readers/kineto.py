"""Kineto / torch.profiler Chrome traces (.json, .json.gz), read in typed chunks.

Kineto writes one event per top-level array element separated by "},\\n  {" at two-space indent;
that separator cannot occur inside a string (raw newlines are escaped) or a nested object (deeper
indent), so the event array is cut there and each chunk decoded with msgspec into typed events.
Memory stays bounded by the chunk size plus the numeric columns. Other layouts are decoded whole.
Damaged input keeps the events before the damage, with a warning naming the file and byte offset.
"""

from __future__ import annotations

import re
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from ..table import CPU_OP, DEVICE_KINDS, KIND_OF_CATEGORY, OTHER, PYTHON, RUNTIME, ColumnBuilder, EventTable

CHUNK = 8 << 20
MAX_US = 1e17  # ~3,000 years of microseconds: beyond it a timestamp or duration is not a time
SEP = b"},\n  {"
ARRAY_KEY = b'"traceEvents"'
ARRAY_END = re.compile(rb"\n  \}\s*\]")  # the last event's brace (indent 2), then the array's bracket
LOOSE_END = re.compile(rb"\}\s*\]")  # any event's closing brace, then a bracket (checked by decoding)


class Args(msgspec.Struct, gc=False):
    total_allocated: float | None = msgspec.field(default=None, name="Total Allocated")
    name: str | None = None  # process_name / thread_name metadata events


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float | str = float("nan")  # missing: dropped (not read as time 0)
    dur: float | str = 0.0
    id: int | str = 0  # flow events ("ac2g": host launch -> device event) pair by id
    args: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # decoded only where needed

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
_decode_meta = msgspec.json.Decoder(Meta).decode
_decode_whole = msgspec.json.Decoder(WholeTrace | list[Event]).decode


class WholeShapeTrace(WholeTrace):
    traceEvents: list[ShapeEvent] = []


_decode_whole_shapes = msgspec.json.Decoder(WholeShapeTrace | list[ShapeEvent]).decode


def _num(x) -> float:
    return float(x) if not isinstance(x, str) else float(x.strip() or 0)


_KIND = dict(KIND_OF_CATEGORY, **{"": CPU_OP})  # no category: a CPU op (old Chrome-trace writers)


class _Sink:
    """Turns decoded events into columns. Whole-list comprehensions, not a per-event loop: this is
    the hot path of ingestion."""

    def __init__(self, shapes: bool = False):
        self.cols = ColumnBuilder(shapes)
        self._thread_ids: dict[tuple, int] = {}
        self.decode = _decode_shape_events if shapes else _decode_events
        self.event_type = ShapeEvent if shapes else Event
        self.shapes = shapes
        self.dropped: dict[str, int] = defaultdict(int)  # events dropped for bad values, by reason
        self.complete = self.unknown = 0  # complete events, and those of a category rlprof does not know
        self.unknown_cats: dict[str, int] = defaultdict(int)
        self.flow_starts: list[tuple] = []  # per chunk (ids, ts): where launch flows leave the host
        self.flow_ends: list[tuple] = []  # per chunk (ids, ts, thread): the device events they arrive at

    def _ids(self, keys: list, table: dict, labels: list, label=str) -> list[int]:
        for key in dict.fromkeys(keys):
            if key not in table:
                table[key] = len(labels)
                labels.append(label(key))
        return [table[k] for k in keys]

    def add(self, events: list[Event]) -> None:
        xs = [e for e in events if e.ph == "X"]
        if len(xs) != len(events):
            rest = [e for e in events if e.ph != "X"]
            for e in rest:
                if e.ph == "i" and e.name == "[memory]":
                    total = e.decoded_args().total_allocated
                    ts = _floats([e.ts])[0]
                    if total is not None and np.isfinite(ts) and np.isfinite(total):
                        self.cols.add_memory(float(ts), total)
            starts = [e for e in rest if e.ph == "s" and e.cat == "ac2g"]
            ends = [e for e in rest if e.ph == "f" and e.cat == "ac2g"]
            if starts:  # kept as arrays per chunk: 16-24 bytes a flow, whatever the trace's size
                self.flow_starts.append((_ids([e.id for e in starts]), np.array([e.ts for e in starts], np.float64)))
            if ends:
                thread = self._ids([(e.pid, e.tid) for e in ends], self._thread_ids, self.cols.threads.names,
                                   lambda k: f"{k[0]}/{k[1]}")
                self.flow_ends.append((_ids([e.id for e in ends]), np.array([e.ts for e in ends], np.float64),
                                       np.array(thread, np.int64)))
        if not xs:
            return
        start = _floats([e.ts for e in xs])  # numpy parses string timestamps too
        dur = _floats([e.dur for e in xs])
        with np.errstate(all="ignore"):
            bad_ts = ~np.isfinite(start) | (np.abs(start) > MAX_US)
            bad_dur = ~np.isfinite(dur) | (dur < 0) | (dur > MAX_US)
        if bad_ts.any() or bad_dur.any():  # dropped and counted: no NaN, inf or negative time reaches a table
            self.dropped["missing, non-finite or out-of-range ts"] += int(bad_ts.sum())
            self.dropped["negative, non-finite or out-of-range dur"] += int((bad_dur & ~bad_ts).sum())
            ok = np.flatnonzero(~(bad_ts | bad_dur))
            xs, start, dur = [xs[i] for i in ok.tolist()], start[ok], dur[ok]
            if not xs:
                return
        end = start + dur
        self.cols.extend_span(float(start.min()), float(end.max()))
        kind = np.array([_KIND.get(e.cat, OTHER) for e in xs], dtype=np.uint8)
        self.complete += len(xs)
        unknown = np.flatnonzero(kind == OTHER)
        if len(unknown):
            self.unknown += len(unknown)
            for i in unknown[:1000].tolist():  # which categories, for the warning (a sample is enough)
                self.unknown_cats[xs[i].cat] += 1
        # runtime API calls are only ever summed (launch overhead): aggregate now, do not store them
        runtime = np.flatnonzero(kind == RUNTIME)
        if len(runtime):
            stats = self.cols.runtime
            for i in runtime.tolist():
                entry = stats.setdefault(xs[i].name, [0, 0.0])
                entry[0] += 1
                entry[1] += end[i] - start[i]
        keep = np.flatnonzero((kind != RUNTIME) & (kind != OTHER) & (kind != PYTHON))
        if len(keep) != len(xs):
            xs = [xs[i] for i in keep.tolist()]
            start, end, kind = start[keep], end[keep], kind[keep]
        names = self._ids([e.name for e in xs], self.cols.names.ids, self.cols.names.names)
        threads = self._ids([(e.pid, e.tid) for e in xs], self._thread_ids, self.cols.threads.names,
                            lambda k: f"{k[0]}/{k[1]}")
        shapes = None
        if self.shapes:
            raw = [bytes(e.args.input_dims).replace(b" ", b"").decode() for e in xs]
            shapes = self._ids(raw, self.cols.shapes.ids, self.cols.shapes.names)
        self.cols.add(start, end, kind, names, threads, shapes)


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
        table = self.cols.build()
        table.launch = self._launch_times(table)
        return table

    def _launch_times(self, t: EventTable) -> np.ndarray | None:
        """Each device event's host launch time, through the trace's ac2g flows: a flow end sits on its device
        event (same thread, same timestamp), its start at the launch. Vectorised: sorted keys + searchsorted."""
        if not self.flow_ends or not self.flow_starts or not len(t):
            return None
        ids = [c[0] for c in self.flow_starts] + [c[0] for c in self.flow_ends]
        if any(a.dtype.kind != "i" for a in ids):  # one writer's string ids: compare as strings throughout
            ids = [a.astype(str) for a in ids]
        start_id = np.concatenate(ids[:len(self.flow_starts)])
        end_id = np.concatenate(ids[len(self.flow_starts):])
        start_ts = np.concatenate([c[1] for c in self.flow_starts])
        end_ts = np.concatenate([c[1] for c in self.flow_ends])
        end_thread = np.concatenate([c[2] for c in self.flow_ends])
        order = np.argsort(start_id, kind="stable")
        pos = np.clip(np.searchsorted(start_id[order], end_id), 0, len(order) - 1)
        found = start_id[order][pos] == end_id
        launch_of_end = np.where(found, start_ts[order][pos], np.nan)
        # device events <- flow ends on the same thread at the same start time
        width = float(max(t.end.max(), end_ts.max()) - min(t.start.min(), end_ts.min())) + 1.0
        base = float(min(t.start.min(), end_ts.min()))
        end_key = end_thread * width + (end_ts - base)
        key_order = np.argsort(end_key, kind="stable")
        device = np.flatnonzero(np.isin(t.kind, DEVICE_KINDS))
        ev_key = t.thread[device].astype(np.int64) * width + (t.start[device] - base)
        at = np.clip(np.searchsorted(end_key[key_order], ev_key), 0, len(key_order) - 1)
        hit = np.abs(end_key[key_order][at] - ev_key) < 1e-3
        launch = np.full(len(t), np.nan)
        launch[device[hit]] = launch_of_end[key_order][at[hit]]
        return launch if np.isfinite(launch).any() else None


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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()
        return False


def _open(path: Path):
    with open(path, "rb") as f:
        magic = f.read(2)
    return _CutTolerantGzip(path) if magic == b"\x1f\x8b" else open(path, "rb")


def read_kineto(path: str | Path, shapes: bool = False) -> Trace:
    """`shapes`: also keep each op's input shapes (slower: args are decoded)."""
    path = Path(path)
    sink, warnings = _Sink(shapes), []
    partial = False
    offset = 0  # decompressed bytes consumed so far
    header = b""
    with _open(path) as f:
        buf = b""
        stream_error = None

        def more() -> bytes:
            nonlocal stream_error
            if stream_error is not None:
                return b""
            try:
                data = f.read(CHUNK)
            except (EOFError, OSError, zlib.error) as exc:
                stream_error = exc
                return b""
            if not data and getattr(f, "error", None) is not None:
                stream_error = f.error
            return data

        # 1. header: everything up to the event array's "["
        while True:
            data = more()
            buf += data
            k = buf.find(ARRAY_KEY)
            if k >= 0 and buf.find(b"[", k) >= 0:
                open_at = buf.find(b"[", k)
                header, buf = buf[:k], buf[open_at + 1:]
                offset = open_at + 1
                break
            if not data:
                return _read_whole(path, buf, stream_error, sink)
        if b"\n  {" not in buf[:64] and not buf.lstrip().startswith(b"]"):
            # not Kineto's pretty layout: decode the whole file (small traces from other writers)
            rest = buf
            while data := more():
                rest += data
            return _read_whole(path, header + ARRAY_KEY + b":[" + rest, stream_error, sink)
        # 2. events, chunk by chunk, cut at the separator
        tail = b""
        while True:
            data = more()
            buf += data
            cut = buf.rfind(SEP)
            if data and cut < 0:
                continue
            if not data:  # last piece: events up to the array's closing bracket, then the tail keys
                close = ARRAY_END.search(buf)
                if close is None:  # a writer whose events end on their own line: the first "}]" that decodes
                    loose = next((m for m in LOOSE_END.finditer(buf)
                                  if _decodes(b"[" + buf[:m.start() + 1] + b"]")), None)
                    if loose is not None:
                        if not _decode_into(b"[" + buf[:loose.start() + 1] + b"]", sink):
                            partial = True
                        tail = buf[loose.end():]
                        break
                if close is None:
                    partial = True
                    good = _salvage(buf, sink)
                    warnings.append(f"{path}: trace ends early at byte {offset + good} of the decompressed stream "
                                    f"({_why(stream_error) or 'no closing bracket'}); events before it were kept")
                    break
                body, tail = buf[:close.start() + 4], buf[close.end():]
                if body.strip():
                    ok = _decode_into(b"[" + body + b"]", sink)
                    if not ok:
                        partial = True
                        good = _salvage(body, sink)
                        warnings.append(f"{path}: damaged event near byte {offset + good}; events before it kept")
                break
            piece, buf = buf[:cut + 1], buf[cut + len(SEP) - 1:]
            if not _decode_into(b"[" + piece + b"]", sink):
                partial = True
                good = _salvage(piece, sink)
                warnings.append(f"{path}: damaged event near byte {offset + good}; events before it were kept")
                break
            offset += cut + len(SEP) - 1
    if stream_error is not None and not partial:
        partial = True
        warnings.append(f"{path}: {_why(stream_error)} at byte {offset}; events before it were kept")
    meta = _meta(header, tail)
    return Trace(path, sink.build(), meta, warnings + sink.drop_warnings(path), partial, offset)


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


def _decode_into(data: bytes, sink: _Sink) -> bool:
    try:
        sink.add(sink.decode(data))
        return True
    except (msgspec.DecodeError, UnicodeDecodeError):  # invalid UTF-8 in a name is damage like any other
        return False


def _salvage(piece: bytes, sink: _Sink) -> int:
    """Decode the events of `piece` one by one up to the first damaged one; returns bytes kept."""
    kept = 0
    pos = 0
    events = []
    while True:
        cut = piece.find(SEP, pos)
        end = len(piece) if cut < 0 else cut + 1
        try:
            events.append(msgspec.json.decode(piece[pos:end].strip().rstrip(b","), type=sink.event_type))
        except (msgspec.DecodeError, UnicodeDecodeError):
            break
        kept = end
        if cut < 0:
            break
        pos = cut + len(SEP) - 1
    sink.add(events)
    return kept


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
