"""The verl plugin's sampler on a stand-in DistProfiler and backend (no verl needed): each stage call is one window
of collect/window.py's lifecycle, the file named as verl names its traces; a fault in any phase of that window is
one warning, the window dropped with its raw file, and the stage's own work goes on (tests/test_verl_plugin.py runs
verl's own code)."""

from __future__ import annotations

import gzip
import json
import logging
import time
from contextlib import nullcontext

import pytest
import torch

from conftest import fill
from rlprof import warn_once
from rlprof.collect.backends import Backend, Output
from rlprof.integrations.verl import layouts, sampler as sampling


class FakeDistProfiler:
    """What the sampler reads of verl's DistProfiler: its config, tool config, tool, rank, prefix and backend."""

    def __init__(self, save_path, active: int = 1):
        self.config = {"tool": "torch", "save_path": str(save_path), "ranks": [0]}
        self.tool_config = {
            "discrete": True,
            "schedule": {"unit": "micro_batch", "wait": 1, "warmup": 0, "active": active},
        }
        self._tool, self.rank, self.save_file_prefix, self._impl = "torch", 0, "actor", None


class ChromeBackend(Backend):
    """Writes a raw Chrome trace on stop, as the torch backend does; `explode` names the phase that raises."""

    explode: str | None = None

    def __init__(self, spec):
        super().__init__(spec)
        self.steps, self.raw = 0, None

    def start(self):
        if self.explode == "start":
            raise RuntimeError("no profiler here")
        self.raw = self.spec.run_dir / f".raw-{time.time_ns()}.json"
        self.raw.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "op", "ts": 1, "dur": 2}]}))

    def step(self):
        self.steps += 1
        if self.explode == "step":
            raise RuntimeError("step went wrong")

    def range(self, name):
        return nullcontext()

    def stop(self):
        return [Output(path=self.raw, index=None, start_ns=0, end_ns=1, finalize_to=self.spec.base_name(None))]


@pytest.fixture
def make_sampler(tmp_path, monkeypatch):
    monkeypatch.setattr(sampling, "_torch_backend_class", lambda: ChromeBackend)
    monkeypatch.setattr(warn_once, "_said_here", set())  # each test starts with nothing said in this process

    def make(explode=None):
        monkeypatch.setattr(ChromeBackend, "explode", explode)
        prof = FakeDistProfiler(tmp_path)
        s = sampling.MicroBatchSampler(prof, sampling._plan(prof), layout="engine")
        s.start(profile_step=3)
        return s

    return make


def lengths_of(k: int):
    """Where micro-batch k's two rows' real lengths are (3+k and 7), as the layouts hand them over: its mask."""
    mask = torch.zeros(2, 10, dtype=torch.int64)
    mask[0, : 3 + k], mask[1, :7] = 1, 1
    return "mask", mask


def update_actor(micro_batches: int, lengths=lengths_of) -> str:
    """verl's update loop as the engine layout sees it: each micro-batch begins at the head of its iteration."""
    window = layouts.CURRENT.get()  # None where no window opened: the loop runs as verl's own
    for k in range(micro_batches):
        if window is not None:
            window.unit_begins(lambda k=k: {"seqs": 2, "tokens": 10 + k}, lambda k=k: lengths(k))
        time.sleep(0.01)
    if window is not None:
        window.unit_ends()
    return "updated"


def traces(tmp_path):
    return sorted(tmp_path.glob("*.json.gz"))


def test_a_stage_call_is_one_window_holding_the_kept_micro_batch(make_sampler, tmp_path, capsys):
    s = make_sampler()
    assert s.annotate(role="update_actor")(update_actor)(3) == "updated"
    (path,) = traces(tmp_path)
    assert path.name.startswith("actor_actor-update_step3_rank0_pid")  # verl's own stem
    meta = json.loads(gzip.decompress(path.read_bytes()))["rlprof"]
    call = meta["sampled"].pop("call")
    assert meta["sampled"] == {"unit": "micro_batch", "kept": [1]}  # wait 1, active 1: the second micro-batch
    # the whole call beside it: its three micro-batches' rows (3+k and 7 tokens), at least their 10 ms sleeps each
    assert call.pop("wall_ms") >= 30
    assert call == {
        "timed": "the stage call",  # no call verl's own timers wrap ran inside it: the stage call whole
        "units": 3,
        "real_tokens": 3 + 4 + 5 + 3 * 7,
        "query_key_pairs": 9 + 16 + 25 + 3 * 49,
        "tallied_units": 3,
    }
    assert meta["stage"] == "actor_update" and meta["step"] == 3 and meta["collected_by"].endswith("verl.loader")
    assert not list(tmp_path.glob(".raw-*"))
    assert f"micro-batch(es) 1 -> {path}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "phase, said", [("start", "could not open a window for actor_update"), ("step", "sampling actor_update failed")]
)
def test_a_fault_is_one_warning_and_the_stage_goes_on(make_sampler, tmp_path, caplog, phase, said):
    s = make_sampler(explode=phase)
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        for _ in range(2):  # the same fault at every stage call: said once
            assert s.annotate(role="update_actor")(update_actor)(3) == "updated"
    warnings = [r.getMessage() for r in caplog.records if said in r.getMessage()]
    assert len(warnings) == 1 and ("training goes on" in warnings[0] or "verl goes on" in warnings[0])
    assert traces(tmp_path) == [] and not list(tmp_path.glob(".raw-*"))  # dropped, raw file included
    assert not s.windows  # nothing left open


def test_a_calls_time_is_what_verls_own_timers_wrap_inside_it(make_sampler, tmp_path):
    """Two mini-batches, each the engine's train_batch (what verl's train_batch timer wraps for its mfu), between
    them 1 s of other work: the call's time is the two train_batch calls', not the stage call's."""

    class Engine:
        def train_batch(self, micro_batches):
            return update_actor(micro_batches)

    layouts._time_methods(Engine, ("train_batch", "infer_batch"))

    def update_actor_two_mini_batches():
        Engine().train_batch(2)
        time.sleep(1.0)
        Engine().train_batch(2)
        return "updated"

    s = make_sampler()
    assert s.annotate(role="update_actor")(update_actor_two_mini_batches)() == "updated"
    (path,) = traces(tmp_path)
    call = json.loads(gzip.decompress(path.read_bytes()))["rlprof"]["sampled"]["call"]
    assert call["timed"].startswith("2 x ") and call["timed"].endswith(".Engine.train_batch")
    assert 40 <= call["wall_ms"] < 1000 and call["units"] == call["tallied_units"] == 4


def test_a_call_whose_lengths_cannot_be_read_keeps_its_time_and_its_kept_micro_batch(make_sampler, tmp_path):
    def unreadable(k):
        raise KeyError("attention_mask")

    s = make_sampler()
    assert s.annotate(role="update_actor")(update_actor)(3, lengths=unreadable) == "updated"
    (path,) = traces(tmp_path)
    sampled = json.loads(gzip.decompress(path.read_bytes()))["rlprof"]["sampled"]
    assert sampled["kept"] == [1] and set(sampled["call"]) == {
        "wall_ms",
        "timed",
        "units",
    }  # its work unsaid, not guessed


def test_a_stage_with_no_micro_batch_through_the_known_loop_writes_nothing(make_sampler, tmp_path, caplog):
    s = make_sampler()
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        assert s.annotate(role="update_actor")(lambda: "done")() == "done"
    assert traces(tmp_path) == [] and not list(tmp_path.glob(".raw-*"))
    assert any("ran no micro-batch through the loop" in r.getMessage() for r in caplog.records)


# ---- faults while collecting, on the plugin's own window lifecycle with rlprof's real torch backend --------------
def torch_update_actor(micro_batches: int) -> str:
    """update_actor with real work in each micro-batch (torch ops the real backend records)."""
    import torch

    window = layouts.CURRENT.get()
    for k in range(micro_batches):
        if window is not None:
            window.unit_begins(lambda k=k: {"seqs": 2, "tokens": 10 + k})
        (torch.ones(64, 64) @ torch.ones(64, 64)).sum()
    if window is not None:
        window.unit_ends()
    return "updated"


def test_a_full_disk_is_one_line_per_window_and_leaves_nothing_behind(small_disk, monkeypatch, caplog):
    disk = small_disk("1m")  # a real tmpfs, filled: the raw export of a window does not fit
    fill(disk)
    monkeypatch.setattr(warn_once, "_said_here", set())
    prof = FakeDistProfiler(disk)
    s = sampling.MicroBatchSampler(prof, sampling._plan(prof), layout="engine")
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        for step in (3, 4):
            s.start(profile_step=step)
            assert s.annotate(role="update_actor")(torch_update_actor)(3) == "updated"  # the stage's work goes on
            s.stop()
    said = [r.getMessage() for r in caplog.records]
    first = [m for m in said if "sampling actor_update failed" in m or "could not be written" in m]
    later = [m for m in said if "window actor_update of step 4 failed the same way" in m]
    assert len(first) == 1 and "OSError" in first[0] and len(later) == 1, said
    assert sorted(p.name for p in disk.rglob("*") if p.is_file()) == ["filler"]  # no raw export, .part or empty trace


WORKER = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from test_verl_plugin_sampler import FakeDistProfiler, torch_update_actor
from rlprof.integrations.verl import layouts, sampler as sampling

def ray_like(signum, frame):  # the host's handler, installed before the plugin's sampler (as Ray's worker does)
    print("host handler", flush=True)
    sys.exit(7)

signal.signal(signal.SIGTERM, ray_like)
prof = FakeDistProfiler({save!r})
s = sampling.MicroBatchSampler(prof, sampling._plan(prof), layout="engine")
s.start(profile_step=3)

def preempted_mid_update(n):
    window = layouts.CURRENT.get()
    window.unit_begins(lambda: {{"seqs": 2, "tokens": 10}})
    window.unit_begins(lambda: {{"seqs": 2, "tokens": 11}})  # the kept micro-batch (wait 1, active 1)
    os.kill(os.getpid(), signal.SIGTERM)
    print("not reached", flush=True)

s.annotate(role="update_actor")(preempted_mid_update)(2)
"""


def test_sigterm_in_a_verl_worker_writes_the_open_window_then_runs_the_hosts_handler(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(Path(__file__).parent), save=str(tmp_path / "save")))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 7, proc.stderr[-2000:]  # the host's handler decided how the process ends
    assert "host handler" in proc.stdout and "not reached" not in proc.stdout
    (path,) = sorted((tmp_path / "save").glob("*.json.gz"))  # the window in flight, written before it
    meta = json.loads(gzip.decompress(path.read_bytes()))["rlprof"]
    assert meta["sampled"] == {"unit": "micro_batch", "kept": [1]} and meta["step"] == 3
    assert not [p for p in (tmp_path / "save").iterdir() if p.name.startswith(".")]
