"""Real framework configs mean what the framework's own code does with them (issue 24), each case over the real
lines it came from (tests/data/*/SOURCES.md: the repositories and commits)."""

import pytest
import yaml

from conftest import DATA, run_cli
from rlprof.config import load_config, load_plan, resolve_plan
from rlprof.errors import ConfigError

DOC = DATA / "mindspeed" / "doc"
PPO_TEST = DATA / "mindspeed" / "config" / "test_ppo_trainer_qwen25_7b_integrated.yaml"
INTEGRATED = "profiler_config.integrated"


def integrated(block: dict, device: str):
    return resolve_plan({"profiler_config": {"integrated": block}}, device=device)


# ---- MindSpeed-RL: mstx (point 7) ---------------------------------------------------------------------------------
def test_the_lightweight_block_records_npu_activity_at_level_none_plus_ranges():
    """mindspeed_rl/utils/utils.py ~562-589 @05a90d7: mstx only sets msprof_tx; activities come from
    profile_with_npu / profile_with_cpu and the level from profile_level."""
    block = yaml.safe_load((DOC / "profiler_md_L92-96.yaml").read_text())
    assert block["mstx"] is True
    npu = integrated(block, "npu").role("actor")
    assert (npu.tool, npu.contents, npu.level) == ("npu", ("npu",), "level_none")
    cuda = integrated(block, "cpu").role("actor")
    assert (cuda.tool, cuda.contents) == ("torch", ("cuda",))
    plan = integrated(block, "npu")
    assert sum("mstx ranges" in w for w in plan.warnings) == 1


def test_mstx_changes_nothing_but_the_ranges():
    general = yaml.safe_load((DOC / "profiler_md_L17-33.yaml").read_text())["profiler_config"]["integrated"]
    on = integrated({**general, "profile": True, "mstx": True}, "npu")
    off = integrated({**general, "profile": True, "mstx": False}, "npu")
    assert on.roles == off.roles
    assert on.role("actor").contents == ("cpu", "npu") and on.role("actor").level == "level1"


# ---- MindSpeed-RL: what its ProfilerConfig refuses and what it runs (point 8) ---------------------------------
def test_profile_with_stack_is_refused_as_mindspeed_refuses_it():
    """config_cls/base_config.py ~29-33: a key ProfilerConfig lacks stops the setup."""
    with pytest.raises(ConfigError, match="profile_with_stack"):
        load_plan(PPO_TEST, [f"+{INTEGRATED}.profile_with_stack=true"], device="npu")


def test_an_integer_profile_ranks_falls_back_to_rank_0_as_mindspeed_does():
    """utils.py ~524-532: list(1) raises TypeError -> ranks [0]."""
    plan = load_plan(PPO_TEST, [f"{INTEGRATED}.profile=true", f"{INTEGRATED}.profile_ranks=1"], device="npu")
    actor = plan.role("actor")
    assert actor.ranks == (0,) and not actor.all_ranks
    (line,) = [w for w in plan.warnings if "profile_ranks" in w]
    assert "rank 0" in line and "[1]" in line


def test_a_string_profile_ranks_is_refused_saying_mindspeed_would_profile_nothing():
    proc = run_cli("plan", PPO_TEST, f"{INTEGRATED}.profile=true", f"{INTEGRATED}.profile_ranks='0,1'")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "profile no rank" in proc.stderr


def test_the_real_test_configs_profile_ranks_list_is_kept():
    data = load_config(PPO_TEST, [f"{INTEGRATED}.profile=true"])
    assert data["profiler_config"]["integrated"]["profile_ranks"] == [0]
    assert resolve_plan(data, device="npu").role("actor").ranks == (0,)


# ---- verl at its head (points 2, 3, 4) ----------------------------------------------------------------------------
HEAD_CASES = yaml.safe_load((DATA / "verl" / "head_cases.yaml").read_text())


def overrides_of(case: str) -> list[str]:
    """The case's override lines as the shell would pass them ($VARS from its env; quotes removed)."""
    import shlex
    import string

    c = HEAD_CASES["cases"][case]
    text = " ".join(line.rstrip("\\").strip() for line in c["text"] if "=" in line and not line.strip().startswith("#"))
    env = {**c["env"], "VERL_PROFILE_SAVE_PATH": "$VERL_PROFILE_SAVE_PATH"}  # left for the hook's own shell
    return shlex.split(string.Template(text).safe_substitute(env))


def test_the_rollout_with_nsys_is_off_as_verls_rollout_servers_switch_it_off():
    """run_ppo_trainer_megatron.sh (nsys, discrete): verl's agent-loop servers profile with torch or npu only."""
    plan = load_plan(None, overrides_of("rollout_nsys"), device="cuda")
    assert plan.role("actor").enabled and plan.role("actor").tool == "nsys"
    assert not plan.role("rollout").enabled
    (line,) = [w for w in plan.warnings if "rollout servers" in w]
    assert "nsys" in line and "tool=torch" in line


def test_the_finish_hook_never_runs_for_the_rollout():
    """docs/perf/torch_profiling.md: the hook runs on the training workers; the rollout engine never runs it."""
    run = ["global_profiler.tool=torch", "global_profiler.steps=[1]", "actor_rollout_ref.actor.profiler.enable=True"]
    # the doc's line as a shell passes it is refused by Hydra's grammar, as verl's own Hydra refuses it
    # (tests/data/verl/head_meanings.json); quoted for Hydra, it is taken
    with pytest.raises(ConfigError, match="does not parse as Hydra parses it"):
        load_plan(None, overrides_of("finish_hook") + run, device="cpu")
    hook = """global_profiler.finish_hook_cmd='my-upload-tool "$VERL_PROFILE_SAVE_PATH"'"""
    plan = load_plan(None, overrides_of("finish_hook")[:-1] + [hook] + run, device="cpu")
    assert plan.role("actor").finish_hook.cmd == 'my-upload-tool "$VERL_PROFILE_SAVE_PATH"'
    assert plan.role("rollout").enabled and plan.role("rollout").finish_hook is None
    assert sum("finish hook does not run for the rollout" in w for w in plan.warnings) == 1


def test_precision_debugger_opens_every_rank():
    """precision_debugger_zh.md's command: verl opens the rank gate on every rank for this tool."""
    plan = load_plan(None, overrides_of("precision_debugger"), device="npu")
    actor = plan.role("actor")
    assert actor.enabled and actor.tool == "precision_debugger" and actor.all_ranks
    words = run_cli("plan", *overrides_of("precision_debugger"), "--rank", "3", "--world-size", "4")
    assert words.returncode == 0 and "rank 3: collects on this rank" in words.stdout.split("rollout")[0], words.stdout


# ---- verl: the continuous schedule (point 1), the version and what every plan says (point 9) ------------------
VERL = DATA / "verl" / "config"


def test_a_continuous_schedule_that_skips_keeps_only_the_active_mini_batches():
    """examples/profile/run_qwen2_5_7b_torch_profile.sh with PROFILE_SCHED_SKIP_FIRST=1 PROFILE_SCHED_ACTIVE=1:
    torch_profile.py ~303-356 @1dda039 keeps only what runs inside the active window."""
    overrides = overrides_of("e2e_schedule_skip")
    proc = run_cli("plan", *overrides)
    assert proc.returncode == 0, proc.stderr
    assert "stages before the active window are not kept" in proc.stdout and "in full" not in proc.stdout
    actor = load_plan(None, overrides, device="cpu").role("actor")
    assert actor.mode == "e2e" and (actor.schedule.skip_first, actor.schedule.active) == (1, 1)
    # the script's defaults (skip 0): every earlier stage is kept in full
    plain = run_cli("plan", *overrides, "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.skip_first=0")
    assert "stages before the active window are kept in full" in plain.stdout


@pytest.mark.parametrize(
    "config, version",
    [
        (None, "0.10.0.dev"),
        ("v0.10.0.dev_1dda039_generated_ppo_trainer.yaml", "0.10.0.dev"),
        ("v0.9.1_generated_ppo_trainer.yaml", "0.9.1"),
        ("v0.9.0_generated_ppo_trainer.yaml", "0.9.0"),
    ],
)
def test_the_verl_version_is_detected_and_shown(config, version):
    args = ([VERL / config] if config else []) + [
        "global_profiler.tool=torch",
        "global_profiler.steps=[1]",
        "actor_rollout_ref.actor.profiler.enable=True",
    ]
    proc = run_cli("plan", *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith(f"dialect: global_role with verl {version}'s meaning")


def test_every_verl_plan_says_advantage_compute_runs_on_the_driver():
    proc = run_cli("plan", *overrides_of("e2e_schedule_skip"))
    assert sum("runs on verl's driver" in line for line in proc.stdout.splitlines()) == 1


def test_the_async_plan_says_the_rollout_runs_in_its_own_processes():
    """verl's rollout runs in agent-loop server processes: the header says so and no note puts it in the actor's
    process; ranks are global GPU ranks mapped to replicas (0.9.1 on)."""
    proc = run_cli(
        "plan",
        *overrides_of("e2e_schedule_skip"),
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete=True",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.profiler.ranks=[2]",
    )
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    assert "server processes of its own" in out.splitlines()[0] and "replica indices" not in out
    assert not any("a process hosting" in line and "rollout" in line for line in out.splitlines())
    assert "are global GPU ranks" in out and "select replica(s) 1" in out


# ---- verl: an explicit setting that has no effect says so (point 10) ----------------------------------------------
RUN = ["global_profiler.tool=torch", "global_profiler.steps=[1]"]


def test_ref_enable_false_beside_an_enabled_actor_is_said_to_have_no_effect():
    """docs/perf/torch_profiling.md ~301-303 @1dda039: the hybrid worker follows actor.profiler, so turning the ref's
    off changes nothing while the actor's is on; the line names what would."""
    plan = load_plan(
        None,
        RUN + ["actor_rollout_ref.actor.profiler.enable=True", "actor_rollout_ref.ref.profiler.enable=False"],
        device="cpu",
    )
    assert plan.role("ref").enabled and plan.role("ref").stages == ("ref_compute_log_prob",)
    (line,) = [w for w in plan.warnings if "has no effect" in w]
    assert "ref.profiler.stages=[]" in line
    lever = load_plan(
        None,
        RUN + ["actor_rollout_ref.actor.profiler.enable=True", "actor_rollout_ref.ref.profiler.stages=[]"],
        device="cpu",
    )
    assert lever.role("ref").stages == () and lever.role("actor").stages[0] == "actor_compute_log_prob"


def test_ref_enable_true_alone_profiles_nothing_and_says_why():
    plan = load_plan(None, RUN + ["actor_rollout_ref.ref.profiler.enable=True"], device="cpu")
    assert not plan.role("ref").enabled and plan.collects_nothing
    assert any("differs from the actor's profiler and is not used" in w for w in plan.warnings)


def test_a_generated_yamls_own_default_is_not_called_a_choice():
    plan = load_plan(
        VERL / "v0.10.0.dev_1dda039_generated_ppo_trainer.yaml",
        RUN + ["actor_rollout_ref.actor.profiler.enable=True"],
        device="cpu",
    )
    assert not any("has no effect" in w for w in plan.warnings)


# ---- Hydra's rules for a whole generated verl YAML (point 5) -----------------------------------------------------
HEAD_YAML = VERL / "v0.10.0.dev_1dda039_generated_ppo_trainer.yaml"
ENABLED = RUN + ["actor_rollout_ref.actor.profiler.enable=True"]


@pytest.mark.parametrize(
    "key, said",
    [
        ("actor_rollout_ref.actor.profiler.tool_config.torch.profile_token_start=5", "apply to the rollout role only"),
        ("actor_rollout_ref.rollout.profiler.tool_config.torch.schedule.active=1", "so verl ignores it"),
    ],
)
def test_a_key_the_generated_yaml_lacks_is_refused_plain_and_taken_with_plus(key, said):
    proc = run_cli("plan", HEAD_YAML, key, *ENABLED)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "Key not in struct" in line and f"+{key}" in line
    plan = load_plan(HEAD_YAML, [f"+{key}"] + ENABLED, device="cpu")
    assert sum(said in w for w in plan.warnings) == 1  # one warning: verl ignores it
    # without the whole YAML (overrides only) there is no struct to refuse it: the same one warning
    loose = load_plan(None, [key] + ENABLED, device="cpu")
    assert sum(said in w for w in loose.warnings) == 1


def test_keys_the_generated_yaml_holds_take_plain_overrides():
    plan = load_plan(
        HEAD_YAML, ENABLED + ["actor_rollout_ref.actor.profiler.tool_config.torch.schedule.active=1"], device="cpu"
    )
    assert plan.role("actor").schedule.active == 1


# ---- where rlprof is stricter than the framework, the refusal says what the framework would do -----------------
@pytest.mark.parametrize(
    "overrides, said",
    [
        (["global_profiler.tool=nsight"], "verl would run this config and profile nothing"),
        (["actor_rollout_ref.actor.profiler.tool=foo"], "verl would run this config and profile nothing"),
        (
            ["global_profiler.tool=torch", "global_profiler.steps=[-1]"],
            "verl would run this config and profile no such step",
        ),
        (
            [f"{INTEGRATED}.profile=true", f"{INTEGRATED}.stage=actor_updat"],
            "MindSpeed-RL would run this config and profile nothing",
        ),
        (
            [
                f"{INTEGRATED}.profile=true",
                f"{INTEGRATED}.stage=[actor_update]",
                f"{INTEGRATED}.profile_step_start=3",
                f"{INTEGRATED}.profile_step_end=2",
            ],
            "MindSpeed-RL would run this config and profile no step",
        ),
    ],
)
def test_a_refusal_stricter_than_the_framework_says_what_it_would_do(overrides, said):
    proc = run_cli("plan", *overrides)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert said in line and "allowed:" in line


# ---- MindSpeed-RL's own configs, whole (docs/framework_configs.md, the MindSpeed-RL table) ------------------------
MINDSPEED_CASES = [
    # source, device, (role, tool, mode, steps, stages, contents, level, export, all ranks / ranks)
    (PPO_TEST, "npu", ("actor", "npu", "discrete", (1,), ("actor_update",), ("cpu", "npu"), "level1", "db", (0,))),
    (
        DOC / "profiler_md_L17-33.yaml",
        "npu",
        ("actor", None, "e2e", (1,), None, None, None, None, None),
    ),  # profile: false
]


@pytest.mark.parametrize("source, device, want", MINDSPEED_CASES, ids=["ppo-test-config", "guide-general-block"])
def test_mindspeeds_own_configs_mean_what_its_profiler_code_does(source, device, want):
    """utils.py get_grpo_profiler / profiler_start @05a90d7: profile switches it on; a stage name opens a window at
    that stage in each step of [start, end); activities from profile_with_*; level and export as written."""
    role, tool, mode, steps, stages, contents, level, export, ranks = want
    rp = load_plan(source, [], device=device).role(role)
    if tool is None:
        assert not rp.enabled
        return
    assert (rp.tool, rp.mode, rp.steps, rp.stages) == (tool, mode, steps, stages)
    assert (rp.contents, rp.level, rp.export_type, rp.ranks, rp.all_ranks) == (contents, level, export, ranks, False)


def test_the_guides_dpo_block_collects_every_rank_at_level1():
    block = yaml.safe_load((DOC / "profiler_md_L40-51.yaml").read_text())
    plan = resolve_plan(block, device="npu")
    actor = plan.role("actor")
    assert actor.enabled and actor.all_ranks and actor.level == "level1" and actor.export_type == "text"
    assert actor.contents == ("cpu", "npu") and actor.steps == (1,)  # [start, end) = [1, 2)


def test_a_key_global_profiler_lacks_is_ignored_in_a_whole_yaml_and_refused_on_the_command_line(tmp_path):
    """verl reads global_profiler key by key (ray_trainer.py ~857-866, ~1459 @1dda039): in an edited trainer YAML an
    extra key (nsight_profiling.md's `discrete`) is ignored; on the command line Hydra refuses it (not in struct)."""
    edited = tmp_path / "edited.yaml"
    data = yaml.safe_load(HEAD_YAML.read_text())
    data["global_profiler"]["discrete"] = False
    edited.write_text(yaml.safe_dump(data))
    plan = load_plan(edited, ENABLED, device="cpu")
    assert sum("global_profiler.discrete is not a key verl reads" in w for w in plan.warnings) == 1
    with pytest.raises(ConfigError, match="Key not in struct"):
        load_plan(HEAD_YAML, ENABLED + ["global_profiler.discrete=False"], device="cpu")
    with pytest.raises(ConfigError, match="unknown key"):
        load_plan(None, ENABLED + ["global_profiler.discrete=False"], device="cpu")
