"""rlprof inside verl's own workers: micro-batch sampling by verl's profiler config, no source edits, proven on verl's
code (src/rlprof/integrations/verl/).

The live tests run verl's own training code on this CPU, in side venvs made on first use by bench/setup_verl.sh
(fixtures verl091 / verl071 in conftest.py; skipped where they cannot be made, required in CI by RLPROF_REQUIRE_VERL):
verl 0.9.1's ActorRolloutRefWorker as main_ppo builds it (role actor_rollout_ref) in this process and inside a Ray
worker, and verl 0.7.1's (DataParallelPPOActor inside). Everything the assertions read was written by verl's code with
rlprof's plugin loaded by verl itself; the comparison traces are verl's own profiler's.
"""

from __future__ import annotations

import collections
import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, plan_json, run_cli

from rlprof.analyze.inputs.host_stacks_file import stacks_path
from rlprof.frameworks import verl as facts

DATA = ROOT / "tests" / "data" / "verl"
FSDP = DATA / "config" / "v0.9.1_generated_ppo_trainer.yaml"
A = "actor_rollout_ref.actor.profiler"
PROFILE = ["global_profiler.tool=torch", f"{A}.enable=True", f"{A}.tool_config.torch.contents=[cpu]"]
# verl's default contents ([]: what the machine has): rlprof's host sampler is on in the sampled windows
SAMPLED = ["global_profiler.tool=torch", f"{A}.enable=True"]
# The seed's two code edits (a torch profiler with schedule(wait=.., active=1) around dp_actor's micro-batch loop, and
# step() per micro-batch), as config: the unit, and the schedule's counts (here: keep micro-batch 1).
TWO_LINES = [
    f"+{A}.tool_config.torch.schedule.unit=micro_batch",
    f"{A}.tool_config.torch.schedule.wait=1",
    f"{A}.tool_config.torch.schedule.active=1",
]
STAGES = ("actor_compute_log_prob", "ref_compute_log_prob", "actor_update")
MICRO = re.compile(r"^micro_batch(\d+)$")


# ---- what a trace holds ------------------------------------------------------------------------------------------
def events(path: Path) -> list[dict]:
    return [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X"]


def ranges(evs: list[dict], pattern: str) -> list[dict]:
    return [e for e in evs if re.match(pattern, e["name"])]


def ops_inside(evs: list[dict], rng: dict) -> collections.Counter:
    lo, hi = rng["ts"], rng["ts"] + rng["dur"]
    return collections.Counter(
        e["name"] for e in evs if e.get("cat") == "cpu_op" and lo <= e["ts"] and e["ts"] + e["dur"] <= hi
    )


def by_stage(save_path: Path) -> dict[tuple[int, str], Path]:
    """verl-named traces under a save_path: (step, stage) -> file, read with rlprof's reader of verl's names."""
    out = {}
    for f in sorted(save_path.glob("*.json.gz")):
        meta = facts.parse_trace_name(f.name)
        assert meta is not None, f"{f.name} is not named as verl names its traces"
        assert (meta["step"], meta["stage"]) not in out, f"two files for {meta['step']}, {meta['stage']}"
        out[(meta["step"], meta["stage"])] = f
    return out


def assert_keeps_micro_batch(path: Path, k: int, verl_ranges: bool = True) -> list[dict]:
    """The file holds micro-batch k of its stage and nothing of another: one rlprof unit range k inside the stage
    range, and (verl 0.9.1 on) verl's own `micro_batch{k}` range inside it, no other."""
    evs = events(path)
    units = ranges(evs, r"rlprof:micro_batch:")
    assert [u["name"].split("|")[0] for u in units] == [f"rlprof:micro_batch:{k}"], path.name
    (stage,) = ranges(evs, r"rlprof:stage:")
    unit = units[0]
    assert stage["ts"] <= unit["ts"] and unit["ts"] + unit["dur"] <= stage["ts"] + stage["dur"]
    held = dict(part.split("=") for part in unit["name"].split("|")[1].split(","))
    assert int(held["seqs"]) == 2 and int(held["tokens"]) >= int(held["real_tokens"]) > 0
    outside = [e for e in evs if e.get("cat") == "cpu_op" and not stage["ts"] <= e["ts"] <= stage["ts"] + stage["dur"]]
    assert not outside, f"{path.name}: {len(outside)} operators outside the kept micro-batch"
    if verl_ranges:
        (own,) = [e for e in evs if MICRO.match(e["name"])]
        assert own["name"] == f"micro_batch{k}"
        assert unit["ts"] <= own["ts"] and own["ts"] + own["dur"] <= unit["ts"] + unit["dur"]
    return evs


# ---- the plan, without verl ----------------------------------------------------------------------------------------
def test_plan_shows_the_micro_batches_the_plugin_keeps_in_verls_workers():
    plan = plan_json(FSDP, *PROFILE, "global_profiler.steps=[1,2]", *TWO_LINES)
    actor, ref = plan["roles"]["actor"], plan["roles"]["ref"]
    # verl's YAML says repeat: 0; in e2e mode that is one schedule window (per stage call), as verl reads it
    assert actor["schedule"] == {
        "unit": "micro_batch",
        "skip_first": 0,
        "wait": 1,
        "warmup": 0,
        "active": 1,
        "repeat": 1,
    }
    assert actor["verl_plugin"]["stages"] == ["actor_compute_log_prob", "actor_update"]
    assert ref["verl_plugin"]["stages"] == ["ref_compute_log_prob"]
    assert actor["verl_plugin"]["micro_batches"] == ref["verl_plugin"]["micro_batches"] == [1]
    assert not actor["verl_plugin"]["more"]
    words = run_cli("plan", FSDP, *PROFILE, "global_profiler.steps=[1,2]", *TWO_LINES).stdout
    assert (
        "in verl's workers (rlprof's verl plugin): micro-batch 1 of each call of actor_compute_log_prob, actor_update"
    ) in words
    # discrete mode: repeat 0 is every cycle until the stage ends, as verl reads it
    discrete = plan_json(
        FSDP, *PROFILE, "global_profiler.steps=[1]", *TWO_LINES, f"{A}.tool_config.torch.discrete=True"
    )
    assert discrete["roles"]["actor"]["verl_plugin"]["micro_batches"][:3] == [1, 3, 5]
    assert discrete["roles"]["actor"]["verl_plugin"]["more"]
    # verl's own unit (update mini-batches): the plugin has no part
    own = plan_json(FSDP, *PROFILE, "global_profiler.steps=[1]", f"{A}.tool_config.torch.schedule.active=1")
    assert own["roles"]["actor"]["verl_plugin"] is None


def test_the_unit_needs_plus_over_verls_yaml_and_a_bad_one_is_one_line_exit_2():
    plain = run_cli(
        "plan", FSDP, *PROFILE, "global_profiler.steps=[1]", f"{A}.tool_config.torch.schedule.unit=micro_batch"
    )
    assert plain.returncode == 2 and f"+{A}.tool_config.torch.schedule.unit=micro_batch" in plain.stderr
    bad = run_cli(
        "plan", FSDP, *PROFILE, "global_profiler.steps=[1]", f"+{A}.tool_config.torch.schedule.unit=micro_batches"
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert f"{A}.tool_config.torch.schedule.unit" in bad.stderr and "'micro_batches'" in bad.stderr
    assert "micro_batch" in bad.stderr.split("allowed:")[1] and "Traceback" not in bad.stderr


def test_the_plugin_costs_an_import_and_a_finder_until_a_config_asks():
    probe = (
        "import sys; import rlprof.integrations.verl.loader as p; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'omegaconf', 'msgspec', 'numpy') "
        "or m.startswith(('rlprof.config', 'rlprof.collect')))); "
        "print(type(sys.meta_path[0]).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["[]", "_AfterImport"]


def test_verls_layout_at_0_9_1_and_head_is_where_the_plugin_attaches():
    """tests/data/verl/layout.json: read from verl 0.9.1's package and verl's head (1dda039) by bench/verl_layout.py."""
    recorded = json.loads((DATA / "layout.json").read_text())
    assert {"0.9.1", "head"} <= set(recorded)
    for label, entry in recorded.items():
        engine = entry["engine"]
        assert engine["class"] == facts.ENGINE_LAYOUT["class"] and engine["method"] == facts.ENGINE_LAYOUT["method"]
        assert engine["calls"] == engine["module_imports"] == [facts.ENGINE_LAYOUT["source"]], label
        loop = engine["loop"]
        assert loop["iterates"] == "enumerate(micro_batches)" and loop["backward_inside_range"], label
        assert "micro_batch{" in loop["range"], label
        assert {facts.stage_of_annotation(role) for role in entry["annotations"].values()} == set(STAGES), label
        assert {"tool_config", "_impl"} <= set(entry["dist_profiler"]["init_keeps"])
        assert entry["dist_profiler"]["annotate_delegates"] and entry["loads_plugin_group"], label
        assert "unit" not in entry["config"]["TorchProfilerScheduleConfig"], label  # the plugin must teach it
        assert "schedule" not in entry["config"]["NPUToolConfig"], label


# ---- verl 0.9.1's own code ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sampled091(verl091, tmp_path_factory):
    """Six profiled steps of verl 0.9.1's worker with the two lines; verl's finish hook lists what it sees."""
    out = tmp_path_factory.mktemp("verl091-sampled")
    hook = (
        'global_profiler.finish_hook_cmd=\'ls "$VERL_PROFILE_SAVE_PATH" > "$VERL_PROFILE_SAVE_PATH/../hook_saw.txt"\''
    )
    result = verl091.run(out, *SAMPLED, "global_profiler.steps=[1,2,3,4,5,6]", hook, *TWO_LINES, steps=6)
    return out, result


@pytest.fixture(scope="module")
def full091(verl091, tmp_path_factory):
    """Step 1 of the same run with verl's own profiler, discrete, no schedule: every micro-batch in full."""
    out = tmp_path_factory.mktemp("verl091-full")
    return out, verl091.run(out, *PROFILE, "global_profiler.steps=[1]", f"{A}.tool_config.torch.discrete=True", steps=1)


def test_verl_0_9_1_keeps_exactly_micro_batch_1_of_each_stage(sampled091):
    out, result = sampled091
    files = by_stage(out / "profile")
    assert sorted(files) == sorted((step, stage) for step in range(1, 7) for stage in STAGES)
    for (_, stage), path in files.items():
        evs = assert_keeps_micro_batch(path, 1)
        backward = [e for e in evs if "Backward" in e["name"]]
        assert bool(backward) == (stage == "actor_update"), path.name  # the update's window holds its backward
        (own,) = [e for e in evs if e["name"] == "micro_batch1"]
        assert all(own["ts"] <= e["ts"] <= own["ts"] + own["dur"] for e in backward)
    said = result.rlprof_lines()
    assert len(said) == 18 and all(line.startswith("[rlprof] rank 0: ") for line in said), said  # no warning
    saw = (out / "hook_saw.txt").read_text().split()  # verl's finish hook, after the last profiled step
    traces = [name for name in saw if not name.endswith(".stacks.msgpack.gz")]  # the host's stacks beside each
    assert sorted(traces) == sorted(p.name for p in files.values())
    assert sorted(set(saw) - set(traces)) == sorted(stacks_path(p).name for p in files.values())
    assert result.data["record_changed"] == []  # no file of the installed verl changed


def test_the_window_is_verls_own_micro_batch_range_of_a_full_trace_of_the_same_call(sampled091, full091):
    sampled, full = by_stage(sampled091[0] / "profile"), by_stage(full091[0] / "profile")
    for stage in STAGES:
        whole = events(full[(1, stage)])
        assert sorted(e["name"] for e in whole if MICRO.match(e["name"])) == [f"micro_batch{k}" for k in range(4)]
        (reference,) = [e for e in whole if e["name"] == "micro_batch1"]
        kept = events(sampled[(1, stage)])
        (own,) = [e for e in kept if e["name"] == "micro_batch1"]
        inside = ops_inside(kept, own)
        assert inside == ops_inside(whole, reference) and sum(inside.values()) > 100, stage
        assert sum(1 for e in kept if e.get("cat") == "cpu_op") == sum(inside.values())  # nothing else kept


def test_the_installed_plugin_stays_out_of_a_config_that_does_not_ask(full091):
    out, result = full091
    assert facts.PLUGIN_MODULE in result.data["plugins_loaded"]  # loaded by verl's entry point
    assert not [m for m in result.data["plugins_loaded"] if m.startswith(("rlprof.config", "rlprof.collect"))]
    assert result.rlprof_lines() == []
    for path in by_stage(out / "profile").values():  # verl's own traces, as verl writes them
        assert not ranges(events(path), r"rlprof:")


def test_rlprof_analyze_of_a_sampled_verl_run(sampled091, tmp_path):
    save_path = tmp_path / "profile"
    shutil.copytree(sampled091[0] / "profile", save_path)
    proc = run_cli("analyze", save_path, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    units = [r for r in doc["rows"] if r["unit"] == "micro_batch"]
    keys = sorted((r["step"], r["role"], r["stage"], r["index"], r["rank"]) for r in units)
    expected = sorted((s, "ref" if st.startswith("ref") else "actor", st, 1, 0) for s in range(1, 7) for st in STAGES)
    assert keys == expected  # one row per (step, role, stage, micro-batch, rank)
    assert all(r["seqs"] == 2 and r["tokens"] >= r["real_tokens"] > 0 and r["wall_ms"] > 0 for r in units)
    measures = {(m["measure"], m["stage"]): m for m in doc["measures"]}
    for stage in STAGES:
        padding, fixed = measures[("padding", stage)], measures[("fixed_cost", stage)]
        assert padding["status"] == "measured", padding
        # the fit is tried on the six kept micro-batches' token counts, and said not measurable where it breaks
        # physics or they scatter too much about it (a loaded machine's verl worker: 33% once), with why
        assert "token_counts" in fixed and (fixed["status"] == "measured" or fixed["why"]), fixed
        held = [r for r in units if r["stage"] == stage]
        tokens, real = sum(r["tokens"] for r in held), sum(r["real_tokens"] for r in held)
        assert padding["value"] == pytest.approx(1 - real / tokens) and 0 < padding["value"] < 1
    # each stage row says the whole call its kept micro-batch came from: verl's four micro-batches, all their tokens
    for row in (r for r in doc["rows"] if r["unit"] is None and r["stage"] in STAGES):
        (kept,) = [u for u in units if (u["step"], u["stage"]) == (row["step"], row["stage"])]
        call = row["call"]
        assert call["units"] == call["tallied_units"] == 4 and call["wall_ms"] > row["wall_ms"], row
        assert kept["real_tokens"] < call["real_tokens"] and kept["query_key_pairs"] < call["query_key_pairs"]


def test_idle_in_verls_worker_is_charged_to_verls_own_frames(sampled091, tmp_path):
    """The host's stacks sampled in each micro-batch window inside verl's worker: each stage's idle is charged to
    frames of verl's own code (the innermost verl frame on the stage thread's stack), at least 90% of it, the rest
    said as unattributed or as other frames, adding up to the idle."""
    save_path = tmp_path / "profile"
    shutil.copytree(sampled091[0] / "profile", save_path)
    proc = run_cli("analyze", save_path, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    for stage in STAGES:
        rows = [r for r in doc["rows"] if r["stage"] == stage and r["unit"] is None]
        assert len(rows) == 6 and all("idle_frames" in r for r in rows), stage
        idle = sum(r["idle_ms"] for r in rows)
        verl = sum(f["ms"] for r in rows for f in r["idle_frames"] if f["library"] == "verl")
        assert idle > 0 and verl >= 0.9 * idle, (stage, verl, idle)
        assert all(f["file"].startswith("verl/") for r in rows for f in r["idle_frames"] if f["library"] == "verl")
        said = sum(
            sum(f["ms"] for f in r["idle_frames"]) + r["idle_frames_rest_ms"] + r["idle_unattributed_ms"] for r in rows
        )
        assert said == pytest.approx(idle, abs=1e-3)
    for f in doc["findings"]:
        if f["kind"] == "idle" and "% in " in f["text"]:
            assert re.search(r"\d+% in verl/\S+:\d+ ", f["text"]), f["text"]


def test_inside_a_ray_worker(verl091, tmp_path):
    result = verl091.run(tmp_path, *PROFILE, "global_profiler.steps=[1]", *TWO_LINES, mode="ray", steps=1)
    files = by_stage(tmp_path / "profile")
    assert sorted(files) == sorted((1, stage) for stage in STAGES)
    for path in files.values():
        assert_keeps_micro_batch(path, 1)
    assert result.data["record_changed"] == []


def test_what_the_plugin_decides_on_verls_own_profiler_objects(verl091, tmp_path):
    """verl's DistProfiler built by verl's config classes: which profilers the plugin takes over, and a bad unit."""
    probe = f"""
import json, logging, io
import verl
from verl.utils.profiler import DistProfiler, ProfilerConfig
from verl.utils.profiler.config import TorchProfilerToolConfig, TorchProfilerScheduleConfig
stream = io.StringIO(); logging.getLogger("rlprof").addHandler(logging.StreamHandler(stream))
def impl(enable=True, ranks=(0,), **schedule):
    config = ProfilerConfig(tool="torch", enable=enable, ranks=list(ranks), save_path={str(tmp_path)!r}, tool_config=None)
    tool = TorchProfilerToolConfig(schedule=TorchProfilerScheduleConfig(**schedule))
    return type(DistProfiler(rank=0, config=config, tool_config=tool)._impl).__name__
print(json.dumps({{"asks": impl(unit="micro_batch", active=1), "none": impl(active=1),
                   "mini_batch": impl(unit="mini_batch", active=1), "other_rank": impl(ranks=(1,), unit="micro_batch"),
                   "bad": impl(unit="micro_batches", active=1), "said": stream.getvalue().splitlines()}}))
"""
    proc = subprocess.run([str(verl091.python), "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["asks"] == "MicroBatchSampler"
    assert got["none"] == got["mini_batch"] == got["other_rank"] == got["bad"] == "Profiler"  # verl's own
    (line,) = got["said"]  # one warning: the key, the value, what is allowed, and that verl goes on
    assert "schedule.unit" in line and "'micro_batches'" in line and "micro_batch" in line.split("allowed:")[1]
    assert "verl goes on" in line


def test_a_verl_release_the_plugin_does_not_know_is_one_warning_and_no_patching(verl091, tmp_path):
    result = verl091.run(
        tmp_path,
        *PROFILE,
        "global_profiler.steps=[1]",
        *TWO_LINES,
        f"{A}.tool_config.torch.discrete=True",
        steps=1,
        extra=("--pretend-release", "0.11.0"),
    )
    (line,) = result.rlprof_lines()
    assert "verl 0.11.0 is not a release the verl plugin knows" in line and "collects instead" in line
    assert "update mini-batches by the schedule" in line
    files = by_stage(tmp_path / "profile")  # verl's own profiler did its own work: whole log-prob stages
    assert {stage for _, stage in files} >= {"actor_compute_log_prob", "ref_compute_log_prob"}
    for path in files.values():
        assert not ranges(events(path), r"rlprof:")


# ---- verl 0.7.1's own code (dp_actor) --------------------------------------------------------------------------------
MODULES = {"VERL_USE_EXTERNAL_MODULES": f"verl_cpu_shim,{facts.PLUGIN_MODULE}"}


def test_verl_0_7_1_through_verl_use_external_modules(verl071, tmp_path):
    schedule = f"+{A}.tool_config.torch.schedule={{unit: micro_batch, wait: 1, active: 1}}"  # 0.7 has no schedule
    result = verl071.run(tmp_path, *PROFILE, "global_profiler.steps=[1]", schedule, steps=1, env=MODULES)
    files = by_stage(tmp_path / "profile")
    assert sorted(files) == sorted((1, stage) for stage in STAGES)
    for (_, stage), path in files.items():
        evs = assert_keeps_micro_batch(path, 1, verl_ranges=False)  # 0.7.1 marks no micro-batch of its own
        names = collections.Counter(e["name"] for e in evs)
        assert names["aten::embedding"] == 1  # one micro-batch's forward
        assert names["EmbeddingBackward0"] == (1 if stage == "actor_update" else 0)  # and its backward
    assert result.data["record_changed"] == []
    proc = run_cli("analyze", tmp_path / "profile", "--json")
    units = [r for r in json.loads(proc.stdout)["rows"] if r["unit"] == "micro_batch"]
    assert sorted((r["stage"], r["index"]) for r in units) == sorted((stage, 1) for stage in STAGES)
    assert all(r["tokens"] > r["real_tokens"] for r in units)  # 0.7.1 computes padded rows here


def test_verl_0_7_1_imports_external_lib_after_its_worker_refused_the_schedule(verl071, tmp_path):
    """Why 0.7.x needs VERL_USE_EXTERNAL_MODULES: external_lib comes in init_model, after __init__ built the config."""
    schedule = f"+{A}.tool_config.torch.schedule={{unit: micro_batch, wait: 1, active: 1}}"
    result = verl071.run(
        tmp_path,
        *PROFILE,
        "global_profiler.steps=[1]",
        schedule,
        f"actor_rollout_ref.model.external_lib={facts.PLUGIN_MODULE}",
        steps=1,
        env={"VERL_USE_EXTERNAL_MODULES": "verl_cpu_shim"},
        check=False,
    )
    assert "TorchProfilerToolConfig.__init__() got an unexpected keyword argument 'schedule'" in result.stderr
    assert not (tmp_path / "profile").exists() or not list((tmp_path / "profile").iterdir())


def test_the_readmes_two_lines_are_these():
    """docs/verl.md "rlprof inside verl": its main_ppo commands' overrides keep the micro-batches it says they keep."""
    import shlex

    text = (ROOT / "docs" / "verl.md").read_text()
    section = text.split("## rlprof inside verl", 1)[1].split("\n## ", 1)[0]
    blocks = [b.replace("\\\n", " ") for b in re.findall(r"```bash\n(.*?)```", section, re.S)]
    # the block's shell variables ($A, $R: the actor's and the rollout's profiler keys), as the shell expands them
    blocks = [
        b.replace("$A.", "actor_rollout_ref.actor.profiler.").replace("$R.", "actor_rollout_ref.rollout.profiler.")
        for b in blocks
    ]
    lines = [line.split("   #")[0] for b in blocks for line in b.splitlines()]
    commands = [shlex.split(line) for line in lines if "main_ppo" in line]
    current, legacy, whole_job, triggered = ([a for a in c if "=" in a] for c in commands)
    assert [a for a in current if "schedule" in a] == [TWO_LINES[0], TWO_LINES[2]]  # the two lines
    plan = plan_json(FSDP, *current)
    assert plan["roles"]["actor"]["verl_plugin"]["micro_batches"] == [0]
    assert plan["roles"]["ref"]["verl_plugin"]["micro_batches"] == [0]
    assert f"+{facts.RUNTIME_ENV_VARS}.{facts.EXTERNAL_MODULES_ENV}={facts.PLUGIN_MODULE}" in legacy
    old = plan_json(*PROFILE, "global_profiler.steps=[1]", *legacy)
    assert old["roles"]["actor"]["verl_plugin"]["micro_batches"] == [0]
    # the whole job's command (tests/test_verl_job.py runs it): micro-batch 1 (and every second one after it: discrete
    # mode, verl's repeat 0), and the rollout's decode window
    job = plan_json(FSDP, *whole_job)
    assert job["roles"]["actor"]["verl_plugin"]["micro_batches"][:3] == [1, 3, 5]
    window = job["roles"]["rollout"]["schedule"]
    assert (window["unit"], window["wait"], window["warmup"], window["active"]) == ("decode_step", 29, 1, 30)
    # the trigger in main_ppo (tests/test_verl_job.py runs it): no step listed, actor and rollout enabled
    caught = plan_json(FSDP, *triggered)
    assert (caught["trigger"]["slow"]["factor"], caught["trigger"]["request"]) == (2.0, True)
    assert all(caught["roles"][r]["steps"] == [] for r in ("actor", "rollout"))


def test_overhead_bench_prints_documented_json(verl091):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "verl_plugin_overhead.py"), "--pairs", "1", "--calls", "3"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["plugin_loaded"] == {"verl_alone": False, "plugin_installed_inactive": True}
    assert set(figures["median_ms"]) == {"verl_alone", "plugin_installed_inactive"}
    assert figures["difference_ms"] == pytest.approx(
        figures["median_ms"]["plugin_installed_inactive"] - figures["median_ms"]["verl_alone"], abs=2e-3
    )
    recorded = json.loads((ROOT / "bench" / "results" / "verl_plugin_overhead_cpu.json").read_text())
    assert set(recorded) >= set(figures)


# ---- the rollout's decode window: verl's command line handed to rlprof's vLLM plugin ----------------------------
def test_main_ppos_command_line_hands_the_rollouts_decode_window_to_the_vllm_plugin():
    """In main_ppo's driver the verl plugin turns the command line's profiler overrides into the plan rlprof's vLLM
    plugin reads in the engine processes (which inherit the driver's environment through Ray); only when the
    rollout asks for decode steps, and never over a plan the user gave (tests/test_verl_job.py runs it live)."""
    from rlprof.integrations.verl.rollout_plan import hand_rollout_plan
    from rlprof.integrations.vllm.settings import engine_settings

    R = "actor_rollout_ref.rollout.profiler"
    window = f"+{R}.tool_config.torch.schedule={{unit: decode_step, wait: 29, warmup: 1, active: 30}}"
    argv = [
        "algorithm.adv_estimator=grpo",
        "global_profiler.tool=torch",
        "global_profiler.steps=[1,2]",
        f"{A}.enable=True",
        f"{A}.ranks=[0]",
        *TWO_LINES,
        f"{R}.enable=True",
        f"{R}.ranks=[0]",
        f"{R}.tool_config.torch.discrete=True",
        window,
    ]
    env: dict = {}
    handed = hand_rollout_plan(argv, env)
    assert env["RLPROF_PLAN"] == handed and "algorithm.adv_estimator" not in handed
    settings = engine_settings(handed, {"RLPROF_REPLICA": "0"})
    assert settings.steps == (1, 2) and settings.rollout.schedule.unit == "decode_step"
    assert (settings.rollout.schedule.wait, settings.rollout.schedule.warmup, settings.rollout.schedule.active) == (
        29,
        1,
        30,
    )
    assert engine_settings(handed, {"RLPROF_REPLICA": "1"}) is None  # ranks [0]: replica 0 only
    assert hand_rollout_plan(argv[:-1], {}) is None  # no decode window asked: vLLM is left alone
    mine = {"RLPROF_PLAN": "my_plan.yaml"}
    assert hand_rollout_plan(argv, mine) is None and mine == {"RLPROF_PLAN": "my_plan.yaml"}
