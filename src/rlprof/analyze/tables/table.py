"""Typed, columnar event tables: what every reader produces and every analysis reads."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Event kinds (uint8 codes); collectives are recognised by name within device kernels or CPU ops.
OTHER, CPU_OP, KERNEL, MEMCPY, MEMSET, USER_ANNOTATION, GPU_ANNOTATION, RUNTIME, PYTHON = range(9)
KIND_OF_CATEGORY = {
    "cpu_op": CPU_OP,
    "operator": CPU_OP,
    "kernel": KERNEL,
    "gpu_memcpy": MEMCPY,
    "gpu_memset": MEMSET,
    "user_annotation": USER_ANNOTATION,
    "gpu_user_annotation": GPU_ANNOTATION,
    "cuda_runtime": RUNTIME,
    "cuda_driver": RUNTIME,
    "python_function": PYTHON,
    "mark": USER_ANNOTATION,
    "stage": USER_ANNOTATION,
    "micro_batch": USER_ANNOTATION,
    "mini_batch": USER_ANNOTATION,
    "decode_step": USER_ANNOTATION,
    # PyTorch 1.8/1.9-era Kineto wrote capitalised categories
    "Operator": CPU_OP,
    "Kernel": KERNEL,
    "Memcpy": MEMCPY,
    "Memset": MEMSET,
    "Runtime": RUNTIME,
    "Python": PYTHON,
    "User annotation": USER_ANNOTATION,
    "GPU user annotation": GPU_ANNOTATION,
}
DEVICE_KINDS = (KERNEL, MEMCPY, MEMSET)
CPU_MEMORY, UNKNOWN_DEVICE = -1, -2  # memory counters that are not one accelerator's (by its id, 0 and up)


def release_free_memory() -> None:
    """Hand the heap's free pages back to the OS (glibc's malloc_trim). Freed column pieces otherwise stay in
    the process and the next phase's arrays land beside them: on a 2 GB trace that is the difference between
    the phases' peaks adding up and each phase holding what it uses. A no-op where there is no glibc."""
    global _malloc_trim
    if _malloc_trim is None:
        import ctypes
        import ctypes.util

        try:
            _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None
TRIM_ROWS = 1 << 20  # a column this long frees pieces worth trimming for (a few ms a trim)


class AutoIds(dict):
    """key -> id; a key not seen before gets the next id and its label is appended to `names`, so a lookup is
    one C call for known keys (map(ids.__getitem__, keys) runs in C but for the first sight of each key)."""

    __slots__ = ("names",)

    def __init__(self, names: list):
        super().__init__()
        self.names = names

    def __missing__(self, key):
        i = self[key] = len(self.names)
        self.names.append(self.label(key))
        return i

    @staticmethod
    def label(key):
        return key


class Interner:
    """Names -> dense integer ids in order of first appearance (the tables hold ids, not strings)."""

    def __init__(self):
        self.names: list[str] = []
        self.ids: dict[str, int] = AutoIds(self.names)

    def __call__(self, name: str) -> int:
        return self.ids[name]


@dataclass
class EventTable:
    """Complete events ('X') of one trace, one column per field, times in microseconds."""

    start: np.ndarray  # float64, absolute µs
    end: np.ndarray  # float64
    kind: np.ndarray  # uint8 (codes above)
    name: np.ndarray  # int32 id into names
    thread: np.ndarray  # int32 id into threads ("pid/tid")
    names: list[str]
    threads: list[str]
    memory: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))  # (ts µs, allocated bytes, device)
    runtime: dict[str, list[float]] = field(default_factory=dict)  # runtime API name -> [count, total µs]
    span: tuple[float, float] | None = None  # first start, last end over every complete event
    shape: np.ndarray | None = None  # int32 id into shapes ("Input Dims"), when read with shapes
    shapes: list[str] = field(default_factory=list)
    # Device events: when the host launched them (µs; NaN where the trace has no launch flow for the event)
    launch: np.ndarray | None = None

    def placed_at(self, sel: np.ndarray | None = None) -> np.ndarray:
        """The time that places each event (of `sel`, else all) in a stage window: its launch on the host where
        the trace links it (a kernel queued at a stage's end belongs to that stage even if it runs in the next;
        -inf: launched before the trace began), else its start."""
        if self.launch is None:
            return self.start if sel is None else self.start[sel]
        if sel is None:
            return np.where(np.isnan(self.launch), self.start, self.launch)
        when = self.launch[sel]  # one copy, filled in place where unlinked (a selection is mostly device events)
        unlinked = np.flatnonzero(np.isnan(when))
        when[unlinked] = self.start[sel[unlinked]]
        return when

    def __len__(self) -> int:
        return len(self.start)

    def mask(self, *kinds: int) -> np.ndarray:
        return kind_flags(kinds)[self.kind]


def kind_flags(kinds) -> np.ndarray:
    """A lookup table over the uint8 kind codes, True at `kinds`: `kind_flags(k)[column]` is one gather, where
    np.isin compares the whole column once per kind."""
    flags = np.zeros(256, bool)
    flags[list(kinds)] = True
    return flags


class ColumnBuilder:
    """Appends decoded events chunk by chunk into growable numpy columns (bounded memory)."""

    def __init__(self, shapes: bool = False):
        self.names, self.threads, self.shapes = Interner(), Interner(), Interner()
        self.with_shapes = shapes
        self._chunks: list[tuple[np.ndarray, ...]] = []
        self.memory_points: list[tuple[float, float, int]] = []
        self.runtime: dict[str, list[float]] = {}
        self.span: tuple[float, float] | None = None

    def extend_span(self, lo: float, hi: float) -> None:
        self.span = (lo, hi) if self.span is None else (min(self.span[0], lo), max(self.span[1], hi))

    def add(self, start, end, kind, name, thread, shape=None) -> None:
        if len(start):
            cols = (
                np.asarray(start, np.float64),
                np.asarray(end, np.float64),
                np.asarray(kind, np.uint8),
                np.asarray(name, np.int32),
                np.asarray(thread, np.int32),
            )
            if self.with_shapes:
                cols += (np.asarray(shape if shape is not None else np.zeros(len(start)), np.int32),)
            self._chunks.append(cols)

    def take_chunks(self) -> list[tuple[np.ndarray, ...]]:
        """The appended column pieces, handed over (this builder forgets them)."""
        chunks, self._chunks = self._chunks, []
        return chunks

    def add_memory(self, ts: float, total: float, device: int = UNKNOWN_DEVICE) -> None:
        self.memory_points.append((ts, total, device))

    def build(self) -> EventTable:
        dtypes = (np.float64, np.float64, np.uint8, np.int32, np.int32) + ((np.int32,) if self.with_shapes else ())
        cols = []
        for i, dtype in enumerate(dtypes):  # column by column, releasing the pieces as we go
            pieces = [c[i] for c in self._chunks]
            cols.append(np.concatenate(pieces) if pieces else np.zeros(0, dtype))
            self._chunks = [c[:i] + (None,) + c[i + 1 :] for c in self._chunks]
            del pieces
            if len(cols[-1]) > TRIM_ROWS:  # the pieces' pages back to the OS before the next column is made
                release_free_memory()
        self._chunks = []
        memory = np.array(sorted(self.memory_points), dtype=np.float64).reshape(-1, 3)
        shape = cols.pop() if self.with_shapes else None
        return EventTable(
            *cols,
            names=self.names.names,
            threads=self.threads.names,
            memory=memory,
            runtime=self.runtime,
            span=self.span,
            shape=shape,
            shapes=self.shapes.names if self.with_shapes else [],
        )
