"""Real torch_npu output, text and db export, profiler levels 0-2, two ranks (MindStudio Insight's test data,
tests/data/ascend/SOURCES.md): rlprof's numbers against torch_npu's own step trace and msprof-analyze's, on every
collection. The references are read here with csv and sqlite3, independently of rlprof's readers."""

import csv
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from conftest import open_page, run_cli
from helpers import set_csv_cells
from rlprof.analyze.pipeline import analyze

LEVELS = ("level0", "level1", "level2")
TEXT = ("trace_view.json", "kernel_details.csv", "step_trace_time.csv")


def torch_npu_step_trace(collection: Path) -> dict[int, dict[str, float]]:
    """torch_npu's own step trace of a collection (step_trace_time.csv, else analysis.db StepTraceTime), in ms."""
    out = collection / "ASCEND_PROFILER_OUTPUT"
    if (out / "step_trace_time.csv").exists():
        with open(out / "step_trace_time.csv", newline="") as f:
            rows = [
                (r["Step"], r["Computing"], r["Communication(Not Overlapped)"], r["Overlapped"], r["Free"])
                for r in csv.DictReader(f)
            ]
    else:
        rows = (
            sqlite3.connect(out / "analysis.db")
            .execute("SELECT step, computing, communication_not_overlapped, overlapped, free FROM StepTraceTime")
            .fetchall()
        )
    keys = ("compute_ms", "comm_ms", "overlap_ms", "idle_ms")
    return {int(step): {k: float(v) / 1e3 for k, v in zip(keys, rest)} for step, *rest in rows}


def step_rows(doc: dict) -> dict[int, dict]:
    return {r["step"]: r for r in doc["rows"] if r["stage"] is None and r["unit"] is None}


def collections(root: Path) -> list[Path]:
    return sorted(root.glob("*/level*/rank*_ascend_pt"))


def test_every_real_collection_equals_torch_npus_own_step_trace(msinsight):
    """Computing, exposed and overlapped communication, free: per step, equal to what torch_npu wrote."""
    checked = []
    for collection in collections(msinsight):
        ref = torch_npu_step_trace(collection)
        doc = analyze(collection, workers=1)
        assert doc["inputs"][0]["export"] == collection.parts[-3] and not doc["warnings"], collection
        mine = step_rows(doc)
        assert set(mine) == set(ref), collection
        for step, theirs in ref.items():
            for bucket, value in theirs.items():
                assert mine[step][bucket] == pytest.approx(value, rel=1e-4, abs=1e-6), (collection, step, bucket)
            # wall is torch_npu's Stage (no hcom_receive here, so no bubble): the three buckets add up to it
            assert mine[step]["wall_ms"] == pytest.approx(
                theirs["compute_ms"] + theirs["comm_ms"] + theirs["idle_ms"], rel=1e-4
            )
        checked.append(collection)
    assert len(checked) == 12  # text and db x level0-2 x two ranks


@pytest.mark.parametrize("level", LEVELS)
def test_each_text_file_alone_gives_the_same_rows(msinsight, tmp_path, level):
    """trace_view.json alone (device tasks classified by task type), kernel_details.csv alone (CANN's op summary)
    and both together: one set of rows."""
    src = msinsight / "text" / level / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    rows = {}
    for keep in (TEXT, ("trace_view.json",), ("kernel_details.csv",)):
        out = tmp_path / "+".join(keep) / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
        out.mkdir(parents=True)
        for name in keep:
            shutil.copy(src / name, out)
        doc = analyze(out.parent, workers=1)
        assert not doc["warnings"], doc["warnings"]
        rows[keep] = step_rows(doc)[50]
    for keep, row in rows.items():  # kernel_details.csv prints durations to the ns, trace_view.json finer
        for bucket in ("wall_ms", "compute_ms", "comm_ms", "overlap_ms", "idle_ms"):
            assert row[bucket] == pytest.approx(rows[TEXT][bucket], rel=1e-5, abs=1e-6), (keep, bucket)


def test_text_operators_have_their_step_names_and_cpu_side(msinsight):
    """Operators per step (so compare and cluster match them), named by op type where the level records one and
    by task name at level0 (Type N/A), with the host's torch ops as in the db export."""
    for level in LEVELS:
        doc = analyze(msinsight / "text" / level / "rank0_ascend_pt", workers=1)
        kernels = [o for o in doc["ops"] if o["kind"] == "kernel"]
        assert kernels and all(o["step"] == 50 for o in kernels), level
        names = {o["name"] for o in kernels}
        assert "N/A" not in names and "hcom_N/A" not in names
        assert {c["name"] for c in doc["collectives"]} == {"hcom_allReduce_"}  # the call ids folded away
        assert sum(c["count"] for c in doc["collectives"]) == 4
        assert any(o["kind"] == "cpu_op" and o["name"] == "aten::conv2d" for o in doc["ops"])
        with open(
            msinsight / "text" / level / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", newline=""
        ) as f:
            types = {
                r["Type"] if r["Type"] != "N/A" else r["Name"]
                for r in csv.DictReader(f)
                if r["Accelerator Core"] != "HCCL"
            }
        assert names - {"hcom_allReduce_"} <= types and len(names) > 10


def test_compare_of_two_real_text_collections_matches_operators_as_the_db_pair_does(msinsight, tmp_path):
    matched = {}
    for export in ("text", "db"):
        runs = msinsight / export / "level1"
        out = tmp_path / export
        proc = run_cli("compare", "-d", runs / "rank1_ascend_pt", "-bp", runs / "rank0_ascend_pt", "-o", out)
        assert proc.returncode == 0, proc.stderr[-2000:]
        doc = json.loads((out / "compare.json").read_text())
        assert not doc["unmatched"] and [s["step"] for s in doc["stages"] if s.get("step") is not None]
        matched[export] = {(o["kind"], o["name"]) for o in doc["ops"] if o["status"] not in ("added", "removed")}
        assert {c["name"] for c in doc["collectives"]} == {"hcom_allReduce_"}
    assert matched["text"] == matched["db"]  # host ops and device operators alike
    assert {("kernel", "Conv2D"), ("kernel", "MatMulV2"), ("kernel", "hcom_allReduce_")} <= matched["text"]
    assert sum(k == "cpu_op" for k, _ in matched["text"]) > 20


def test_buckets_agree_with_msprof_analyze_on_real_pairs(msprof, msinsight):
    """msprof-analyze's OverallMetrics (Computing, Uncovered Communication, Free, E2E) of a real text pair and a real
    db pair, within 1% of rlprof's. Its text mode reads the exporter's Overlap Analysis lanes (the step trace's
    span: rlprof's device_totals); its db mode runs E2E from the first device task of any kind (the step's input
    copies before the first operator too: rlprof's device_totals_all_tasks)."""
    for export, totals in (("text", "device_totals"), ("db", "device_totals_all_tasks")):
        base, new = (msinsight / export / "level1" / f"rank{r}_ascend_pt" for r in (0, 1))
        ref = msprof.overall(base, new)
        for side, collection in (("base", base), ("new", new)):
            mine = analyze(collection, workers=1)["inputs"][0][totals]
            mine = {
                "Computing Time": mine["compute_ms"],
                "Uncovered Communication Time": mine["comm_ms"],
                "Free Time": mine["idle_ms"],
                "E2E Time": mine["wall_ms"],
            }
            for metric, theirs in ref[side].items():
                assert mine[metric] == pytest.approx(theirs, rel=0.01), (export, side, metric)


def test_analyze_cluster_and_report_a_real_two_rank_text_run(msinsight, tmp_path, browser):
    run = tmp_path / "profiler_data"
    shutil.copytree(msinsight / "text" / "level1", run)
    proc = run_cli("analyze", run, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert sorted((r["rank"], r["step"]) for r in doc["rows"]) == [(0, 50), (1, 50)]
    assert {(o["rank"], o["step"]) for o in doc["ops"] if o["kind"] == "kernel"} == {(0, 50), (1, 50)}
    proc = run_cli("cluster", run, "-o", tmp_path / "c")
    assert proc.returncode == 0, proc.stderr[-2000:]
    cluster = json.loads((tmp_path / "c" / "cluster.json").read_text())
    assert {r["rank"] for r in cluster["ranks"]} == {0, 1}
    proc = run_cli("report", run, "-o", tmp_path / "report.html")
    assert proc.returncode == 0, proc.stderr[-2000:]
    page, seen = open_page(browser, tmp_path / "report.html")
    page.wait_for_timeout(500)
    assert seen["errors"] == [] and seen["dialogs"] == []
    assert [u for u in seen["requests"] if not u.startswith(("file:", "data:", "blob:", "about:"))] == []
    text = page.inner_text("body")
    assert "hcom_allReduce_" in text and "Conv2D" in text
    page.close()


@pytest.mark.parametrize("damage", ["bad-durations", "cut-csv"])
def test_damaged_kernel_details_is_a_lower_bound_marked_partial(msinsight, tmp_path, damage):
    """Rows dropped for values that are no time, or lost to a cut: one warning naming the file, finite numbers,
    partial, and every bucket of computing no more than the whole file's (never a different quantity)."""
    src = msinsight / "text" / "level1" / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    out = tmp_path / "r_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    shutil.copy(src, out)
    whole = analyze(out.parent, workers=1)
    kept = len(whole_rows := list(csv.DictReader(open(src, newline=""))))
    if damage == "bad-durations":
        set_csv_cells(out / "kernel_details.csv", "Duration(us)", {5: "NaN", 6: "-500", 7: "1e300"})
        kept -= 3
    else:
        text = src.read_bytes()
        (out / "kernel_details.csv").write_bytes(text[: text.index(b"\n", len(text) // 2) + 40])
        kept = len(list(csv.reader(open(out / "kernel_details.csv", newline="")))) - 2  # header, the cut row
    doc = analyze(out.parent, workers=1)
    json.dumps(doc, allow_nan=False)  # finite
    (warning,) = doc["warnings"]
    assert str(out / "kernel_details.csv") in warning and doc["partial"] and doc["inputs"][0]["partial"]
    # every row kept is one operator or collective (collectives are the kernel ops named hcom_*)
    assert sum(o["count"] for o in doc["ops"] if o["kind"] == "kernel") == kept < len(whole_rows)
    for bucket in ("compute_ms", "comm_ms"):
        assert doc["rows"][0][bucket] <= whole["rows"][0][bucket] + 1e-9, bucket
