"""docs/bad_input.md, row by row: the table is the test's list, so the two cannot drift apart."""

import gzip
import json
import socket
import shutil
import sqlite3

import pytest

from conftest import REAL, ROOT, run_cli, unpack_msinsight
from helpers import set_csv_cells

DOC = ROOT / "docs" / "bad_input.md"
ASCEND = ROOT / "tests" / "data" / "ascend" / "mindspeed" / "profiler_data"


def table_rows() -> list[dict]:
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] not in ("id", "---"):
            rows.append({"id": cells[0], "says": cells[3], "exit": int(cells[4])})
    return rows


def _events(n=3):
    return [
        {"ph": "X", "cat": "cpu_op", "name": f"op{k}", "pid": 1, "tid": 1, "ts": 10 * k, "dur": 5} for k in range(n)
    ]


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return path


ONE_LINE = "sglang_qwen3_8b_decode_mi300x.json.gz"  # TraceLens' real SGLang decode trace: one line, not Kineto's layout


def _plain(name: str) -> bytes:
    return gzip.decompress((REAL / name).read_bytes())


def _before_first_device_event(data: bytes) -> int:
    """Where the first event that is a device event or a runtime call starts (a cut there keeps none)."""
    first = min(data.index(cat) for cat in (b'"cat": "kernel"', b'"cat": "cuda_runtime"', b'"cat": "gpu_memcpy"'))
    return data.rfind(b'{"ph"', 0, first)


KERNEL_VALUE = {
    "nan-literal": ("ts", "NaN"),
    "wrong-type-dur": ("dur", "[1]"),
    "ts-far-apart": ("ts", "-5"),
    "day-long-dur": ("dur", "1e12"),
}


def build(case: str, tmp) -> list:
    """The command line for one row of the table."""
    f = tmp / "t.json"
    if case == "missing-path":
        return ["analyze", tmp / "nothing-here"]
    if case == "empty-file":
        f.write_text("")
        return ["analyze", f]
    if case == "not-json":
        f.write_text("hello, this is not a trace")
        return ["analyze", f]
    if case == "no-trace-events":
        return ["analyze", _write(f, {"schemaVersion": 1, "events": []})]
    if case == "no-events":
        return ["analyze", _write(f, {"schemaVersion": 1, "traceEvents": []})]
    if case == "empty-dir":
        (tmp / "d").mkdir()
        return ["analyze", tmp / "d"]
    if case == "cut-gzip":
        cut = tmp / "cut.json.gz"
        cut.write_bytes((REAL / "gpu_nccl_rank0.json.gz").read_bytes()[:300_000])
        return ["analyze", cut, "--json"]
    if case == "bad-times":
        bad = [
            {"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1, "tid": 1, "ts": ts, "dur": dur}
            for ts, dur in (("NaN", 1), ("soon", 1), (5, -3), (1e300, 1))
        ]
        return ["analyze", _write(f, {"traceEvents": _events() + bad}), "--json"]
    if case in KERNEL_VALUE:  # one kernel of a real trace given a bad value, written as the JSON text shown
        field, text = KERNEL_VALUE[case]
        doc = json.loads(gzip.decompress((REAL / "gpu_nccl_rank0.json.gz").read_bytes()))
        kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
        kernel[field] = "@@VALUE@@"
        f.write_bytes(json.dumps(doc).replace('"@@VALUE@@"', text).encode())
        return ["analyze", f, "--json"]
    if case == "not-an-object":
        return ["analyze", _write(f, {"traceEvents": _events() + [7]}), "--json"]
    if case == "deep-args":
        f.write_text(
            json.dumps({"traceEvents": _events() + ["@@DEEP@@"]}).replace(
                '"@@DEEP@@"',
                '{"ph": "X", "cat": "cpu_op", "name": "deep", "pid": 1, "tid": 1, "ts": 40, "dur": 2, '
                '"args": ' + "[" * 5000 + "]" * 5000 + "}",
            )
        )
        return ["analyze", f, "--json"]
    if case == "gzip-flipped-one-line":
        data = bytearray((REAL / ONE_LINE).read_bytes())
        data[len(data) // 5] ^= 0x55
        gz = tmp / "t.json.gz"
        gz.write_bytes(bytes(data))
        return ["analyze", gz, "--json"]
    if case.startswith("gzip-flipped-"):
        data = bytearray((REAL / "gpu_nccl_rank0.json.gz").read_bytes())
        data[{"trailer": -8, "block": len(data) // 2, "header": 3}[case.rsplit("-", 1)[1]]] ^= 0x55
        gz = tmp / "t.json.gz"
        gz.write_bytes(bytes(data))
        return ["analyze", gz] + (["--json"] if not case.endswith("header") else [])
    if case == "cut-gpu-trace":
        data = gzip.decompress((REAL / "gpu_nccl_rank0.json.gz").read_bytes())
        f.write_bytes(data[: data.index(b'"cat": "kernel"')])
        return ["analyze", f, "--json"]
    if case == "cut-at-an-event":  # just after an event's comma: the text ends where another element could start
        data = _plain(ONE_LINE)
        f.write_bytes(data[: data.index(b"}, {", len(data) // 2) + 3])
        return ["analyze", f, "--json"]
    if case == "cut-after-events":  # in the keys Kineto writes after its events (the time base)
        data = _plain("rocm_mi250_train.json.gz")
        f.write_bytes(data[: data.index(b'"baseTimeNanoseconds"') + 10])
        return ["analyze", f, "--json"]
    if case == "cut-gpu-one-line":
        data = _plain(ONE_LINE)
        f.write_bytes(data[: _before_first_device_event(data)])
        return ["analyze", f, "--json"]
    if case == "flipped-byte-plain":  # the quote before an event's phase, before the first runtime call
        data = bytearray(_plain(ONE_LINE))
        data[data.index(b'"ph": "X"', len(data) // 5) + 6] ^= 0x55
        f.write_bytes(bytes(data))
        return ["analyze", f, "--json"]
    if case == "trailing-bytes":
        f.write_bytes(_plain("rocm_mi250_train.json.gz") + b"garbage after the end")
        return ["analyze", f, "--json"]
    if case == "two-documents":
        f.write_bytes(_plain(ONE_LINE) * 2)
        return ["analyze", f, "--json"]
    if case == "compare-partial-side":
        data = _plain(ONE_LINE)
        f.write_bytes(data[: len(data) // 2])
        return ["compare", "-d", REAL / ONE_LINE, "-bp", f, "--json"]
    if case == "not-a-trace-array":
        f.write_text(
            json.dumps(
                [
                    {"file": "a.json", "batch_size": 4, "mode": "train"},
                    {"file": "b.json", "batch_size": 8, "mode": "eval"},
                ]
            )
        )
        return ["analyze", f]
    if case in ("dangling-link", "same-rank-twice"):
        run = tmp / "run"
        run.mkdir()
        shutil.copy(REAL / "gpu_nccl_rank0.json.gz", run / "rank0.json.gz")
        if case == "dangling-link":
            (run / "rank1.json.gz").symlink_to(tmp / "gone" / "rank1.json.gz")
        else:
            shutil.copy(REAL / "gpu_nccl_rank0.json.gz", run / "rank0_copy.json.gz")
        return ["analyze", run, "--json"]
    if case == "unknown-categories":
        odd = [{**e, "cat": "Mystery"} for e in _events(5)]
        return ["analyze", _write(f, {"traceEvents": odd + _events(1)}), "--json"]
    if case == "missing-window":
        run = tmp / "run"
        run.mkdir()
        _write(run / "a.json", {"traceEvents": _events()})
        rows = [
            {"path": "a.json", "step": 1, "role": "actor", "stage": "e2e", "rank": 0, "status": "complete"},
            {"path": "gone.json", "step": 2, "role": "actor", "stage": "e2e", "rank": 0, "status": "complete"},
        ]
        (run / "manifest.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
        return ["analyze", run, "--json"]
    if case == "truncated-db":
        src = next((ASCEND / "integrated").glob("node0_4101_*_ascend_pt"))
        shutil.copytree(src, tmp / "run" / src.name)
        db = next((tmp / "run").rglob("*.db"))
        db.write_bytes(db.read_bytes()[: db.stat().st_size // 3])
        for extra in (tmp / "run").rglob("analysis.db"):
            extra.unlink()
        return ["analyze", tmp / "run"]
    if case.startswith("ascend-") and case != "ascend-backwards-tasks":
        real = unpack_msinsight(tmp, "pytorch/text/level1/rank0_ascend_pt/") / "text" / "level1"
        out = real / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
        if case == "ascend-bad-durations":
            set_csv_cells(out / "kernel_details.csv", "Duration(us)", {5: "NaN", 6: "-500", 7: "1e300"})
        elif case == "ascend-bad-view-times":
            events = json.loads((out / "trace_view.json").read_text())
            device = {e["pid"] for e in events if e.get("ph") == "M" and e["args"].get("name") == "Ascend Hardware"}
            tasks = [e for e in events if e.get("ph") == "X" and e["pid"] in device]
            for e, (key, value) in zip(tasks[10:], (("dur", "NaN"), ("dur", -500), ("dur", 1e300), ("ts", "soon"))):
                e[key] = value
            (out / "trace_view.json").write_text(json.dumps(events))
        else:
            (out / "trace_view.json").unlink()
            text = (out / "kernel_details.csv").read_bytes()
            (out / "kernel_details.csv").write_bytes(text[: len(text) // 2])
        return ["analyze", real, "--json"]
    if case == "ascend-backwards-tasks":
        real = unpack_msinsight(tmp, "pytorch/db/level1/rank0_ascend_pt/") / "db" / "level1"
        db = sqlite3.connect(next(real.rglob("ascend_pytorch_profiler_0.db")))
        db.execute("UPDATE TASK SET endNs = startNs - 1000 WHERE rowid IN (SELECT rowid FROM TASK LIMIT 3 OFFSET 40)")
        db.commit()
        db.close()
        return ["analyze", real, "--json"]
    if case == "unparsed-ascend":
        shutil.copytree(ASCEND / "actor_update", tmp / "raw")
        return ["analyze", tmp / "raw"]
    if case == "bad-config-key":
        return ["plan", "global_profiler.tool=torch", "global_profiler.steps=[0]"]
    if case == "bad-budget":
        _write(f, {"traceEvents": _events()})
        return ["advise", f, "--budget", "lots"]
    if case == "ray-unreachable":
        with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return ["analyze", _write(f, {"traceEvents": _events()}), "--ray"], {"RAY_ADDRESS": f"127.0.0.1:{port}"}
    if case == "bad-model":
        return ["analyze", _write(f, {"traceEvents": _events()}), "--model", _write(tmp / "c.json", {"hidden_size": 8})]
    raise AssertionError(f"docs/bad_input.md row {case!r} has no input builder in this test")


def test_the_table_is_there():
    assert len(table_rows()) >= 12


@pytest.mark.parametrize("row", table_rows(), ids=lambda r: r["id"])
def test_bad_input_row(tmp_path, row):
    cmd, env = build(row["id"], tmp_path), None
    if isinstance(cmd, tuple):  # (arguments, environment)
        cmd, env = cmd
    proc = run_cli(*cmd, env=env)
    assert proc.returncode == row["exit"], (proc.returncode, proc.stderr[-1500:])
    assert "Traceback" not in proc.stderr
    if row["exit"] == 2:
        (line,) = proc.stderr.strip().splitlines()
        assert row["says"] in line, line
    else:

        def refuse(constant):
            raise AssertionError(f"non-finite number in the output: {constant}")

        doc = json.loads(proc.stdout, parse_constant=refuse)
        said = doc["warnings"] + [doc[side].get("partial_note") or "" for side in ("baseline", "new") if side in doc]
        assert any(row["says"] in w for w in said), said


def test_truncated_db_case_really_is_damaged(tmp_path):
    """The truncated-db row's input is what it says: sqlite refuses it."""
    build("truncated-db", tmp_path)
    db = next((tmp_path / "run").rglob("*.db"))
    with pytest.raises(sqlite3.DatabaseError):
        sqlite3.connect(db).execute("SELECT COUNT(*) FROM TASK").fetchall()
