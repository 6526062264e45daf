"""Property-based: generated traces, cut anywhere or filled with bad values (hypothesis, CI-sized)."""

import gzip
import json
import math
import zlib

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from helpers import complete_events
from rlprof.analyze.inputs.readers.kineto import MAX_DUR_US, MAX_US, NotATrace, read_kineto

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

event = st.fixed_dictionaries(
    {
        "ph": st.just("X"),
        "cat": st.just("cpu_op"),
        "name": st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12),
        "pid": st.integers(0, 3),
        "tid": st.integers(0, 3),
        "ts": st.integers(0, 10**9),
        "dur": st.integers(0, 10**6),
    }
)


def kineto_layout(events: list[dict]) -> bytes:
    """Kineto's own layout: one event per top-level element at two-space indent (the chunked fast path)."""
    body = ",\n  ".join(json.dumps(e) for e in events)
    return ('{\n  "schemaVersion": 1,\n  "traceEvents": [\n  ' + body + "\n  ]\n}\n").encode()


@SETTINGS
@given(
    events=st.lists(event, min_size=1, max_size=40),
    layout=st.sampled_from(["kineto", "compact"]),
    gz=st.booleans(),
    fraction=st.floats(0.0, 1.0),
)
def test_a_cut_anywhere_keeps_exactly_the_complete_events_before_it(tmp_path, events, layout, gz, fraction):
    raw = kineto_layout(events) if layout == "kineto" else json.dumps({"traceEvents": events}).encode()
    data = gzip.compress(raw) if gz else raw
    cut = data[: int(len(data) * fraction)]
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(cut)
    readable = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(cut) if gz else cut
    expected = len(complete_events(readable)[0])
    try:
        trace = read_kineto(path)
    except NotATrace:
        assert expected == 0
        return
    assert len(trace.table) == expected
    assert np.isfinite(trace.table.start).all() and np.isfinite(trace.table.end).all()


# times within a few hours of each other (set-apart times are the outlier rule's, tested below), durations of any size
weird_ts = st.one_of(
    st.integers(-(10**6), 10**9), st.floats(-1e10, 1e10), st.sampled_from(["nan", "inf", "-inf", "soon", "", "12.5"])
)
weird_dur = st.one_of(
    st.integers(-(10**6), 10**9),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.sampled_from(["nan", "inf", "-inf", "soon", "", "12.5"]),
)


def usable(ts, dur) -> bool:
    def num(v):
        try:
            return float(v)
        except (TypeError, ValueError):
            return math.nan

    t, d = num(ts), num(dur)
    return math.isfinite(t) and abs(t) <= MAX_US and math.isfinite(d) and 0 <= d <= MAX_DUR_US


@SETTINGS
@given(values=st.lists(st.tuples(weird_ts, weird_dur), min_size=1, max_size=30))
def test_bad_values_are_dropped_counted_and_never_reach_the_table(tmp_path, values):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"e{k}", "pid": 1, "tid": 1, "ts": ts, "dur": dur}
        for k, (ts, dur) in enumerate(values)
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    good = sum(usable(ts, dur) for ts, dur in values)
    trace = read_kineto(path)
    assert len(trace.table) == good
    assert np.isfinite(trace.table.start).all() and np.isfinite(trace.table.end).all()
    assert (trace.table.end >= trace.table.start).all()
    dropped = [w for w in trace.warnings if "dropped" in w]
    if good < len(values):
        (warning,) = dropped
        assert f"dropped {len(values) - good} event(s)" in warning
    else:
        assert not dropped


any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.integers(10**19, 10**400),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
) | st.builds(lambda n: "[" * n + "]" * n, st.integers(1000, 3000)).map(lambda raw: ("raw", raw))


def rows_of(trace) -> list[tuple]:
    t = trace.table
    return sorted(
        zip(
            t.start.tolist(),
            t.end.tolist(),
            t.kind.tolist(),
            (t.names[i] for i in t.name),
            (t.threads[i] for i in t.thread),
        )
    )


def dump(events: list[dict], layout: str) -> bytes:
    text = kineto_layout(events).decode() if layout == "kineto" else json.dumps({"traceEvents": events})
    return text.replace('"@@RAW@@"', RAW[0]).encode() if RAW else text.encode()


RAW: list[str] = []  # a raw JSON text to put in place of the marker (nesting deeper than json.dumps writes)


@SETTINGS
@given(
    events=st.lists(event, min_size=2, max_size=30),
    which=st.integers(0, 10**6),
    field=st.sampled_from(["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]),
    value=any_json,
    layout=st.sampled_from(["kineto", "compact"]),
)
def test_any_value_in_any_field_costs_at_most_its_event(tmp_path, events, which, field, value, layout):
    """One field of one event replaced by any JSON value (NaN, Infinity, huge integers, nesting deeper than a
    decoder recurses): the table is the trace's without that event, or with it read; never anything else."""
    k = which % len(events)
    without = tmp_path / "without.json"
    without.write_bytes(dump(events[:k] + events[k + 1 :], layout))
    bad = [dict(e) for e in events]
    RAW[:] = [value[1]] if isinstance(value, tuple) else []
    bad[k][field] = "@@RAW@@" if RAW else value
    path = tmp_path / "t.json"
    path.write_bytes(dump(bad, layout))
    trace = read_kineto(path)  # no traceback, whatever the value
    mine, ref = rows_of(trace), rows_of(read_kineto(without))
    assert np.isfinite(trace.table.start).all() and np.isfinite(trace.table.end).all()
    extra = list(mine)
    for row in ref:
        extra.remove(row)  # every other event read as it is without the bad one
    assert len(extra) <= 1, extra


@SETTINGS
@given(
    events=st.lists(event, min_size=3, max_size=30),
    which=st.integers(0, 10**6),
    far=st.sampled_from([-5.0, -1e15, 1e12, 1e16]),
)
def test_a_time_set_far_apart_is_dropped_and_counted(tmp_path, events, which, far):
    """ts -5 or 1e12 among times a few minutes apart: that event is dropped and counted, the others kept, and the
    trace's span is theirs."""
    events = [dict(e, ts=1_700_000_000_000_000 + e["ts"]) for e in events]  # epoch microseconds, as Kineto writes
    k = which % len(events)
    rest = events[:k] + events[k + 1 :]
    bad = [dict(e) for e in events]
    bad[k]["ts"] = far
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": bad}))
    trace = read_kineto(path)
    assert len(trace.table) == len(rest)
    assert trace.table.span == (min(e["ts"] for e in rest), max(e["ts"] + e["dur"] for e in rest))
    (warning,) = [w for w in trace.warnings if "apart from the rest" in w]
    assert "dropped 1 event(s)" in warning


LITERALS = ["NaN", "Infinity", "-Infinity", "null", "true", "[1]", "1e400", "1" + "0" * 400, "-5", "-1e15", "1e12"]


def test_each_literal_in_ts_or_dur_of_a_real_kernel_costs_exactly_that_event(tmp_path):
    """HTA's real NCCL rank (Kineto's layout): one kernel's ts or dur written as each literal a post-processing
    script can leave there; the table is the undamaged file's without that kernel, and the drop is counted."""
    import gzip

    from conftest import REAL

    doc = json.loads(gzip.decompress((REAL / "gpu_nccl_rank0.json.gz").read_bytes()))
    events = doc["traceEvents"]
    k = next(i for i, e in enumerate(events) if e.get("cat") == "kernel")
    without = tmp_path / "without.json"
    without.write_bytes(kineto_layout(events[:k] + events[k + 1 :]))
    ref = read_kineto(without)
    for field in ("ts", "dur"):
        for literal in LITERALS:
            bad = [dict(e) for e in events]
            bad[k][field] = "@@LIT@@"
            path = tmp_path / "t.json"
            path.write_bytes(kineto_layout(bad).replace(b'"@@LIT@@"', literal.encode()))
            trace = read_kineto(path)
            assert rows_of(trace) == rows_of(ref) and trace.table.span == ref.table.span, (field, literal)
            assert any("dropped 1 event(s)" in w for w in trace.warnings), (field, literal, trace.warnings)
