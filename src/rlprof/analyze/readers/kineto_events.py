"""Kineto / Chrome trace events as msgspec decodes them, and the typed decoders (no reading, no columns)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from ..table import EventTable

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
