"""The host's Python stacks sampled inside one window (collect/host_stacks.py writes them, the analysis reads them
here): one file beside each Chrome trace a window writes, `<trace stem>.stacks.msgpack.gz` (gzip of one msgpack map),
written before its trace, so that a window's trace and its stacks together stay within its byte budget.

The map (`version` 1):
- `clock`: "epoch_us": the writing host's wall clock, microseconds since the Unix epoch (the manifest's `start_ns` /
  1000, the clock a Kineto trace's `baseTimeNanoseconds` counts from); the analysis maps it onto the trace's clock as
  it maps the rollout's sample records.
- `interval_us`: how often the sampler looked.
- `threads`: one map per thread seen: `ident` (Python's), `native_id` (the OS thread id, Kineto's `tid`), `name`,
  `stage` (true for the thread that opened the window: the stage's own).
- `frames`: one list per distinct (code, line): [module, file, line, function, source line].
- `stacks`: a prefix tree, one [parent, frame] pair per node (parent -1 at the outermost frame): a sample's stack is
  its node and the node's parents, innermost first.
- `samples`: columns `t_us` (epoch microseconds), `thread` (index into `threads`), `stack` (node of `stacks`).
- `gc`: one [start_us, end_us, thread, generation, collected] per garbage collection (Python's `gc.callbacks`).
- `truncated`: the sampler stopped early at its share of the byte budget; `faults`: what stopped it otherwise.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import msgspec

SUFFIX = ".stacks.msgpack.gz"
VERSION = 1
# The trace names a window's stacks file is named after: the suffix replaced (not a trace name: analyze/inputs/find.py
# reads *.json and *.json.gz, so a stacks file is never taken for a trace).
TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json")


class Thread(msgspec.Struct, frozen=True):
    ident: int
    native_id: int | None
    name: str
    stage: bool = False


class Samples(msgspec.Struct, frozen=True):
    t_us: list[float]
    thread: list[int]
    stack: list[int]


class HostStacks(msgspec.Struct, frozen=True):
    version: int
    clock: str
    interval_us: float
    threads: list[Thread]
    frames: list[tuple[str, str, int, str, str]]
    stacks: list[tuple[int, int]]
    samples: Samples
    gc: list[tuple[float, float, int, int, int]] = []
    truncated: bool = False
    faults: list[str] = []
    window: dict = {}

    def stage_thread(self) -> int | None:
        """The index of the thread that opened the window (the stage's own), else of the main thread."""
        for i, t in enumerate(self.threads):
            if t.stage:
                return i
        return next((i for i, t in enumerate(self.threads) if t.name == "MainThread"), None)

    def frames_of(self, node: int) -> list[int]:
        """The frames of a stack node, innermost first."""
        out = []
        while node >= 0:
            node, frame = self.stacks[node]
            out.append(frame)
        return out


def stacks_path(trace: Path) -> Path:
    """Where the stacks of the window written as `trace` are (the same directory, the trace's stem)."""
    trace = Path(trace)
    name = trace.name
    suffix = next((s for s in TRACE_SUFFIXES if name.endswith(s)), trace.suffix)
    return trace.with_name(name[: len(name) - len(suffix)] + SUFFIX)


def encode(stacks: dict) -> bytes:
    """The file's bytes: the map gzipped (stdlib gzip, level 3 as the traces)."""
    return gzip.compress(msgspec.msgpack.encode(stacks), compresslevel=3)


def read_host_stacks(trace: Path) -> HostStacks | None:
    """The stacks sampled beside `trace`, or None where there are none (a window recorded without them, a file
    another tool wrote) or they cannot be read (a cut or foreign file: the trace's analysis goes on without them)."""
    path = stacks_path(trace)
    try:
        data = gzip.decompress(path.read_bytes())
        stacks = msgspec.msgpack.decode(data, type=HostStacks)
    except (OSError, EOFError, zlib.error, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return stacks if stacks.version == VERSION else None
