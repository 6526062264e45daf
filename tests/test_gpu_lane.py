"""The GPU lane: rlprof's trainer on a CUDA device with the windows a GPU user takes first, and what the analysis says
of them. Run with `bash bench/gpu_lane.sh` on a GPU machine (it keeps what they print in bench/results/); skipped,
saying why, where there is no CUDA device (conftest.py). Without one, the H100 recordings in tests/data are the GPU
truth the suite checks.

The model is the H100 recordings' (hidden 768, 6 layers: tests/data/h100/torch-memory/SOURCES.md): big enough that
its decode loop is launch-bound on an H100, small enough that each run takes seconds.
"""

import json
import re

import pytest

from conftest import run_cli
from helpers import A, R, unjudged_steps, rows, trigger_steps

from rlprof.analyze.pipeline import analyze

pytestmark = pytest.mark.cuda

MODEL = (
    "trainer.device=cuda",
    "model.hidden_size=768",
    "model.num_layers=6",
    "model.num_heads=12",
    "model.num_kv_heads=4",
    "model.intermediate_size=3072",
    "model.max_position_embeddings=256",
    "data.prompts_per_step=8",
    "rollout.n=8",
    "actor.micro_batch_size=8",
)
TORCH_LINE = re.compile(r"^\[[WE]\d{4} |collection\.cpp")  # a C++ line of torch's (c10's format) on our screen


def train(tmp_path, *overrides, steps=3):
    proc = run_cli(
        "train",
        *MODEL,
        f"trainer.steps={steps}",
        f"trainer.output_dir={tmp_path}/train",
        f"global_profiler.save_path={tmp_path}/p",
        *overrides,
        cwd=tmp_path,
        timeout=300,
    )
    print(proc.stdout)  # what the lane keeps (bench/gpu_lane.sh)
    print(proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line for line in (proc.stdout + proc.stderr).splitlines() if TORCH_LINE.search(line)] == []
    (run,) = [p for p in (tmp_path / "p").iterdir() if p.is_dir()]
    return proc, run


def measure(doc, name, stage):
    (m,) = [m for m in doc["measures"] if m["measure"] == name and m["stage"] == stage]
    return m


def named(doc, kind, stage):
    """The findings of `kind` that name `stage` (one per stage, or one per cause listing its stages)."""
    return [f for f in doc["findings"] if f["kind"] == kind and (f.get("stage") == stage or stage in f["text"])]


def test_discrete_decode_step_and_micro_batch_windows(tmp_path):
    """Decode steps 10-29 of rollout and micro-batches 1-2 of each actor stage, one file per stage: every unit kept is
    a row of device work; the decode loop is launch-bound (its units, and the stage row assembled from them)."""
    _, run = train(
        tmp_path,
        "rollout.max_new_tokens=40",
        "rollout.ignore_eos=true",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"{A}.enable=true",
        f"{A}.tool_config.torch.discrete=true",
        f"{A}.tool_config.torch.schedule={{unit: micro_batch, wait: 1, active: 2}}",
        f"{R}.tool_config.torch.schedule={{unit: decode_step, wait: 10, warmup: 0, active: 20}}",
    )
    doc = analyze(run, workers=1)
    assert all(i.get("device") for i in doc["inputs"]), doc["inputs"]  # CUDA activity in every file
    units = lambda stage, unit: sorted(  # noqa: E731
        r["index"] for r in doc["rows"] if r["stage"] == stage and r["unit"] == unit
    )
    assert units("rollout_generate", "decode_step") == list(range(10, 30))
    for stage in ("ref_compute_log_prob", "actor_compute_log_prob", "actor_update"):
        assert units(stage, "micro_batch") == [1, 2], stage
    decode = [r for r in doc["rows"] if r["unit"] == "decode_step"]
    assert all(r["compute_ms"] > 0 for r in decode)  # each decode step's kernels, attributed by launch
    share = sum(r["launch_bound_ms"] for r in decode) / sum(r["wall_ms"] for r in decode)
    assert share >= 0.25, share  # the device waits on the host's launches (92% on the H100 recording)
    lb = measure(doc, "launch_bound", "rollout_generate")  # the stage row assembled from its units says the same
    assert lb["value"] >= 0.25, lb
    assert named(doc, "launch_bound", "rollout_generate"), [f["text"] for f in doc["findings"]]


def test_a_whole_step_with_memory_names_rollout_launch_bound_and_measures_memory(tmp_path):
    """Step 2 in one window with the torch tool's memory: every stage a row, rollout launch-bound with its levers,
    and the device's capacity beside the window, so memory use is a number."""
    proc, run = train(
        tmp_path,
        "rollout.max_new_tokens=24",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"{A}.enable=true",
        f"{A}.tool_config.torch.discrete=false",
        f"{A}.tool_config.torch.contents=[cpu,cuda,memory,host_stacks]",
    )
    import torch

    (row,) = rows(run)
    capacity = torch.cuda.get_device_properties(0).total_memory
    assert row["device_memory"]["capacity_bytes"] == capacity and row["device_memory"]["device"] == "cuda:0"
    doc = analyze(run, workers=1)
    stages = {r["stage"] for r in doc["rows"] if r["unit"] is None}
    assert stages >= {"rollout_generate", "ref_compute_log_prob", "actor_compute_log_prob", "actor_update"}
    assert measure(doc, "launch_bound", "rollout_generate")["value"] >= 0.25  # 89% on the H100 recording
    (rollout,) = named(doc, "launch_bound", "rollout_generate")
    assert rollout["levers"].get("rlprof") or rollout["levers"].get("verl"), rollout
    # the host's stacks beside the window: the device's launch-bound gaps split by the frames the host was in then
    (stage,) = [r for r in doc["rows"] if r["stage"] == "rollout_generate" and r["unit"] is None]
    launch = stage["launch_frames"]
    assert sum(f["ms"] for f in launch) <= stage["launch_bound_ms"] + 1e-3 and launch[0]["share"] > 0, launch
    assert sum(f["ms"] for f in launch if f["library"] == "rlprof") >= 0.5 * stage["launch_bound_ms"], launch
    (use,) = [m for m in doc["measures"] if m["measure"] == "memory_use"]
    assert use["status"] == "measured" and 0 < use["value"] < 1 and use["capacity_bytes"] == capacity
    assert "headroom" in proc.stdout  # the trainer's own screen
    speed_of_light_on_this_device(proc, run, doc)


def speed_of_light_on_this_device(proc, run, doc):
    """The window names the GPU it ran on; where rlprof's table knows it, every stage gets its mfu and mbu against the
    datasheet's limits (float32: the trainer's dtype), each recomputed from the row's work, and the trainer prints them;
    where it does not, the one line says so and the work stands."""
    import torch

    from rlprof.frameworks.devices import device_limits

    name = torch.cuda.get_device_name(0)
    (row,) = rows(run)
    assert row["device"] == {"kind": "cuda", "name": name, "count": torch.cuda.device_count()}
    assert doc["model"]["dtype"] == "float32" and doc["model"]["hidden_size"] == 768
    limits = device_limits(name)
    print(f"speed of light on {name}: {limits.name if limits else 'not in the table'}")
    if limits is None:
        assert doc["stage_limits"] == [] and "is not in rlprof's table" in proc.stdout
        return
    peak, bandwidth = limits.peak_flops["float32"], limits.bandwidth
    stages = {s["stage"]: s for s in doc["stage_limits"]}
    assert set(stages) >= {"rollout_generate", "ref_compute_log_prob", "actor_compute_log_prob", "actor_update"}
    for s in stages.values():
        assert s["mfu"] == pytest.approx(s["model_flops"] / (s["wall_ms"] / 1e3) / peak)
        assert s["mbu"] == pytest.approx(s["min_bytes"] / (s["wall_ms"] / 1e3) / bandwidth)
        assert 0 < s["mfu"] < 1 and 0 < s["mbu"] < 1 and s["sol_ms"] < s["wall_ms"], s
        assert f"{s['role']}/{s['stage']}: " in proc.stdout
    assert stages["rollout_generate"]["gap_largest"] == "launch-bound"  # as on the H100 recordings


def test_torch_memory_on_a_gpu_step_carries_the_capacity_and_measures_memory(tmp_path):
    """The acceptance of the memory work on a real device: the snapshot's window records the device's capacity and
    the allocator's reservations; memory use is measured against it; `rlprof analyze` prints the peak and headroom."""
    import torch

    proc, run = train(
        tmp_path,
        "rollout.max_new_tokens=24",
        "global_profiler.tool=torch_memory",
        "global_profiler.steps=[2]",
        f"{A}.enable=true",
    )
    (row,) = rows(run)
    assert row["path"].endswith(".memory_snapshot.pickle")
    dm = row["device_memory"]
    props = torch.cuda.get_device_properties(0)
    assert dm["capacity_bytes"] == props.total_memory and dm["name"] == props.name
    assert 0 < dm["free_bytes"] < dm["capacity_bytes"] and 0 < dm["reserved_bytes"] <= dm["max_reserved_bytes"]
    assert 0 < dm["allocated_bytes"] <= dm["max_allocated_bytes"] <= dm["max_reserved_bytes"]
    doc = analyze(run, workers=1)
    (mem,) = doc["memory"]
    (use,) = [m for m in doc["measures"] if m["measure"] == "memory_use"]
    assert use["status"] == "measured" and use["value"] == pytest.approx(mem["peak_bytes"] / props.total_memory)
    assert 0 < mem["peak_bytes"] <= dm["max_reserved_bytes"]
    shown = run_cli("analyze", run)
    print(shown.stdout)
    assert shown.returncode == 0 and "headroom" in shown.stdout and props.name in shown.stdout
    assert "no operators" not in shown.stdout


def test_the_trigger_captures_a_slowed_gpu_step(tmp_path):
    """Every step watched on the GPU; from step 14 the update sleeps 0.5 s more: the step after the first one judged
    slow is captured whole, a trace of the device's work, and analysed."""
    _, run = train(
        tmp_path,
        "data.prompts_per_step=2",
        "rollout.n=2",
        "actor.mini_batch_size=2",
        "actor.micro_batch_size=2",
        "rollout.max_new_tokens=4",
        "global_profiler.tool=torch",
        f"{A}.enable=true",
        "global_profiler.trigger.slow.factor=2.0",
        "trainer.debug.inject_slowdown.from_step=14",
        "trainer.debug.inject_slowdown.stage=actor_update",
        "trainer.debug.inject_slowdown.seconds=0.5",
        steps=22,
    )
    expected = trigger_steps(14, unjudged_steps(run), 22)
    captured = [r for r in rows(run) if r.get("trigger")]
    assert expected and captured, (expected, unjudged_steps(run))
    judged = captured[0]["trigger"]["step"]
    assert judged in expected and captured[0]["step"] == judged + 1 and captured[0]["stage"] == "e2e"
    assert captured[0]["trigger"]["reason"] == "slow" and captured[0]["trigger"]["stage"] == "actor_update"
    doc = analyze(run, workers=1)
    kept = [i for i in doc["inputs"] if i["path"].endswith(captured[0]["path"])]
    assert kept and kept[0].get("device"), doc["inputs"]
    assert {r["stage"] for r in doc["rows"] if r["step"] == judged + 1} >= {"rollout_generate", "actor_update"}
    print(json.dumps(captured[0]["trigger"]))
