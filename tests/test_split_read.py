"""A large trace read in byte ranges by several workers gives exactly the table one reader builds."""

import gzip
import json
import shutil

import msgspec
import numpy as np
import pytest

from conftest import REAL
from rlprof.analyze.window import per_file
from rlprof.analyze import pipeline
from rlprof.analyze.inputs.readers.kineto import _Sink, LeanEvent, byte_ranges, kineto_layout, read_kineto

PRETTY = ("gpu_nccl_rank0", "rocm_mi250_train", "cpu_only_rank34")  # Kineto's own layout: split
COMPACT = ("compare_base",)  # another writer's one-line layout: read whole whatever is asked


def in_process(fn, jobs):
    return map(fn, jobs)


def plain_copy(name: str, tmp_path):
    out = tmp_path / f"{name}.json"
    with gzip.open(REAL / f"{name}.json.gz", "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def assert_same_trace(a, b):
    for column in ("start", "end", "kind", "name", "thread", "launch", "memory", "shape"):
        x, y = getattr(a.table, column), getattr(b.table, column)
        assert (x is None) == (y is None), column
        if x is not None:
            assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True), column
    for attr in ("names", "threads", "runtime", "span", "shapes"):
        assert getattr(a.table, attr) == getattr(b.table, attr), attr
    assert (a.warnings, a.partial, a.bytes_read, a.meta) == (b.warnings, b.partial, b.bytes_read, b.meta)


@pytest.mark.parametrize("name", PRETTY + COMPACT)
def test_byte_ranges_give_the_same_table_on_every_real_fixture(name, tmp_path):
    path = plain_copy(name, tmp_path)
    whole = read_kineto(path)
    assert len(whole.table) > 10
    layout = kineto_layout(path)
    assert (layout is not None) == (name in PRETTY)
    for parts in (2, 3, 7):
        if layout is not None:
            ranges = byte_ranges(path, layout, parts)
            assert 2 <= len(ranges) <= parts  # really split, each range cut between two events
            assert all(hi is None or lo < hi for lo, hi in ranges)
        assert_same_trace(whole, read_kineto(path, map_ranges=in_process, parts=parts))
    # shapes (compare --by-shape) go through the same merge
    assert_same_trace(read_kineto(path, shapes=True), read_kineto(path, shapes=True, map_ranges=in_process, parts=3))


def test_a_trace_damaged_in_a_later_range_stops_where_one_reader_stops(tmp_path):
    path = plain_copy("gpu_nccl_rank0", tmp_path)
    data = path.read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: int(len(data) * 0.6)])  # ends inside the third of four ranges
    damaged = tmp_path / "damaged.json"
    at = data.index(b'"ph": "X"', len(data) // 2)
    damaged.write_bytes(data[:at] + b'"ph": X"' + data[at + 9 :])  # invalid JSON mid-file
    for bad in (cut, damaged):
        whole = read_kineto(bad)
        assert whole.partial and whole.warnings
        split = read_kineto(bad, map_ranges=in_process, parts=4)
        assert_same_trace(whole, split)


def test_an_event_longer_than_a_decode_piece_is_read_whole(tmp_path):
    """An event's args can outgrow the reader's piece (long stacks, concrete inputs): the buffer grows for it."""
    from rlprof.analyze.inputs.readers import kineto

    path = plain_copy("gpu_nccl_rank0", tmp_path)
    data = path.read_bytes()
    at = data.index(b'"args": {', len(data) // 3) + len(b'"args": {')
    big = tmp_path / "big.json"
    big.write_bytes(data[:at] + b'"stack": "' + b"frame; " * (3 * kineto.CHUNK // 7) + b'", ' + data[at:])
    original, whole = read_kineto(path), read_kineto(big)
    assert not whole.partial and not whole.warnings
    for column in ("start", "end", "kind", "name", "thread"):
        assert np.array_equal(getattr(original.table, column), getattr(whole.table, column)), column
    assert_same_trace(whole, read_kineto(big, map_ranges=in_process, parts=3))


def test_a_thread_written_as_number_and_as_string_is_one_thread():
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 3, "ts": 1.0, "dur": 2.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": "7", "tid": "3", "ts": 5.0, "dur": 2.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 8, "tid": 3, "ts": 9.0, "dur": 2.0},
    ]
    sink = _Sink()
    sink.add(msgspec.json.decode(json.dumps(events), type=list[LeanEvent]))
    table = sink.build()
    assert table.threads == ["7/3", "8/3"] and table.thread.tolist() == [0, 0, 1]


@pytest.mark.parametrize("cut", [None, 300_000, 1_000_000])
def test_a_compressed_trace_in_pieces_gives_the_same_table(cut, tmp_path, monkeypatch):
    """gzip cannot be entered mid-way: one process inflates, workers decode pieces; whole or cut, the same."""
    from rlprof.analyze.inputs.readers import kineto

    path = tmp_path / "t.json.gz"
    data = (REAL / "gpu_nccl_rank0.json.gz").read_bytes()
    path.write_bytes(data[:cut] if cut else data)
    whole = read_kineto(path)
    monkeypatch.setattr(kineto, "PIECE", 256 << 10)
    pieces = []
    split = read_kineto(path, map_ranges=lambda fn, jobs: (pieces.append(job) or fn(job) for job in jobs), parts=2)
    assert len(pieces) > 3  # really handed out in pieces
    assert_same_trace(whole, split)
    assert split.partial == bool(cut)


def test_worker_processes_give_the_same_analysis(tmp_path, monkeypatch):
    """The engine's own path: the file's ranges over a process pool, merged, then analysed."""
    path = plain_copy("gpu_nccl_rank0", tmp_path)
    one = pipeline.analyze(path, workers=1)
    monkeypatch.setattr(per_file, "SPLIT_BYTES", 1 << 20)
    monkeypatch.setattr(per_file, "RANGE_BYTES", 2 << 20)
    assert per_file.range_count(path, 2) > 2
    split = pipeline.analyze(path, workers=2)
    assert json.dumps(split, sort_keys=True) == json.dumps(one, sort_keys=True)
    # the compressed original: inflated here, decoded in pieces by the workers
    from rlprof.analyze.inputs.readers import kineto

    monkeypatch.setattr(kineto, "PIECE", 512 << 10)
    gz = tmp_path / "rank0.json.gz"
    gz.write_bytes((REAL / "gpu_nccl_rank0.json.gz").read_bytes())
    assert per_file.range_count(gz, 2) > 2  # sized by what it inflates to
    one_gz, split_gz = pipeline.analyze(gz, workers=1), pipeline.analyze(gz, workers=2)
    assert json.dumps(split_gz, sort_keys=True) == json.dumps(one_gz, sort_keys=True)


def test_a_batch_of_runtime_calls_only_is_summed_not_stored():
    sink = _Sink()
    sink.add(
        [
            LeanEvent(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", pid=1, tid=1, ts=1.0, dur=2.0),
            LeanEvent(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", pid=1, tid=1, ts=4.0, dur=3.0),
        ]
    )
    table = sink.build()
    assert len(table) == 0 and table.runtime == {"cudaLaunchKernel": [2, 5.0]}
