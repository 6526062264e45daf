"""Diagnosis: RL measures, cause findings with levers, metrics-first advice (issue 26).

Levers are checked against the frameworks' own configs; each threshold fires just above it and stays quiet just
below; the device measures are recomputed independently on real public GPU traces; three injected scenarios and
one healthy control are diagnosed exactly on runs the reference trainer recorded (tests/data/runs), and one cause
made to dominate is found live (bench/diagnose.py holds the full suite).
"""

import dataclasses
import gzip
import importlib.util
import json
import shutil
import typing
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import REAL, ROOT, open_page, run_cli
from rlprof.analyze.window.breakdown import unit_label
from rlprof.analyze.pipeline import analyze
from rlprof.analyze.diagnosis.findings import THRESHOLDS, diagnose, findings
from rlprof.analyze.diagnosis.measures import TAIL_ACTIVE
from rlprof.analyze.inputs.step_metrics import read_step_metrics
from rlprof.analyze.over_time.step_trends import OUTLIER_FACTOR, TREND_R, diagnose_steps
from rlprof.frameworks.levers import FULLY_ASYNC, LEVERS
from rlprof.errors import ConfigError
from rlprof.trainer.config import TrainConfig
from conftest import window_doc, window_row

DATA = ROOT / "tests" / "data"
VERL_YAML = DATA / "verl" / "config" / "v0.10.0.dev_1dda039_generated_ppo_trainer.yaml"
FULLY_ASYNC_YAML = DATA / "verl" / "config" / "v0.9.1_fully_async_ppo_trainer.yaml"


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- levers name keys the frameworks have ------------------------------------------------------------------
def _has_path(node, dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _rlprof_key(key: str) -> bool:
    cls = TrainConfig
    for part in key.split("."):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if part not in fields:
            return False
        hint = typing.get_type_hints(cls)[part]
        cls = hint if dataclasses.is_dataclass(hint) else None
    return True


def test_every_lever_is_a_key_of_its_frameworks_config():
    verl_cfg = OmegaConf.to_container(OmegaConf.load(VERL_YAML), resolve=False)
    fully_async = OmegaConf.to_container(OmegaConf.load(FULLY_ASYNC_YAML), resolve=False)
    ms = json.loads((DATA / "mindspeed" / "config_keys.json").read_text())["sections"]
    seen = 0
    for name, by_dialect in LEVERS.items():
        for lv in by_dialect.get("verl", ()):
            # a lever that needs verl's fully-async trainer names a key of that trainer's config
            cfg, which = (fully_async, "fully-async trainer") if lv.needs == FULLY_ASYNC else (verl_cfg, "trainer")
            assert _has_path(cfg, lv.key), f"{name}: {lv.key} is not in verl's {which} YAML"
            seen += 1
        for lv in by_dialect.get("mindspeed", ()):
            section, *rest = lv.key.split(".")
            keys = ms[section]
            ok = rest[0] in keys["keys"] and (len(rest) == 1 or rest[1] in keys["dict_keys"].get(rest[0], []))
            assert ok, f"{name}: {lv.key} is not a key MindSpeed-RL's {section} accepts"
            seen += 1
        for lv in by_dialect.get("rlprof", ()):
            assert _rlprof_key(lv.key), f"{name}: {lv.key} is not in rlprof's TrainConfig"
            seen += 1
    assert seen >= 30
    # a key that is not there fails the same check (the check can fail)
    assert not _has_path(verl_cfg, "actor_rollout_ref.actor.use_dynamic_bsize")
    assert not _has_path(verl_cfg, "async_training.partial_rollout")  # the PPO trainer has no such key
    assert not _rlprof_key("actor.micro_batch")


def test_rlprof_levers_are_accepted_by_the_trainer():
    from rlprof.trainer.config import parse_train_config

    for by_dialect in LEVERS.values():
        for lv in by_dialect.get("rlprof", ()):
            if lv.set in ("raise", "lower"):
                continue
            config: dict = {}
            for key, text in ((lv.key, lv.set), *lv.also):  # the lever with what --fix writes beside it
                *path, leaf = key.split(".")
                node = config
                for part in path:
                    node = node.setdefault(part, {})
                # the value as a YAML config or a key=value override gives it; a setting the run computes: a number
                node[leaf] = 100 if text.startswith("{") else yaml.safe_load(text)
            try:
                parse_train_config(config)  # raises on a key or value the trainer refuses
            except ConfigError as exc:  # vLLM is not in this venv: the one refusal that is the machine's
                assert importlib.util.find_spec("vllm") is None and "which is not installed" in str(exc), exc


# ---- units carry what they hold ---------------------------------------------------------------------------
def test_unit_labels_read_back_what_units_hold():
    assert unit_label("3|seqs=8,tokens=160,real_tokens=97") == (3, {"seqs": 8, "tokens": 160, "real_tokens": 97})
    assert unit_label("12") == (12, {})
    assert unit_label("7|seqs=-1,bogus=3,active=x,active2=4") == (7, {})  # other keys, non-integers: left out


# ---- thresholds: fire just above, quiet just below ---------------------------------------------------------


def _kinds(doc):
    return [f["kind"] for f in findings(doc) if f["actionable"]]


def _tail_doc(tail_share):
    n = 20
    tail = round(tail_share * n)
    units = [
        window_row("rollout_generate", "rollout", 1.0, "decode_step", k, seqs=10, active=(10 if k < n - tail else 4))
        for k in range(n)
    ]
    return window_doc(
        [window_row("rollout_generate", "rollout", 20.0), window_row("actor_update", "actor", 20.0), *units]
    )


def test_rollout_tail_threshold():
    t = THRESHOLDS["tail_share"]
    assert "rollout_tail" in _kinds(_tail_doc(t + 0.05))
    assert "rollout_tail" not in _kinds(_tail_doc(t - 0.05))
    assert TAIL_ACTIVE == 0.5  # 4 of 10 active is tail, 10 of 10 is not


def _padding_doc(share):
    units = [
        window_row(
            "actor_update", "actor", 2.0, "micro_batch", k, seqs=2, tokens=1000, real_tokens=round(1000 * (1 - share))
        )
        for k in range(2)
    ]
    return window_doc(
        [window_row("actor_update", "actor", 10.0), window_row("rollout_generate", "rollout", 10.0), *units]
    )


def test_padding_threshold():
    t = THRESHOLDS["padding_share"]
    found = findings(_padding_doc(t + 0.02))
    f = next(f for f in found if f["kind"] == "padding")
    assert f["levers"]["verl"][0]["key"] == "actor_rollout_ref.model.use_remove_padding"
    assert "actor.use_dynamic_bsz" in f["levers_text"]
    assert "padding" not in _kinds(_padding_doc(t - 0.02))


def _fixed_doc(fixed_ms, per_token_ms=0.01, units=8):
    rows = [window_row("actor_update", "actor", 100.0), window_row("rollout_generate", "rollout", 100.0)]
    for k in range(units):
        tokens = 100 + 50 * k
        rows.append(
            window_row(
                "actor_update",
                "actor",
                fixed_ms + per_token_ms * tokens,
                "micro_batch",
                k,
                seqs=1,
                tokens=tokens,
                real_tokens=tokens,
            )
        )
    return window_doc(rows)


def test_fixed_cost_threshold_and_mergeable_units():
    # share = fixed / (fixed + per_token x mean tokens); mean tokens 275 -> per-token part 2.75 ms
    above, below = THRESHOLDS["fixed_share"] + 0.05, THRESHOLDS["fixed_share"] - 0.05
    fixed = lambda s: s * 2.75 / (1 - s)  # noqa: E731
    assert "small_units" in _kinds(_fixed_doc(fixed(above)))
    assert "small_units" not in _kinds(_fixed_doc(fixed(below)))
    # fewer micro-batches per pass than fixed_units: nothing to merge, no finding however large the fixed part
    few = _fixed_doc(fixed(0.9), units=THRESHOLDS["fixed_units"] - 1)
    assert "small_units" not in _kinds(few)
    # the same micro-batches, one per mini-batch (each its own optimizer step): they cannot merge
    one_each = _fixed_doc(fixed(0.9))
    one_each["rows"] += [window_row("actor_update", "actor", 1.0, "mini_batch", k) for k in range(8)]
    assert "small_units" not in _kinds(one_each)
    # identical token counts: the fixed part cannot be told apart, said as such
    same = _fixed_doc(fixed(0.9), per_token_ms=0.0)
    for r in same["rows"]:
        r["tokens"] = 100
    m = next(m for m in diagnose(same).measures if m["measure"] == "fixed_cost")
    assert m["status"] == "not measurable" and "too few different token counts" in m["why"]


def _share_doc(stage, role, share):
    other = 100.0
    return window_doc(
        [window_row(stage, role, other * share / (1 - share)), window_row("actor_update", "actor", other)]
    )


@pytest.mark.parametrize(
    "stage,role,kind,key",
    [
        ("reward_compute", "reward", "slow_reward", "reward_share"),
        ("weight_sync", "actor", "weight_sync", "weight_sync_share"),
    ],
)
def test_stage_share_thresholds(stage, role, kind, key):
    t = THRESHOLDS[key]
    assert kind in _kinds(_share_doc(stage, role, t + 0.02))
    assert kind not in _kinds(_share_doc(stage, role, t - 0.02))


def test_unused_reference_needs_the_runs_config():
    rows = [window_row("ref_compute_log_prob", "ref", 20.0), window_row("actor_update", "actor", 50.0)]
    off = {"source": "x/trainer_config.json", "reference_pass": True, "kl_coef": 0.0}
    assert "unused_reference" in _kinds(window_doc(rows, run_config=off))
    assert "unused_reference" not in _kinds(window_doc(rows, run_config={**off, "kl_coef": 0.001}))
    assert "unused_reference" not in _kinds(window_doc(rows))  # no config beside the traces: not claimed


def _launch_doc(share):
    wall = 100.0
    row = window_row(
        "actor_update", "actor", wall, launch_bound_ms=share * wall, device_gap_ms=share * wall, launch_unlinked_ms=0.0
    )
    return window_doc([row, window_row("rollout_generate", "rollout", 100.0)])


def test_launch_bound_threshold():
    t = THRESHOLDS["launch_bound_share"]
    assert "launch_bound" in _kinds(_launch_doc(t + 0.02))
    assert "launch_bound" not in _kinds(_launch_doc(t - 0.02))


def _memory_doc(use):
    cap = 80 * 2**30
    return window_doc(
        [window_row("actor_update", "actor", 10.0)],
        memory=[
            {
                "rank": 0,
                "role": "actor",
                "stage": "actor_update",
                "file": "f",
                "peak_bytes": use * cap,
                "capacity_bytes": cap,
            }
        ],
    )


def test_memory_headroom_threshold():
    t = THRESHOLDS["memory_use_low"]
    assert "memory_headroom" in _kinds(_memory_doc(t - 0.02))
    assert "memory_headroom" not in _kinds(_memory_doc(t + 0.02))


def test_causes_rank_before_descriptions_and_slow_rank_first():
    doc = _tail_doc(0.6)
    found = findings(doc)
    kinds = [f["kind"] for f in found]
    assert kinds[0] == "rollout_tail" and all(f["cause"] is None for f in found if not f["actionable"])
    first_descriptive = next(i for i, f in enumerate(found) if not f["actionable"])
    assert all(f["actionable"] for f in found[:first_descriptive])


# ---- device measures on real public GPU traces, recomputed here ---------------------------------------------
def _independent_gaps(path):
    """Device idle gaps and those the host had not yet launched into, from the raw JSON: launches matched by
    Kineto's correlation ids (rlprof's reader links by the ac2g flows instead)."""
    ev = json.load(gzip.open(path))["traceEvents"]
    launch = {}
    for e in ev:
        if (
            e.get("ph") == "X"
            and e.get("cat") in ("cuda_runtime", "cuda_driver")
            and "correlation" in e.get("args", {})
        ):
            launch.setdefault(e["args"]["correlation"], float(e["ts"]))
    dev = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e["dur"]), e.get("args", {}).get("correlation"))
        for e in ev
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    busy_until, gap, bound = dev[0][1], 0.0, 0.0
    for start, end, corr in dev[1:]:
        if start > busy_until:
            gap += start - busy_until
            if corr in launch and launch[corr] > busy_until:
                bound += start - busy_until
        busy_until = max(busy_until, end)
    return gap / 1e3, bound / 1e3, (busy_until - dev[0][0]) / 1e3


@pytest.mark.parametrize(
    "name", ["gpu_nccl_rank0.json.gz", "sglang_qwen3_8b_decode_mi300x.json.gz", "rocm_mi250_train.json.gz"]
)
def test_launch_bound_gaps_on_real_gpu_traces(name):
    launch = analyze(REAL / name, workers=1)["launch"][0]
    gap, bound, span = _independent_gaps(REAL / name)
    assert launch["device_gap_ms"] == pytest.approx(gap, rel=1e-9)
    assert launch["device_span_ms"] == pytest.approx(span, rel=1e-9)
    # where the trace has no flow for a gap's kernel rlprof says unlinked, never guesses: the correlation-linked
    # count lies between what it calls launch-bound and that plus the unlinked
    assert launch["launch_bound_ms"] - 1e-9 <= bound <= launch["launch_bound_ms"] + launch["launch_unlinked_ms"] + 1e-9
    if name == "gpu_nccl_rank0.json.gz":  # an eager CUDA rank: its gaps mostly wait on work queued before them
        assert launch["launch_bound_ms"] == pytest.approx(bound) and bound < 0.05 * gap


def test_memory_use_against_capacity_on_a_real_capture():
    path = REAL / "sglang_decode_capture_bs32_mi300x.json.gz"
    raw = json.load(gzip.open(path))
    peaks = {}
    for e in raw["traceEvents"]:
        a = e.get("args", {})
        if e.get("name") == "[memory]" and a.get("Device Type") != 0 and "Total Allocated" in a:
            peaks[a["Device Id"]] = max(peaks.get(a["Device Id"], 0), a["Total Allocated"])
    ((device, peak),) = peaks.items()
    capacity = next(p["totalGlobalMem"] for p in raw["deviceProperties"] if p["id"] == device)
    doc = analyze(path, workers=1)
    (mem,) = doc["memory"]
    assert (mem["device"], mem["peak_bytes"], mem["capacity_bytes"]) == (device, peak, capacity)
    (use,) = [m for m in doc["measures"] if m["measure"] == "memory_use"]
    assert use["value"] == pytest.approx(peak / capacity)
    assert use["value"] >= THRESHOLDS["memory_use_low"]  # the engine took most of the GPU: no headroom finding
    assert "memory_headroom" not in [f["kind"] for f in doc["findings"]]


# ---- metrics first ---------------------------------------------------------------------------------------
def test_verl_console_and_file_logger_read_alike():
    metrics = DATA / "verl" / "metrics"
    fmt_c, console = read_step_metrics(metrics / "issue1208_console.log")
    fmt_f, logged = read_step_metrics(metrics / "file_logger.jsonl")
    assert (fmt_c, fmt_f) == ("verl console", "verl file logger")
    assert console == logged
    (rec,) = logged
    assert rec["stages"]["rollout_generate"] == 74.020 and rec["step_s"] == 96.551
    assert rec["response_length"] == 324.958


def test_advise_from_verl_metrics_targets_the_dominant_stage(tmp_path):
    out = tmp_path / "next.yaml"
    proc = run_cli("advise", DATA / "verl" / "metrics" / "file_logger.jsonl", "--dialect", "verl", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "rollout_generate dominates the step: 77%" in proc.stdout  # 74.020 of 96.551 s
    cfg = OmegaConf.load(out)
    assert cfg.global_profiler.steps == [2]
    assert cfg.actor_rollout_ref.rollout.profiler.enable is True


def _records(times, lengths=None):
    return [
        {
            "step": i + 1,
            "stages": {"rollout_generate": t, "actor_update": 1.0},
            "step_s": t + 1.0,
            "response_length": (lengths[i] if lengths else 100.0),
        }
        for i, t in enumerate(times)
    ]


def test_outlier_step_threshold():
    base = [1.0] * 8
    spike = list(base)
    spike[5] = (OUTLIER_FACTOR * 2.0 + 0.1) - 1.0  # step time just above OUTLIER_FACTOR x the median (2 s)
    (o,) = diagnose_steps(_records(spike))["outliers"]
    assert (o["step"], o["stage"]) == (6, "rollout_generate")
    calm = list(base)
    calm[5] = (OUTLIER_FACTOR * 2.0 - 0.1) - 1.0
    assert diagnose_steps(_records(calm))["outliers"] == []


def test_trend_with_response_length_threshold():
    lengths = [100.0, 200, 300, 400, 500, 600, 700, 800]
    grows = _records([0.5 + 0.002 * x for x in lengths], lengths)
    (t,) = [t for t in diagnose_steps(grows)["trends"] if t["stage"] == "rollout_generate"]
    assert t["with"] == "response_length" and t["r"] >= TREND_R
    assert t["s_per_100_tokens"] == pytest.approx(0.2)
    noise = _records([1.0, 1.3, 0.9, 1.2, 1.0, 1.1, 0.95, 1.05], lengths)
    assert all(t["stage"] != "rollout_generate" for t in diagnose_steps(noise)["trends"])


def test_unreadable_metrics_are_refused_in_one_line(tmp_path):
    bad = tmp_path / "m.jsonl"
    bad.write_text('{"step": 1, "loss": 0.3}\nnot json\n')
    proc = run_cli("advise", bad)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "no step metrics with stage timings" in proc.stderr


# ---- scenarios: recorded runs (exact), and one live run whose cause dominates by a wide margin ----------------
RUNS = DATA / "runs"  # the reference trainer's runs, recorded by bench/record_runs.py (tests/data/runs/SOURCES.md)


def recorded(name: str, tmp_path: Path) -> Path:
    """A copy of a recorded run directory (analysis writes beside its input)."""
    return shutil.copytree(RUNS / name, tmp_path / name)


@pytest.mark.parametrize("name", ["skewed_lengths", "slow_reward", "kl_off_reference_on", "healthy"])
def test_recorded_scenario_is_diagnosed_exactly(name, tmp_path):
    """On what the trainer recorded, the first cause is the injected one with its verl and rlprof levers, and a
    healthy run names none: the same answer on any machine, busy or not."""
    bench = _bench("diagnose")
    case = next(c for c in bench.SCENARIOS + bench.CONTROLS if c["name"] == name)
    doc = analyze(recorded(name, tmp_path), workers=1)
    scored = bench.score(case, {"findings": doc["findings"]})
    assert scored["passed"], scored
    if "cause" in case:
        assert all(scored["levers_named"].values())
    assert not any(f["kind"] == "busy_machine" for f in doc["findings"])  # recorded on a quiet machine
    # the units said what they held: the decode steps their active rows, the micro-batches their tokens
    statuses = {(m["measure"], m["stage"]): m["status"] for m in doc["measures"]}
    assert statuses[("rollout_tail", "rollout_generate")] == "measured"
    assert statuses[("padding", "actor_update")] == "measured"


@pytest.mark.slow
@pytest.mark.timing
def test_a_cause_that_dominates_is_found_live_whatever_the_load(tmp_path):
    """Live training asserts what holds whatever the timing: a verifier that waits 25 ms a sample holds the step
    for 1.6 s, several times what the rest of it takes even on a loaded machine, and is among the causes found."""
    bench = _bench("diagnose")
    case = {
        "name": "slow_reward_25ms",
        "cause": "slow_reward",
        "nproc": 1,
        "overrides": ("reward.cost_ms=25",),
        "levers": {"verl": "reward.num_workers", "rlprof": "reward.workers"},
    }
    result = bench.run_case(case, tmp_path, steps="[2]")
    scored = bench.score(case, result)
    assert "slow_reward" in scored["causes_found"], scored
    assert Path(result["run_dir"], "step2_actor_e2e_rank0.pt.trace.json.gz").is_file()


# ---- the report shows cause, evidence and levers ------------------------------------------------------------
def test_report_shows_cause_evidence_and_levers(browser, tmp_path):
    run_dir = recorded("slow_reward", tmp_path)
    proc = run_cli("analyze", run_dir)
    assert proc.returncode == 0, proc.stderr
    assert "cause: the reward function runs on the critical path" in proc.stdout  # the terminal leads with it
    out = tmp_path / "report.html"
    assert run_cli("report", run_dir, "-o", out).returncode == 0
    page, seen = open_page(browser, out)
    first = page.locator("section#findings .finding").first
    assert first.get_attribute("data-kind") == "slow_reward"
    assert "the reward function runs on the critical path" in first.locator(".cause").inner_text()
    assert "stage_ms" in first.locator(".evidence").inner_text()
    keys = first.locator("table.levers code").all_inner_texts()
    assert "reward.workers" in keys and "reward.num_workers" in keys and "rl_config.verifier_parallel" in keys
    # the breakdown chart ends where its axis labels end (no empty band below)
    band = page.evaluate("""() => { const g = document.querySelector('#chart-breakdown');
        const svg = g.querySelector('svg.main-svg').getBoundingClientRect();
        const ticks = [...g.querySelectorAll('.xtick text')].map(t => t.getBoundingClientRect().bottom);
        return svg.bottom - Math.max(...ticks); }""")
    assert 0 <= band < 60, band
    assert seen["errors"] == []
    page.close()


def test_profiled_steps_and_untimed_extra_time_are_not_targeted():
    recs = _records([1.0] * 8)
    recs[1]["profiled"], recs[1]["step_s"] = True, 9.0  # the profiler's own cost: left out
    assert diagnose_steps(recs)["outliers"] == []
    recs = _records([1.0] * 8)
    recs[5]["step_s"] = 9.0  # slow, but in no timed stage: reported without a stage, not targeted
    (o,) = diagnose_steps(recs)["outliers"]
    assert o["step"] == 6 and o["stage"] is None
