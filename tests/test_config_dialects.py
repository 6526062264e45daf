"""Every example of the three dialects, as YAML and as overrides, resolves through `rlprof plan --json`."""

import pytest

from conftest import EXAMPLES, ROOT, plan_json

ACTOR_STAGES = ["actor_compute_log_prob", "advantage_compute", "actor_update", "weight_sync"]
ALL_CONTENTS = ["cpu", "cuda", "memory", "shapes", "stack", "module"]

GLOBAL_OVERRIDES = [
    "global_profiler.tool=torch",
    "global_profiler.steps=[1,2,5]",
    "global_profiler.save_path=outputs/profile",
    "global_profiler.continuous_steps=false",
    "actor_rollout_ref.actor.profiler.enable=true",
    "actor_rollout_ref.actor.profiler.all_ranks=false",
    "actor_rollout_ref.actor.profiler.ranks=[0]",
    "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=false",
    "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cpu,cuda,memory,shapes,stack,module]",
    "actor_rollout_ref.actor.profiler.tool_config.torch.schedule={unit: micro_batch, skip_first: 0, wait: 0, "
    "warmup: 0, active: 1, repeat: 1}",
    "actor_rollout_ref.actor.profiler.tool_config.npu={discrete: false, level: level0, contents: [npu, cpu], "
    "analysis: false, export_type: text}",
    "actor_rollout_ref.actor.profiler.tool_config.torch_memory.max_entries=100000",
    "actor_rollout_ref.actor.profiler.tool_config.torch_memory.stack_depth=32",
    "actor_rollout_ref.actor.profiler.tool_config.nsys.discrete=false",
    "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete=true",
    "actor_rollout_ref.rollout.profiler.tool_config.torch.schedule.unit=decode_step",
    "actor_rollout_ref.rollout.profiler.tool_config.torch.schedule.wait=29",
    "actor_rollout_ref.rollout.profiler.tool_config.torch.schedule.warmup=1",
    "actor_rollout_ref.rollout.profiler.tool_config.torch.schedule.active=30",
    "critic.profiler.enable=false",
]


def check_global(plan, rank=0):
    assert plan["dialect"] == "global_role"
    roles = plan["roles"]
    assert set(roles) == {"actor", "rollout", "ref", "critic", "reward"}
    actor = roles["actor"]
    assert actor["enabled"] is True and actor["collects_on_rank"] is (rank == 0)
    assert actor["tool"] == "torch" and actor["mode"] == "e2e"
    assert actor["contents"] == ALL_CONTENTS
    assert actor["level"] is None and actor["export_type"] is None and actor["analysis"] is False
    assert actor["steps"] == [1, 2, 5]
    assert actor["stages"] == ACTOR_STAGES
    assert actor["ranks"] == [0] and actor["all_ranks"] is False
    assert actor["schedule"] == {
        "unit": "micro_batch",
        "skip_first": 0,
        "wait": 0,
        "warmup": 0,
        "active": 1,
        "repeat": 1,
    }
    assert actor["save_path"] == "outputs/profile"
    rollout = roles["rollout"]  # follows the actor except where it says otherwise
    assert rollout["enabled"] is True and rollout["mode"] == "discrete"
    assert rollout["contents"] == ALL_CONTENTS and rollout["ranks"] == [0]
    assert rollout["stages"] == ["rollout_generate"]
    assert rollout["schedule"] == {
        "unit": "decode_step",
        "skip_first": 0,
        "wait": 29,
        "warmup": 1,
        "active": 30,
        "repeat": 1,
    }
    ref = roles["ref"]  # says nothing: the actor's settings
    assert ref["enabled"] is True and ref["mode"] == "e2e" and ref["schedule"] == actor["schedule"]
    assert ref["stages"] == ["ref_compute_log_prob"] and ref["steps"] == [1, 2, 5]
    assert roles["critic"]["enabled"] is False and roles["critic"]["collects_on_rank"] is False
    assert roles["reward"]["enabled"] is False
    assert actor["windows_per_process"] == 3 and rollout["windows_per_process"] == 3
    assert plan["continuous_steps"] is False


def test_global_role_yaml():
    check_global(plan_json(EXAMPLES / "global_role.yaml"))


def test_global_role_yaml_other_rank_collects_nothing():
    check_global(plan_json(EXAMPLES / "global_role.yaml", "--rank", "1", "--world-size", "2"), rank=1)


def test_global_role_overrides_only():
    check_global(plan_json(*GLOBAL_OVERRIDES))


def test_overrides_apply_after_yaml():
    plan = plan_json(
        EXAMPLES / "global_role.yaml",
        "global_profiler.steps=[4,2]",
        "actor_rollout_ref.actor.profiler.all_ranks=true",
        "global_profiler.continuous_steps=true",
    )
    assert plan["roles"]["actor"]["steps"] == [2, 4]
    assert plan["roles"]["actor"]["all_ranks"] is True
    assert plan["roles"]["rollout"]["all_ranks"] is True  # inherited from the actor
    assert plan["continuous_steps"] is True


def test_enabled_without_ranks_means_rank_zero():
    plan = plan_json(
        "global_profiler.tool=torch",
        "global_profiler.steps=[3]",
        "actor_rollout_ref.actor.profiler.enable=true",
        "--rank",
        "0",
    )
    assert plan["roles"]["actor"]["ranks"] == [0]
    assert plan["roles"]["actor"]["contents"] == ["cpu", "cuda"]
    assert plan["roles"]["actor"]["schedule"] is None


def test_null_tool_and_null_steps_collect_nothing():
    off = plan_json(EXAMPLES / "global_role.yaml", "global_profiler.tool=null")
    assert all(not r["enabled"] and not r["collects_on_rank"] for r in off["roles"].values())
    none = plan_json(EXAMPLES / "global_role.yaml", "global_profiler.steps=null")
    assert none["roles"]["actor"]["enabled"] and none["roles"]["actor"]["steps"] == []
    assert none["roles"]["actor"]["collects_on_rank"] is False


def test_npu_tool_resolves_on_any_machine_with_warning():
    plan = plan_json(EXAMPLES / "global_role.yaml", "global_profiler.tool=npu", "--device", "cpu")
    actor = plan["roles"]["actor"]
    assert actor["tool"] == "npu" and actor["level"] == "level0" and actor["export_type"] == "text"
    assert actor["contents"] == ["npu", "cpu"]
    assert any("npu" in w and "torch_npu" in w for w in plan["warnings"])


LEGACY_OVERRIDES = [
    "trainer.profile_steps=[2,4]",
    "trainer.npu_profile.options.save_path=./profiler_data",
    "trainer.npu_profile.options.level=level1",
    "trainer.npu_profile.options.record_shapes=true",
    "trainer.npu_profile.options.with_memory=false",
    "trainer.npu_profile.options.with_npu=true",
    "trainer.npu_profile.options.with_cpu=true",
    "trainer.npu_profile.options.with_module=false",
    "trainer.npu_profile.options.with_stack=false",
    "trainer.npu_profile.options.analysis=true",
    "actor_rollout_ref.profiler.discrete=true",
    "actor_rollout_ref.profiler.all_ranks=false",
    "actor_rollout_ref.profiler.ranks=[0,1]",
]


@pytest.mark.parametrize("source", ["yaml", "overrides"])
def test_legacy_dialect(source):
    args = [EXAMPLES / "legacy.yaml"] if source == "yaml" else LEGACY_OVERRIDES
    plan = plan_json(*args, "--rank", "1", "--device", "cpu")
    assert plan["dialect"] == "legacy"
    for role in ("actor", "rollout", "ref"):
        r = plan["roles"][role]
        assert r["enabled"] and r["collects_on_rank"]
        assert r["tool"] == "npu" and r["mode"] == "discrete"
        assert r["contents"] == ["npu", "cpu", "shapes"]  # derived from the with_* switches
        assert r["level"] == "level1" and r["export_type"] == "text" and r["analysis"] is True
        assert r["steps"] == [2, 4] and r["ranks"] == [0, 1] and r["all_ranks"] is False
        assert r["save_path"] == "./profiler_data"
    assert plan["roles"]["rollout"]["stages"] == ["rollout_generate"]
    assert plan["roles"]["critic"]["enabled"] is False
    assert plan["warnings"]


def test_legacy_tool_follows_the_machine_as_verl_did():
    """Seed-era verl: NVTX present (CUDA) -> nsys, else the npu tool, whether or not an npu block exists."""
    args = ("trainer.profile_steps=[1]", "actor_rollout_ref.profiler.all_ranks=true")
    actor = plan_json(*args, "--device", "cuda")["roles"]["actor"]
    assert actor["tool"] == "nsys" and actor["all_ranks"] is True and actor["mode"] == "e2e"
    assert plan_json(*args, "--device", "npu")["roles"]["actor"]["tool"] == "npu"


INTEGRATED_OVERRIDES = [
    "profiler_config.integrated.profile=true",
    "profiler_config.integrated.mstx=false",
    "profiler_config.integrated.stage=all",
    "profiler_config.integrated.profile_save_path=./profiler_data",
    "profiler_config.integrated.profile_export_type=text",
    "profiler_config.integrated.profile_step_start=1",
    "profiler_config.integrated.profile_step_end=2",
    "profiler_config.integrated.profile_level=level0",
    "profiler_config.integrated.profile_with_memory=false",
    "profiler_config.integrated.profile_record_shapes=false",
    "profiler_config.integrated.profile_with_cpu=true",
    "profiler_config.integrated.profile_with_npu=true",
    "profiler_config.integrated.profile_with_module=false",
    "profiler_config.integrated.profile_analysis=false",
    "profiler_config.integrated.profile_ranks=all",
]


@pytest.mark.parametrize("source", ["yaml", "overrides"])
@pytest.mark.parametrize(
    "device,tool,device_content", [("cpu", "torch", "cuda"), ("cuda", "torch", "cuda"), ("npu", "npu", "npu")]
)
def test_integrated_dialect(source, device, tool, device_content):
    args = [EXAMPLES / "integrated.yaml"] if source == "yaml" else INTEGRATED_OVERRIDES
    plan = plan_json(*args, "--device", device, "--rank", "3", "--world-size", "4")
    assert plan["dialect"] == "integrated"
    assert plan["continuous_steps"] is True  # stage: all is MindSpeed-RL's one profiler over [start, end)
    for name, r in plan["roles"].items():
        assert r["enabled"] and r["collects_on_rank"], name
        assert r["tool"] == tool and r["mode"] == "e2e"
        assert r["contents"] == ["cpu", device_content]
        assert r["steps"] == [1]  # [start, end)
        assert r["all_ranks"] is True and r["ranks"] == []
        assert r["level"] == "level0" and r["export_type"] == "text" and r["analysis"] is False
        assert r["save_path"] == "./profiler_data"
    assert plan["roles"]["rollout"]["stages"] == ["rollout_generate"]
    assert plan["roles"]["critic"]["stages"] == ["critic_compute_values", "critic_update"]


def test_integrated_stage_names_map_to_canonical():
    plan = plan_json(
        EXAMPLES / "integrated.yaml",
        "profiler_config.integrated.stage=[actor_generate,reference_compute_log_prob]",
        "profiler_config.integrated.profile_ranks=[1]",
        "profiler_config.integrated.profile_step_end=4",
        "profiler_config.integrated.mstx=true",
    )
    roles = plan["roles"]
    assert roles["rollout"]["stages"] == ["rollout_generate"] and roles["rollout"]["enabled"]
    assert roles["ref"]["stages"] == ["ref_compute_log_prob"] and roles["ref"]["enabled"]
    assert roles["actor"]["enabled"] is False and roles["actor"]["stages"] == []
    # mstx only adds MindSpeed-RL's ranges: the tool is still the device's (torch on this CPU machine)
    assert roles["rollout"]["tool"] == "torch" and roles["rollout"]["steps"] == [1, 2, 3]
    assert roles["rollout"]["ranks"] == [1] and roles["rollout"]["collects_on_rank"] is False


def test_integrated_stage_all_is_one_window_over_the_steps():
    """MindSpeed-RL: stage all -> schedule(skip_first=start, active=end-start): one window holding steps
    [start, end); a stage list -> a window per listed stage per step."""
    plan = plan_json(
        EXAMPLES / "integrated.yaml",
        "profiler_config.integrated.profile_step_start=2",
        "profiler_config.integrated.profile_step_end=5",
    )
    actor = plan["roles"]["actor"]
    assert actor["mode"] == "e2e" and actor["steps"] == [2, 3, 4] and plan["continuous_steps"] is True
    assert actor["windows_per_process"] == 1
    listed = plan_json(
        EXAMPLES / "integrated.yaml",
        "profiler_config.integrated.stage=[actor_update]",
        "profiler_config.integrated.profile_step_start=2",
        "profiler_config.integrated.profile_step_end=5",
    )
    assert listed["roles"]["actor"]["mode"] == "discrete" and listed["continuous_steps"] is False
    assert listed["roles"]["actor"]["windows_per_process"] == 3


def test_integrated_accepts_mindspeeds_vision_stage():
    plan = plan_json(EXAMPLES / "integrated.yaml", "profiler_config.integrated.stage=[actor_image_embeds,actor_update]")
    assert plan["roles"]["actor"]["stages"] == ["actor_update", "actor_image_embeds"]
    assert any("actor_image_embeds" in w for w in plan["warnings"])


def test_integrated_single_stage_string():
    plan = plan_json(EXAMPLES / "integrated.yaml", "profiler_config.integrated.stage=actor_update")
    assert plan["roles"]["actor"]["stages"] == ["actor_update"]
    assert [n for n, r in plan["roles"].items() if r["enabled"]] == ["actor"]


def test_async_rollout_ranks_are_replicas():
    plan = plan_json(
        EXAMPLES / "global_role.yaml",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.profiler.ranks=[1]",
        "--rank",
        "1",
    )
    assert plan["async_rollout"] is True
    assert plan["roles"]["rollout"]["collects_on_rank"] is True
    assert plan["roles"]["actor"]["collects_on_rank"] is False


def test_plan_in_words_names_steps_roles_windows():
    from conftest import run_cli

    proc = run_cli("plan", EXAMPLES / "global_role.yaml", "--world-size", "4")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "steps 1, 2, 5" in text and "rollout_generate" in text and "3 window(s)" in text
    assert "critic   disabled" in text


def test_mindspeed_rls_own_integrated_config_loads_whole():
    """MindSpeed-RL's integrated PPO test config (its megatron/rl/generate blocks are not rlprof's business)."""
    cfg = ROOT / "tests" / "data" / "mindspeed" / "config" / "test_ppo_trainer_qwen25_7b_integrated.yaml"
    plan = plan_json(cfg, "--device", "npu")
    assert plan["dialect"] == "integrated" and plan["framework"] == "MindSpeed-RL"
    actor = plan["roles"]["actor"]
    assert actor["enabled"] and actor["tool"] == "npu" and actor["stages"] == ["actor_update"]
    assert actor["mode"] == "discrete" and actor["steps"] == [1] and actor["ranks"] == [0]
    assert actor["export_type"] == "db" and actor["level"] == "level1" and actor["analysis"] is True
    assert [n for n, r in plan["roles"].items() if r["enabled"]] == ["actor"]
