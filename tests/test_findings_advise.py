"""Findings (each threshold firing and not), operators per stage, and `rlprof advise` closing the loop."""

import json
import shutil

import pytest
from omegaconf import OmegaConf

from conftest import REAL, ROOT, plan_json, run_cli
from rlprof.analyze.diagnosis.findings import THRESHOLDS, findings
from rlprof.frameworks import verl

BUCKETS = ("wall_ms", "compute_ms", "comm_ms", "overlap_ms", "memcpy_ms", "idle_ms")


def row(
    stage,
    wall,
    compute=None,
    comm=0.0,
    memcpy=0.0,
    idle=None,
    step=2,
    rank=0,
    role="actor",
    unit=None,
    index=None,
    sig=None,
    file="w.json",
):
    compute = wall - comm - memcpy - (idle or 0.0) if compute is None else compute
    idle = wall - compute - comm - memcpy if idle is None else idle
    return {
        "step": step,
        "role": role,
        "stage": stage,
        "rank": rank,
        "replica": None,
        "file": file,
        "unit": unit,
        "index": index,
        "start_us": 0.0,
        "wall_ms": wall,
        "compute_ms": compute,
        "comm_ms": comm,
        "overlap_ms": 0.0,
        "memcpy_ms": memcpy,
        "idle_ms": idle,
        **({"ops_sig": sig} if unit else {}),
    }


def doc(rows, inputs=None, collectives=None):
    return {"rows": rows, "inputs": inputs or [{"path": "w.json"}], "collectives": collectives or [], "ops": []}


def kinds(d):
    return [f["kind"] for f in findings(d)]


def test_dominant_stage_fires_above_its_share_only():
    share = THRESHOLDS["dominant_share"]
    assert 0.5 > share  # the firing case below holds half the step
    top = doc([row("actor_update", 50), row("rollout_generate", 30), row("ref_compute_log_prob", 20)])
    (f,) = [f for f in findings(top) if f["kind"] == "dominant_stage"]
    assert f["stage"] == "actor_update" and f["evidence"]["share"] == pytest.approx(0.5) and "50%" in f["text"]
    just_below = 100 * share - 1  # the top stage just under the threshold, the rest split evenly
    even = doc(
        [row("actor_update", just_below)]
        + [row(s, (100 - just_below) / 3) for s in ("rollout_generate", "ref_compute_log_prob", "reward_compute")]
    )
    assert "dominant_stage" not in kinds(even)


@pytest.mark.parametrize("bucket,kind", [("comm", "exposed_comm"), ("idle", "idle"), ("memcpy", "memcpy")])
def test_bucket_shares_fire_above_their_thresholds_only(bucket, kind):
    limit = THRESHOLDS[f"{bucket}_share"]
    above = doc([row("actor_update", 100, **{bucket: 100 * limit + 2}), row("rollout_generate", 100, idle=0)])
    below = doc([row("actor_update", 100, **{bucket: 100 * limit - 2}), row("rollout_generate", 100, idle=0)])
    (f,) = [f for f in findings(above) if f["kind"] == kind]
    assert f["stage"] == "actor_update" and f["impact_ms"] == pytest.approx(100 * limit + 2)
    assert kind not in kinds(below)


def test_idle_in_several_stages_is_one_finding_holding_them_all():
    limit = THRESHOLDS["idle_share"]
    one = doc([row("actor_update", 100, idle=100 * limit + 2), row("rollout_generate", 100, idle=0)])
    (single,) = [f for f in findings(one) if f["kind"] == "idle"]
    assert single["text"].startswith("idle is ") and "of actor/actor_update" in single["text"]
    several = doc(
        [
            row("actor_update", 100, idle=30),
            row("rollout_generate", 80, idle=40),
            row("ref_compute_log_prob", 60, idle=5),
        ]
    )
    (merged,) = [f for f in findings(several) if f["kind"] == "idle"]
    stages = [(s["stage"], s["bucket_ms"], s["wall_ms"]) for s in merged["evidence"]["stages"]]
    assert stages == [("rollout_generate", 40, 80), ("actor_update", 30, 100)]  # largest idle first; ref is below
    assert merged["impact_ms"] == pytest.approx(70) and merged["evidence"]["share"] == pytest.approx(70 / 180)
    assert merged["stage"] == "rollout_generate"
    assert (
        "of 2 stages (70.0 of 180.0 ms)" in merged["text"]
        and "actor/rollout_generate 50% (40.0 of 80.0 ms)" in merged["text"]
    )


def test_exposed_communication_names_the_collectives():
    d = doc(
        [row("actor_update", 100, comm=30), row("rollout_generate", 100, idle=0)],
        collectives=[{"role": "actor", "stage": "actor_update", "name": "nccl:all_reduce", "total_ms": 25.0}],
    )
    (f,) = [f for f in findings(d) if f["kind"] == "exposed_comm"]
    assert "nccl:all_reduce 25.0 ms" in f["text"]


def test_markers_windows_get_no_bucket_finding():
    d = doc(
        [row("actor_update", 100, compute=0, idle=100, file="m.json"), row("rollout_generate", 40, file="m.json")],
        inputs=[{"path": "run/m.json", "tool": "markers"}],
    )
    assert kinds(d) == ["dominant_stage"]


def test_step_to_step_variance_fires_above_its_threshold_only():
    wobbly = doc([row("actor_update", 100, step=2, idle=0), row("actor_update", 140, step=3, idle=0)])
    steady = doc([row("actor_update", 100, step=2, idle=0), row("actor_update", 105, step=3, idle=0)])
    (f,) = [f for f in findings(wobbly) if f["kind"] == "variance"]
    assert f["evidence"]["spread_ms"] == 40 and "step 3" in f["text"]
    assert "variance" not in kinds(steady)


def test_repeating_units_fire_when_units_match_only():
    stage = row("actor_update", 100, idle=0)
    same = [row("actor_update", 12 + 0.1 * k, idle=0, unit="micro_batch", index=k, sig="abc") for k in range(8)]
    mixed = [row("actor_update", 12, idle=0, unit="micro_batch", index=k, sig=f"s{k % 3}") for k in range(8)]
    few = same[: THRESHOLDS["repeat_units"] - 1]
    (f,) = [f for f in findings(doc([stage, *same])) if f["kind"] == "repeating_units"]
    assert f["evidence"]["units"] == 8 and "{unit: micro_batch, active: 1}" in f["text"]
    assert "repeating_units" not in kinds(doc([stage, *mixed])) and "repeating_units" not in kinds(doc([stage, *few]))


def test_truncated_window_fires_only_when_cut():
    rows = [row("actor_update", 100, idle=0)]
    assert "truncated" in kinds(doc(rows, inputs=[{"path": "w.json", "window_status": "truncated"}]))
    assert "truncated" not in kinds(doc(rows, inputs=[{"path": "w.json", "window_status": "complete"}]))


def test_slow_rank_comes_first_and_only_when_the_others_wait():
    slow = [
        row("actor_update", 100, compute=c, comm=w, rank=r, step=s)
        for r, (c, w) in {0: (50, 40), 1: (85, 5)}.items()
        for s in (2, 3)
    ] + [row("rollout_generate", 20, rank=r) for r in (0, 1)]
    found = findings(doc(slow))
    first = [(f["kind"], f.get("rank"), f.get("stage"), f.get("saving_ms")) for f in found]
    assert found[0]["kind"] == "slow_rank" and found[0]["rank"] == 1 and found[0]["stage"] == "actor_update", first
    even = [row("actor_update", 100, compute=50, comm=40, rank=r) for r in (0, 1)]
    assert "slow_rank" not in kinds(doc(even))


def test_real_gpu_rank_findings_name_the_communication_share():
    proc = run_cli("analyze", REAL / "gpu_nccl_rank0.json.gz", "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    (f,) = [f for f in d["findings"] if f["kind"] == "exposed_comm"]
    assert f["evidence"]["share"] >= THRESHOLDS["comm_share"] and "nccl" in f["text"].lower()
    assert d["ops"] and {o["kind"] for o in d["ops"]} == {"cpu_op", "kernel"}
    assert all({"role", "stage", "step", "rank"} <= o.keys() for o in d["ops"])  # each tagged with its window
    proc = run_cli("analyze", REAL / "gpu_nccl_rank0.json.gz")
    first, _, rest = proc.stdout.partition("time per window")
    assert "findings" in first and "exposed communication" in first  # the answer before the tables
    assert "top operators and kernels per stage" in rest and "ncclKernel" in rest


@pytest.fixture(scope="module")
def markers_run(tmp_path_factory):
    """The markers run of examples/configs/markers.yaml as the trainer recorded it (tests/data/runs/markers,
    bench/record_runs.py): advice from it is the same on any machine, busy or not."""
    tmp = tmp_path_factory.mktemp("markers")
    run = shutil.copytree(ROOT / "tests" / "data" / "runs" / "markers", tmp / "m" / "markers")
    return tmp, run


def _slowest_stage(run) -> str:
    d = json.loads(run_cli("analyze", run, "--json").stdout)
    walls = {}
    for r in d["rows"]:
        if r["unit"] is None:
            walls[r["stage"]] = walls.get(r["stage"], 0.0) + r["wall_ms"]
    return max(walls, key=walls.get)


def _verl_keys_only(cfg: dict) -> None:
    """Every key is one verl 0.9's profiler config knows (rlprof's extensions would be refused by verl)."""
    g = cfg["global_profiler"]
    assert set(g) <= set(verl.GLOBAL_KEYS), g
    for block in ("actor", "rollout", "ref"):
        prof = cfg["actor_rollout_ref"].get(block, {}).get("profiler")
        if prof is None:
            continue
        assert set(prof) <= set(verl.ROLE_KEYS), prof
        for tool, tc in prof.get("tool_config", {}).items():
            assert set(tc) <= set(verl.TOOL_CONFIG_KEYS[tool]), tc
            assert set(tc.get("schedule", {})) <= set(verl.SCHEDULE_KEYS), tc


def test_advise_closes_the_loop_from_a_markers_run_in_verls_dialect(markers_run):
    tmp, run = markers_run
    nxt = tmp / "next.yaml"
    proc = run_cli("advise", run, "--budget", "2MB", "--dialect", "verl", "-o", nxt)
    assert proc.returncode == 0, proc.stderr
    assert "why:" in proc.stdout and "predicted total" in proc.stdout
    cfg = OmegaConf.to_container(OmegaConf.load(nxt))
    _verl_keys_only(cfg)
    plan = plan_json(nxt)
    assert plan["framework"].startswith("verl") and not [w for w in plan["warnings"] if "extension" in w]
    advice = json.loads((tmp / "next.advice.json").read_text())
    assert advice["target"]["stage"] == _slowest_stage(run)  # what the markers run found slowest
    assert plan["roles"][advice["target"]["role"] if advice["target"]["role"] != "ref" else "actor"]["enabled"]
    out = tmp / "next_run"
    proc = run_cli(
        "train",
        nxt,
        "trainer.steps=4",
        f"trainer.output_dir={tmp}/t2",
        f"global_profiler.save_path={out}",
        cwd=tmp,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (new,) = list(out.iterdir())
    written = sum(json.loads(line)["bytes"] for line in (new / "manifest.jsonl").read_text().splitlines())
    assert 0 < written <= 2_000_000
    proc = run_cli("advise", "--check", new, "--advice", tmp / "next.advice.json")
    assert proc.returncode == 0, proc.stderr
    ratio = float(proc.stdout.split("(")[1].split("x of the prediction")[0])
    assert 0.7 <= ratio <= 1.3, proc.stdout


def test_advise_samples_units_to_fit_a_small_budget(markers_run):
    tmp, run = markers_run
    nxt = tmp / "small.yaml"
    proc = run_cli("advise", run, "--budget", "300KB", "--dialect", "rlprof", "-o", nxt)
    assert proc.returncode == 0, proc.stderr
    advice = json.loads((tmp / "small.advice.json").read_text())
    assert advice["unit"] == "micro_batch" and 1 <= advice["active"] < 8 and advice["predicted_bytes"] <= 300_000
    actor = plan_json(nxt)["roles"]["actor"]
    assert actor["stages"] == ["actor_update"] and actor["schedule"]["active"] == advice["active"]
    out = tmp / "small_run"
    proc = run_cli(
        "train",
        nxt,
        "trainer.steps=4",
        f"trainer.output_dir={tmp}/t3",
        f"global_profiler.save_path={out}",
        cwd=tmp,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (new,) = list(out.iterdir())
    check = run_cli("advise", "--check", new, "--advice", tmp / "small.advice.json")
    assert "within 30%" in check.stdout, check.stdout


def test_advise_in_mindspeeds_dialect(markers_run):
    tmp, run = markers_run
    proc = run_cli("advise", run, "--dialect", "mindspeed", "-o", tmp / "ms.yaml")
    assert proc.returncode == 0, proc.stderr
    plan = plan_json(tmp / "ms.yaml")
    assert plan["dialect"] == "integrated"
    enabled = {n: r for n, r in plan["roles"].items() if r["enabled"]}
    assert list(enabled) == ["actor"] and enabled["actor"]["stages"] == ["actor_update"]


@pytest.mark.parametrize(
    "args,says",
    [(["--budget", "lots"], "--budget"), (["--dialect", "hydra"], "--dialect"), (["--check", "."], "--advice")],
)
def test_advise_bad_input_is_one_line(markers_run, args, says):
    _, run = markers_run
    proc = run_cli("advise", run, *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert says in line


def test_advise_needs_stage_windows(tmp_path):
    proc = run_cli("advise", REAL / "gpu_nccl_rank0.json.gz")
    assert proc.returncode == 2 and "no stage windows" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
