"""Bad configurations: exit 2 with one line naming the key, the value and what is allowed."""

import pytest

from conftest import run_cli

A = "actor_rollout_ref.actor.profiler"
T = f"{A}.tool_config.torch"
INTEGRATED = "profiler_config.integrated"
BASE = ["global_profiler.tool=torch", "global_profiler.steps=[1]", f"{A}.enable=true"]

# (id, overrides, key named in the message, value shown in the message)
CASES = [
    ("unknown-global-key", ["global_profiler.stepz=[1]"], "global_profiler.stepz", "[1]"),
    ("unknown-role-key", BASE + [f"{A}.enabled=true"], f"{A}.enabled", "True"),
    ("unknown-tool-config", BASE + [f"{A}.tool_config.torchh.discrete=true"], f"{A}.tool_config.torchh", "discrete"),
    ("unknown-torch-key", BASE + [f"{T}.discret=true"], f"{T}.discret", "True"),
    ("unknown-schedule-key", BASE + [f"{T}.schedule.activ=1"], f"{T}.schedule.activ", "1"),
    ("steps-wrong-type", ["global_profiler.tool=torch", "global_profiler.steps=abc"], "global_profiler.steps", "abc"),
    ("enable-wrong-type", BASE + [f"{A}.enable=maybe"], f"{A}.enable", "maybe"),
    ("all-ranks-wrong-type", BASE + [f"{A}.all_ranks=3"], f"{A}.all_ranks", "3"),
    ("unknown-tool", ["global_profiler.tool=perf", "global_profiler.steps=[1]"], "global_profiler.tool", "perf"),
    ("unknown-role-tool", BASE + [f"{A}.tool=vtune"], f"{A}.tool", "vtune"),
    (
        "unknown-level",
        BASE + [f"{A}.tool=npu", f"{A}.tool_config.npu.level=level3"],
        f"{A}.tool_config.npu.level",
        "level3",
    ),
    ("unknown-content", BASE + [f"{T}.contents=[cpu,gpu]"], f"{T}.contents[1]", "gpu"),
    ("content-of-other-tool", BASE + [f"{T}.contents=[npu]"], f"{T}.contents[0]", "npu"),
    ("unknown-stage", BASE + [f"{A}.stages=[actor_train]"], f"{A}.stages[0]", "actor_train"),
    ("stage-of-other-role", BASE + [f"{A}.stages=[rollout_generate]"], f"{A}.stages[0]", "rollout_generate"),
    ("unknown-unit", BASE + [f"{T}.schedule.unit=token"], f"{T}.schedule.unit", "token"),
    ("step-zero", ["global_profiler.tool=torch", "global_profiler.steps=[0]"], "global_profiler.steps[0]", "0"),
    ("step-negative", ["global_profiler.tool=torch", "global_profiler.steps=[2,-1]"], "global_profiler.steps[1]", "-1"),
    (
        "step-not-integer",
        ["global_profiler.tool=torch", "global_profiler.steps=[1.5]"],
        "global_profiler.steps[0]",
        "1.5",
    ),
    (
        "integrated-end-le-start",
        [f"{INTEGRATED}.profile=true", f"{INTEGRATED}.profile_step_start=3", f"{INTEGRATED}.profile_step_end=3"],
        f"{INTEGRATED}.profile_step_end",
        "3",
    ),
    (
        "integrated-start-zero",
        [f"{INTEGRATED}.profile=true", f"{INTEGRATED}.profile_step_start=0"],
        f"{INTEGRATED}.profile_step_start",
        "0",
    ),
    ("ranks-not-integers", BASE + [f"{A}.ranks=[a]"], f"{A}.ranks[0]", "a"),
    ("ranks-negative", BASE + [f"{A}.ranks=[-2]"], f"{A}.ranks[0]", "-2"),
    ("ranks-not-list", BASE + [f"{A}.ranks=0"], f"{A}.ranks", "0"),
    (
        "integrated-ranks-word",
        [f"{INTEGRATED}.profile=true", f"{INTEGRATED}.profile_ranks=some"],
        f"{INTEGRATED}.profile_ranks",
        "some",
    ),
    ("mixed-global-legacy", BASE + ["trainer.profile_steps=[1]"], "config", "global_profiler"),
    ("mixed-integrated-global", BASE + [f"{INTEGRATED}.profile=true"], "config", "profiler_config"),
    (
        "async-rollout-e2e",
        BASE + ["rollout.mode=async"],
        "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete",
        "False",
    ),
    (
        "unknown-export-type",
        BASE + [f"{A}.tool=npu", f"{A}.tool_config.npu.export_type=csv"],
        f"{A}.tool_config.npu.export_type",
        "csv",
    ),
    ("schedule-wait-negative", BASE + [f"{T}.schedule.wait=-1"], f"{T}.schedule.wait", "-1"),
    ("budget-zero", BASE + ["global_profiler.max_bytes_per_window=0"], "global_profiler.max_bytes_per_window", "0"),
    (
        "budget-string",
        BASE + ["global_profiler.max_bytes_per_window=big"],
        "global_profiler.max_bytes_per_window",
        "big",
    ),
    ("continuous-not-bool", BASE + ["global_profiler.continuous_steps=7"], "global_profiler.continuous_steps", "7"),
    (
        "integrated-unknown-stage",
        [f"{INTEGRATED}.profile=true", f"{INTEGRATED}.stage=actor_train"],
        f"{INTEGRATED}.stage",
        "actor_train",
    ),
    (
        "integrated-unknown-key",
        [f"{INTEGRATED}.profile=true", f"{INTEGRATED}.profile_with_gpu=true"],
        f"{INTEGRATED}.profile_with_gpu",
        "True",
    ),
    (
        "legacy-unknown-level",
        ["trainer.profile_steps=[1]", "trainer.npu_profile.options.level=levelX"],
        "trainer.npu_profile.options.level",
        "levelX",
    ),
    (
        "legacy-unknown-roles",
        ["trainer.profile_steps=[1]", "trainer.npu_profile.options.roles=[everything]"],
        "trainer.npu_profile.options.roles[0]",
        "everything",
    ),
    (
        "legacy-ranks-not-integers",
        ["trainer.profile_steps=[1]", "actor_rollout_ref.profiler.ranks=[x]"],
        "actor_rollout_ref.profiler.ranks[0]",
        "x",
    ),
    ("legacy-steps-zero", ["trainer.profile_steps=[0]"], "trainer.profile_steps[0]", "0"),
    ("tool-config-not-mapping", BASE + [f"{A}.tool_config=5"], f"{A}.tool_config", "5"),
    (
        "rollout-mode-unknown",
        BASE + ["actor_rollout_ref.rollout.mode=turbo"],
        "actor_rollout_ref.rollout.mode",
        "turbo",
    ),
    (
        "memory-max-entries-zero",
        BASE + [f"{A}.tool=torch_memory", f"{A}.tool_config.torch_memory.max_entries=0"],
        f"{A}.tool_config.torch_memory.max_entries",
        "0",
    ),
    ("override-without-equals", BASE + ["global_profiler.tool"], "override", "global_profiler.tool"),
]


@pytest.mark.parametrize("overrides,key,value", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_config_exits_2_with_one_line(overrides, key, value, workdir):
    proc = run_cli("plan", *overrides, cwd=workdir)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert "Traceback" not in proc.stderr
    assert key in line, line
    assert value in line, line
    assert "allowed" in line, line
    assert proc.stdout == ""


def test_save_path_under_a_file(workdir):
    blocker = workdir / "afile"
    blocker.write_text("x")
    proc = run_cli("plan", *BASE, f"global_profiler.save_path={blocker}/profile", cwd=workdir)
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert "global_profiler.save_path" in line and "cannot be created" in line and "allowed" in line


def test_save_path_not_writable(workdir):
    ro = workdir / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    import os

    if os.access(ro, os.W_OK):  # root ignores permission bits: use a read-only filesystem instead
        ro = "/proc/rlprof-profile"
    proc = run_cli("plan", *BASE, f"global_profiler.save_path={ro}/sub", cwd=workdir)
    assert proc.returncode == 2, proc.stdout
    assert "global_profiler.save_path" in proc.stderr and "allowed" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_missing_config_file(workdir):
    proc = run_cli("plan", "nope.yaml", cwd=workdir)
    assert proc.returncode == 2 and "nope.yaml" in proc.stderr and "allowed" in proc.stderr


def test_yaml_that_is_not_a_mapping(workdir):
    (workdir / "list.yaml").write_text("- a\n- b\n")
    proc = run_cli("plan", "list.yaml", cwd=workdir)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "config" in proc.stderr and "allowed" in proc.stderr


def test_at_least_thirty_distinct_cases():
    assert len({c[0] for c in CASES}) >= 30


def test_a_bad_value_in_a_tool_block_verl_does_not_read_is_said_not_refused():
    """verl builds only the active tool's config (engine_workers.py ~486-492 @1dda039): a bad npu level while the tool
    is torch does not stop it, so rlprof says it in one warning and resolves the plan."""
    proc = run_cli("plan", *BASE, f"{A}.tool_config.npu.level=level3")
    assert proc.returncode == 0, proc.stderr
    (line,) = [w for w in proc.stdout.splitlines() if "level3" in w]
    assert "not used: verl reads only the torch block" in line
