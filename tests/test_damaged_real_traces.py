"""Damaged copies of the real public traces (tests/data/real, issue #34): a cut anywhere, a flipped byte, bytes after
the document, a GPU trace cut before its first device event. Each damage is said in one warning naming the file,
where it is and what was kept; what is read is a lower bound of the undamaged file's numbers (never a
different quantity), and a GPU trace stays one whatever the damage left of it."""

import gzip
import json
import re
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from conftest import REAL, run_cli
from rlprof.analyze.window.breakdown import BUCKETS, Breakdown
from rlprof.analyze.window.per_file import analyze_file
from rlprof.analyze.inputs.readers.kineto import read_kineto

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# Kineto's own layout (read in chunks at its separators) and other writers' one-line layout (decoded whole,
# salvaged element by element when damaged)
KINETO = ("rocm_mi250_train", "cpu_only_rank34")
ONE_LINE = ("sglang_qwen3_8b_decode_mi300x", "compare_base")
BUSY = tuple(b for b in BUCKETS if b != "idle_ms")


@lru_cache(None)
def plain(name: str) -> bytes:
    return gzip.decompress((REAL / f"{name}.json.gz").read_bytes())


@lru_cache(None)
def whole(name: str) -> dict:
    res = analyze_file(REAL / f"{name}.json.gz", {})
    assert not res["input"]["partial"] and not res["warnings"]
    return res


def read(tmp_path, data: bytes, gz: bool = False):
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(data, 1) if gz else data)
    return path, analyze_file(path, {})


@lru_cache(None)
def whole_span(name: str) -> dict:
    """The undamaged file's buckets over its whole span (what an unmarked damaged read is one row of; the whole
    file itself may be marked: TraceLens' SGLang capture holds one vLLM-style execute annotation)."""
    trace = read_kineto(REAL / f"{name}.json.gz")
    t = trace.table
    lo, hi = t.span or (float(t.start.min()), float(t.end.max()))
    return Breakdown(t, trace.has_device).window(lo, hi)


def assert_lower_bound(res: dict, ref: dict, name: str | None = None) -> None:
    """Every bucket of each damaged row at most the undamaged file's (the same stage / unit row, or the whole span
    for an unmarked row); idle its lower bound (0), the rest unknown."""
    marked = {(r["stage"], r["unit"], r["index"]): r for r in ref["rows"]}
    for row in res["rows"]:
        key = (row["stage"], row["unit"], row["index"])
        if len(ref["rows"]) == 1:  # the undamaged file is one unmarked row
            full = ref["rows"][0]
        else:  # marked: the same stage / unit, or the whole span for a damaged read that lost the marks
            full = marked[key] if key in marked and row["stage"] is not None else whole_span(name)
        for bucket in BUCKETS:
            assert row[bucket] <= full[bucket] + 1e-9, (bucket, row[bucket], full[bucket])
        assert row["idle_ms"] == 0 and row["unknown_ms"] >= 0
        assert sum(row[b] for b in ("compute_ms", "comm_ms", "memcpy_ms", "unknown_ms")) == pytest.approx(
            row["wall_ms"]
        )
    assert res["input"]["events"] <= ref["input"]["events"]


def the_warning(res: dict, path) -> str:
    """The one warning of a damaged read: it names the file and the byte where the damage is."""
    (line,) = res["warnings"]
    assert line.startswith(f"{path}: ") and re.search(r"\bbyte \d+", line), line
    return line


@SETTINGS
@given(
    name=st.sampled_from(KINETO + ONE_LINE),
    fraction=st.floats(0.02, 0.9999),
    how=st.sampled_from(["plain", "gzip of the cut", "cut gzip"]),
)
def test_a_cut_anywhere_in_a_real_trace_is_said_once_and_reads_a_lower_bound(tmp_path, name, fraction, how):
    data, ref = plain(name), whole(name)
    if how == "cut gzip":  # the real .json.gz itself cut: the stream ends inside a deflate block
        raw = (REAL / f"{name}.json.gz").read_bytes()
        path = tmp_path / "t.json.gz"
        path.write_bytes(raw[: int(len(raw) * fraction)])
        res = analyze_file(path, {})
    else:
        cut = data[: int(len(data) * fraction)]
        assume(cut.strip() != data.strip())  # only the final newline gone: nothing is damaged
        path, res = read(tmp_path, cut, gz=how != "plain")
    if res["input"].get("error"):  # nothing was read before the cut: said, with where, never an empty window
        (line,) = res["warnings"]
        assert res["input"]["partial"] and line.startswith(f"{path}: ")
        assert "ends early" in line or "cut or corrupt" in line, line
        return
    assert res["input"]["partial"]
    line = the_warning(res, path)
    assert ("ends early" in line or "compressed stream is cut" in line) and "kept" in line
    assert_lower_bound(res, ref, name)
    if name.startswith(("rocm", "sglang")):  # their header says which devices ran: a GPU trace, cut anywhere
        assert res["input"]["device"] is True


def first_device_event(data: bytes) -> int:
    """Where the first event that is a device event or a runtime call starts: a cut there keeps none of them."""
    first = min(
        data.index(cat) for cat in (b'"cat": "kernel"', b'"cat": "cuda_runtime"', b'"cat": "gpu_memcpy"') if cat in data
    )
    return data.rfind(b"{", 0, first)


def without_device_properties(data: bytes) -> bytes:
    """HTA's NCCL rank with its header's deviceProperties emptied: its distributedInfo still says backend nccl."""
    start, end = data.index(b'"deviceProperties"'), data.index(b'"record_shapes"')
    return data[:start] + b'"deviceProperties": [],\n  ' + data[end:]


@pytest.mark.parametrize(
    "name,edit,sign",
    [
        ("gpu_nccl_rank0", None, "deviceProperties in its header"),
        ("gpu_nccl_rank0", without_device_properties, "distributedInfo backend nccl"),
        ("sglang_qwen3_8b_decode_mi300x", None, "deviceProperties in its header"),
        ("compare_base", None, "host calls such as nccl:all_reduce"),  # no header sign: its NCCL ranges say it
    ],
)
@pytest.mark.parametrize("gz", [False, True])
def test_a_gpu_trace_cut_before_its_first_device_event_stays_a_gpu_trace(tmp_path, name, edit, sign, gz):
    """Cut before its first kernel, copy and runtime call: its CPU operators are never counted as compute (the
    one-line SGLang trace read them as 47x the whole file's compute); compute, comm and copies are 0, a lower
    bound, and the one warning says why this is a GPU trace."""
    data = plain(name) if edit is None else edit(plain(name))
    path, res = read(tmp_path, data[: first_device_event(data)], gz)
    assert res["input"]["device"] is True and res["input"]["partial"] is True
    line = the_warning(res, path)
    assert f"the part read holds no device activity, but this is a GPU trace ({sign})" in line, line
    assert re.search(r"the \d+ events before it were kept", line), line
    for row in res["rows"]:  # the file, or its marked iteration (the SGLang capture holds one execute range)
        assert row["compute_ms"] == row["comm_ms"] == row["overlap_ms"] == row["memcpy_ms"] == 0
    assert_lower_bound(res, whole(name), name)


def test_a_cpu_trace_cut_stays_a_cpu_trace(tmp_path):
    """HTA's CPU-only rank (gloo, no deviceProperties) cut in its events: no device sign, so its collectives
    and operators are still the CPU buckets, a lower bound of the whole file's."""
    data = plain("cpu_only_rank34")
    path, res = read(tmp_path, data[: data.index(b'"ph": "X"', len(data) * 3 // 4)])
    assert res["input"]["device"] is False
    assert "GPU trace" not in the_warning(res, path)
    assert_lower_bound(res, whole("cpu_only_rank34"), "cpu_only_rank34")


def flipped(data: bytes, fraction: float) -> tuple[bytes, int]:
    at = min(int(len(data) * fraction), len(data) - 1)
    return data[:at] + bytes([data[at] ^ 0x55]) + data[at + 1 :], at


def is_json(data: bytes) -> bool:
    try:
        json.loads(data)
        return True
    except ValueError:
        return False


@SETTINGS
@given(
    name=st.sampled_from(("rocm_mi250_train", "sglang_qwen3_8b_decode_mi300x", "compare_base")),
    fraction=st.floats(0.0, 1.0),
)
def test_one_flipped_byte_in_a_plain_real_trace_is_said_and_reads_a_lower_bound(tmp_path, name, fraction):
    """A byte flipped so that the text is no longer JSON (a flip that leaves valid JSON is a different, valid
    trace: nothing can tell): the events around the damage are kept, one warning says where, every number is at
    most the whole file's, and a GPU trace stays one (the device rule applies to what was kept)."""
    bad, at = flipped(plain(name), fraction)
    assume(not is_json(bad))
    path, res = read(tmp_path, bad)
    ref = whole(name)
    if res["input"].get("error"):  # the flip broke the object before its events
        assert res["warnings"][0].startswith(f"{path}: ")
        return
    assert res["input"]["partial"]
    line = the_warning(res, path)
    assert "kept" in line or "the other events were read" in line
    assert_lower_bound(res, ref, name)
    if name != "compare_base":  # its header says nothing of devices; the others' does
        assert res["input"]["device"] is True


@pytest.mark.parametrize("fraction", [0.2, 0.35, 0.5])
def test_one_flipped_byte_in_a_real_gzip_trace_keeps_the_events_before_it_as_a_gpu_trace(tmp_path, fraction):
    """TraceLens' one-line SGLang trace as published (.json.gz), one byte of its deflate data flipped: what
    inflates before the damage is kept, and no device event among it makes it no CPU trace."""
    bad, _ = flipped((REAL / "sglang_qwen3_8b_decode_mi300x.json.gz").read_bytes(), fraction)
    path = tmp_path / "t.json.gz"
    path.write_bytes(bad)
    res = analyze_file(path, {})
    line = the_warning(res, path)
    assert "compressed stream is cut or corrupt" in line and "kept" in line
    assert res["input"]["partial"] and res["input"]["device"] is True
    assert_lower_bound(res, whole("sglang_qwen3_8b_decode_mi300x"), "sglang_qwen3_8b_decode_mi300x")


EXTRA = {"text": b"garbage after the end\n", "nuls": bytes(4096), "a second document": None}


@pytest.mark.parametrize("name", ["rocm_mi250_train", "sglang_qwen3_8b_decode_mi300x", "cpu_only_rank34"])
@pytest.mark.parametrize("extra", sorted(EXTRA))
@pytest.mark.parametrize("gz", [False, True])
def test_bytes_after_the_document_read_the_first_and_say_where_the_rest_begins(tmp_path, name, extra, gz):
    data, ref = plain(name), whole(name)
    more = EXTRA[extra] if EXTRA[extra] is not None else data
    path, res = read(tmp_path, data + more, gz)
    at = len(data) + len(more) - len(more.lstrip())
    line = the_warning(res, path)
    assert line.startswith(f"{path}: bytes after the end of the JSON document, from byte {at} "), line
    assert f"the first document was read whole, its {ref['input']['events']} events were kept" in line
    assert res["input"]["partial"] and res["input"]["events"] == ref["input"]["events"]
    assert res["input"]["device"] == ref["input"]["device"] and res["input"]["rank"] == ref["input"]["rank"]
    assert len(res["rows"]) == len(ref["rows"])
    for row, full in zip(res["rows"], ref["rows"]):  # row by row (the file, or its marked stage and units)
        assert {b: row[b] for b in BUSY} == pytest.approx({b: full[b] for b in BUSY})
        assert row["unknown_ms"] == pytest.approx(full["idle_ms"])  # a partial file: idle not known, its bound 0
    assert_lower_bound(res, ref, name)


def test_two_gzip_members_back_to_back_read_the_first_document(tmp_path):
    """`cat a.json.gz b.json.gz`: one gzip stream of two members, two documents."""
    raw = (REAL / "rocm_mi250_train.json.gz").read_bytes()
    path = tmp_path / "t.json.gz"
    path.write_bytes(raw + raw)
    res = analyze_file(path, {})
    data = plain("rocm_mi250_train")
    assert f"from byte {len(data) + 1} " in the_warning(res, path)  # the second document starts with a newline
    assert res["input"]["events"] == whole("rocm_mi250_train")["input"]["events"]


@pytest.mark.parametrize("parts", [2, 3, 7])
def test_a_second_document_ends_a_split_read_where_one_reader_ends(tmp_path, parts):
    """A plain file in Kineto's layout read in byte ranges: the range in which the first document ends stops
    the read there, as one reader stops; the ranges of the second document are not the trace's."""
    path = tmp_path / "t.json"
    data = plain("rocm_mi250_train")
    path.write_bytes(data * 3)
    one, split = read_kineto(path), read_kineto(path, map_ranges=map, parts=parts)
    assert len(one.table) == len(split.table) == len(read_kineto(REAL / "rocm_mi250_train.json.gz").table)
    assert (one.warnings, one.partial, one.bytes_read, one.meta) == (
        split.warnings,
        split.partial,
        split.bytes_read,
        split.meta,
    )
    assert one.partial and f"from byte {len(data) + 1} " in one.warnings[0]


@pytest.mark.parametrize("damaged", ["baseline", "new"])
def test_compare_says_per_side_that_a_side_is_partial_and_why(tmp_path, damaged):
    """The terminal output, compare.json and compare.html each say which side is partial and its file's warning."""
    name = "sglang_qwen3_8b_decode_mi300x"
    data = plain(name)
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: len(data) // 2])
    sides = {"baseline": REAL / f"{name}.json.gz", "new": REAL / f"{name}.json.gz", damaged: cut}
    out = tmp_path / "out"
    proc = run_cli("compare", "-d", sides["new"], "-bp", sides["baseline"], "-o", out)
    assert proc.returncode == 0, proc.stderr
    other = "new" if damaged == "baseline" else "baseline"
    note = f"{damaged} {cut} is partial: 1 of its 1 input(s) damaged or cut"
    assert note in proc.stdout and f"{other} " + str(sides[other]) + " is partial" not in proc.stdout
    assert re.search(rf"{damaged}: {re.escape(str(cut))}: trace ends early at byte \d+", proc.stdout.replace("\n", ""))
    doc = json.loads((out / "compare.json").read_text())
    assert doc[damaged]["partial"] is True and doc[other]["partial"] is False and doc[other]["partial_inputs"] == []
    (entry,) = doc[damaged]["partial_inputs"]
    assert entry["path"] == str(cut) and entry["why"].startswith(f"{cut}: trace ends early at byte")
    assert note in doc[damaged]["partial_note"]
    page = (out / "compare.html").read_text()
    assert '<ul class="partial">' in page and note in page and "trace ends early at byte" in page
    as_json = json.loads(run_cli("compare", "-d", sides["new"], "-bp", sides["baseline"], "--json").stdout)
    assert as_json[damaged]["partial_inputs"] == doc[damaged]["partial_inputs"]


@pytest.mark.parametrize("given", ["alone", "in a directory"])
def test_a_trace_whose_file_name_is_not_utf8_is_analysed_and_its_name_kept_in_json_and_csv(tmp_path, given):
    """Bytes ff fe in a file name (a Latin-1 host, a copied archive): analysed without a traceback; the name kept,
    escaped, in --json (read back, the same name) and in the CSV tables (as \\udcff\\udcfe)."""
    import csv
    import os
    import shutil

    name = os.fsdecode(b"rank0_\xff\xfe.json.gz")
    where = tmp_path / "run" if given == "in a directory" else tmp_path
    where.mkdir(exist_ok=True)
    shutil.copy(REAL / "cpu_only_rank34.json.gz", where / name)
    target = where if given == "in a directory" else where / name
    proc = run_cli("analyze", target, "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert [i["path"].rsplit("/", 1)[-1] for i in doc["inputs"]] == [name]
    assert {r["file"] for r in doc["rows"]} == {name} and doc["rows"]
    out = tmp_path / "tables"
    proc = run_cli("analyze", target, "-o", out)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    escaped = name.encode("utf-8", "backslashreplace").decode()
    with open(out / "inputs.csv", encoding="utf-8") as f:
        assert [r["path"].rsplit("/", 1)[-1] for r in csv.DictReader(f)] == [escaped]
    with open(out / "rows.csv", encoding="utf-8") as f:
        assert {r["file"] for r in csv.DictReader(f)} == {escaped}
    assert json.loads((out / "analysis.json").read_text())["inputs"][0]["path"].endswith(name)
