"""Kineto / torch.profiler Chrome traces (.json, .json.gz), read in typed chunks.

Kineto writes one event per top-level array element separated by "},\\n  {" at two-space indent;
that separator cannot occur inside a string (raw newlines are escaped) or a nested object (deeper
indent), so the event array is cut there and each chunk decoded with msgspec into typed events.
Memory stays bounded by the chunk size plus the numeric columns. Other layouts are decoded whole.
Damaged input keeps the events before the damage, with a warning naming the file and byte offset.

Over 400 lines because it is the reader's one path through a file (the stream, the pipelined chunks, the
whole-file decode, the hand-off to salvage); its parts already live in kineto_events, kineto_stream,
kineto_columns and kineto_salvage.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ...tables.table import DEVICE_KINDS
from .kineto_columns import NO_PHASE, _NeedArgs, _Sink
from .kineto_salvage import decode_each, salvage_events, value_end  # noqa: F401 (salvage_events: Ascend's too)

# The names marked F401 are re-exported: other readers and the tests import them from this module.
from .kineto_events import (
    ARRAY_END,
    ARRAY_KEY,
    CHUNK,
    LOOSE_END,
    MAX_DUR_US,  # noqa: F401
    MAX_US,  # noqa: F401
    SEP,
    Event,  # noqa: F401
    LeanEvent,  # noqa: F401
    Meta,
    NotATrace,
    ShapeEvent,  # noqa: F401
    Trace,
    _decode_events,
    _decode_lean,
    _decode_meta,
    _decode_shape_events,
    _decode_whole,
    _decode_whole_shapes,
)
from .kineto_stream import (
    Layout,  # noqa: F401
    _Chunks,
    _CutTolerantGzip,
    _open,
    byte_ranges,
    kineto_layout,  # noqa: F401
    stream_size,  # noqa: F401
)


@dataclass
class Part:
    """What one reader made of a stretch of the event array: the sink holding its columns, and how it ended."""

    sink: _Sink
    warnings: list[str]
    partial: bool
    end: int  # byte offset just past the last event read
    tail: bytes = b""  # after the array (the part that read its "]"): the document's remaining top-level keys
    closed: bool = False  # the event array's "]" was read here: nothing after this part is the trace's
    damage: str | None = None  # what ended the reading ("{n}": the events kept, filled in with the table)


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
                header, key, buf = bytes(buf[:k]), bytes(buf[k : open_at + 1]), bytes(buf[open_at + 1 :])
                break
            if not data:
                return _read_whole(path, bytes(buf), chunks.error, sink)
        if b"\n  {" not in buf[:64] and not buf.lstrip().startswith(b"]"):
            # not Kineto's pretty layout: decode the whole file (small traces from other writers)
            rest = bytearray(buf)
            while data := chunks.more():
                rest += data
            return _read_whole(path, header + key + rest, chunks.error, sink)
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
                yield path, bytes(buf[: cut + 1]), offset, shapes
                del buf[: cut + len(SEP) - 1]
                offset += cut + len(SEP) - 1
            if not data:
                rest.append((bytes(buf), offset))
                return

    for part in map_ranges(read_piece_job, pieces()):
        yield part
        if part.partial or part.closed:
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
    Damage in a part ends the trace there, as it ends one reader; so does the end of the event array (what
    follows a document's end is no event of it)."""
    sink, warnings, last = None, [], None
    for part in parts:
        if sink is None:
            sink = part.sink
        else:
            sink.absorb(part.sink)
        warnings += part.warnings
        last = part
        if part.partial or part.closed:
            break
    if hasattr(parts, "close"):  # a generator over worker processes: let them go before the table is built
        parts.close()
    meta, bad_keys = _meta(header, last.tail)
    damage = last.damage or bad_keys
    return _trace(path, sink, meta, warnings, last.partial or sink.damaged or bool(bad_keys), last.end, damage)


def _scan(chunks: _Chunks, buf: bytes, offset: int, sink: _Sink, final: bool, path: Path, strict: bool = False) -> Part:
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
    space[1 : 1 + len(buf)] = buf
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
                    if ARRAY_END.search(rest):  # the array ends in this range: a document, then more bytes
                        return _scan_end(chunks, rest, offset, sink, path, warnings, strict)
                    stopped = each(rest, offset)
                    if stopped:
                        return stopped
                return Part(sink, warnings, False, offset + len(rest))
            return _scan_end(chunks, rest, offset, sink, path, warnings, strict)
        space[cut + 1] = 0x5D  # "]"
        with memoryview(space) as view:
            decoded = _decode_into(view[: cut + 2], sink)
        if not decoded:
            space[cut + 1] = 0x2C  # ","
            if ARRAY_END.search(space, 1, cut + 1):  # the array ends in this piece: the bytes after it are no events
                return _scan_end(chunks, bytes(space[1:fill]), offset, sink, path, warnings, strict)
            if stopped := each(bytes(space[1 : cut + 1]), offset):
                return stopped
        keep = cut + len(SEP) - 2  # the space before the next event's "{": becomes its "["
        space[: fill - keep] = space[keep:fill]
        space[0] = 0x5B
        fill -= keep
        offset += keep


def _scan_end(
    chunks: _Chunks, buf: bytes, offset: int, sink: _Sink, path: Path, warnings: list[str], strict: bool = False
) -> Part:
    """The last piece: events up to the array's closing bracket, then the keys after it."""
    close = ARRAY_END.search(buf)
    if close is None:  # a writer whose events end on their own line: the first "}]" that decodes
        loose = next((m for m in LOOSE_END.finditer(buf) if _decodes(b"[" + buf[: m.start() + 1] + b"]")), None)
        # else, where the file ends as a document does, the array's end found value by value (an event there
        # that does not decode is dropped, not taken for a cut)
        end_at = (
            loose.start() + 1 if loose is not None else _array_end(buf) if buf.rstrip().endswith((b"}", b"]")) else None
        )
        if end_at is not None:
            if buf[:end_at].strip() and not _decode_into(b"[" + buf[:end_at] + b"]", sink):
                stop = decode_each(buf[:end_at], sink, offset, stop_at_damage=strict)
                if stop is not None:
                    return _damaged(path, warnings, sink, offset + stop)
            after = buf.index(b"]", end_at) + 1
            return _ended(chunks, Part(sink, warnings, False, offset + end_at, buf[after:], True), offset + after)
        good = decode_each(buf, sink, offset, fragment_last=True, stop_at_damage=strict)
        good = len(buf) if good is None else good
        return Part(
            sink,
            warnings,
            True,
            offset + good,
            damage=f"trace ends early at byte {offset + good} of the decompressed stream "
            f"({_why(chunks.error) or 'no closing bracket'}); the {{n}} events before it were kept",
        )
    body, tail = buf[: close.start() + 4], buf[close.end() :]
    end = offset + len(body)
    if body.strip() and not _decode_into(b"[" + body + b"]", sink):
        stop = decode_each(body, sink, offset, stop_at_damage=strict)
        if stop is not None:
            return _damaged(path, warnings, sink, offset + stop)
    return _ended(chunks, Part(sink, warnings, False, end, tail, True), offset + close.end())


def _damaged(path: Path, warnings: list[str], sink: _Sink, at: int) -> Part:
    return Part(
        sink,
        warnings,
        True,
        at,
        damage=f"damaged event near byte {at} of the decompressed stream; the {{n}} events before it were kept",
    )


TAIL_MAX = 1 << 20  # the keys after the event array: Kineto writes a few hundred bytes there


def _ended(chunks: _Chunks, part: Part, tail_at: int) -> Part:
    """The document after its event array (`part.tail`, from byte `tail_at`): its remaining keys and closing
    brace, then nothing. A stream that broke, a document cut in those keys, or bytes after its end (text, a
    second document) are said, and the result is partial; `part.tail` keeps the first document's keys only."""
    tail = part.tail
    close = _document_end(tail)
    while close is None and len(tail) < TAIL_MAX and (more := chunks.more()):
        tail += more
        close = _document_end(tail)
    if close is not None and not tail[close:].strip():  # nothing more buffered: is there more in the stream?
        while (more := chunks.more()) and not more.strip():
            pass
        tail += more
    part.tail = tail[:close] if close is not None else b""
    if chunks.error is not None:  # the array closed, but the stream broke after it
        part.partial = True
        part.damage = f"{_why(chunks.error)} at byte {part.end}; all {{n}} events were kept"
    elif close is None:
        part.partial = True
        part.damage = (
            f"trace ends early at byte {tail_at + len(tail)}, after its events (the keys that follow them "
            "are cut); all {n} events were kept"
        )
    elif extra := tail[close:].lstrip():
        part.partial = True
        part.damage = (
            f"bytes after the end of the JSON document, from byte {tail_at + len(tail) - len(extra)} "
            f"({_sample(extra)}: another document or text); the first document was read whole, its {{n}} "
            "events were kept, the rest was not read"
        )
    return part


def _sample(extra: bytes) -> str:
    """The first bytes after a document's end, as the warning shows them."""
    return repr(bytes(extra[:16]))[1:] + ("..." if len(extra) > 16 else "")


def _document_end(tail: bytes) -> int | None:
    """Just past the closing brace of the object whose event array ended where `tail` starts (the keys after the
    array, then "}"), found without decoding; None when the text ends first (a cut)."""
    end = value_end(b"{" + tail[:TAIL_MAX], 0)
    return None if end is None else end - 1


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


def _meta(header: bytes, tail: bytes) -> tuple[Meta, str | None]:
    """The top-level keys before the event array (`header`) and after it (`tail`, up to the document's closing
    brace), and what of them could not be read (None: all of it): keys that do not decode are damage (the rank,
    the device properties and the time base live there), said like any other."""
    text = header.strip().removeprefix(b"\xef\xbb\xbf")  # a byte-order mark is no damage
    if not text.startswith(b"{"):  # the object's own brace is gone
        return Meta(), (
            "the keys before the event array are damaged (near byte 0: no opening brace); all {n} events were kept"
        ) if text else None
    doc = text + b'"traceEvents":[]' + tail.strip()
    if not doc.endswith(b"}"):
        doc += b"}"
    try:
        return _decode_meta(doc), None
    except (msgspec.DecodeError, RecursionError) as exc:  # a value of another type than torch writes is no damage
        whole_exc = None if isinstance(exc, msgspec.ValidationError) else exc
    try:  # the keys before the array alone
        meta = _decode_meta(text + b'"traceEvents":[]}')
    except msgspec.ValidationError:
        return Meta(), None
    except (msgspec.DecodeError, RecursionError) as exc:
        return Meta(), (
            f"the keys before the event array are damaged ({_where(exc, len(text))}: its rank, device "
            "properties and time base are not known); all {n} events were kept"
        )
    return meta, (
        f"the keys after the event array are damaged ({whole_exc}); all {{n}} events were kept"
        if whole_exc is not None and tail.strip() not in (b"", b"}")
        else None
    )


def _where(exc, limit: int) -> str:
    """ "near byte N" from a decode error that names its byte (within the first `limit` bytes), else less."""
    m = re.search(r"\(byte (\d+)\)", str(exc))
    return f"near byte {m.group(1)}" if m and int(m.group(1)) <= limit else f"in the first {limit} bytes"


def _salvage_any(path: Path, data: bytes, bracket: int, sink: _Sink, exc, stream_error=None) -> Trace:
    """A file in another writer's layout that did not decode at once: element by element (kineto_salvage). In an
    object, the text must go on past the array's "]" to the object's closing brace, then end."""
    got = salvage_events(data, bracket, sink.event_type)
    if not got.events and not got.dropped and got.cut:
        raise NotATrace(
            f"{path}: trace ends early at byte {len(data)}, before its first event "
            f"({_why(stream_error) or exc}); allowed: a Chrome/Kineto trace JSON object with traceEvents"
        )
    if not got.events and not got.dropped:
        raise NotATrace(
            f"{path}: not a readable trace ({exc}); allowed: a Chrome/Kineto trace JSON object "
            "with traceEvents, or an array of trace events"
        )
    sink.add(got.events)
    for why, n in got.dropped.items():
        for _ in range(n):
            sink.count_bad(why, got.end)
    damage, meta, bad_keys = got.damage(exc), Meta(), None
    if damage is not None and stream_error is not None:  # a broken stream: what it inflated to ends there
        damage = (
            f"trace ends early at byte {got.end} of the decompressed stream ({_why(stream_error)}); the {{n}} "
            "events before it were kept"
        )
    key = data.rfind(ARRAY_KEY, 0, bracket)
    rest = data[got.close_at :] if got.close_at is not None else b""
    if key >= 0:  # an object: {..., "traceEvents": [...], ...}
        close = _document_end(rest) if got.close_at is not None else None
        if damage is None and got.close_at is None:  # the text ended inside the array: a cut, not its end
            damage = (
                f"trace ends early at byte {len(data)} ({_why(stream_error) or 'no closing bracket'}); the "
                "{n} events before it were kept"
            )
        elif damage is None and close is None:
            damage = (
                f"trace ends early at byte {len(data)}, after its events (the keys that follow them are cut); "
                "all {n} events were kept"
            )
        meta, bad_keys = _meta(data[:key], rest[:close] if close is not None else b"")
        rest = rest[close:] if close is not None else b""
    if damage is None and (extra := rest.lstrip()):  # bytes after the document's end
        damage = (
            f"bytes after the end of the JSON document, from byte {len(data) - len(extra)} ({_sample(extra)}: "
            "another document or text); the first document was read whole, its {n} events were kept, the rest "
            "was not read"
        )
    damage = damage or bad_keys
    return _trace(path, sink, meta, got.warnings(path), damage is not None or sink.damaged, got.end, damage)


TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")


def _first_document(data: bytes, decode, exc):
    """A document followed by more bytes (text, a second document): the first, decoded whole, and where the
    bytes after it start; (None, None) when that is not what the decoder refused."""
    m = TRAILING.search(str(exc))
    if m is None:
        return None, None
    at = int(m.group(1))
    for end in (at - 1, at):  # the decoder names the byte after the first one that is not the document's
        if 0 < end < len(data) and data[end:].strip():
            try:
                return decode(data[:end]), end + len(data[end:]) - len(data[end:].lstrip())
            except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
                continue
    return None, None


def _read_whole(path: Path, data: bytes, stream_error, sink: _Sink) -> Trace:
    if not data.strip():
        if stream_error is not None:
            raise NotATrace(
                f"{path}: {_why(stream_error)} before its first event; allowed: a gzip-compressed or "
                "plain Chrome/Kineto trace"
            )
        raise NotATrace(f"{path}: empty file; allowed: a Chrome/Kineto trace JSON object with traceEvents")
    decode = _decode_whole_shapes if sink.shapes else _decode_whole
    extra_at = None
    try:
        doc = decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        doc, extra_at = _first_document(data, decode, exc)
        body = data.strip()
        if doc is not None:
            pass
        elif body.startswith(b"["):  # the Trace Event Format lets the array form end without its "]"
            try:
                doc = decode(body.rstrip(b",") + b"]")
            except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
                return _salvage_any(path, data, data.index(b"["), sink, exc, stream_error)
        elif (k := data.find(ARRAY_KEY)) >= 0 and (bracket := data.find(b"[", k)) >= 0:
            return _salvage_any(path, data, bracket, sink, exc, stream_error)
        elif body.startswith(b"{") and ("truncated" in str(exc) or stream_error is not None):
            raise NotATrace(
                f"{path}: trace ends early at byte {len(data)}, before its first event "
                f"({_why(stream_error) or exc}); allowed: a Chrome/Kineto trace JSON object with "
                "traceEvents"
            ) from None
        else:
            raise NotATrace(
                f"{path}: not a readable trace ({exc}); allowed: a Chrome/Kineto trace JSON object "
                "with traceEvents, or an array of trace events"
            ) from None
    if isinstance(doc, list):
        sink.add(doc)
        meta = Meta()
    else:
        if not doc.traceEvents and b"traceEvents" not in data:
            raise NotATrace(f"{path}: JSON without traceEvents; allowed: a Chrome/Kineto trace")
        sink.add(doc.traceEvents)
        meta = Meta(doc.distributedInfo, doc.baseTimeNanoseconds, doc.rlprof, doc.deviceProperties)
    damage = None
    if extra_at is not None:
        damage = (
            f"bytes after the end of the JSON document, from byte {extra_at} ({_sample(data[extra_at:])}: "
            "another document or text); the first document was read whole, its {n} events were kept, the rest "
            "was not read"
        )
    elif stream_error is not None:
        damage = f"{_why(stream_error)} at byte {len(data)}; all {{n}} events were kept"
    return _trace(path, sink, meta, [], damage is not None, len(data), damage)


def _trace(
    path: Path, sink: _Sink, meta: Meta, warnings: list[str], partial: bool, end: int, damage: str | None = None
) -> Trace:
    """The trace a sink read, with every drop counted in its warnings. `damage`: what ended the reading, the first
    warning ("{n}": the events kept); where no device event was kept but the file says a device was there, that
    line says so too (compute, communication and copies are then a lower bound: 0, never CPU-operator time)."""
    table = sink.build()
    no_phase = sink.dropped.get(NO_PHASE, 0)
    if not len(table) and not sink.complete and no_phase:
        raise NotATrace(
            f"{path}: JSON whose {no_phase} entries are no trace events (none has a ph); allowed: a "
            "Chrome/Kineto trace, an object with traceEvents or an array of trace events"
        )
    lines = ([f"{path}: " + damage.replace("{n}", str(len(table)))] if damage else []) + sink.drop_warnings(path)
    trace = Trace(path, table, meta, lines + warnings, partial, end, sink.device_seen)
    if partial and not table.mask(*DEVICE_KINDS).any() and (sign := trace.device_sign()) is not None:
        note = (
            f"the part read holds no device activity, but this is a GPU trace ({sign}): compute, communication "
            "and copies count device events (none here), a lower bound of the whole file's"
        )
        if lines:
            trace.warnings[0] += "; " + note
        else:
            trace.warnings.insert(0, f"{path}: {note}")
    return trace
