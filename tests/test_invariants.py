"""Invariants across the analysis document, on every input the tests have: the recorded CPU runs, rlprof's trainer
recorded on an H100, the real public traces and the frameworks' own output. One quantity computed in two places must
never disagree (a stage row once read 13.6 ms launch-bound where its units held 654.5): so each is recomputed here, by
code of this module's own, from what it is made of.

- a stage row made from its units is, field by field, their aggregate (sum, earliest start, span, union);
- every row's buckets fill its wall: compute + comm + memcpy + idle (+ the time a damaged file no longer says) = wall,
  overlap inside compute;
- a device row's gap and launch-bound time, and each file's launch record, equal the device's idle gaps recomputed
  from the file's events (one brute-force pass over them, not the analysis's prefix sums);
- each measure recomputes from the rows it names, and each finding's numbers are its measure's (a cause found in
  several stages: each stage's);
- each row's speed of light recomputes from its work and its window's device, the gap's parts sum to the gap, a stage
  row's work is its units', and no predicted saving brings a stage below its speed-of-light time.
"""

import math
import re
import shutil
import statistics
from collections import defaultdict

import numpy as np
import pytest

from conftest import DATA, REAL
from data_inputs import analysable_inputs
from rlprof.analyze import document as assembly
from rlprof.analyze.diagnosis.causes import CAUSES, THRESHOLDS
from rlprof.analyze.diagnosis.measures import TAIL_ACTIVE
from rlprof.analyze.pipeline import analyze
from rlprof.analyze.inputs.readers.kineto import read_kineto
from rlprof.analyze.result import Row
from rlprof.analyze.tables.table import DEVICE_KINDS
from rlprof.report.charts import timeline

BUCKETS = ("compute_ms", "comm_ms", "memcpy_ms", "idle_ms")
INPUTS = analysable_inputs()


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """Each input's analysis document, made once from a copy (analysis writes nothing into tests/data)."""
    root = tmp_path_factory.mktemp("inputs")
    made: dict[str, tuple] = {}

    def document(name: str):
        if name not in made:
            source = REAL / name.split("/", 1)[1] if name.startswith("real/") else DATA / name
            copy = root / name.replace("/", "__")
            (shutil.copytree if source.is_dir() else shutil.copy)(source, copy)
            made[name] = (analyze(copy, workers=1), copy)
        return made[name]

    return document


def close(a, b, rel=1e-6, abs_ms=1e-6) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_ms)


# ---- a stage row made from its units ---------------------------------------------------------------------------------
SUMMED = ("wall_ms", *BUCKETS, "overlap_ms", "unknown_ms", "device_gap_ms", "launch_bound_ms", "launch_unlinked_ms")


def _units_of(doc: dict, row: dict) -> list[dict]:
    key = ("step", "role", "stage", "rank", "replica")
    return [r for r in doc["rows"] if r["unit"] is not None and all(r[k] == row[k] for k in key)]


@pytest.mark.parametrize("name", INPUTS)
def test_a_stage_row_made_from_units_is_their_aggregate_field_by_field(documents, name):
    doc, _ = documents(name)
    for row in (r for r in doc["rows"] if r.get("units_only")):
        units = _units_of(doc, row)
        assert len(units) == row["units_only"], row
        for k in SUMMED:
            if any(k in u for u in units):
                assert close(row[k], sum(u.get(k, 0.0) for u in units)), (name, k)
        assert row.get("unlinked_events", 0) == sum(u.get("unlinked_events", 0) for u in units)
        assert row["start_us"] == min(u["start_us"] for u in units)
        hosts = [u for u in units if u.get("host_start_us") is not None]
        if hosts:  # the host lane: first unit's host start to last unit's host end
            assert row["host_start_us"] == min(u["host_start_us"] for u in hosts)
            end = max(u["host_start_us"] + u["host_wall_ms"] * 1e3 for u in hosts)
            assert close(row["host_start_us"] + row["host_wall_ms"] * 1e3, end, abs_ms=1e-3)
        devices = [u["device_start_us"] for u in units if u.get("device_start_us") is not None]
        if devices:
            assert row["device_start_us"] == min(devices)
        if any(u.get("attribution") for u in units):
            mixed = any(u.get("attribution") == "launch+time" for u in units)
            assert row["attribution"] == ("launch+time" if mixed else "launch")
        for k in ("ops_sig", "device_overlap_next_ms", "seqs", "active", "tokens", "index"):
            assert row.get(k) is None, (name, k)  # a unit's own: not the stage's


def test_every_field_of_a_row_has_its_rule_when_assembled():
    """A field added to Row must say how a stage row made from units takes it (document.py), or the bug returns:
    the first unit's value standing for the stage."""
    ruled = set(assembly.KEY) | set(assembly.SUMMED) | set(assembly.EARLIEST) | set(assembly.NOT_CARRIED)
    ruled |= set(assembly.ALIKE)
    ruled |= set(assembly.MERGED)  # the units' idle frames, summed frame by frame (analyze/window/idle_frames.py)
    ruled |= {"host_wall_ms", "attribution", "units_only"} | set(assembly.NAMED_AFTER) | set(assembly.AFTERWARDS)
    assert set(Row.__struct_fields__) == ruled


def test_the_h100_decode_window_stage_row_holds_its_units_launch_bound_time(documents):
    """The issue's case: 20 decode steps of a launch-bound rollout, one file; the stage row had the first step's
    13.6 ms where the steps held hundreds."""
    doc, _ = documents("h100/discrete-windows")
    (stage,) = [r for r in doc["rows"] if r["stage"] == "rollout_generate" and r["unit"] is None]
    units = _units_of(doc, stage)
    assert len(units) == 20 and stage["launch_bound_ms"] > 10 * max(u["launch_bound_ms"] for u in units)
    (launch,) = [x for x in doc["launch"] if x["stage"] == "rollout_generate"]
    assert stage["launch_bound_ms"] <= launch["launch_bound_ms"] and stage["launch_bound_ms"] > 0.9 * stage["idle_ms"]
    # the report's host lane draws the stage from its first unit's host start to its last unit's host end
    (hosts,) = [t for t in timeline(doc)["data"] if t["name"] == "host range"]
    (bar,) = [x for x, c in zip(hosts["x"], hosts["customdata"]) if c[2] == "rollout_generate"]
    first, last = min(units, key=lambda u: u["host_start_us"]), max(units, key=lambda u: u["host_start_us"])
    assert bar == pytest.approx((last["host_start_us"] + last["host_wall_ms"] * 1e3 - first["host_start_us"]) / 1e3)
    assert bar > 15 * units[0]["host_wall_ms"]  # not one decode step's sliver
    # and the diagnosis names it: launch-bound, rollout first, with a lever in every dialect, rlprof's trainer's too
    (found,) = [f for f in doc["findings"] if f["kind"] == "launch_bound"]
    assert (found["role"], found["stage"]) == ("rollout", "rollout_generate")
    rollout_keys = {d: [lv["key"] for lv in lvs] for d, lvs in found["levers"].items()}
    assert "rollout.engine" in rollout_keys["rlprof"] and set(rollout_keys) == {"verl", "mindspeed", "rlprof"}


# ---- the buckets fill the wall ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", INPUTS)
def test_buckets_add_up_to_the_wall_on_every_row(documents, name):
    doc, _ = documents(name)
    assert doc["rows"] or not any(i.get("kind") == "kineto" for i in doc["inputs"])
    for r in doc["rows"]:
        parts = sum(r[b] for b in BUCKETS) + r.get("unknown_ms", 0.0)
        assert close(parts, r["wall_ms"], rel=1e-6, abs_ms=1e-6), (name, r)
        assert all(r[b] >= -1e-9 for b in (*BUCKETS, "overlap_ms")), (name, r)
        assert r["overlap_ms"] <= r["compute_ms"] + 1e-9, (name, r)  # communication under compute: inside compute
        if "device_gap_ms" in r:  # the device's gaps lie in what the row's own work left idle
            assert r["launch_bound_ms"] <= r["device_gap_ms"] + 1e-9
            assert r["device_gap_ms"] <= r["idle_ms"] + r.get("unknown_ms", 0.0) + 1e-6, (name, r)


# ---- the device's gaps, recomputed from the file -------------------------------------------------------------------
def _gaps(path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, launched after the gap began, launch unknown) of every stretch where no device event of the file
    runs, between its first and its last: one pass over the device events in start order."""
    t = read_kineto(path).table
    device = np.flatnonzero(np.isin(t.kind, DEVICE_KINDS))
    device = device[np.argsort(t.start[device], kind="stable")]
    lo, hi, bound, unknown = [], [], [], []
    busy_until = None
    for i in device:
        s, e = float(t.start[i]), float(t.end[i])
        if busy_until is not None and s > busy_until:
            issued = float(t.launch[i]) if t.launch is not None else math.nan
            lo.append(busy_until)
            hi.append(s)
            bound.append(not math.isnan(issued) and issued > busy_until)
            unknown.append(math.isnan(issued))
        busy_until = e if busy_until is None else max(busy_until, e)
    return np.array(lo), np.array(hi), np.array(bound, bool), np.array(unknown, bool)


def _inside(gaps, a: float, b: float) -> tuple[float, float, float]:
    lo, hi, bound, unknown = gaps
    part = np.clip(np.minimum(hi, b) - np.maximum(lo, a), 0.0, None)
    return float(part.sum()) / 1e3, float(part[bound].sum()) / 1e3, float(part[unknown].sum()) / 1e3


@pytest.mark.parametrize("name", INPUTS)
def test_each_rows_and_each_files_device_gaps_are_the_files_own(documents, name):
    doc, copy = documents(name)
    checked = 0
    for launch in doc["launch"]:
        if "device_gap_ms" not in launch:
            continue
        path = next(copy.rglob(launch["file"])) if copy.is_dir() else copy
        gaps = _gaps(path)
        lo = min(gaps[0], default=0.0)
        span = (lo, lo + launch["device_span_ms"] * 1e3) if len(gaps[0]) else (0.0, 0.0)
        whole = _inside(gaps, *span) if len(gaps[0]) else (0.0, 0.0, 0.0)
        # the file's gaps all lie inside its device span: its record is their total
        assert close(launch["device_gap_ms"], float((gaps[1] - gaps[0]).sum()) / 1e3, rel=1e-6, abs_ms=1e-6)
        assert close(launch["launch_bound_ms"], float((gaps[1] - gaps[0])[gaps[2]].sum()) / 1e3, abs_ms=1e-6)
        assert whole[0] <= launch["device_gap_ms"] + 1e-6
        for r in (r for r in doc["rows"] if r.get("file") == launch["file"] and "device_gap_ms" in r):
            gap, bound, unknown = _inside(gaps, r["start_us"], r["start_us"] + r["wall_ms"] * 1e3)
            assert close(r["device_gap_ms"], gap, abs_ms=1e-6), (name, r)
            assert close(r["launch_bound_ms"], bound, abs_ms=1e-6), (name, r)
            assert close(r["launch_unlinked_ms"], unknown, abs_ms=1e-6), (name, r)
            checked += 1
    assert checked or not any(i.get("device") and i.get("kind") == "kineto" for i in doc["inputs"]) or not doc["launch"]


# ---- measures from their rows, findings from their measures --------------------------------------------------------
def _stage_rows(doc):
    return [r for r in doc["rows"] if r["unit"] is None]


def _passes(rows) -> int:
    return len({(r["step"], r["rank"], r["replica"], r["file"]) for r in rows}) or 1


def _means(doc) -> dict:
    """(role, stage) -> each bucket's mean per step and rank (a stage twice in a step counts twice)."""
    per = defaultdict(list)
    for r in _stage_rows(doc):
        per[(r["role"], r["stage"])].append(r)
    out = {}
    for key, rows in per.items():
        ranks = {r["replica"] if r["role"] == "rollout" and r["replica"] is not None else r["rank"] for r in rows}
        n = len({r["step"] for r in rows}) * len(ranks)
        out[key] = {b: sum(r[b] for r in rows) / n for b in ("wall_ms", *BUCKETS)}
    return out


def _recomputed(doc, m: dict) -> dict:
    """The measure `m` names, recomputed here from the rows (or memory records) it names."""
    role, stage = m["role"], m["stage"]
    means = _means(doc)
    if m["measure"] == "launch_bound":
        rows = [r for r in _stage_rows(doc) if (r["role"], r["stage"]) == (role, stage) and "launch_bound_ms" in r]
        wall = sum(r["wall_ms"] for r in rows)
        return {
            "value": sum(r["launch_bound_ms"] for r in rows) / wall,
            "launch_bound_ms": sum(r["launch_bound_ms"] for r in rows) / _passes(rows),
            "device_gap_ms": sum(r["device_gap_ms"] for r in rows) / _passes(rows),
            "wall_ms": wall / _passes(rows),
        }
    units = [r for r in doc["rows"] if (r["role"], r["stage"]) == (role, stage)]
    if m["measure"] == "rollout_tail":
        held = [u for u in units if u["unit"] == "decode_step" and u.get("active") is not None and u.get("seqs")]
        tail = sum(u["wall_ms"] for u in held if u["active"] < TAIL_ACTIVE * u["seqs"])
        total = sum(u["wall_ms"] for u in held)
        return {"value": tail / total if total else 0.0, "tail_ms": tail / _passes(held)}
    if m["measure"] == "padding":
        held = [u for u in units if u["unit"] == "micro_batch" and u.get("tokens") and u.get("real_tokens") is not None]
        return {"value": 1 - sum(u["real_tokens"] for u in held) / sum(u["tokens"] for u in held)}
    if m["measure"] == "fixed_cost":  # least squares, again over the units not slowed 3 robust deviations above it
        held = [u for u in units if u["unit"] == "micro_batch" and u.get("tokens")]
        x = np.array([u["tokens"] for u in held], float)
        y = np.array([u["wall_ms"] for u in held], float)

        def line(keep):
            return np.linalg.lstsq(np.stack([x[keep], np.ones(int(keep.sum()))], 1), y[keep], rcond=None)[0]

        keep = np.ones(len(x), bool)
        slope, intercept = line(keep)
        if m["fit"] == "quickest":  # a busy machine's window: again over the units on or below the line, 3 times
            busy = {i["path"].rsplit("/", 1)[-1] for i in doc["inputs"] if i.get("run_wait_ms") is not None}
            assert sum(u["file"] in busy for u in held) * 2 > len(held)
            for _ in range(3):
                lower = keep & (y <= intercept + slope * x)
                if lower.sum() < 6 or len(set(x[lower])) < 3:
                    break
                keep = lower
                slope, intercept = line(keep)
        else:
            r = y - (intercept + slope * x)
            mad = np.median(np.abs(r - np.median(r)))
            trimmed = r <= np.median(r) + 3 * 1.4826 * mad if mad > 0 else keep
            if trimmed.sum() >= 6 and len(set(x[trimmed])) >= 3:
                keep = trimmed
                slope, intercept = line(keep)
        if slope < 0:  # within its noise (else not measurable): no per-token part
            slope, intercept = 0.0, y[keep].mean()
        elif intercept < 0:
            slope, intercept = (x[keep] @ y[keep]) / (x[keep] @ x[keep]), 0.0
        return {"value": intercept / y[keep].mean(), "fixed_ms": intercept, "per_token_us": slope * 1e3}
    if m["measure"] in ("reward_share", "weight_sync_share"):
        step = sum(v["wall_ms"] for k, v in means.items() if k[1] is not None)
        return {"value": means[(role, stage)]["wall_ms"] / step, "stage_ms": means[(role, stage)]["wall_ms"]}
    if m["measure"] == "recompute":
        get = lambda s: sum(v["wall_ms"] for k, v in means.items() if k[1] == s)  # noqa: E731
        return {"value": (get("ref_compute_log_prob") + get("actor_compute_log_prob")) / get("actor_update")}
    if m.get("basis") == "samples" or m["measure"] in ("tool_share", "preempted_share", "queue_share"):
        return _from_samples(doc, m)
    if m["measure"] in ("outside_share", "refill_share"):
        return _from_account(doc, m)
    if m["measure"] == "memory_use":
        (mem,) = [x for x in doc["memory"] if x.get("file") == m["file"] and x.get("rank") == m["rank"]]
        return {"value": mem["peak_bytes"] / mem["capacity_bytes"]}
    raise AssertionError(f"a measure this test does not recompute: {m['measure']}")


def _from_samples(doc, m: dict) -> dict:
    """A measure made from the rollout's samples, recomputed from the samples alone."""
    samples = doc["samples"]
    timed = [r for r in samples if "start_us" in r and "end_us" in r]
    if m["measure"] == "rollout_tail":
        spans = [_brute_tail([r for r in timed if r["step"] == step]) for step in sorted({r["step"] for r in timed})]
        return {"value": sum(t for _, t in spans) / sum(s for s, _ in spans)}
    if m["measure"] == "preempted_share":
        known = [r for r in samples if "preemptions" in r]
        return {"value": sum(r["preemptions"] > 0 for r in known) / len(known)}
    if m["measure"] == "queue_share":
        waited = [r for r in timed if "queue_ms" in r]
        queue = sum(r["queue_ms"] for r in waited)
        return {"value": queue / (queue + sum((r["end_us"] - r["start_us"]) / 1e3 for r in waited))}
    slowest = [
        max((r for r in timed if r["step"] == st), key=lambda r: r["end_us"] - r["start_us"])
        for st in {r["step"] for r in timed}
    ]
    slowest = [r for r in slowest if "tool_ms" in r]
    return {"value": sum(r["tool_ms"] for r in slowest) / sum((r["end_us"] - r["start_us"]) / 1e3 for r in slowest)}


def _generation_ms(samples: list[dict]) -> dict:
    """step -> its samples' generation (each pass's first start to last end, summed over the passes), ms."""
    spans: dict = defaultdict(lambda: defaultdict(list))
    for r in samples:
        if "start_us" in r and "end_us" in r:
            spans[r["step"]][r.get("rollout_pass", 0)].append(r)
    return {
        step: sum((max(r["end_us"] for r in p) - min(r["start_us"] for r in p)) / 1e3 for p in passes.values())
        for step, passes in spans.items()
    }


def _from_account(doc, m: dict) -> dict:
    """The rollout stage's share outside generation (its unprofiled watched steps) and DAPO's refills' share of the
    generation, from the watch's stage times the account keeps and the samples, recomputed here."""
    generation = _generation_ms(doc["samples"])
    account = doc["rollout_account"]
    if m["measure"] == "outside_share":
        steps = [a for a in account if not a["profiled"]]
        stage = sum(a["stage_ms"] for a in steps)
        return {"value": sum(a["stage_ms"] - generation[a["step"]] for a in steps) / stage}
    refill = sum(a.get("refill_ms", 0.0) for a in account)
    return {"value": refill / sum(generation[a["step"]] for a in account)}


def _brute_tail(batch: list[dict]) -> tuple[float, float]:
    """(span, time with fewer than half of the batch running), ms: every stretch between two consecutive boundaries,
    its running samples counted one by one."""
    cuts = sorted({r["start_us"] for r in batch} | {r["end_us"] for r in batch})
    tail = sum(
        b - a
        for a, b in zip(cuts, cuts[1:])
        if sum(r["start_us"] <= a and b <= r["end_us"] for r in batch) < 0.5 * len(batch)
    )
    return (cuts[-1] - cuts[0]) / 1e3, tail / 1e3


@pytest.mark.parametrize("name", [n for n in INPUTS if n.startswith("samples/")] or ["none"])
def test_each_steps_samples_summary_recomputes_from_its_samples(documents, name):
    """A step's distribution, tail and slowest are its samples' (a brute force here); the samples of a profiled
    step lie inside its rollout's window (the trace's clock); a slow rollout's `why` holds its steps' longest samples."""
    doc, _ = documents(name)
    for s in doc["sample_steps"]:
        mine = [r for r in doc["samples"] if r["step"] == s["step"]]
        took = sorted((r["end_us"] - r["start_us"]) / 1e3 for r in mine)
        assert s["samples"] == len(mine) and close(s["duration_ms"]["max"], took[-1])
        assert s["response_tokens"]["max"] == max(r["response_tokens"] for r in mine)
        span, tail = _brute_tail(mine)
        assert close(s["span_ms"], span) and close(s["tail_ms"], tail), s["step"]
        assert close(s["slowest"][0]["duration_ms"], took[-1])
    # a rollout window that holds the whole stage holds its samples (one of a few decode steps need not)
    for row in (
        r for r in doc["rows"] if r["unit"] is None and r["stage"] == "rollout_generate" and not r.get("units_only")
    ):
        mine = [r for r in doc["samples"] if r["step"] == row["step"]]
        lo, hi = row["start_us"], row["start_us"] + row["wall_ms"] * 1e3
        assert mine and all(lo - 1e3 <= r["start_us"] and r["end_us"] <= hi + 1e3 for r in mine)
    timeline = doc.get("timeline") or {"level_shifts": [], "spikes": [], "drift": []}
    for entry in timeline["level_shifts"] + timeline["spikes"] + timeline["drift"]:
        if "why" in entry:
            steps = entry["why"]["steps"]
            longest = statistics.median(
                max(r["response_tokens"] for r in doc["samples"] if r["step"] == st) for st in steps
            )
            assert entry["why"]["longest_tokens"] == longest


@pytest.mark.parametrize("name", [n for n in INPUTS if n.startswith("samples/")] or ["none"])
def test_each_samples_phases_fill_its_life_in_the_order_it_lived_them(documents, name):
    """A sample's lane (phase_spans): its placed phases follow one another, without gap or overlap, from its arrival
    (its start, less a queue its host records before it) to its end, in the order a sample lives them, each as
    long as its host recorded it (all scaled by one factor where they sum to more than the span); a phase after the
    batch follows the end; and every recorded phase is there."""
    from rlprof.analyze.diagnosis.samples import UNTIMED, phase_spans
    from rlprof.analyze.inputs.samples_file import PHASES

    doc, _ = documents(name)
    for r in doc["samples"]:
        spans = phase_spans(r)
        placed = [(p, a, b) for p, a, b, at in spans if at]
        assert all(close(b0, a1, abs_ms=1e-6) for (_, _, b0), (_, a1, _) in zip(placed, placed[1:]))
        assert close(placed[-1][2], r["end_us"], abs_ms=2e-3) and placed[0][1] <= r["start_us"]
        order = [p for p, *_ in placed if p != UNTIMED]
        assert order == sorted(order, key=PHASES.index)
        # one factor, to the records' rounding
        scale = [(b - a) / 1e3 / r[p] for p, a, b in placed if p != UNTIMED and r[p] > 0]
        assert not scale or (max(scale) - min(scale) <= 1e-4 and 0 < min(scale) and max(scale) <= 1 + 1e-4), scale
        assert {p for p, *_ in spans if p != UNTIMED} == {p for p in PHASES if p in r}


@pytest.mark.parametrize("name", INPUTS)
def test_each_measure_recomputes_from_the_rows_it_names(documents, name):
    doc, _ = documents(name)
    for m in (m for m in doc["measures"] if m["status"] == "measured"):
        for key, value in _recomputed(doc, m).items():
            assert close(m[key], value, rel=1e-6, abs_ms=1e-9), (name, m["measure"], m["stage"], key)


def _measure_of(doc, kind: str, part: dict) -> dict | None:
    cause = CAUSES[kind]
    same = [
        m
        for m in doc["measures"]
        if m["measure"] == cause.measure
        and m["role"] == part["role"]
        and m["stage"] == part["stage"]
        and m.get("file") == part.get("file")
    ]
    return same[0] if same else None


@pytest.mark.parametrize("name", INPUTS)
def test_each_findings_numbers_are_its_measures(documents, name):
    doc, _ = documents(name)
    means = _means(doc)
    step = sum(v["wall_ms"] for k, v in means.items() if k[1] is not None)
    kinds = [f["kind"] for f in doc["findings"]]
    for f in doc["findings"]:
        ev = f["evidence"]
        if f["kind"] in CAUSES and CAUSES[f["kind"]].judge is not None:
            parts = ev.get("stages") or [{**ev, "role": f["role"], "stage": f["stage"]}]
            assert [(p["role"], p["stage"]) for p in parts][0] == (f["role"], f["stage"])
            for p in parts:
                m = _measure_of(doc, f["kind"], p)
                assert m is not None, (name, f["kind"], p["stage"])
                assert {k: p[k] for k in m} == m, (name, f["kind"], p["stage"])
            assert close(f["impact_ms"], sum(p.get("impact_ms", f["impact_ms"]) for p in parts)) or len(parts) == 1
            assert {k: v for k, v in ev.items() if k not in ("stages", "symptoms")} == {
                k: v
                for k, v in parts[0].items()
                if k not in ("stages", "symptoms") and (k not in ("rank", "impact_ms", "saving_ms") or k in ev)
            }
        elif f["kind"] in ("idle", "exposed_comm", "memcpy"):
            bucket = {"idle": "idle_ms", "exposed_comm": "comm_ms", "memcpy": "memcpy_ms"}[f["kind"]]
            for p in ev.get("stages") or [{**ev, "role": f["role"], "stage": f["stage"]}]:
                mean = means[(p["role"], p["stage"])]
                assert close(p["bucket_ms"], mean[bucket]) and close(p["wall_ms"], mean["wall_ms"]), (name, p)
                assert close(p["share"], mean[bucket] / mean["wall_ms"])
        elif f["kind"] == "dominant_stage":
            assert close(ev["stage_ms"], means[(f["role"], f["stage"])]["wall_ms"]) and close(ev["step_ms"], step)
            assert ev["share"] >= THRESHOLDS["dominant_share"]
        if f.get("saving") and f["saving"]["status"] == "predicted":
            assert close(f["saving"]["saving_ms"], sum(f["saving"]["by_stage_ms"].values())), (name, f["kind"])
    for kind in CAUSES:  # one finding per cause (a slow rank: per rank)
        ranks = [f["rank"] for f in doc["findings"] if f["kind"] == kind]
        assert len(ranks) == len(set(ranks)) if kind == "slow_rank" else len(ranks) <= 1, (name, kind, kinds)


def test_the_h100_whole_step_names_the_same_cause_for_rollout(documents):
    """The same trainer profiled end to end: launch-bound is one finding, rollout among its stages with its lever."""
    doc, _ = documents("h100/e2e-step")
    (found,) = [f for f in doc["findings"] if f["kind"] == "launch_bound"]
    stages = {s["stage"]: s for s in found["evidence"]["stages"]}
    assert stages["rollout_generate"]["value"] >= THRESHOLDS["launch_bound_share"]
    assert "rollout.engine" in [lv["key"] for lv in found["levers"]["rlprof"]]
    assert found["text"].count("launch-bound") == 1 and "rollout/rollout_generate" in found["text"]


# ---- speed of light ------------------------------------------------------------------------------------------------
GAP_FIELDS = (
    "gap_idle_ms",
    "gap_launch_ms",
    "gap_comm_ms",
    "gap_memcpy_ms",
    "gap_padding_ms",
    "gap_small_batches_ms",
    "gap_kernels_ms",
)


def _device_of(doc: dict, row: dict) -> dict:
    """The hardware of the window the row came from: its file's input (an assembled stage row: its units')."""
    files = {row["file"]} if row["file"] else {u["file"] for u in _units_of(doc, row)}
    (hw,) = {id(i["hardware"]): i["hardware"] for i in doc["inputs"] if i["path"].split("/")[-1] in files}.values()
    return hw


@pytest.mark.parametrize("name", INPUTS)
def test_each_rows_speed_of_light_recomputes_and_its_gap_parts_sum_to_its_gap(documents, name):
    doc, _ = documents(name)
    dtype = doc["model"].get("dtype")
    for row in (r for r in doc["rows"] if "sol_ms" in r):
        hw = _device_of(doc, row)
        peak, bandwidth = hw["peak_flops"][dtype], hw["bandwidth"]
        flops_ms, bytes_ms = row["model_flops"] / peak * 1e3, row["min_bytes"] / bandwidth * 1e3
        assert close(row["sol_ms"], max(flops_ms, bytes_ms)), (name, row["stage"], row["unit"])
        assert row["bound"] == ("compute" if flops_ms >= bytes_ms else "memory")
        assert close(row["mfu"], row["model_flops"] / (row["wall_ms"] / 1e3) / peak)
        assert close(row["mbu"], row["min_bytes"] / (row["wall_ms"] / 1e3) / bandwidth)
        assert close(row["gap_ms"], max(0.0, row["wall_ms"] - row["sol_ms"]))
        parts = [row[f] for f in GAP_FIELDS]
        assert min(parts) >= 0 and close(sum(parts), row["gap_ms"], abs_ms=1e-9), (name, row["stage"], parts)
        assert row["padded_flops"] >= row["model_flops"] * (1 - 1e-9)
        if row["gap_ms"] > 0:
            assert row[GAP_FIELDS[int(np.argmax(parts))]] == max(parts)
    for s in doc.get("stage_limits", []):
        held = [r for r in _stage_rows(doc) if (r["role"], r["stage"]) == (s["role"], s["stage"]) and "sol_ms" in r]
        assert s["rows"] == len(held) and close(s["gap_ms"], sum(s[f] for f in GAP_FIELDS))
        for k in ("model_flops", "min_bytes", "wall_ms", "sol_ms", *GAP_FIELDS):
            assert close(s[k], sum(r[k] for r in held)), (name, s["stage"], k)


@pytest.mark.parametrize("name", INPUTS)
def test_a_stage_rows_work_is_its_units_work(documents, name):
    doc, _ = documents(name)
    for row in (r for r in _stage_rows(doc) if "model_flops" in r):
        units = [u for u in _units_of(doc, row) if "model_flops" in u]
        if not units:
            assert "samples" in row["work_from"], (name, row["stage"])  # a training stage without units: its samples
            continue
        for k in ("model_flops", "padded_flops", "min_bytes"):
            assert close(row[k], sum(u[k] for u in units)), (name, row["stage"], k)


def stage_speed_of_light(doc: dict) -> dict:
    """stage -> its speed-of-light time per step (its rows' over steps x ranks, roles added), recomputed here."""
    out = {}
    for (role, stage), rows in _by_stage(doc).items():
        if rows and all("sol_ms" in r for r in rows):
            ranks = {r["replica"] if role == "rollout" and r["replica"] is not None else r["rank"] for r in rows}
            n = len({r["step"] for r in rows}) * len(ranks)
            out[stage] = out.get(stage, 0.0) + sum(r["sol_ms"] for r in rows) / n
    return out


def _by_stage(doc: dict) -> dict:
    per = defaultdict(list)
    for r in _stage_rows(doc):
        if r["stage"]:
            per[(r["role"], r["stage"])].append(r)
    return per


def savings_below_speed_of_light(doc: dict) -> list[tuple]:
    """(finding, stage, saving, what the stage may lose) of every predicted saving that would bring a stage below its
    speed-of-light time: the stage's time (the larger of its profiled mean and its unprofiled median, the most a
    saving may be taken from) less its speed of light."""
    sol = stage_speed_of_light(doc)
    means = _means(doc)
    unprofiled = ((doc.get("run_config") or {}).get("unprofiled") or {}).get("stage_ms") or {}
    out = []
    for f in doc["findings"]:
        saving = f.get("saving") or {}
        for stage, ms in (saving.get("by_stage_ms") or {}).items():
            if stage not in sol:
                continue
            profiled = sum(v["wall_ms"] for k, v in means.items() if k[1] == stage)
            room = max(profiled, unprofiled.get(stage, 0.0)) - sol[stage]
            if ms > max(0.0, room) * (1 + 1e-9) + 1e-9:
                out.append((f["kind"], stage, ms, room))
    return out


# ---- advice a senior engineer would sign: savings bounded, one plan, no key both ways, fits that obey physics -----
def _spans(doc) -> float | None:
    """The rollout's time per step from its samples, brute force: each (step, pass, replica) batch's first start to
    last end, summed over a step's batches, mean over steps."""
    batches = defaultdict(list)
    for r in doc.get("samples", []):
        if "start_us" in r and "end_us" in r:
            batches[
                (r["step"], r.get("rollout_pass", 0), r.get("replica") if r["source"] != "rlprof" else None)
            ].append(r)
    per_step = defaultdict(float)
    for (step, _, _), b in batches.items():
        per_step[step] += (max(r["end_us"] for r in b) - min(r["start_us"] for r in b)) / 1e3
    return statistics.fmean(per_step.values()) if per_step else None


def _watched_stage_ms(doc, stage) -> float | None:
    """A stage's median over the watch's steps (every step it timed), ms."""
    per = ((doc.get("timeline") or {}).get("per_step") or {}).get(stage)
    values = [v for v in (per or {}).get("max", []) if v is not None]
    return statistics.median(values) * 1e3 if values else None


def _stage_allowance(doc, stage) -> float:
    """The most any saving can take from a stage per step: its time in the profiled step, its median in the run's
    unprofiled or watched steps, the rollout's samples' span, whichever is largest."""
    means = _means(doc)
    mine = [m["wall_ms"] for k, m in means.items() if k[1] == stage]
    unprofiled = (((doc.get("run_config") or {}).get("unprofiled") or {}).get("stage_ms") or {}).get(stage)
    span = _spans(doc) if stage == "rollout_generate" else None
    return max([sum(mine)] + [x for x in (unprofiled, _watched_stage_ms(doc, stage), span) if x])


def _predicted(doc):
    return [f for f in doc["findings"] if (f.get("saving") or {}).get("status") == "predicted"]


@pytest.mark.parametrize("name", INPUTS)
def test_a_saving_is_a_share_of_the_real_step_and_never_more_than_the_stages_it_acts_on(documents, name):
    """Each predicted saving: no part negative, none more than its stage's time, their sum at most the step, and the
    step it is a share of holds the rollout its samples span (never a window that holds a few decode steps)."""
    doc, _ = documents(name)
    span = _spans(doc)
    for f in _predicted(doc):
        s = f["saving"]
        for stage, ms in s["by_stage_ms"].items():
            assert ms >= 0, (name, f["kind"], stage, ms)
            top = _stage_allowance(doc, None if stage == "null" else stage)
            assert ms <= top * (1 + 1e-9) + 1e-9, (name, f["kind"], stage, ms, top)
        if s["saving_share"] is not None:
            assert s["saving_share"] <= 1 + 1e-9, (name, f["kind"], s["saving_share"])
            assert close(s["saving_share"], s["saving_ms"] / s["step_ms"])
            if span is not None:  # the step holds its rollout
                assert s["step_ms"] >= span * (1 - 1e-9) or s.get("basis") in ("unprofiled_steps", "watched_steps")
    bases = ("unprofiled_steps", "watched_steps", "profiled_step", "profiled_step_and_samples", "window")
    for f in _predicted(doc):  # and each says which step that is: a window of a few units gives no share
        s = f["saving"]
        assert s.get("basis") in bases, (name, f["kind"])
        assert s["basis"] != "window" or s["saving_share"] is None, (name, f["kind"])


@pytest.mark.parametrize("name", INPUTS)
def test_the_plan_counts_each_stage_once_and_never_passes_the_step(documents, name):
    """The findings' first levers together: per stage at least the largest one saving's and at most the stage's time,
    in all at most the step and the savings' plain sum, and no key turned two ways."""
    doc, _ = documents(name)
    plan = doc["plan"]
    found = _predicted(doc)
    assert sorted(c["kind"] for c in plan["causes"]) == sorted(f["kind"] for f in found)
    assert plan["total_ms"] <= sum(f["saving"]["saving_ms"] for f in found) + 1e-6
    if plan["basis"] != "window":
        assert plan["total_ms"] <= plan["step_ms"] * (1 + 1e-9) and plan["total_share"] <= 1 + 1e-9
    for stage, ms in plan["by_stage_ms"].items():
        parts = [f["saving"]["by_stage_ms"].get(stage, 0.0) for f in found]
        assert max(parts) * (1 - 1e-9) - 1e-9 <= ms <= _stage_allowance(doc, stage) * (1 + 1e-9) + 1e-9, (name, stage)
    assert plan["conflicts"] == {}


@pytest.mark.parametrize("name", INPUTS)
def test_no_key_is_pulled_two_ways_by_one_documents_findings(documents, name):
    """Across every finding of a document, in every dialect, a key is raised or lowered one way and set to one
    value; and in each finding's levers those that change what the run learns come last."""
    doc, _ = documents(name)
    turned = defaultdict(set)
    for f in doc["findings"]:
        for dialect, levers in (f.get("levers") or {}).items():
            for lv in levers:
                turned[(dialect, lv["key"])].add(lv["set"])
            changes = [lv.get("changes_result", False) for lv in levers]
            assert changes == sorted(changes), (name, f["kind"], dialect)  # False (no result changed) first
    for (dialect, key), ways in turned.items():
        assert not {"raise", "lower"} <= ways and len(ways - {"raise", "lower"}) <= 1, (name, dialect, key, ways)


FIT_WORDS = re.compile(r"(-?[\d.]+) ms fixed \+ (-?[\d.]+) us per token")


@pytest.mark.parametrize("name", INPUTS)
def test_no_fit_in_use_breaks_physics(documents, name):
    """A fixed-cost fit that is measured has no negative part, and every fit a saving rests on is such a one."""
    doc, _ = documents(name)
    for m in doc["measures"]:
        if m["measure"] == "fixed_cost" and m["status"] == "measured":
            assert m["fixed_ms"] >= 0 and m["per_token_us"] >= 0, (name, m["stage"])
    for f in _predicted(doc):
        for fixed, per_token in FIT_WORDS.findall(f["saving"]["assumption"]):
            assert float(fixed) >= 0 and float(per_token) >= 0, (name, f["kind"], fixed, per_token)


def _lengths_by_step(doc) -> dict:
    """Each step's response lengths: its samples' where they say them, else from its decode steps (rows active at
    step k are those longer than k: the count that drops after k ends there)."""
    out = defaultdict(list)
    for r in doc.get("samples", []):
        if r.get("response_tokens"):
            out[r["step"]].append(r["response_tokens"])
    if out:
        return out
    passes = defaultdict(list)
    for u in doc["rows"]:
        if u["unit"] == "decode_step" and u["stage"] == "rollout_generate" and u.get("active") is not None:
            passes[(u["step"], u["rank"], u["file"])].append(u)
    for (step, _, _), units in passes.items():
        active = [u["active"] for u in sorted(units, key=lambda u: u["start_us"])]
        for k, a in enumerate(active):
            out[step] += [k + 1] * (a - (active[k + 1] if k + 1 < len(active) else 0))
    return out


@pytest.mark.parametrize("name", INPUTS)
def test_no_saving_brings_a_stage_below_its_speed_of_light(documents, name):
    doc, _ = documents(name)
    assert savings_below_speed_of_light(doc) == [], name
    for f in doc["findings"]:  # a saving cut there says the stage's speed of light, as recomputed here
        cut = (f.get("saving") or {}).get("speed_of_light_ms") or {}
        sol = stage_speed_of_light(doc)
        assert all(close(ms, sol[stage]) for stage, ms in cut.items()), (name, f["kind"], cut)


@pytest.mark.parametrize("name", INPUTS)
def test_a_response_cap_keeps_the_experiment(documents, name):
    """Any response cap offered (in the run's dialect, and in rlprof's, which has no partial rollout) is at or above
    the p95 of each step's sampled response lengths and says how many responses and tokens it cuts."""
    from rlprof.analyze.diagnosis.causes import predict
    from rlprof.analyze.diagnosis.finding import Finding as Found
    from rlprof.analyze.diagnosis.findings import prediction_context

    doc, _ = documents(name)
    tails = [f for f in doc["findings"] if f["kind"] == "rollout_tail"]
    offered = [f["saving"] for f in tails if f.get("saving")]
    offered += [predict(prediction_context(doc), Found.of(f), "rlprof") for f in tails]
    lengths = _lengths_by_step(doc)
    for s in offered:
        cap = (s.get("setting") or {}).get("max_new_tokens")
        if cap is None:
            continue
        for step, ls in lengths.items():
            assert cap >= math.ceil(np.percentile(ls, 95)), (name, step, cap, sorted(ls))
        assert {"responses_cut", "responses_cut_count", "tokens_cut", "tokens_cut_share"} <= set(s) and "are cut" in s[
            "assumption"
        ]
