"""Contract tests of the npu, nsys and torch_memory backends against recording stand-ins.

The stand-ins below are NOT torch_npu / CUDA: they record every call and argument the backends
make, so the exact API usage can be checked on a machine without an NPU or a GPU.
"""

import itertools
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from helpers import A, R, rows

from rlprof.collect import Profiler
from rlprof.collect.backends.npu import NpuBackend
from rlprof.collect.backends.nsys import NsysBackend
from rlprof.collect.backends.torch_memory import TorchMemoryBackend
from rlprof.config import load_plan


class Enum:
    def __init__(self, kind, *names):
        for n in names:
            setattr(self, n, f"{kind}.{n}")


class RecordingTorchNpu:
    """Recording stand-in of the torch_npu.profiler / torch_npu.npu.mstx API surface rlprof uses."""

    def __init__(self):
        self.calls = []
        rec = self.calls
        self._ids = itertools.count(1)
        self._dirs = itertools.count()

        def handler_factory(dir_name, worker_name=None, analyse_flag=True):
            rec.append(
                ("tensorboard_trace_handler", dir_name, {"worker_name": worker_name, "analyse_flag": analyse_flag})
            )

            def handler(prof):  # what torch_npu writes: <worker>_<timestamp>_ascend_pt/
                out = Path(dir_name) / f"{worker_name}_{next(self._dirs)}_ascend_pt"
                (out / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
                (out / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").write_text("[]")
                rec.append(("trace_ready", out.name))

            return handler

        class Prof:
            def __init__(self, **kwargs):
                rec.append(("profile", kwargs))
                self.kwargs = kwargs

            def start(self):
                rec.append(("start",))

            def step(self):
                rec.append(("step",))

            def stop(self):
                rec.append(("stop",))
                self.kwargs["on_trace_ready"](self)

        self.profiler = SimpleNamespace(
            ProfilerLevel=Enum("ProfilerLevel", "Level_none", "Level0", "Level1", "Level2"),
            ExportType=Enum("ExportType", "Text", "Db"),
            ProfilerActivity=Enum("ProfilerActivity", "CPU", "NPU"),
            AiCMetrics=Enum("AiCMetrics", "AiCoreNone", "PipeUtilization"),
            _ExperimentalConfig=lambda **kw: rec.append(("_ExperimentalConfig", kw)) or ("experimental", kw),
            tensorboard_trace_handler=handler_factory,
            schedule=lambda **kw: rec.append(("schedule", kw)) or ("schedule", kw),
            profile=Prof,
        )

        def range_start(message, stream=None):
            rid = next(self._ids)
            rec.append(("mstx.range_start", message, rid))
            return rid

        self.npu = SimpleNamespace(
            mstx=SimpleNamespace(
                range_start=range_start,
                range_end=lambda rid: rec.append(("mstx.range_end", rid)),
                mark=lambda message, stream=None: rec.append(("mstx.mark", message)),
            )
        )

        # torch.npu's memory queries (torch_npu answers as torch.cuda does): one initialised 64 GiB device 0
        self.device = SimpleNamespace(
            is_available=lambda: True,
            is_initialized=lambda: True,
            current_device=lambda: 0,
            get_device_properties=lambda i: SimpleNamespace(name="Ascend stand-in", total_memory=64 * 2**30),
            mem_get_info=lambda i=None: (60 * 2**30, 64 * 2**30),
            memory_reserved=lambda i=None: 2**30,
            max_memory_reserved=lambda i=None: 2 * 2**30,
            memory_allocated=lambda i=None: 2**29,
            max_memory_allocated=lambda i=None: 2**30,
        )

    def named(self, name):
        return [c for c in self.calls if c[0] == name]


def tiny_loop(prof, steps=(1,), decode_steps=3, micro_batches=2):
    for step in steps:
        with prof.step(step):
            with prof.stage("rollout_generate"):
                for _ in range(decode_steps):
                    with prof.unit("decode_step"):
                        pass
            with prof.stage("actor_update"):
                for _ in range(micro_batches):
                    with prof.unit("micro_batch"):
                        pass


NPU_MATRIX = [
    # level, export_type, contents, analysis, schedule
    ("level0", "text", "[npu,cpu]", False, None),
    ("level1", "db", "[npu]", True, None),
    ("level2", "text", "[cpu,memory,shapes]", False, "{unit: micro_batch, wait: 1, warmup: 0, active: 1}"),
    (
        "level_none",
        "db",
        "[npu,cpu,stack,module]",
        True,
        "{unit: decode_step, skip_first: 1, wait: 0, warmup: 1, active: 1, repeat: 1}",
    ),
    ("level_none", "text", "[npu,cpu,memory,shapes,stack,module]", False, None),
]


@pytest.mark.parametrize("level,export,contents,analysis,schedule", NPU_MATRIX)
def test_npu_backend_maps_plan_to_torch_npu_profiler(tmp_path, level, export, contents, analysis, schedule):
    npu = f"{A}.tool_config.npu"
    overrides = [
        "global_profiler.tool=npu",
        "global_profiler.steps=[1]",
        f"global_profiler.save_path={tmp_path}",
        f"{A}.enable=true",
        f"{npu}.discrete=true",
        f"{npu}.level={level}",
        f"{npu}.export_type={export}",
        f"{npu}.contents={contents}",
        f"{npu}.analysis={str(analysis).lower()}",
        f"{A}.stages=[actor_update]",
    ]
    if schedule:
        overrides.append(f"{npu}.schedule={schedule}")
    plan = load_plan(None, overrides)
    standin = RecordingTorchNpu()
    factory = {"npu": lambda s: NpuBackend(s, torch_npu=standin, device_api=standin.device)}
    with Profiler(plan, run_id="r", role="actor", backends=factory) as p:
        tiny_loop(p)
    want = set(contents.strip("[]").split(",")) | {"cpu"}  # verl's npu tool records CPU activity always
    window_dir = str(tmp_path / "r" / "step1_actor_actor_update_rank0")
    (exp,) = standin.named("_ExperimentalConfig")
    level_name = {"level_none": "Level_none", "level0": "Level0", "level1": "Level1", "level2": "Level2"}[level]
    assert exp[1] == {
        "export_type": f"ExportType.{export.capitalize()}",
        "profiler_level": f"ProfilerLevel.{level_name}",
        "msprof_tx": not (export == "db" and level == "level_none"),
        "aic_metrics": "AiCMetrics.AiCoreNone",
        "data_simplification": True,
    }
    assert standin.named("tensorboard_trace_handler") == [
        (
            "tensorboard_trace_handler",
            window_dir,
            {"worker_name": "step1_actor_actor_update_rank0", "analyse_flag": analysis},
        )
    ]
    (prof_call,) = standin.named("profile")
    kwargs = prof_call[1]
    assert kwargs["activities"] == [f"ProfilerActivity.{a}" for a in ("CPU", "NPU") if a.lower() in want]
    assert kwargs["record_shapes"] == ("shapes" in want)
    assert kwargs["profile_memory"] == ("memory" in want)
    assert kwargs["with_stack"] == ("stack" in want)
    assert kwargs["with_modules"] == ("module" in want)
    assert kwargs["experimental_config"] == ("experimental", exp[1])
    if schedule:
        (sched,) = standin.named("schedule")
        s = plan.role("actor").schedule
        assert sched[1] == {
            "wait": s.wait,
            "warmup": s.warmup,
            "active": s.active,
            "repeat": s.repeat,
            "skip_first": s.skip_first,
        }
        assert kwargs["schedule"] == ("schedule", sched[1])
    else:
        assert "schedule" not in kwargs and not standin.named("schedule")
    # call order: start, one step per micro-batch tick only when scheduled on micro_batch, stop
    order = [c[0] for c in standin.calls if c[0] in ("start", "step", "stop", "mstx.range_start", "mstx.range_end")]
    steps = 2 if schedule and "micro_batch" in schedule else 0
    per_micro_batch = ["mstx.range_start", "mstx.range_end"] + (["step"] if steps else [])
    assert order == ["start", "mstx.range_start"] + per_micro_batch * 2 + ["mstx.range_end", "stop"]
    ranges = [c[1] for c in standin.named("mstx.range_start")]
    assert ranges == ["rlprof:stage:actor_update", "rlprof:micro_batch:0", "rlprof:micro_batch:1"]
    (row,) = rows(tmp_path / "r")
    assert row["tool"] == "npu" and row["status"] == "complete"
    assert row["path"].startswith("step1_actor_actor_update_rank0_") and row["path"].endswith("_ascend_pt")
    if "memory" in want:  # the device's capacity beside a window that records memory: what memory_use needs
        assert row["device_memory"]["device"] == "npu:0" and row["device_memory"]["capacity_bytes"] == 64 * 2**30
        assert row["device_memory"]["max_reserved_bytes"] == 2 * 2**30
    else:
        assert "device_memory" not in row


def test_npu_e2e_window_covers_all_stages(tmp_path):
    plan = load_plan(
        None,
        [
            "global_profiler.tool=npu",
            "global_profiler.steps=[2]",
            f"global_profiler.save_path={tmp_path}",
            f"{A}.enable=true",
        ],
    )
    standin = RecordingTorchNpu()
    with Profiler(plan, run_id="r", backends={"npu": lambda s: NpuBackend(s, torch_npu=standin)}) as p:
        tiny_loop(p, steps=(1, 2, 3))
    assert len(standin.named("profile")) == 1  # only step 2
    assert [c[1] for c in standin.named("mstx.range_start") if "stage" in c[1]] == [
        "rlprof:stage:rollout_generate",
        "rlprof:stage:actor_update",
    ]
    assert [r["stage"] for r in rows(tmp_path / "r")] == ["e2e"]


class RecordingNvtxApi:
    """Recording stand-in of CUDA capture-range + NVTX calls (not CUDA)."""

    def __init__(self):
        self.calls = []

    def capture_start(self):
        self.calls.append("capture_start")

    def capture_stop(self):
        self.calls.append("capture_stop")

    def range_push(self, name):
        self.calls.append(f"push {name}")
        return name

    def range_pop(self, handle):
        self.calls.append(f"pop {handle}")


def test_nsys_e2e_capture_and_ranges_in_order(tmp_path):
    plan = load_plan(
        None,
        [
            "global_profiler.tool=nsys",
            "global_profiler.steps=[1]",
            f"global_profiler.save_path={tmp_path}",
            f"{A}.enable=true",
        ],
    )
    api = RecordingNvtxApi()
    with Profiler(plan, run_id="r", backends={"nsys": lambda s: NsysBackend(s, api=api)}) as p:
        tiny_loop(p, steps=(1, 2), decode_steps=2, micro_batches=1)
    assert api.calls == [
        "push step1_actor_e2e_rank0",
        "capture_start",
        "push rlprof:stage:rollout_generate",
        "push rlprof:decode_step:0",
        "pop rlprof:decode_step:0",
        "push rlprof:decode_step:1",
        "pop rlprof:decode_step:1",
        "pop rlprof:stage:rollout_generate",
        "push rlprof:stage:actor_update",
        "push rlprof:micro_batch:0",
        "pop rlprof:micro_batch:0",
        "pop rlprof:stage:actor_update",
        "capture_stop",
        "pop step1_actor_e2e_rank0",
    ]
    (row,) = rows(tmp_path / "r")
    assert row["tool"] == "nsys" and row["path"] is None and row["status"] == "complete"


def test_nsys_discrete_schedule_opens_capture_only_for_active_units(tmp_path):
    plan = load_plan(
        None,
        [
            "global_profiler.tool=nsys",
            "global_profiler.steps=[1]",
            f"global_profiler.save_path={tmp_path}",
            f"{A}.enable=true",
            f"{R}.tool_config.nsys.discrete=true",
            f"{R}.tool_config.nsys.schedule={{unit: decode_step, wait: 1, active: 1}}",
        ],
    )
    # verl's rollout servers switch nsys off (the plan says so); the backend itself still honours a rollout window
    assert not plan.role("rollout").enabled
    rollout = msgspec.structs.replace(plan.role("rollout"), enabled=True)
    plan = msgspec.structs.replace(plan, roles=tuple(rollout if r.role == "rollout" else r for r in plan.roles))
    api = RecordingNvtxApi()
    with Profiler(plan, run_id="r", role="rollout", backends={"nsys": lambda s: NsysBackend(s, api=api)}) as p:
        tiny_loop(p, decode_steps=3)
    assert api.calls == [
        "push step1_rollout_rollout_generate_rank0",
        "push rlprof:stage:rollout_generate",
        "push rlprof:decode_step:0",
        "pop rlprof:decode_step:0",
        "capture_start",
        "push rlprof:decode_step:1",
        "pop rlprof:decode_step:1",
        "capture_stop",
        "push rlprof:decode_step:2",
        "pop rlprof:decode_step:2",
        "pop rlprof:stage:rollout_generate",
        "pop step1_rollout_rollout_generate_rank0",
    ]


class RecordingCudaMemory:
    """Recording stand-in of torch.cuda.memory's history/snapshot calls (not CUDA)."""

    def __init__(self):
        self.calls = []

    def _record_memory_history(self, **kwargs):
        self.calls.append(("record", kwargs))

    def _dump_snapshot(self, path):
        self.calls.append(("dump", Path(path).name))
        Path(path).write_bytes(b"\x80\x04}\x94.")  # an empty pickled dict


def test_torch_memory_records_history_and_dumps_snapshot_per_cycle(tmp_path):
    m = f"{A}.tool_config.torch_memory"
    plan = load_plan(
        None,
        [
            "global_profiler.tool=torch_memory",
            "global_profiler.steps=[1]",
            f"global_profiler.save_path={tmp_path}",
            f"{A}.enable=true",
            f"{m}.discrete=true",
            f"{m}.max_entries=5000",
            f"{m}.stack_depth=16",
            f"{m}.schedule={{unit: micro_batch, active: 1, repeat: 2}}",
            f"{A}.stages=[actor_update]",
        ],
    )
    mem = RecordingCudaMemory()
    factory = {"torch_memory": lambda s: TorchMemoryBackend(s, memory_api=mem)}
    with Profiler(plan, run_id="r", role="actor", backends=factory) as p:
        tiny_loop(p, micro_batches=3)
    start = ("record", {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 5000})
    stop = ("record", {"enabled": None})
    assert mem.calls == [
        start,
        ("dump", "step1_actor_actor_update_rank0_w0.memory_snapshot.pickle"),
        stop,
        start,
        ("dump", "step1_actor_actor_update_rank0_w1.memory_snapshot.pickle"),
        stop,
    ]
    assert sorted(r["window"] for r in rows(tmp_path / "r")) == [0, 1]
