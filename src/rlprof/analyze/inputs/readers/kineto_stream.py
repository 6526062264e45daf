"""Bytes of a trace file: gzip that keeps what it could inflate, reads in CHUNK-sized pieces, and the byte ranges
a plain file in Kineto's layout is cut into (at separators between events) for parallel readers."""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path

from .kineto_events import ARRAY_END, ARRAY_KEY, CHUNK, SEP


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
            before = self.d.copy()
            try:
                piece = self.d.decompress(raw)
                while self.d.eof and self.d.unused_data:  # the next gzip member
                    rest, self.d = self.d.unused_data, zlib.decompressobj(16 + zlib.MAX_WBITS)
                    piece += self.d.decompress(rest)
            except zlib.error as exc:  # kept without its traceback: its frames hold the caller's buffer views
                self.error, self.done = exc.with_traceback(None), True
                piece = _inflate_up_to_damage(before, raw)
                out.append(piece)
                size += len(piece)
                break
            out.append(piece)
            size += len(piece)
        data = b"".join(out)
        if len(data) > n:
            data, self.pending = data[:n], data[n:]
        return data

    def readinto(self, view) -> int:
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()
        return False


def _inflate_up_to_damage(d, raw: bytes, step: int = 4096) -> bytes:
    """What a decompressor (in its state before `raw`) gives of `raw` before the damage in it: zlib drops a call's
    whole output when the call fails (a corrupt block, a bad CRC in the trailer), so feed it in steps, and the
    failing step byte by byte. A slow path, taken once, on damage only."""
    out = []
    for lo in range(0, len(raw), step):
        saved = d.copy()
        try:
            out.append(d.decompress(raw[lo : lo + step]))
            continue
        except zlib.error:
            d = saved
        for i in range(lo, min(lo + step, len(raw))):
            try:
                out.append(d.decompress(raw[i : i + 1]))
            except zlib.error:
                return b"".join(out)
    return b"".join(out)


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
            self.error = exc.with_traceback(None)  # its frames would hold `view` exported: the buffer could not shrink
            return 0
        if self.left is not None:
            self.left -= got
        if not got and getattr(self.f, "error", None) is not None:
            self.error = self.f.error
        return got


@dataclass
class Layout:
    """Where a plain trace in Kineto's layout keeps its event array: what byte ranges are cut from."""

    header: bytes  # the top-level keys before traceEvents
    body_start: int  # the first byte after the array's "["
    size: int


def kineto_layout(path: Path) -> Layout | None:
    """The layout of a plain (uncompressed) file in Kineto's form; None for anything else (read by one reader)."""
    if _is_gzip(path):
        return None
    with open(path, "rb") as f:
        head = f.read(1 << 20)
    k = head.find(ARRAY_KEY)
    open_at = head.find(b"[", k) if k >= 0 else -1
    if open_at < 0 or b"\n  {" not in head[open_at + 1 : open_at + 65]:
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
