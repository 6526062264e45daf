"""A profiler fault never kills the training it observes (unless the plan is strict)."""

import errno
import logging
from contextlib import nullcontext

import pytest

from helpers import A, load_trace, names, profiler, rows, run, run_dir, trace_files

from rlprof.collect.backends.base import Backend
from rlprof.demo import DemoShape, run_demo
from rlprof.errors import CollectError


class ExplodingBackend(Backend):
    """A stand-in backend that fails in one phase, the way a real one does (bad driver, disk full)."""

    tool = "torch"

    def __init__(self, spec, phase):
        super().__init__(spec)
        self.phase = phase

    def start(self):
        if self.phase == "start":
            raise RuntimeError("device profiler could not start")

    def step(self):
        if self.phase == "step":
            raise RuntimeError("schedule step failed")

    def range(self, name):
        return nullcontext()

    def stop(self):
        if self.phase == "stop":
            raise OSError(errno.ENOSPC, "No space left on device")
        return []


def test_exception_inside_stage_closes_and_saves_window(tmp_path):
    prof = profiler(tmp_path, f"{A}.tool_config.torch.discrete=true", steps="[1]")
    with pytest.raises(ValueError, match="training bug"):
        with prof.step(1):
            with prof.stage("actor_update"):
                sum(i * i for i in range(1000))
                raise ValueError("training bug")
    prof.close()
    d = run_dir(tmp_path)
    assert trace_files(d) == ["step1_actor_actor_update_rank0.pt.trace.json.gz"]
    trace = load_trace(d / trace_files(d)[0])  # a valid, complete Chrome trace
    assert names(trace, "rlprof:stage:") == ["rlprof:stage:actor_update"]
    assert [r["status"] for r in rows(d)] == ["complete"]


def test_e2e_window_left_open_by_exception_is_saved(tmp_path):
    prof = profiler(tmp_path, steps="[1]")
    with pytest.raises(KeyError):
        with prof.step(1), prof.stage("rollout_generate"):
            raise KeyError("x")
    prof.close()
    assert [r["status"] for r in rows(run_dir(tmp_path))] == ["complete"]


@pytest.mark.parametrize("phase", ["start", "step", "stop"])
def test_backend_failure_is_logged_once_marked_failed_and_training_goes_on(tmp_path, caplog, phase):
    overrides = [
        f"{A}.tool_config.torch.discrete=true",
        f"{A}.tool_config.torch.schedule={{unit: micro_batch, active: 2}}",
    ]
    factory = {"torch": lambda spec: ExplodingBackend(spec, phase)}
    prof = profiler(tmp_path, *overrides, steps="[1,2,3]", backends=factory)
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        with prof:
            rewards = run_demo(prof, DemoShape(steps=3))
    assert len(rewards) == 3  # the loop ran to the end
    faults = [r for r in caplog.records if f"failed to {phase}" in r.getMessage()]
    assert len(faults) == 1, [r.getMessage() for r in caplog.records]
    listed = rows(run_dir(tmp_path))
    windows = 3 * 5  # 3 steps x 5 stages selected (rollout, ref, 3 actor stages)
    if phase == "step":
        windows = 3 * 3  # rollout and advantage_compute have no micro-batches: their windows never tick
        assert sum(r["status"] == "failed" for r in listed) == windows
    else:
        assert len(listed) == windows and all(r["status"] == "failed" for r in listed)
    assert all("error" in r for r in listed if r["status"] == "failed")


def test_export_failure_disk_full_is_failed_not_fatal(tmp_path, monkeypatch, caplog):
    import rlprof.collect.window as runtime

    def disk_full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runtime, "finalize_trace", disk_full)
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        d = run(tmp_path, steps="[1,2]")
    assert [r["status"] for r in rows(d)] == ["failed", "failed"]
    assert sum("failed to export" in r.getMessage() for r in caplog.records) == 1
    assert not list(d.glob(".raw-*"))  # raw exports are cleaned up


def test_strict_turns_a_fault_into_an_error(tmp_path):
    factory = {"torch": lambda spec: ExplodingBackend(spec, "start")}
    prof = profiler(tmp_path, "global_profiler.strict=true", steps="[1]", backends=factory)
    with pytest.raises(CollectError, match="failed to start"):
        run_demo(prof, DemoShape(steps=1))
    prof.close()


def test_strict_export_failure_raises(tmp_path, monkeypatch):
    import rlprof.collect.window as runtime

    monkeypatch.setattr(runtime, "finalize_trace", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    prof = profiler(tmp_path, "global_profiler.strict=true", steps="[1]")
    with pytest.raises(OSError, match="disk full"):
        run_demo(prof, DemoShape(steps=1))
    prof.close()


def test_budget_overrun_is_truncated_with_warning(tmp_path, caplog):
    budget = 20_000
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        d = run(tmp_path, f"global_profiler.max_bytes_per_window={budget}", steps="[2]")
    (row,) = rows(d)
    assert row["status"] == "truncated"
    path = d / row["path"]
    assert path.stat().st_size <= budget and row["bytes"] == path.stat().st_size
    trace = load_trace(path)  # still valid Chrome-trace JSON
    meta = trace["rlprof"]
    assert meta["truncated"] is True and meta["original_bytes"] > budget
    assert 0 < meta["kept_events"] < meta["total_events"]
    ts = [float(e["ts"]) for e in trace["traceEvents"] if e.get("ph") != "M"]
    assert ts == sorted(ts)  # the earliest events are the ones kept
    assert any("budget" in r.getMessage() and "truncated" in r.getMessage() for r in caplog.records)


def test_window_within_budget_is_complete(tmp_path):
    d = run(tmp_path, "global_profiler.max_bytes_per_window=100000000", steps="[2]")
    assert [r["status"] for r in rows(d)] == ["complete"]


def test_torch_memory_on_cpu_prints_notice_and_goes_on(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        d = run(tmp_path, tool="torch_memory", steps="[1]")
    assert rows(d) == []
    notices = [r.getMessage() for r in caplog.records if "torch_memory" in r.getMessage()]
    assert len(notices) == 1 and "CUDA" in notices[0]


def test_tool_this_machine_lacks_is_an_error_at_start(tmp_path):
    from rlprof.errors import ConfigError

    with pytest.raises(ConfigError, match="torch_npu"):
        profiler(tmp_path, tool="npu", steps="[1]")
    with pytest.raises(ConfigError, match="CUDA"):
        profiler(tmp_path, tool="nsys", steps="[1]")
