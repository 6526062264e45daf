"""Kineto / Chrome trace events as msgspec decodes them, and the typed decoders (no reading, no columns)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ...tables.table import EventTable

CHUNK = 512 << 10  # small pieces: the decoded events of one fit in memory the allocator keeps (fewer page faults)
MAX_US = 1e17  # ~3,000 years of microseconds: beyond it a timestamp is not a time
# Plausibility (docs/bad_input.md): no traced event lasts a day, and no group of events stands a day and ten times
# the rest's span apart from the rest (a ts of -5 or 1e12 in a trace of epoch microseconds).
MAX_DUR_US = 24 * 3600 * 1e6
OUTLIER_GAP_US = 24 * 3600 * 1e6
OUTLIER_SPAN_FACTOR = 10
OUTLIER_SHARE = 0.01  # at most this share of the events (at least one) can be set apart as outliers
SEP = b"},\n  {"
ARRAY_KEY = b'"traceEvents"'
ARRAY_END = re.compile(rb"\n  \}\s*\]")  # the last event's brace (indent 2), then the array's bracket
LOOSE_END = re.compile(rb"\}\s*\]")  # any event's closing brace, then a bracket (checked by decoding)
# A device was there (docs/bad_input.md): a collective backend that runs on accelerators, and host calls that only
# a device trace holds (runtime calls written without their category, torch_npu's aclnn*/aclrt*, NCCL/HCCL ranges).
DEVICE_BACKEND = re.compile(r"nccl|hccl|xccl", re.IGNORECASE)
DEVICE_CALL = re.compile(r"(cuda|cu|hip|aclrt|aclnn)[A-Z]|(nccl|hccl):")


class Args(msgspec.Struct, gc=False):
    total_allocated: float | None = msgspec.field(default=None, name="Total Allocated")
    device_type: int | None = msgspec.field(default=None, name="Device Type")  # Kineto: 0 CPU, 1 CUDA
    device_id: int | None = msgspec.field(default=None, name="Device Id")
    name: str | None = None  # process_name / thread_name metadata events
    correlation: Any = None  # Kineto: a device event's id = its host launch call's (any JSON: never damage)


# What an event without a `correlation` arg holds there: an int, so a batch's ids convert to int64 in one C call
# (None would send every batch holding a copy without one down the slow path); told from a written id by identity
NO_CORRELATION = -(2**63)


class LaunchArgs(msgspec.Struct, gc=False):
    """The one arg the hot path reads: `correlation`, which ties a kernel, copy or set (a graph's kernels
    included) to the runtime call that launched it. Every other arg is skipped by the decoder."""

    correlation: Any = NO_CORRELATION


class LeanEvent(msgspec.Struct, gc=False):
    """What the hot path reads: an event and, of its args, only `correlation` (the rest skipped by the decoder,
    not materialised)."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float | str = float("nan")  # missing: dropped (not read as time 0)
    dur: float | str = float("nan")  # missing on a complete event: dropped and counted
    id: int | str = 0  # flow events ("ac2g": host launch -> device event) pair by id
    args: LaunchArgs | list | str | float | bool | None = msgspec.field(default_factory=LaunchArgs)  # any JSON


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
    device_type: int | None = msgspec.field(default=None, name="Device Type")
    device_id: int | None = msgspec.field(default=None, name="Device Id")
    correlation: Any = NO_CORRELATION


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
    device_seen: bool = False  # device events, CUDA/HIP runtime calls or launch flows anywhere in what was read

    @property
    def rank(self) -> int | None:
        for source in (self.meta.rlprof or {}, self.meta.distributedInfo or {}):
            if isinstance(source.get("rank"), int):
                return source["rank"]
        return None

    @property
    def has_device(self) -> bool:
        """A GPU trace: decided by what the file declares, not by what a cut left of it, so a partial trace's
        compute stays kernel time (a lower bound), never CPU-operator time."""
        return self.device_sign() is not None

    def device_sign(self) -> str | None:
        """What says a device was there (None: a CPU trace): device events or runtime calls / launch flows read;
        on a partial trace also its header (deviceProperties, a device collective backend) and the host calls
        it kept (cudaLaunchKernel, hipMemcpyAsync, aclnn*, nccl:* ...). Looked up in the header and the distinct
        names only: no pass over the events."""
        from ...tables.table import DEVICE_KINDS

        if self.table.mask(*DEVICE_KINDS).any():
            return "device events"
        if self.device_seen:
            return "runtime calls or launch flows"
        if not self.partial:  # a whole trace without device activity is a CPU trace (CPU-only profiling)
            return None
        if self.meta.deviceProperties:
            return "deviceProperties in its header"
        backend = (self.meta.distributedInfo or {}).get("backend")
        if isinstance(backend, str) and DEVICE_BACKEND.search(backend):
            return f"distributedInfo backend {backend}"
        call = next((n for n in (*self.table.names, *(self.table.runtime or {})) if DEVICE_CALL.match(n)), None)
        return f"host calls such as {call}" if call else None


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
