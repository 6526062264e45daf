"""Inference-engine adapters: vLLM / SGLang settings built from the rollout plan, replica selection,
engine output files into the manifest and the analysis. The engines are recording stand-ins (named
as such): what they record is exactly the calls a real engine would receive."""

import gzip
import json
import warnings
from pathlib import Path

import pytest

from conftest import plan_json, run_cli
from helpers import R, rows

from rlprof.config import load_plan
from rlprof.errors import ConfigError
from rlprof.integrations.engines import (
    ReplicaFleet,
    SglangAdapter,
    VllmAdapter,
    recognise,
    rollout_plan,
    sglang_start_args,
    vllm_settings,
)

ASYNC = [
    "global_profiler.tool=torch",
    "global_profiler.steps=[2]",
    "actor_rollout_ref.rollout.mode=async",
    f"{R}.enable=true",
    f"{R}.all_ranks=true",
    f"{R}.tool_config.torch.discrete=true",
]
SCHED = f"{R}.tool_config.torch.schedule={{unit: decode_step, wait: 2, warmup: 1, active: 3}}"


def plan(*overrides):
    return load_plan(None, ASYNC + list(overrides))


def contents(*c):
    return f"{R}.tool_config.torch.contents=[{','.join(c)}]"


VLLM_CASES = [
    # (overrides, new-form subset, old-form env subset (0.12), warnings that must appear)
    (
        (contents("cpu", "cuda"), SCHED),
        # skip 3 iterations: vLLM starts on the delay-th it counts (checked live, tests/test_vllm_live.py)
        {
            "delay_iterations": 4,
            "max_iterations": 3,
            "torch_profiler_with_stack": False,
            "torch_profiler_record_shapes": False,
            "torch_profiler_with_memory": False,
            "ignore_frontend": True,
        },
        {
            "VLLM_PROFILER_DELAY_ITERS": "4",
            "VLLM_PROFILER_MAX_ITERS": "3",
            "VLLM_TORCH_PROFILER_DISABLE_ASYNC_LLM": "1",
        },
        [],
    ),
    (
        (contents("cpu", "cuda", "memory", "shapes", "stack"),),
        {
            "delay_iterations": 0,
            "max_iterations": 0,
            "torch_profiler_with_stack": True,
            "torch_profiler_record_shapes": True,
            "torch_profiler_with_memory": True,
            "ignore_frontend": False,
        },
        {
            "VLLM_TORCH_PROFILER_WITH_STACK": "1",
            "VLLM_TORCH_PROFILER_RECORD_SHAPES": "1",
            "VLLM_TORCH_PROFILER_WITH_PROFILE_MEMORY": "1",
            "VLLM_PROFILER_MAX_ITERS": "0",
        },
        [],
    ),
    ((contents("cpu"),), {"torch_profiler_with_stack": False}, {}, ["fixed level"]),
    ((contents("cpu", "cuda"), f"{R}.tool_config.torch.analysis=true"), {}, {}, ["does not run an analysis"]),
    (
        (contents("cpu", "cuda"), f"{R}.tool_config.torch.schedule={{unit: stage, active: 1}}"),
        {"delay_iterations": 0, "max_iterations": 0},
        {},
        [],
    ),
]


@pytest.mark.parametrize(
    "schedule,key,allowed",
    [
        ("{unit: micro_batch, active: 1}", "schedule.unit", "decode_step (engine iterations)"),
        ("{unit: mini_batch, active: 1}", "schedule.unit", "decode_step (engine iterations)"),
        ("{unit: decode_step, active: 2, repeat: 2}", "schedule.repeat", "0 or 1"),
    ],
)
def test_what_an_engine_cannot_honour_is_one_line_naming_the_key(tmp_path, schedule, key, allowed):
    p = plan(contents("cpu", "cuda"), f"{R}.tool_config.torch.schedule={schedule}")
    with pytest.raises(ConfigError) as exc:
        vllm_settings(p, tmp_path, "0.32.0")
    line = str(exc.value)
    assert f"{R}.tool_config.torch.{key}" in line and allowed in line and "\n" not in line


@pytest.mark.parametrize("overrides,new_form,old_env,notes", VLLM_CASES)
def test_vllm_settings_new_and_old_forms(tmp_path, overrides, new_form, old_env, notes):
    p = plan(*overrides)
    new, new_notes = vllm_settings(p, tmp_path / "t", "0.15.1")
    cfg = new["profiler_config"]
    assert cfg["profiler"] == "torch" and cfg["torch_profiler_dir"] == str(tmp_path / "t")
    assert {k: cfg[k] for k in new_form} == new_form
    json.dumps(cfg)  # what --profiler-config takes
    old, old_notes = vllm_settings(p, tmp_path / "t", "0.12.0")
    env = old["env"]
    assert env["VLLM_TORCH_PROFILER_DIR"] == str(tmp_path / "t")
    assert {k: env[k] for k in old_env} == old_env and all(isinstance(v, str) for v in env.values())
    for note in notes:
        assert any(note in n for n in new_notes) and any(note in n for n in old_notes), (note, new_notes)
    if not notes:
        assert new_notes == []


def test_vllm_before_iteration_limits_says_so(tmp_path):
    env, notes = vllm_settings(plan(contents("cpu", "cuda"), SCHED), tmp_path, "0.10.2")
    assert "VLLM_PROFILER_DELAY_ITERS" not in env["env"]
    assert any("cannot delay or limit" in n and "0.10.2" in n for n in notes)


def test_sglang_start_arguments(tmp_path):
    p = plan(contents("cpu", "cuda", "stack", "shapes"), SCHED, f"{R}.tool_config.torch.analysis=true")
    args, notes = sglang_start_args(p, tmp_path, forward_count=100)
    assert args == {
        "output_dir": str(tmp_path),
        "activities": ["CPU", "GPU"],
        "with_stack": True,
        "record_shapes": True,
        "start_step": 104,
        "num_steps": 3,
    }
    assert notes == []
    args, notes = sglang_start_args(p, tmp_path)  # the engine's forward count unknown: a superset, said so
    assert "start_step" not in args and args["num_steps"] == 6 and any("start_step" in n for n in notes)
    args, notes = sglang_start_args(plan(contents("cpu", "memory")), tmp_path)
    assert args == {"output_dir": str(tmp_path), "activities": ["CPU"], "with_stack": False, "record_shapes": False}
    assert any("no memory content" in n for n in notes) and any("runs its trace export" in n for n in notes)


def test_async_rollout_without_discrete_is_refused():
    e2e = load_plan(None, ["global_profiler.tool=torch", "global_profiler.steps=[2]", f"{R}.enable=true"])
    with pytest.raises(ConfigError) as err:
        rollout_plan(e2e)
    assert "discrete" in str(err.value) and "\n" not in str(err.value)
    own = [o.replace("actor_rollout_ref.rollout.mode", "rollout.mode") for o in ASYNC if "discrete" not in o]
    proc = run_cli("plan", *own)  # rlprof's trainer (rollout.mode) refuses it
    assert proc.returncode == 2 and "discrete" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    # verl (actor_rollout_ref.rollout.mode) runs it and does not profile its engines: one warning, rollout off
    plan = plan_json(*[o for o in ASYNC if "discrete" not in o])
    assert plan["roles"]["rollout"]["enabled"] is False
    assert sum("discrete" in w for w in plan["warnings"]) == 1


class RecordingEngine:
    """A recording stand-in for a running engine: logs calls, and on stop writes what the engine would."""

    def __init__(self, files=()):
        self.calls, self.files, self.out = [], list(files), None

    def start_profile(self, **kwargs):
        self.calls.append(("start_profile", kwargs))
        self.out = Path(kwargs["output_dir"]) if "output_dir" in kwargs else self.out

    def stop_profile(self):
        self.calls.append(("stop_profile", {}))
        for name in self.files:
            _write_trace(self.out / name, name)


def _write_trace(path: Path, label: str):
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 1,
            "tid": 1,
            "ts": 10,
            "dur": 40,
            "args": {"engine": label},
        },
        {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_64x64", "pid": 0, "tid": 7, "ts": 20, "dur": 25},
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events, "schemaVersion": 1}, f)


def test_only_the_selected_replica_is_asked_to_profile(tmp_path):
    p = plan(contents("cpu", "cuda"), f"{R}.ranks=[1]", f"{R}.all_ranks=false")
    engines = [RecordingEngine() for _ in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fleet = ReplicaFleet([SglangAdapter(p, r, 3, tmp_path, engines[r]) for r in range(3)])
    assert fleet.start(1) == [] and fleet.stop() == []  # step 1 is not profiled
    assert fleet.start(2) == [1]
    fleet.stop()
    assert [e.calls for e in engines] == [
        [],
        [
            (
                "start_profile",
                {
                    "output_dir": str(tmp_path / "sglang_replica1" / "step2"),
                    "activities": ["CPU", "GPU"],
                    "with_stack": False,
                    "record_shapes": False,
                },
            ),
            ("stop_profile", {}),
        ],
        [],
    ]


VLLM_FILES = [
    "inst-3f2a-rank-0.1763700000000.pt.trace.json.gz",
    "inst-3f2a-rank-1.1763700000001.pt.trace.json.gz",
    "async_llm.1763700000002.pt.trace.json.gz",
]
SGLANG_FILES = [
    "1763700000.25-TP-0.trace.json.gz",
    "rl-1763700000.25-TP-1-DP-0-PP-0-EP-0.trace.json.gz",
    "1763700000.25-TP-0-DECODE.trace.json.gz",
    "merged-1763700000.25.trace.json.gz",
]


def test_engine_file_names_are_recognised():
    kinds = [recognise(n) for n in VLLM_FILES + SGLANG_FILES]
    assert [(k.engine, k.part, k.tp_rank) for k in kinds] == [
        ("vllm", "worker", 0),
        ("vllm", "worker", 1),
        ("vllm", "frontend", None),
        ("sglang", "worker", 0),
        ("sglang", "worker", 1),
        ("sglang", "worker", 0),
        ("sglang", "merged", None),
    ]
    assert kinds[5].phase == "DECODE"
    assert recognise("host_1234.1763700000000.pt.trace.json") == recognise("host_1234.1763700000000.pt.trace.json")
    assert recognise("notes.json") is None and recognise("manifest.jsonl") is None


def test_engine_outputs_land_in_the_manifest_and_are_analysed_per_replica(tmp_path):
    p = plan(contents("cpu", "cuda"), f"{R}.ranks=[0,2]", f"{R}.all_ranks=false")
    run_dir = tmp_path / "run"
    vllm_engines = {r: RecordingEngine(VLLM_FILES) for r in (0, 2)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vllm = [VllmAdapter(p, r, 3, run_dir, vllm_engines.get(r, RecordingEngine()), "0.15.1") for r in range(3)]
    for a in vllm:  # vLLM's directory is fixed at launch: the recording engine writes there
        a.client.out = a.trace_dir
    fleet = ReplicaFleet(vllm)
    assert fleet.start(2) == [0, 2]
    written = fleet.stop()
    assert len(written) == 6
    manifest = rows(run_dir)
    assert {(r["replica"], r["engine"], r["engine_part"], r["engine_tp_rank"]) for r in manifest} == {
        (rep, "vllm", part, tp) for rep in (0, 2) for part, tp in (("worker", 0), ("worker", 1), ("frontend", None))
    }
    assert all(
        (r["step"], r["role"], r["stage"], r["mode"]) == (2, "rollout", "rollout_generate", "discrete")
        for r in manifest
    )
    proc = run_cli("analyze", run_dir, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    per_replica = {}
    for r in doc["rows"]:
        per_replica.setdefault(r["replica"], []).append(r)
    assert set(per_replica) == {0, 2} and all(len(v) == 3 for v in per_replica.values())
    assert all(r["role"] == "rollout" and r["stage"] == "rollout_generate" and r["step"] == 2 for r in doc["rows"])
    assert all(r["compute_ms"] > 0 for r in doc["rows"])  # the sgemm kernel is compute

    sg_run = tmp_path / "sg"
    engine = RecordingEngine(SGLANG_FILES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adapter = SglangAdapter(p, 0, 3, sg_run, engine)
    adapter.start_profile(2)
    got = adapter.stop_profile()
    assert sorted(Path(r["path"]).name for r in got) == sorted(SGLANG_FILES)
    assert all(r["path"].startswith("sglang_replica0/step2/") for r in got)


def test_engine_limits_are_warned_once_per_adapter(tmp_path):
    p = plan(contents("cpu", "memory"), SCHED)
    with pytest.warns(UserWarning) as caught:
        SglangAdapter(p, 0, 1, tmp_path, RecordingEngine())
    messages = [str(w.message) for w in caught]
    assert all(m.startswith("rlprof: SGLang: ") and "\n" not in m for m in messages)
    assert any("no memory content" in m for m in messages) and any("start_step" in m for m in messages)
