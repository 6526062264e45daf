"""The device's memory beside each window on an accelerator (collect/device_memory.py), and the memory measure
computed from it: a torch_memory snapshot holds no capacity, so its window's manifest row carries one.

No GPU is lent here: torch.cuda's query functions (and torch.cuda.memory's history and dump) are substituted
in-process with a stand-in device, so the real Profiler, window and torch_memory backend run unchanged and record
what the stand-in answers; the snapshot the stand-in dumps is the real H100 one (tests/data/h100/torch-memory,
SOURCES.md there). The GPU lane (tests/test_gpu_lane.py) runs the same on a real device.
"""

import gzip
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import DATA, run_cli
from helpers import A, load_trace, rows, run

from rlprof.analyze.pipeline import analyze
from rlprof.collect.backends.torch_backend import TorchBackend
from rlprof.collect.device_memory import device_memory
from rlprof.report.terminal import memory_lines

H100 = DATA / "h100" / "torch-memory"
SNAPSHOT = H100 / "step2_actor_e2e_rank0.memory_snapshot.pickle"
H100_PEAK = 1_522_118_656  # the snapshot's peak allocated bytes (SOURCES.md)
CAPACITY = 80 * 2**30  # the stand-in device's memory
FREE, RESERVED, MAX_RESERVED = 76 * 2**30, 3 * 2**30, 4 * 2**30


class StandInDevice:
    """torch.cuda's query functions for one initialised device 0 of CAPACITY bytes (not CUDA); counts its calls."""

    def __init__(self, initialized=True):
        self.initialized, self.calls = initialized, []

    def install(self, monkeypatch, module):
        for name in (
            "is_available",
            "is_initialized",
            "current_device",
            "get_device_properties",
            "mem_get_info",
            "memory_reserved",
            "max_memory_reserved",
            "memory_allocated",
            "max_memory_allocated",
        ):
            monkeypatch.setattr(module, name, getattr(self, name))

    def _call(self, name, value):
        self.calls.append(name)
        return value

    def is_available(self):
        return self._call("is_available", True)

    def is_initialized(self):
        return self._call("is_initialized", self.initialized)

    def current_device(self):
        return self._call("current_device", 0)

    def get_device_properties(self, index):
        return self._call("get_device_properties", SimpleNamespace(name="stand-in device", total_memory=CAPACITY))

    def mem_get_info(self, index=None):
        return self._call("mem_get_info", (FREE, CAPACITY))

    def memory_reserved(self, index=None):
        return self._call("memory_reserved", RESERVED)

    def max_memory_reserved(self, index=None):
        return self._call("max_memory_reserved", MAX_RESERVED)

    def memory_allocated(self, index=None):
        return self._call("memory_allocated", H100_PEAK // 2)

    def max_memory_allocated(self, index=None):
        return self._call("max_memory_allocated", H100_PEAK)


@pytest.fixture
def stand_in_cuda(monkeypatch):
    """torch.cuda answering as one device, torch.cuda.memory recording history and dumping the H100 snapshot."""
    device = StandInDevice()
    device.install(monkeypatch, torch.cuda)
    history = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda **kw: history.append(kw))
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda path: shutil.copyfile(SNAPSHOT, path))
    return SimpleNamespace(device=device, history=history)


def test_torch_memory_window_on_a_device_carries_its_capacity_and_memory_is_measured(tmp_path, stand_in_cuda):
    d = run(tmp_path, tool="torch_memory", steps="[2]")
    (row,) = rows(d)
    assert row["tool"] == "torch_memory" and row["path"].endswith(".memory_snapshot.pickle")
    assert row["device_memory"] == {
        "device": "cuda:0",
        "index": 0,
        "name": "stand-in device",
        "capacity_bytes": CAPACITY,
        "free_bytes": FREE,
        "reserved_bytes": RESERVED,
        "max_reserved_bytes": MAX_RESERVED,
        "allocated_bytes": H100_PEAK // 2,
        "max_allocated_bytes": H100_PEAK,
    }
    assert [h.get("enabled") for h in stand_in_cuda.history] == ["all", None]  # recorded, then stopped

    doc = analyze(d, workers=1)
    (mem,) = doc["memory"]
    assert mem["peak_bytes"] == H100_PEAK and mem["capacity_bytes"] == CAPACITY and mem["device"] == 0
    assert mem["max_reserved_bytes"] == MAX_RESERVED and "capacity_why" not in mem
    (use,) = [m for m in doc["measures"] if m["measure"] == "memory_use"]
    assert use["status"] == "measured" and use["value"] == pytest.approx(H100_PEAK / CAPACITY)
    assert use["peak_bytes"] == H100_PEAK and use["capacity_bytes"] == CAPACITY
    (headroom,) = [f for f in doc["findings"] if f["kind"] == "memory_headroom"]  # 1.8% used: far below half
    assert "1.4 of 80.0 GiB" in headroom["text"]

    proc = run_cli("analyze", d)
    assert proc.returncode == 0, proc.stderr
    assert "peak 1.42 GiB allocated of 80.00 GiB, 1.8% used, headroom 78.58 GiB" in proc.stdout
    assert "memory use / capacity 2%" in proc.stdout
    assert "no operators" not in proc.stdout and "no time windows: these inputs are memory snapshots" in proc.stdout


def test_a_torch_window_with_memory_on_a_device_carries_it_too(tmp_path):
    """The torch tool with `memory` in its contents: the device's memory goes into the manifest row and the trace's
    rlprof metadata (the stand-in handed to the backend: torch.cuda left as it is, so Kineto asks no CUDA here). The demo's memory counter here is host memory, never measured against the device's capacity."""
    factory = {"torch": lambda spec: TorchBackend(spec, device_api=StandInDevice())}  # CUDA activity stays off
    d = run(tmp_path, f"{A}.tool_config.torch.contents=[cpu,cuda,memory]", tool="torch", steps="[2]", backends=factory)
    (row,) = rows(d)
    assert row["device_memory"]["capacity_bytes"] == CAPACITY and row["device_memory"]["device"] == "cuda:0"
    trace = load_trace(d / row["path"])
    assert trace["rlprof"]["device_memory"] == row["device_memory"]
    doc = analyze(d, workers=1)
    (mem,) = [m for m in doc["memory"] if m["peak_bytes"] is not None]
    assert mem["device"] == "cpu" and "capacity_bytes" not in mem and "host memory" in mem["capacity_why"]


def test_a_torch_window_without_memory_asks_nothing(tmp_path):
    device = StandInDevice()
    d = run(tmp_path, tool="torch", steps="[2]", backends={"torch": lambda spec: TorchBackend(spec, device_api=device)})
    (row,) = rows(d)
    assert "device_memory" not in row and not {"get_device_properties", "mem_get_info"} & set(device.calls)


def test_a_device_never_used_is_not_initialised_to_ask(monkeypatch):
    """A process that has not touched its GPU (a CPU run on a GPU machine) records nothing: asking would create a
    context on the device, memory the program never asked for."""
    device = StandInDevice(initialized=False)
    assert device_memory("cuda", device) is None
    assert device.calls == ["is_available", "is_initialized"]


def test_a_failing_query_loses_the_record_not_the_window():
    device = StandInDevice()
    device.mem_get_info = lambda index=None: (_ for _ in ()).throw(RuntimeError("CUDA error: unspecified"))
    assert device_memory("cuda", device) is None
    assert device_memory("npu") is None  # torch_npu is not imported here: no torch.npu to ask


def test_the_h100_recording_without_capacity_says_why_and_still_prints_the_peak(tmp_path):
    """The real H100 torch_memory run, recorded before windows carried the device's memory: the peak is read, the
    use of the device is not measurable and the measure says why; the screen shows the peak, not an operator table."""
    d = shutil.copytree(H100, tmp_path / "torch-memory")
    doc = analyze(d, workers=1)
    (mem,) = doc["memory"]
    assert mem["peak_bytes"] == H100_PEAK and "capacity_bytes" not in mem
    (use,) = [m for m in doc["measures"] if m["measure"] == "memory_use"]
    assert use["status"] == "not measurable" and use["peak_bytes"] == H100_PEAK
    assert "snapshot holds no capacity and its window recorded none" in use["why"]
    assert not [f for f in doc["findings"] if f["kind"] == "memory_headroom"]
    (line,) = memory_lines(doc)
    assert line.startswith(
        "memory (step 2 actor/e2e rank 0): peak 1.42 GiB allocated; use of the device not measurable"
    )
    assert "2.64 GiB reserved" in line  # the snapshot's own segments

    proc = run_cli("analyze", d)
    assert proc.returncode == 0, proc.stderr
    assert "peak 1.42 GiB allocated" in proc.stdout and "no operators" not in proc.stdout


def _trace_with_memory(path: Path, device: int, meta: dict) -> Path:
    """A small Kineto trace: one stage range, two [memory] counter events on CUDA device `device`, no
    deviceProperties (as a trace whose Kineto wrote none), and the window's rlprof metadata."""
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "rlprof:stage:actor_update",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 100,
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 50},
    ]
    for ts, total in ((20, 3 * 2**30), (40, 5 * 2**30)):
        events.append(
            {
                "ph": "i",
                "s": "t",
                "cat": "cpu_instant_event",
                "name": "[memory]",
                "pid": 1,
                "tid": 1,
                "ts": ts,
                "args": {"Device Type": 1, "Device Id": device, "Total Allocated": total, "Bytes": 2**30},
            }
        )
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events, "rlprof": meta}, f)
    return path


@pytest.mark.parametrize("counter_device, measured", [(0, True), (1, False)])
def test_a_trace_without_device_properties_takes_its_windows_record_for_the_same_device(
    tmp_path, counter_device, measured
):
    record = {"device": "cuda:0", "index": 0, "name": "stand-in device", "capacity_bytes": CAPACITY}
    meta = {"step": 2, "role": "actor", "stage": "actor_update", "rank": 0, "tool": "torch", "device_memory": record}
    doc = analyze(_trace_with_memory(tmp_path / "t.pt.trace.json.gz", counter_device, meta), workers=1)
    (mem,) = doc["memory"]
    assert mem["peak_bytes"] == 5 * 2**30 and mem["device"] == counter_device
    (use,) = [m for m in doc["measures"] if m["measure"] == "memory_use"]
    if measured:
        assert use["value"] == pytest.approx(5 / 80) and mem["device_name"] == "stand-in device"
    else:  # the record is device 0's: never taken for device 1's counter
        assert use["status"] == "not measurable" and "device 1" in use["why"] and "capacity_bytes" not in mem


def test_every_memory_counter_event_of_a_trace_is_read(tmp_path):
    """Consecutive [memory] events each count (the reader once took every second one, halving the timeline and
    missing a peak that fell on a skipped event)."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 100}]
    totals = [1, 5, 2, 7, 3, 4]
    for i, total in enumerate(totals):
        args = {"Device Type": 1, "Device Id": 0, "Total Allocated": total * 2**20, "Bytes": 2**20}
        events.append({"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 10 + i, "args": args})
    path = tmp_path / "m.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    doc = analyze(path, workers=1)
    (mem,) = doc["memory"]
    assert [b / 2**20 for _, b in mem["timeline"]] == totals and mem["peak_bytes"] == 7 * 2**20
