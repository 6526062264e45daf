"""Decoded Kineto events into columns: the hot path of ingestion (every per-event step in C), and the merge of
the columns that byte ranges of one file were read into.

Over 400 lines because it is the hot path of ingestion, kept together so that every per-event step stays one
C call over local names, and the merge of its columns.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import compress, repeat
from operator import attrgetter, is_, is_not
from pathlib import Path

import msgspec
import numpy as np

from ...tables.table import (
    CPU_OP,
    DEVICE_KINDS,
    KIND_OF_CATEGORY,
    OTHER,
    PYTHON,
    RUNTIME,
    AutoIds,
    ColumnBuilder,
    EventTable,
    Interner,
    kind_flags,
    release_free_memory,
    CPU_MEMORY,
    UNKNOWN_DEVICE,
)
from .kineto_events import (
    MAX_DUR_US,
    MAX_US,
    NO_CORRELATION,
    OUTLIER_GAP_US,
    OUTLIER_SHARE,
    OUTLIER_SPAN_FACTOR,
    Event,
    LeanEvent,
    ShapeEvent,
    _decode_args_list,
)

_KIND = dict(KIND_OF_CATEGORY, **{"": CPU_OP})  # no category: a CPU op (old Chrome-trace writers)
_PH, _CAT, _NAME, _TS, _DUR, _ID, _ARGS = map(attrgetter, ("ph", "cat", "name", "ts", "dur", "id", "args"))
_PID_TID = attrgetter("pid", "tid")
_CORRELATION = attrgetter("correlation")
_LAUNCH_ID = attrgetter("args.correlation")
_X, _FLOW_START, _FLOW_END, _INSTANT, _NO_PHASE = 1, 2, 3, 4, 5
# the phases read; others are 0; an event without one is counted (it cannot be read as anything)
_PHASE = {"X": _X, "s": _FLOW_START, "f": _FLOW_END, "i": _INSTANT, "": _NO_PHASE}
_IS_DEVICE_SIGN = kind_flags(DEVICE_KINDS + (RUNTIME,))  # kinds only a trace with device activity holds
_IS_DEVICE = kind_flags(DEVICE_KINDS)
NO_PHASE = "no ph (phase)"
EDGE = 16  # earliest and latest events kept per batch for the outlier check
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
        self.device_seen = False  # device events, runtime calls or launch flows: a GPU trace, whatever is kept
        self.edges: list[tuple] = []  # per batch (starts, ends, in table) of its earliest and latest events
        self.bad: dict[str, int] = defaultdict(int)  # events that did not decode, by why (kineto_salvage)
        self.first_bad: int | None = None  # the byte where the first of them starts

    @property
    def event_type(self) -> type:
        return ShapeEvent if self.shapes else Event

    def _keep_edges(self, start: np.ndarray, end: np.ndarray, kind: np.ndarray) -> None:
        """The EDGE earliest and latest events of a batch, of every kind (those the table leaves out too): what
        the outlier check and the span after it need, in a few bytes per batch."""
        n = len(start)
        at = np.argpartition(start, (EDGE - 1, n - EDGE))[np.r_[:EDGE, n - EDGE : n]] if n > 2 * EDGE else np.arange(n)
        in_table = (kind[at] != RUNTIME) & (kind[at] != OTHER) & (kind[at] != PYTHON)
        self.edges.append((start[at], end[at], in_table))

    def count_bad(self, why: str, at: int) -> None:
        self.bad[why] += 1
        if self.first_bad is None:
            self.first_bad = at

    @property
    def damaged(self) -> bool:
        """Events were lost to damage (text that is not JSON): the result is a lower bound of the file's."""
        from .kineto_salvage import DAMAGED

        return self.bad.get(DAMAGED, 0) > 0

    def add(self, events: list) -> None:
        """One decoded batch, in file order. Ids (names, threads) are given in order of first appearance in the
        file, whatever the batch boundaries: so a file split anywhere merges back into the same table."""
        n = len(events)
        if not n:
            return
        phase = np.fromiter(map(_PHASE.get, map(_PH, events), repeat(0)), np.uint8, n)
        is_x = phase == _X
        if phase.max() == _NO_PHASE:
            self.dropped[NO_PHASE] += int((phase == _NO_PHASE).sum())
        x_at = np.flatnonzero(is_x)  # positions in the batch
        flows_before = len(self.flow_starts)
        if len(x_at) < n:
            flow_end_at = self._add_others(events, phase)
            xs = list(compress(events, is_x.tolist()))
        else:
            flow_end_at, xs = np.zeros(0, np.int64), events
        start, dur = _floats_of(xs, _TS), _floats_of(xs, _DUR)
        with np.errstate(all="ignore"):
            bad_ts = ~np.isfinite(start) | (np.abs(start) > MAX_US)
            bad_dur = ~np.isfinite(dur) | (dur < 0) | (dur > MAX_DUR_US)
        if bad_ts.any() or bad_dur.any():  # dropped and counted: no NaN, inf or negative time reaches a table
            self.dropped["missing, non-finite or out-of-range ts"] += int(bad_ts.sum())
            self.dropped["missing, negative, non-finite or day-long dur"] += int((bad_dur & ~bad_ts).sum())
            ok = ~(bad_ts | bad_dur)
            xs, start, dur, x_at = list(compress(xs, ok.tolist())), start[ok], dur[ok], x_at[ok]
        end = start + dur
        if xs:
            self.cols.extend_span(float(start.min()), float(end.max()))
            kind = np.fromiter(map(_KIND.get, map(_CAT, xs), repeat(OTHER)), np.uint8, len(xs))
            self.complete += len(xs)
            if not self.device_seen:
                self.device_seen = bool(_IS_DEVICE_SIGN[kind].any())
            self._keep_edges(start, end, kind)
            unknown = kind == OTHER
            if unknown.any():
                self.unknown += int(unknown.sum())
                for cat, count in Counter(map(_CAT, compress(xs, unknown.tolist()))).items():  # for the warning
                    self.unknown_cats[cat] += count
            # runtime API calls are only ever summed (launch overhead): their name and duration, not their place
            runtime = kind == RUNTIME
            if runtime.any():
                ids = self.runtime_names.ids.__getitem__
                calls = list(compress(xs, runtime.tolist()))
                names = np.fromiter(map(ids, map(_NAME, calls)), np.int32)
                self.runtime.append((names, end[runtime] - start[runtime]))
                # where each launch call sits: the device events carrying its correlation are linked to it
                corr, ok = _correlations(calls)
                if ok is not None:
                    if len(self.flow_starts) > flows_before:  # Kineto's ac2g flows leave these same calls with
                        _replace(self.flow_starts, flows_before, _without(self.flow_starts[flows_before], corr[ok]))
                    self.flow_starts.append((corr[ok], start[runtime][ok]))  # these ids: each kept once (memory)
            keep = (kind != RUNTIME) & (kind != OTHER) & (kind != PYTHON)
            if not keep.all():
                xs, start, end, kind, x_at = (
                    list(compress(xs, keep.tolist())),
                    start[keep],
                    end[keep],
                    kind[keep],
                    x_at[keep],
                )
        if not xs and not len(flow_end_at):
            return
        # threads of the kept events and of the flow ends, given ids together in file order
        chosen = np.zeros(n, bool)
        chosen[x_at] = True
        chosen[flow_end_at] = True
        threads = np.fromiter(
            map(self.thread_keys.__getitem__, map(_PID_TID, compress(events, chosen.tolist()))), np.int32
        )
        rank = np.cumsum(chosen) - 1
        if len(flow_end_at):
            self.flow_ends[-1] += (threads[rank[flow_end_at]],)
        if not xs:
            return
        names = np.fromiter(map(self.cols.names.ids.__getitem__, map(_NAME, xs)), np.int32, len(xs))
        on_device = _IS_DEVICE[kind]
        if on_device.any():  # a device event's correlation names its launch call: matched at build like a flow end
            corr, ok = _correlations(list(compress(xs, on_device.tolist())))
            if ok is not None:
                if len(flow_end_at):  # the batch's ac2g flow ends that name these events by these ids: once
                    _replace(self.flow_ends, len(self.flow_ends) - 1, _without(self.flow_ends[-1], corr[ok]))
                self.flow_ends.append((corr[ok], start[on_device][ok], threads[rank[x_at]][on_device][ok]))
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
            instants = list(compress(events, is_instant.tolist()))  # read twice below: a list, not an iterator
            counters = list(compress(instants, map("[memory]".__eq__, map(_NAME, instants))))
            if counters:
                if type(counters[0]) is LeanEvent:
                    raise _NeedArgs  # decoded without args (nothing added yet): the caller decodes them with args
                self._add_memory(counters)
        is_flow = (phase == _FLOW_START) | (phase == _FLOW_END)
        if not is_flow.any():
            return np.zeros(0, np.int64)
        at = np.flatnonzero(is_flow)
        flows = list(compress(events, is_flow.tolist()))
        launch = np.fromiter(map(_IS_LAUNCH.get, map(_CAT, flows), repeat(False)), bool, len(flows))
        self.device_seen = self.device_seen or bool(launch.any())
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
        args = _decoded_args(counters)
        ts = _floats_of(counters, _TS)
        for t, a in zip(ts.tolist(), args):
            total = a.total_allocated
            if total is not None and np.isfinite(t) and np.isfinite(total):
                self.cols.add_memory(t, total, memory_device(a.device_type, a.device_id))

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
            self.cols.add(
                start, end, kind, name_map[name], thread_map[thread], shape_map[chunk[5]] if self.shapes else None
            )
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
        for why, count in part.bad.items():
            self.bad[why] += count
        if self.first_bad is None:
            self.first_bad = part.first_bad
        self.complete += part.complete
        self.unknown += part.unknown
        self.device_seen = self.device_seen or part.device_seen
        self.edges += part.edges

    def drop_warnings(self, path: Path) -> list[str]:
        from .kineto_salvage import DEEP_ARGS

        out = []
        dropped = {why: n for why, n in self.bad.items() if why != DEEP_ARGS and n}
        if dropped:
            what = ", ".join(f"{n} with {why}" for why, n in dropped.items())
            out.append(
                f"{path}: dropped {sum(dropped.values())} event(s) that could not be read ({what}; the first "
                f"at byte {self.first_bad}); the other events were read"
            )
        if self.bad.get(DEEP_ARGS):
            out.append(
                f"{path}: {self.bad[DEEP_ARGS]} event(s) have args nested too deep to read; they were kept "
                "without their args"
            )
        if self.dropped:
            what = ", ".join(f"{n} with {why}" for why, n in self.dropped.items() if n)
            out.append(f"{path}: dropped {sum(self.dropped.values())} event(s) that carry no usable time ({what})")
        if self.complete and self.unknown > self.complete / 2:  # mostly unread: the numbers would be silently wrong
            cats = ", ".join(
                f"{c or '(none)'!r}" for c, _ in sorted(self.unknown_cats.items(), key=lambda kv: -kv[1])[:5]
            )
            out.append(
                f"{path}: {self.unknown} of {self.complete} events have categories rlprof does not know "
                f"({cats}); they are not counted, so the buckets and operators miss them"
            )
        return out

    def build(self) -> EventTable:
        if self.runtime:  # summed over the whole file at once: the same sums however the file was split
            ids = np.concatenate([r[0] for r in self.runtime])
            dur = np.concatenate([r[1] for r in self.runtime])
            count = np.bincount(ids, minlength=len(self.runtime_names.names))
            total = np.bincount(ids, weights=dur, minlength=len(self.runtime_names.names))
            self.cols.runtime = {
                name: [int(count[i]), float(total[i])] for i, name in enumerate(self.runtime_names.names)
            }
        table = self.cols.build()
        if table.span is not None and table.span[1] - table.span[0] > OUTLIER_GAP_US:
            table = self._without_outliers(table)
        release_free_memory()  # the pieces just concatenated
        table.launch = self._launch_times(table)
        release_free_memory()  # the flows and the launch matching's temporaries
        return table

    def _without_outliers(self, t: EventTable) -> EventTable:
        """Events set far apart from the rest by a damaged ts (docs/bad_input.md), dropped and counted: a group of
        at most OUTLIER_SHARE of the events (and fewer than the rest), beyond a gap of a day and of ten times the
        rest's span. Judged on
        every event of the table and the earliest and latest of every kind; only traces spanning more than a
        day are looked at, so a sound trace pays nothing."""
        e_start, e_end, e_table = (
            (np.concatenate(c) for c in zip(*self.edges))
            if self.edges
            else (np.zeros(0), np.zeros(0), np.zeros(0, bool))
        )
        starts = np.sort(np.concatenate([t.start, e_start[~e_table]]))
        lo, hi = 0, len(starts)  # the rest: starts[lo:hi]
        for _ in range(4):  # a few outlier groups at either end
            if hi - lo < 2:
                break
            gaps = np.diff(starts[lo:hi])
            at = int(np.argmax(gaps))
            left, right = at + 1, hi - lo - at - 1  # events before and after the largest gap
            small, rest_span = (
                (left, starts[hi - 1] - starts[lo + left])
                if left <= right
                else (right, starts[lo + left - 1] - starts[lo])
            )
            if (
                small > max(1, OUTLIER_SHARE * (hi - lo))
                or 2 * small >= hi - lo
                or gaps[at] <= max(OUTLIER_GAP_US, OUTLIER_SPAN_FACTOR * rest_span)
            ):
                break
            lo, hi = (lo + left, hi) if left <= right else (lo, hi - right)
        if lo == 0 and hi == len(starts):
            return t
        first, last = starts[lo], starts[hi - 1]
        rows = np.flatnonzero((t.start >= first) & (t.start <= last))
        kept_edges = (e_start >= first) & (e_start <= last)
        self.dropped["a ts a day or more apart from the rest of the trace"] += (
            len(t) - len(rows) + int((~kept_edges & ~e_table).sum())
        )
        t.start, t.end, t.kind, t.name, t.thread = (c[rows] for c in (t.start, t.end, t.kind, t.name, t.thread))
        if t.shape is not None:
            t.shape = t.shape[rows]
        lows = np.concatenate([t.start, e_start[kept_edges]])
        highs = np.concatenate([t.end, e_end[kept_edges]])
        t.span = (float(lows.min()), float(highs.max())) if len(lows) else None
        return t

    def _launch_times(self, t: EventTable) -> np.ndarray | None:
        """Each device event's host launch time: through the trace's ac2g flows (a flow end sits on its device
        event, same thread and timestamp; its start at the launch) and through Kineto's `correlation`, which a
        kernel, copy or set shares with the runtime call that launched it (a graph launch's id on every kernel of
        the graph), read as one more flow from that call to the event. -inf: launched before the file's window.
        Vectorised: sorted keys + searchsorted."""
        if not self.flow_ends or not self.flow_starts or not len(t):
            return None
        # On a 2 GB trace every array here is 12-15 MB: each is made once, worked on in place and released as soon
        # as it is used, the chunk lists column by column, so no two copies of a column are alive at once.
        starts, ends, self.flow_starts, self.flow_ends = self.flow_starts, self.flow_ends, [], []
        as_text = any(c[0].dtype.kind != "i" for c in starts + ends)  # one writer's string ids: compare as strings

        def column(chunks: list, k: int, ids: bool = False) -> np.ndarray:
            """Column k of the chunks, concatenated; the chunks let go of it."""
            parts = [c[k].astype(str) if ids and as_text else c[k] for c in chunks]
            for i, c in enumerate(chunks):
                chunks[i] = c[:k] + (None,) + c[k + 1 :]
            return np.concatenate(parts)

        start_id = column(starts, 0, ids=True)
        order = np.argsort(start_id, kind="stable")
        start_id = start_id[order]
        start_ts = column(starts, 1)[order]
        del order, starts
        end_id = column(ends, 0, ids=True)
        pos = np.searchsorted(start_id, end_id)
        np.clip(pos, 0, len(start_id) - 1, out=pos)
        found = start_id[pos] == end_id
        # Kineto numbers launches in order: an id below every launch call in the file was launched before the
        # file's window began (the previous step's work still running), which no range of the file launched
        before = (end_id < start_id[0]) & ~found if not as_text else np.zeros(len(end_id), bool)
        del start_id, end_id
        found |= before
        launch_of_end = start_ts[pos]
        launch_of_end[before] = -np.inf
        del start_ts, pos, before
        # device events <- flow ends on the same thread at the same start time
        end_ts = column(ends, 1)
        base = float(min(t.start.min(), end_ts.min()))
        width = float(max(t.end.max(), end_ts.max()) - base) + 1.0
        end_key = column(ends, 2) * width
        del ends
        end_ts -= base
        end_key += end_ts
        del end_ts
        end_key[~found] = np.inf  # an end whose launch the file lacks links nothing: the event's other link counts
        del found
        key_order = np.argsort(end_key, kind="stable")
        end_key = end_key[key_order]
        launch_of_end = launch_of_end[key_order]
        del key_order
        device = np.flatnonzero(t.mask(*DEVICE_KINDS))
        ev_key = t.thread[device] * width
        ev_start = t.start[device]
        ev_start -= base
        ev_key += ev_start
        del ev_start
        at = np.searchsorted(end_key, ev_key)
        np.clip(at, 0, len(end_key) - 1, out=at)
        ev_key -= end_key[at]
        del end_key
        np.abs(ev_key, out=ev_key)
        hit = ev_key < 1e-3
        del ev_key
        linked = launch_of_end[at]
        del at, launch_of_end
        linked[~hit] = np.nan
        del hit
        if not np.isfinite(linked).any():
            return None
        launch = np.full(len(t), np.nan)
        launch[device] = linked
        return launch


def _floats_of(events: list, field) -> np.ndarray:
    """One numeric field of every event as float64, in C; a writer's numeric strings or junk take the slow path."""
    try:
        return np.fromiter(map(field, events), np.float64, len(events))
    except (ValueError, TypeError, OverflowError):
        return _floats(list(map(field, events)))


def _replace(chunks: list, at: int, flows: tuple) -> None:
    """chunks[at] = flows, or no chunk where none is left (fewer arrays to send from a worker and to merge)."""
    if len(flows[0]):
        chunks[at] = flows
    else:
        del chunks[at]


def _without(flows: tuple, ids: np.ndarray) -> tuple:
    """A batch's flow columns without the flows whose id is among `ids` (the same links, read from correlation)."""
    if flows[0].dtype.kind != "i":
        return flows
    if len(flows[0]) == len(ids) and np.array_equal(flows[0], ids):  # Kineto's: one flow per call, in its order
        return tuple(c[:0] for c in flows)
    keep = ~np.isin(flows[0], ids)
    return flows if keep.all() else tuple(c[keep] for c in flows)


def _decoded_args(events: list) -> list:
    """The events' args as structs: as decoded already (shapes, correlation), or raw ones decoded in one call."""
    args = list(map(_ARGS, events))
    if args and isinstance(args[0], msgspec.Raw):
        try:
            return _decode_args_list(b"[" + b",".join(bytes(a) or b"{}" for a in args) + b"]")
        except msgspec.DecodeError:  # one damaged args object: the others still count
            return [e.decoded_args() for e in events]
    return args


def _correlations(events: list) -> tuple[np.ndarray, np.ndarray | slice | None]:
    """The `correlation` arg of each event as int64, and which events have one (an integer, as Kineto writes it):
    a mask, `slice(None)` where all have one, None where none has. In C for Kineto's events (one getter through
    the args struct); args kept raw (a trace read with its memory counters) are decoded in one call."""
    try:
        values = list(map(_LAUNCH_ID, events))
        ids = np.fromiter(values, np.int64, len(values))
    except (AttributeError, ValueError, TypeError, OverflowError):  # raw args, other JSON, not an integer
        values = [getattr(a, "correlation", None) for a in _decoded_args(events)]
        try:
            ids = np.fromiter(values, np.int64, len(values))
        except (ValueError, TypeError, OverflowError):
            ids = None
    if ids is not None:
        at_default = ids == NO_CORRELATION
        if not at_default.any() or not any(map(is_, compress(values, at_default.tolist()), repeat(NO_CORRELATION))):
            return ids, slice(None)  # every event has one (a written id of the default's value is one)
    # some without one (a copy written without it): integers only, the default left out by identity
    ok = np.fromiter(map(isinstance, values, repeat(int)), bool, len(values))
    ok &= np.fromiter(map(is_not, values, repeat(NO_CORRELATION)), bool, len(values))
    if not ok.any():
        return np.zeros(0, np.int64), None
    if ids is None:
        ids = np.zeros(len(values), np.int64)
        try:
            ids[ok] = np.fromiter(compress(values, ok.tolist()), np.int64, int(ok.sum()))
        except OverflowError:  # beyond int64: not an id Kineto writes
            return np.zeros(0, np.int64), None
    return ids, ok


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


def memory_device(device_type, device_id) -> int:
    """Which counter a [memory] event belongs to: the device id for an accelerator, CPU_MEMORY for host memory,
    UNKNOWN_DEVICE where the trace does not say (each is its own allocator: their totals never add)."""
    if device_type == 0:
        return CPU_MEMORY
    if isinstance(device_type, int) and isinstance(device_id, int) and device_id >= 0:
        return device_id
    return UNKNOWN_DEVICE
