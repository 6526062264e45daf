"""Property-based: generated traces, cut anywhere or filled with bad values (hypothesis, CI-sized)."""

import gzip
import json
import math
import zlib

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from helpers import complete_events
from rlprof.analyze.readers.kineto import MAX_US, NotATrace, read_kineto

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

event = st.fixed_dictionaries({
    "ph": st.just("X"), "cat": st.just("cpu_op"),
    "name": st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12),
    "pid": st.integers(0, 3), "tid": st.integers(0, 3),
    "ts": st.integers(0, 10**9), "dur": st.integers(0, 10**6)})


def kineto_layout(events: list[dict]) -> bytes:
    """Kineto's own layout: one event per top-level element at two-space indent (the chunked fast path)."""
    body = ",\n  ".join(json.dumps(e) for e in events)
    return ('{\n  "schemaVersion": 1,\n  "traceEvents": [\n  ' + body + '\n  ]\n}\n').encode()


@SETTINGS
@given(events=st.lists(event, min_size=1, max_size=40), layout=st.sampled_from(["kineto", "compact"]),
       gz=st.booleans(), fraction=st.floats(0.0, 1.0))
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


weird = st.one_of(st.integers(-10**6, 10**9), st.floats(allow_nan=False, allow_infinity=False, width=64),
                  st.sampled_from(["nan", "inf", "-inf", "soon", "", "12.5"]))


def usable(ts, dur) -> bool:
    def num(v):
        try:
            return float(v)
        except (TypeError, ValueError):
            return math.nan

    t, d = num(ts), num(dur)
    return math.isfinite(t) and abs(t) <= MAX_US and math.isfinite(d) and 0 <= d <= MAX_US


@SETTINGS
@given(values=st.lists(st.tuples(weird, weird), min_size=1, max_size=30))
def test_bad_values_are_dropped_counted_and_never_reach_the_table(tmp_path, values):
    events = [{"ph": "X", "cat": "cpu_op", "name": f"e{k}", "pid": 1, "tid": 1, "ts": ts, "dur": dur}
              for k, (ts, dur) in enumerate(values)]
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
