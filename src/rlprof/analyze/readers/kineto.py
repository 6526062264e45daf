"""Kineto / torch.profiler Chrome traces (.json, .json.gz), read in typed chunks.

Kineto writes one event per top-level array element separated by "},\\n  {" at two-space indent;
that separator cannot occur inside a string (raw newlines are escaped) or a nested object (deeper
indent), so the event array is cut there and each chunk decoded with msgspec into typed events.
Memory stays bounded by the chunk size plus the numeric columns. Other layouts are decoded whole.
Damaged input keeps the events before the damage, with a warning naming the file and byte offset.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ..table import DEVICE_KINDS
from .kineto_columns import NO_PHASE, _NeedArgs, _Sink
from .kineto_salvage import decode_each, salvage_events, value_end  # noqa: F401 (salvage_events: Ascend's too)
from .kineto_events import (ARRAY_END, ARRAY_KEY, CHUNK, LOOSE_END, MAX_DUR_US, MAX_US, SEP, Event, LeanEvent,  # noqa: F401
                            Meta, NotATrace, ShapeEvent, Trace, _decode_events, _decode_lean, _decode_meta,
                            _decode_shape_events, _decode_whole, _decode_whole_shapes)
from .kineto_stream import (Layout, _Chunks, _CutTolerantGzip, _open, byte_ranges, kineto_layout,  # noqa: F401
                            stream_size)


@dataclass
class Part:
    """What one reader made of a stretch of the event array: the sink holding its columns, and how it ended."""

    sink: _Sink
    warnings: list[str]
    partial: bool
    end: int  # byte offset just past the last event read
    tail: bytes = b""  # after the array (the final part only): the trace's remaining top-level keys


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
        part = _scan(chunks, buf, open_at + 1, sink, True, path, strict=isinstance(f, _CutTolerantGzip))
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
    yield _scan(chunks, *rest[0], _Sink(shapes), True, path, strict=True)


def read_piece_job(job: tuple) -> Part:
    """One piece of a compressed trace's event array (whole events), decoded in a worker."""
    path, piece, offset, shapes = job
    return _scan(_Chunks(io.BytesIO(piece)), b"", offset, _Sink(shapes), False, path, strict=True)


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
    return _trace(path, sink, _meta(header, tail), warnings, partial or sink.damaged, last.end)


def _scan(chunks: _Chunks, buf: bytes, offset: int, sink: _Sink, final: bool, path: Path, strict: bool = False
          ) -> Part:
    """Decode the events of `buf` and what follows it, piece by piece cut at the separator. `offset`: where `buf`
    starts in the stream. `final`: the stretch runs to the end of the array (else it ends on an event's brace).
    `strict` (a compressed stream): text that is not JSON ends the reading (see decode_each)."""
    warnings: list[str] = []

    def each(piece: bytes, at: int) -> Part | None:  # one event at a time: bad ones dropped and counted
        stop = decode_each(piece, sink, at, stop_at_damage=strict)
        return None if stop is None else _damaged(path, warnings, sink, at + stop)

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
                if rest.strip() and not _decode_into(b"[" + rest + b"]", sink):
                    stopped = each(rest, offset)
                    if stopped:
                        return stopped
                return Part(sink, warnings, False, offset + len(rest))
            return _scan_end(chunks, rest, offset, sink, path, warnings, strict)
        space[cut + 1] = 0x5D  # "]"
        with memoryview(space) as view:
            decoded = _decode_into(view[:cut + 2], sink)
        if not decoded and (stopped := each(bytes(space[1:cut + 1]), offset)):
            return stopped
        keep = cut + len(SEP) - 2  # the space before the next event's "{": becomes its "["
        space[:fill - keep] = space[keep:fill]
        space[0] = 0x5B
        fill -= keep
        offset += keep


def _scan_end(chunks: _Chunks, buf: bytes, offset: int, sink: _Sink, path: Path, warnings: list[str],
              strict: bool = False) -> Part:
    """The last piece: events up to the array's closing bracket, then the keys after it."""
    close = ARRAY_END.search(buf)
    if close is None:  # a writer whose events end on their own line: the first "}]" that decodes
        loose = next((m for m in LOOSE_END.finditer(buf) if _decodes(b"[" + buf[:m.start() + 1] + b"]")), None)
        # else, where the file ends as a document does, the array's end found value by value (an event there
        # that does not decode is dropped, not taken for a cut)
        end_at = loose.start() + 1 if loose is not None else \
            _array_end(buf) if buf.rstrip().endswith((b"}", b"]")) else None
        if end_at is not None:
            if buf[:end_at].strip() and not _decode_into(b"[" + buf[:end_at] + b"]", sink):
                stop = decode_each(buf[:end_at], sink, offset, stop_at_damage=strict)
                if stop is not None:
                    return _damaged(path, warnings, sink, offset + stop)
            tail = buf[buf.index(b"]", end_at) + 1:]
            return _ended(chunks, Part(sink, warnings, False, offset + end_at, tail), path)
        good = decode_each(buf, sink, offset, fragment_last=True, stop_at_damage=strict)
        good = len(buf) if good is None else good
        warnings.append(f"{path}: trace ends early at byte {offset + good} of the decompressed stream "
                        f"({_why(chunks.error) or 'no closing bracket'}); events before it were kept")
        return Part(sink, warnings, True, offset + good)
    body, tail = buf[:close.start() + 4], buf[close.end():]
    end = offset + len(body)
    if body.strip() and not _decode_into(b"[" + body + b"]", sink):
        stop = decode_each(body, sink, offset, stop_at_damage=strict)
        if stop is not None:
            return _damaged(path, warnings, sink, offset + stop)
    return _ended(chunks, Part(sink, warnings, False, end, tail), path)


def _damaged(path: Path, warnings: list[str], sink: _Sink, at: int) -> Part:
    warnings.append(f"{path}: damaged event near byte {at} of the decompressed stream; events before it were kept")
    return Part(sink, warnings, True, at)


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
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return False


def _array_end(buf: bytes) -> int | None:
    """Just past the last event of an array that closes in `buf`, found value by value without decoding; None
    when the text ends first (a cut)."""
    pos = last = 0
    while True:
        while pos < len(buf) and buf[pos] in b" \t\r\n,":
            pos += 1
        if pos >= len(buf):
            return None
        if buf[pos] == 0x5D:  # "]"
            return last
        end = value_end(buf, pos)
        if end is None:
            return None
        pos = last = end


def _decode_into(data, sink: _Sink) -> bool:
    """Decode a JSON array of events (bytes or a view of them) into `sink`; False where it does not parse."""
    try:
        events = (_decode_shape_events if sink.shapes else _decode_lean)(data)
        try:
            sink.add(events)
        except _NeedArgs:  # args are decoded only where they are read
            sink.add(_decode_events(data))
        return True
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):  # invalid UTF-8 is damage like any other;
        return False  # args nested past the decoder's depth: decode_each keeps the event without them


def _meta(header: bytes, tail: bytes) -> Meta:
    text = header.strip()
    if not text.startswith(b"{"):
        return Meta()
    doc = text + b'"traceEvents":[]' + tail.strip()
    if not doc.endswith(b"}"):
        doc += b"}"
    try:
        return _decode_meta(doc)
    except (msgspec.DecodeError, RecursionError):
        try:  # the tail may be cut: the header alone
            return _decode_meta(text + b'"traceEvents":[]}')
        except (msgspec.DecodeError, RecursionError):
            return Meta()


def _salvage_any(path: Path, data: bytes, bracket: int, sink: _Sink, exc) -> Trace:
    """A file in another writer's layout that did not decode at once: element by element (kineto_salvage)."""
    got = salvage_events(data, bracket, sink.event_type)
    if not got.events and not got.dropped:
        raise NotATrace(f"{path}: not a readable trace ({exc}); allowed: a Chrome/Kineto trace JSON object "
                        "with traceEvents, or an array of trace events")
    sink.add(got.events)
    for why, n in got.dropped.items():
        for _ in range(n):
            sink.count_bad(why, got.end)
    return _trace(path, sink, Meta(), got.warnings(path, exc), not got.whole or sink.damaged, got.end)


def _read_whole(path: Path, data: bytes, stream_error, sink: _Sink) -> Trace:
    if not data.strip():
        if stream_error is not None:
            raise NotATrace(f"{path}: {_why(stream_error)} before its first event; allowed: a gzip-compressed or "
                            "plain Chrome/Kineto trace")
        raise NotATrace(f"{path}: empty file; allowed: a Chrome/Kineto trace JSON object with traceEvents")
    decode = _decode_whole_shapes if sink.shapes else _decode_whole
    try:
        doc = decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        body = data.strip()
        if body.startswith(b"["):  # the Trace Event Format lets the array form end without its "]"
            try:
                doc = decode(body.rstrip(b",") + b"]")
            except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
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
    return _trace(path, sink, meta, warnings, stream_error is not None, len(data))


def _trace(path: Path, sink: _Sink, meta: Meta, warnings: list[str], partial: bool, end: int) -> Trace:
    """The trace a sink read, with every drop counted in its warnings."""
    table = sink.build()
    no_phase = sink.dropped.get(NO_PHASE, 0)
    if not len(table) and not sink.complete and no_phase:
        raise NotATrace(f"{path}: JSON whose {no_phase} entries are no trace events (none has a ph); allowed: a "
                        "Chrome/Kineto trace, an object with traceEvents or an array of trace events")
    trace = Trace(path, table, meta, warnings + sink.drop_warnings(path), partial, end, sink.device_seen)
    if partial and trace.has_device and not table.mask(*DEVICE_KINDS).any():
        trace.warnings.append(f"{path}: the part read holds no device activity, but this is a GPU trace: its compute "
                              "counts kernels (none here), a lower bound of the whole file's")
    return trace
