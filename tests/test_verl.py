"""rlprof inside verl: verl 0.9's own configs and example overrides, its finish hook, its own output files.

The data under tests/data/verl/ is real: the generated trainer YAMLs of the verl wheels, the example scripts'
profiler overrides, and traces written by verl 0.9.1's DistProfiler (bench/make_verl_fixtures.py). verl itself
is not needed here.
"""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import REAL, ROOT, open_page, plan_json, run_cli

DATA = ROOT / "tests" / "data" / "verl"
CONFIGS = DATA / "config"
FSDP = CONFIGS / "v0.9.1_generated_ppo_trainer.yaml"
MEGATRON = CONFIGS / "v0.9.1_generated_ppo_megatron_trainer.yaml"
EXAMPLES = yaml.safe_load((DATA / "example_overrides.yaml").read_text())
OUTPUT = DATA / "output"
A = "actor_rollout_ref.actor.profiler"


@pytest.mark.parametrize(
    "config", [FSDP, MEGATRON, CONFIGS / "v0.9.0_generated_ppo_trainer.yaml"], ids=["fsdp", "megatron", "fsdp-0.9.0"]
)
def test_whole_generated_trainer_yaml_loads_and_collects_nothing_by_default(config):
    plan = plan_json(config)
    assert plan["dialect"] == "global_role" and plan["framework"].startswith("verl 0.9.")
    assert not any(r["enabled"] for r in plan["roles"].values())
    assert plan["warnings"] == []


def test_version_is_read_from_the_config():
    assert plan_json(FSDP)["framework"] == "verl 0.9.1"
    assert plan_json(CONFIGS / "v0.9.0_generated_ppo_trainer.yaml")["framework"] == "verl 0.9.0"
    assert plan_json(FSDP, "--verl-version", "0.9.0")["framework"] == "verl 0.9.0"


@pytest.mark.parametrize("config", [FSDP, MEGATRON], ids=["fsdp", "megatron"])
def test_torch_profile_example_is_verl_schedule_over_update_mini_batches(config):
    plan = plan_json(config, *EXAMPLES["torch_profile"])
    actor, ref, rollout = (plan["roles"][r] for r in ("actor", "ref", "rollout"))
    assert actor["enabled"] and actor["tool"] == "torch" and actor["mode"] == "e2e"
    assert actor["steps"] == [1, 2] and actor["ranks"] == [0] and actor["collects_on_rank"]
    assert actor["contents"] == ["cpu", "cuda"]
    # warmup 1 + active 2 update mini-batches, one window per step (repeat 1), other stages in full
    assert actor["schedule"] == {
        "unit": "mini_batch",
        "skip_first": 0,
        "wait": 0,
        "warmup": 1,
        "active": 2,
        "repeat": 1,
    }
    assert actor["schedule_stages"] == ["actor_update", "critic_update"]
    assert actor["save_path"] == "/tmp/home/profile_data"
    # the combined actor_rollout_ref worker: ref stages follow the actor although the YAML says enable: false
    assert ref["enabled"] and ref["mode"] == "e2e" and ref["ranks"] == [0]
    # verl 0.9 rolls out asynchronously; an e2e rollout engine is not profiled: one warning, no refusal
    assert not rollout["enabled"] and plan["async_rollout"]
    assert any("without profiling its rollout engines" in w for w in plan["warnings"])


def test_schedule_active_zero_is_off_and_repeat_zero_runs_until_the_window_closes():
    base = [*EXAMPLES["torch_profile"][:4], "global_profiler.tool=torch", "global_profiler.steps=[1]"]
    assert plan_json(FSDP, *base)["roles"]["actor"]["schedule"] is None  # the YAML's active: 0
    discrete = plan_json(
        FSDP, *base, f"{A}.tool_config.torch.discrete=True", f"{A}.tool_config.torch.schedule.active=2"
    )
    assert discrete["roles"]["actor"]["schedule"]["repeat"] == 0
    e2e = plan_json(FSDP, *base, f"{A}.tool_config.torch.schedule.active=2")
    assert e2e["roles"]["actor"]["schedule"]["repeat"] == 1  # verl caps a continuous window at one per step
    own = plan_json(*base, f"{A}.tool_config.torch.schedule={{unit: micro_batch, active: 1}}")
    assert own["roles"]["actor"]["schedule"]["unit"] == "micro_batch"  # rlprof's unit still extends it


@pytest.mark.parametrize("name", ["npu_discrete", "npu_e2e"])
def test_npu_examples_resolve_with_one_machine_warning(name):
    plan = plan_json(FSDP, *EXAMPLES[name], "--device", "cpu")
    actor, ref = plan["roles"]["actor"], plan["roles"]["ref"]
    discrete = name == "npu_discrete"
    assert actor["tool"] == "npu" and actor["level"] == "level0" and actor["contents"] == ["npu", "cpu"]
    assert actor["mode"] == ("discrete" if discrete else "e2e") and actor["analysis"] is True
    assert actor["export_type"] == "db"  # verl's npu tool always exports Db
    assert actor["steps"] == [2, 4] and ref["enabled"] and ref["mode"] == actor["mode"]
    assert (actor["ranks"], actor["all_ranks"]) == (([1, 2], False) if discrete else ([], True))
    assert sum("torch_npu" in w for w in plan["warnings"]) == 1


def test_torch_memory_example_takes_verls_keys():
    plan = plan_json(
        FSDP, *EXAMPLES["torch_memory"], "global_profiler.steps=[3]", f"{A}.enable=True", "--device", "cpu"
    )
    actor = plan["roles"]["actor"]
    assert actor["tool"] == "torch_memory" and actor["memory"] == {
        "max_entries": 100000,
        "stack_depth": 32,
        "snapshot_steps": 1,
    }
    assert plan_json(FSDP, *EXAMPLES["torch_memory"])["roles"]["actor"]["enabled"] is False  # no steps, no enable


def test_rollout_token_window_and_ranks_mapped_to_replicas():
    plan = plan_json(FSDP, *EXAMPLES["rollout_token_window"])
    rollout = plan["roles"]["rollout"]
    assert rollout["enabled"] and rollout["mode"] == "discrete" and rollout["token_window"] == [12, 46]
    assert rollout["schedule"] == {
        "unit": "decode_step",
        "skip_first": 12,
        "wait": 0,
        "warmup": 0,
        "active": 34,
        "repeat": 1,
    }
    # verl 0.9.1: global GPU ranks 0 and 3 with tp=2 are replicas 0 and 1; verl 0.9.0: replica indices
    assert rollout["ranks"] == [0, 1]
    assert plan_json(FSDP, *EXAMPLES["rollout_token_window"], "--verl-version", "0.9.0")["roles"]["rollout"][
        "ranks"
    ] == [0, 3]
    words = run_cli("plan", FSDP, *EXAMPLES["rollout_token_window"]).stdout
    assert "verl 0.9.1's meaning" in words and "decode steps [12, 46)" in words and "replica(s) 0, 1" in words


def test_finish_hook_keys_and_precision_debugger_resolve():
    hook = 'rlprof analyze "$VERL_PROFILE_SAVE_PATH"'
    plan = plan_json(
        FSDP,
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"{A}.enable=True",
        f"global_profiler.finish_hook_cmd='{hook}'",
        "global_profiler.finish_hook_ranks=[0,8]",
        "global_profiler.relocate_results=True",
        "--rank",
        "8",
    )
    actor = plan["roles"]["actor"]
    assert actor["finish_hook"] == {"cmd": hook, "all_ranks": False, "ranks": [0, 8], "runs_on_rank": True}
    assert actor["relocate_results"] is True and not actor["collects_on_rank"]
    pd = plan_json(FSDP, "global_profiler.tool=precision_debugger", "global_profiler.steps=[1]", f"{A}.enable=True")
    assert pd["roles"]["actor"]["tool"] == "precision_debugger"
    assert sum(w.startswith("warning: tool precision_debugger") for w in pd["warnings"]) == 1


def test_keys_verl_refuses_are_warnings_naming_the_extension():
    plan = plan_json(
        "global_profiler.tool=torch",
        "global_profiler.steps=[1]",
        f"{A}.enable=True",
        f"{A}.tool_config.torch.contents=[cpu,module]",
        f"{A}.tool_config.npu.export_type=text",
    )
    assert any("contents = 'module' is an rlprof extension" in w for w in plan["warnings"])
    assert any("export_type = 'text' is an rlprof extension" in w for w in plan["warnings"])


def test_legacy_layouts_load():
    v041 = plan_json(
        CONFIGS / "v0.4.1_ppo_trainer.yaml",
        "trainer.profile_steps=[2]",
        "trainer.profile_continuous_steps=true",
        "--device",
        "cuda",
    )
    assert v041["dialect"] == "legacy" and v041["continuous_steps"] is True
    assert v041["roles"]["reward"]["enabled"] and v041["roles"]["actor"]["tool"] == "nsys"
    v050 = plan_json(
        CONFIGS / "v0.5.0_generated_ppo_trainer.yaml",
        "trainer.profile_steps=[1]",
        "actor_rollout_ref.profiler.ranks=[]",
        "--device",
        "cpu",
    )
    assert v050["roles"]["actor"]["tool"] == "npu" and v050["roles"]["actor"]["ranks"] == []
    assert not v050["roles"]["actor"]["collects_on_rank"]  # ranks: [] profiles no rank


BROKEN = [
    ("typo-in-key", [f"{A}.tool_config.torch.discret=True"], f"{A}.tool_config.torch.discret"),
    ("bad-tool", ["global_profiler.tool=nsight"], "global_profiler.tool"),
    (
        "token-end-before-start",
        [
            "actor_rollout_ref.rollout.profiler.tool_config.torch.profile_token_start=10",
            "actor_rollout_ref.rollout.profiler.tool_config.torch.profile_token_end=10",
        ],
        "profile_token_end",
    ),
    ("negative-schedule", [f"{A}.tool_config.torch.schedule.wait=-1"], f"{A}.tool_config.torch.schedule.wait"),
    ("rank-not-integer", [f"{A}.ranks=[zero]"], f"{A}.ranks[0]"),
    (
        "hook-ranks-not-integers",
        ["global_profiler.finish_hook_cmd=ls", "global_profiler.finish_hook_ranks=[a]"],
        "finish_hook_ranks[0]",
    ),
    ("bad-level", [f"{A}.tool=npu", f"{A}.tool_config.npu.level=level9"], f"{A}.tool_config.npu.level"),
    ("bad-torch-content", [f"{A}.tool_config.torch.contents=[gpu]"], f"{A}.tool_config.torch.contents[0]"),
    (
        "memory-stack-zero",
        ["global_profiler.global_tool_config.torch_memory.stack_depth=0", "global_profiler.tool=torch_memory"],
        "stack_depth",
    ),
    ("typo-in-global", ["global_profiler.finish_hook_comand=ls"], "global_profiler.finish_hook_comand"),
    ("hook-all-ranks-not-bool", ["global_profiler.finish_hook_all_ranks=maybe"], "finish_hook_all_ranks"),
]


@pytest.mark.parametrize("overrides,key", [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_broken_verl_config_is_one_line_exit_2_nothing_written(overrides, key, tmp_path):
    base = [
        "global_profiler.tool=torch",
        "global_profiler.steps=[1]",
        f"{A}.enable=True",
        f"global_profiler.save_path={tmp_path}/p",
    ]
    proc = run_cli("plan", FSDP, *base, *overrides, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and "allowed" in lines[0], proc.stderr
    assert not (tmp_path / "p").exists()


def test_unparsable_yaml_names_file_line_and_column(tmp_path):
    bad = tmp_path / "verl.yaml"
    bad.write_text("global_profiler:\n  tool: torch\n  steps: [1, 2\n")
    proc = run_cli("plan", bad, cwd=tmp_path)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert str(bad) in line and "line 4, column 1" in line


def test_train_runs_the_finish_hook_once_per_selected_rank_with_verls_environment(tmp_path):
    cmd = 'env | grep ^VERL_PROFILE_ | sort > "$VERL_PROFILE_SAVE_PATH/hook.$VERL_PROFILE_RANK.$$.env"'
    proc = run_cli(
        "train",
        "trainer.steps=3",
        "global_profiler.tool=torch",
        "global_profiler.steps=[1,2]",
        f"global_profiler.save_path={tmp_path}/p",
        f"{A}.enable=true",
        f"global_profiler.finish_hook_cmd='{cmd}'",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = (tmp_path / "p").iterdir()
    (env_file,) = run_dir.glob("hook.0.*.env")  # once, on rank 0 (the profiled rank)
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    verl_env = dict(
        line.split("=", 1)
        for line in (OUTPUT / "e2e" / "finish_hook_actor_rollout_ref.rank0.env").read_text().splitlines()
    )
    assert set(env) == set(verl_env)  # the variables verl's own hook exports
    assert env["VERL_PROFILE_ROLE"] == verl_env["VERL_PROFILE_ROLE"] == "actor_rollout_ref"
    assert env["VERL_PROFILE_TOOL"] == "torch" and env["VERL_PROFILE_RANK"] == "0"
    assert Path(env["VERL_PROFILE_SAVE_PATH"]).resolve() == run_dir.resolve()
    assert sorted(p.name for p in run_dir.glob("step*_actor_e2e_rank0.pt.trace.json.gz")) == [
        "step1_actor_e2e_rank0.pt.trace.json.gz",
        "step2_actor_e2e_rank0.pt.trace.json.gz",
    ]


def test_a_failing_finish_hook_is_a_warning(tmp_path):
    proc = run_cli(
        "train",
        "trainer.steps=2",
        "global_profiler.tool=markers",
        "global_profiler.steps=[1]",
        f"global_profiler.save_path={tmp_path}/p",
        f"{A}.enable=true",
        "global_profiler.finish_hook_cmd='exit 7'",
        cwd=tmp_path,
    )
    assert proc.returncode == 0 and "finish hook exited with 7" in proc.stderr


@pytest.fixture
def verl_output(tmp_path):
    out = tmp_path / "verl"
    shutil.copytree(OUTPUT, out)
    return out


def _rows(path):
    proc = run_cli("analyze", path, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_analyze_verl_e2e_output_has_a_row_per_step_stage_rank(verl_output):
    doc = _rows(verl_output / "e2e")
    stages = {(r["step"], r["role"], r["stage"], r["rank"]) for r in doc["rows"] if r["unit"] is None}
    expected = {
        (s, role, stage, rank)
        for s in (2, 3)
        for rank in (0, 1)
        for role, stage in [
            ("actor", "actor_compute_log_prob"),
            ("ref", "ref_compute_log_prob"),
            ("actor", "actor_update"),
            ("critic", "critic_update"),
        ]
    }
    assert expected <= stages
    minis = sorted(
        (r["step"], r["rank"], r["index"])
        for r in doc["rows"]
        if r["stage"] == "actor_update" and r["unit"] == "mini_batch"
    )
    assert minis == [(s, rank, i) for s in (2, 3) for rank in (0, 1) for i in range(4)]
    update = [r for r in doc["rows"] if r["stage"] == "actor_update" and r["unit"] is None]
    assert all(r["comm_ms"] > 0 and r["compute_ms"] > 0 for r in update)  # gloo all-reduces are communication
    engines = sorted(r["replica"] for r in doc["rows"] if r["stage"] == "rollout_generate")
    assert engines == [0, 1]  # relocated rollout-replica{r}_ engine traces


def test_analyze_verl_discrete_output(verl_output):
    doc = _rows(verl_output / "discrete")
    stages = {(r["step"], r["role"], r["stage"], r["rank"]) for r in doc["rows"] if r["unit"] is None}
    for s in (2, 3):
        for rank in (0, 1):
            assert {
                (s, "actor", "actor_update", rank),
                (s, "ref", "ref_compute_log_prob", rank),
                (s, "actor", "actor_compute_log_prob", rank),
                (s, "critic", "critic_update", rank),
            } <= stages
    critic_units = sorted(
        (r["step"], r["rank"], r["index"])
        for r in doc["rows"]
        if r["stage"] == "critic_update" and r["unit"] == "mini_batch"
    )
    assert critic_units == [(s, rank, i) for s in (2, 3) for rank in (0, 1) for i in range(4)]
    # verl's schedule (active 2, repeat 0) left empty second windows: said, not counted
    assert sum("holds no events" in w for w in doc["warnings"]) == 4


def test_cluster_on_verl_output_spreads_across_ranks(verl_output):
    proc = run_cli("cluster", verl_output / "e2e", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    text = json.dumps(doc)
    for stage in ("actor_update", "critic_update", "ref_compute_log_prob"):
        assert stage in text


@pytest.mark.slow
def test_report_renders_verl_output_in_chromium(verl_output, browser):
    out = verl_output / "report.html"
    proc = run_cli("report", verl_output / "e2e", "-o", out)
    assert proc.returncode == 0, proc.stderr
    page, seen = open_page(browser, out)
    text = page.locator("#breakdown").inner_text()
    assert "actor_update" in text and "critic_update" in text
    assert page.locator("#chart-timeline .point").count() > 0
    assert seen["errors"] == []
    page.close()


def test_verl_npu_save_path_is_read_by_scope_and_rank(tmp_path):
    """verl's npu tool writes {save_path}/{scope}/{host}_{pid}_{ts}_ascend_pt/ (mstx_profile.get_npu_profiler);
    the Ascend content here is the real shared fixture, placed in that layout."""
    run = tmp_path / "save_path" / "actor_update" / "host_123_20261122190000000_ascend_pt"
    shutil.copytree(REAL / "ascend", run / "ASCEND_PROFILER_OUTPUT")
    (run / "profiler_info_3.json").write_text("{}")
    doc = _rows(tmp_path / "save_path")
    assert {(r["role"], r["stage"], r["rank"]) for r in doc["rows"]} == {("actor", "actor_update", 3)}
