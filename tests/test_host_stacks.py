"""The host sampler (collect/host_stacks.py) and idle explained (analyze/window/idle_frames.py): the Python stacks of
the profiled process's threads sampled inside each window, beside its trace, within its budget, off without a window;
each stage's idle split by the frames the stage thread was in, named in the idle finding, drawn in the report and
carried by `rlprof slice`. verl's worker: tests/test_verl_plugin.py; the cost: bench/host_stacks_cost.py."""

from __future__ import annotations

import collections
import gzip
import json
import logging
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from rlprof import warn_once
from rlprof.analyze.inputs.host_stacks_file import read_host_stacks, stacks_path
from rlprof.collect.host_stacks import THREAD_NAME, HostSampler
from rlprof.config import load_plan

A = "actor_rollout_ref.actor.profiler"
TORCH = ("global_profiler.tool=torch", "global_profiler.steps=[1]", f"{A}.enable=true")
REWARD = ROOT / "src" / "rlprof" / "trainer" / "reward.py"


def sleep_line() -> int:
    """The verifier's line that waits (a sandbox, a remote judge): where reward_compute's idle is."""
    (line,) = [i for i, text in enumerate(REWARD.read_text().splitlines(), 1) if "time.sleep(cost_ms" in text]
    return line


def only_run(save: Path) -> Path:
    (run,) = [p for p in save.iterdir() if p.is_dir()]
    return run


# ---- rlprof's trainer: the verifier's wait --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reward_run(tmp_path_factory):
    """`rlprof train reward.cost_ms=3` (2 steps; its default profile, step 2 whole, saved under the test's path)."""
    work = tmp_path_factory.mktemp("reward_run")
    proc = run_cli(
        "train",
        "reward.cost_ms=3",
        "trainer.steps=2",
        f"trainer.output_dir={work}/train",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"{A}.enable=true",
        f"global_profiler.save_path={work}/profile",
        cwd=work,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = only_run(work / "profile")
    return run, json.loads((run / "analysis" / "analysis.json").read_text())


def test_reward_computes_idle_is_the_verifiers_frame_in_the_finding(reward_run):
    run, doc = reward_run
    (row,) = [r for r in doc["rows"] if r["stage"] == "reward_compute" and r["unit"] is None]
    top = row["idle_frames"][0]
    assert (top["file"], top["line"], top["function"]) == ("rlprof/trainer/reward.py", sleep_line(), "score")
    assert top["ms"] >= 0.9 * row["idle_ms"] and top["share"] >= 0.9, row["idle_frames"]
    (idle,) = [f for f in doc["findings"] if f["kind"] == "idle"]
    assert re.search(rf"\d+% in rlprof/trainer/reward\.py:{sleep_line()} score", idle["text"]), idle["text"]
    said = re.search(rf"(\d+)% in rlprof/trainer/reward\.py:{sleep_line()} score", idle["text"])
    assert int(said.group(1)) >= 90


def test_every_rows_idle_is_its_frames_the_rest_and_the_unattributed(reward_run):
    """What the frames hold, what the frames past the listed ones hold and what no sample was near add up to the
    row's idle; each share is its frame's part of that idle; the libraries hold what the frames hold."""
    _, doc = reward_run
    rows = [r for r in doc["rows"] if "idle_frames" in r]
    assert {r["stage"] for r in rows} >= {"rollout_generate", "reward_compute", "actor_update"}
    for r in rows:
        framed = sum(f["ms"] for f in r["idle_frames"])
        assert framed + r["idle_frames_rest_ms"] + r["idle_unattributed_ms"] == pytest.approx(r["idle_ms"], abs=1e-3)
        assert sum(r["idle_libraries"].values()) == pytest.approx(framed + r["idle_frames_rest_ms"], abs=1e-3)
        for f in r["idle_frames"]:
            assert f["share"] == pytest.approx(f["ms"] / r["idle_ms"]) and 0 <= f["share"] <= 1
        assert r["host_samples"] > 0


def test_the_report_draws_the_verifiers_idle(reward_run):
    run, _ = reward_run
    html = (run / "report.html").read_text()
    assert 'id="idle_frames"' in html and '"type":"icicle"' in html
    figure = re.search(r'"chart-idle_frames":(\{.*?\}),"chart-', html).group(1)
    assert "reward/reward_compute" in figure and f"rlprof/trainer/reward.py:{sleep_line()}" in figure


def test_slice_carries_the_host_stacks_as_a_track(reward_run, tmp_path):
    run, _ = reward_run
    out = tmp_path / "slice.json.gz"
    proc = run_cli("slice", run, "--step", "2", "--role", "reward", "--stage", "reward_compute", "-o", out)
    assert proc.returncode == 0, proc.stderr
    trace = json.load(gzip.open(out))
    assert trace["rlprof"]["slice"]["host_stack_tracks"] >= 1
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert "MainThread (the stage's thread)" in names
    stage = next(e for e in trace["traceEvents"] if e.get("name") == "rlprof:stage:reward_compute")
    score = [e for e in trace["traceEvents"] if e.get("cat") == "rlprof_host_stack" and e["name"] == "score"]
    assert score and sum(e["dur"] for e in score) >= 0.9 * stage["dur"]
    assert all(stage["ts"] <= e["ts"] and e["ts"] + e["dur"] <= stage["ts"] + stage["dur"] + 1e-3 for e in score)


# ---- the sampler -----------------------------------------------------------------------------------------------------
def _leaf(n: int) -> int:
    total = 0
    for i in range(n):
        total += _helper(i)  # a frame made and freed each time: an address a later frame may take
    return total


def _helper(i: int) -> int:
    return i * 2


def _through_a(until: float) -> None:
    while time.perf_counter() < until:
        _leaf(200)


def _through_b(until: float) -> None:
    while time.perf_counter() < until:
        _leaf(200)


def test_each_sample_is_the_call_path_the_thread_was_on():
    """The same frames under two callers: each sample's stack is the path the thread was on at its time (a frame's
    callers are never taken from an earlier frame that happened to live at the same address)."""
    sampler = HostSampler()
    sampler.start()
    t0 = time.perf_counter()
    _through_a(t0 + 0.3)
    switched = time.time_ns() / 1000
    _through_b(time.perf_counter() + 0.3)
    sampler.stop()
    doc = sampler.document()
    main = next(i for i, t in enumerate(doc["threads"]) if t["stage"])
    frames, nodes = doc["frames"], doc["stacks"]

    def path(node):
        out = []
        while node >= 0:
            node, f = nodes[node]
            out.append(frames[f][3])
        return out

    seen = {"a": 0, "b": 0}
    for t, thread, node in zip(doc["samples"]["t_us"], doc["samples"]["thread"], doc["samples"]["stack"]):
        names = path(node)
        if thread != main or "_leaf" not in names:
            continue
        via = "a" if "_through_a" in names else "b"
        assert ("_through_b" in names) != ("_through_a" in names), names
        if abs(t - switched) > 20_000:  # the look's time and its frames are a few bytecodes apart: a margin
            assert via == ("a" if t < switched else "b"), (t - switched, names)
        seen[via] += 1
    assert seen["a"] >= 3 and seen["b"] >= 3, seen  # a loaded machine lets the sampler look less often


@pytest.mark.parametrize("host_collects", [True, False])
def test_no_collection_runs_while_the_sampler_reads_other_threads_frames(monkeypatch, host_collects):
    """Each look (sys._current_frames and the walk up each thread's frames, which make frame objects) runs with the
    collector off: on CPython 3.11 a collection set off there runs finalizers that let the frame's own thread pop it
    under the reader. The host's own setting stands before, between and after the looks."""
    import gc

    from rlprof.collect import host_stacks

    seen = []
    real_frames, real_node_of = sys._current_frames, HostSampler._node_of

    def frames():
        seen.append(("frames", gc.isenabled()))
        return real_frames()

    def node_of(self, tid, frame):
        seen.append(("walk", gc.isenabled()))
        return real_node_of(self, tid, frame)

    monkeypatch.setattr(host_stacks.sys, "_current_frames", frames)
    monkeypatch.setattr(HostSampler, "_node_of", node_of)
    was = gc.isenabled()
    (gc.enable if host_collects else gc.disable)()
    try:
        sampler = HostSampler(interval_s=0.001)
        sampler.start()
        between = []
        until = time.perf_counter() + 0.3
        while time.perf_counter() < until:
            between.append(gc.isenabled())
            _leaf(200)
        sampler.stop()
        after = gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert sampler.samples > 0 and {kind for kind, _ in seen} == {"frames", "walk"}
    assert not any(collecting for _, collecting in seen), seen
    assert after == host_collects and (host_collects in between if host_collects else not any(between))


def test_other_threads_are_named_and_the_sampler_runs_only_while_a_window_is_open(tmp_path):
    from rlprof.collect.profiler import Profiler

    stop = threading.Event()
    loader = threading.Thread(target=lambda: stop.wait(30), name="data-loader", daemon=True)
    loader.start()
    prof = Profiler(load_plan(None, [*TORCH, f"global_profiler.save_path={tmp_path}"]), rank=0, world_size=1)
    try:
        assert not [t for t in threading.enumerate() if t.name == THREAD_NAME]
        with prof.step(1), prof.stage("actor_update"):
            assert [t for t in threading.enumerate() if t.name == THREAD_NAME]
            time.sleep(0.05)
        prof.wait_written()
        assert not [t for t in threading.enumerate() if t.name == THREAD_NAME]
    finally:
        prof.close()
        stop.set()
    (trace,) = only_run(tmp_path).glob("*.pt.trace.json.gz")
    stacks = read_host_stacks(trace)
    threads = {t.name: t for t in stacks.threads}
    assert threads["MainThread"].stage and not threads["data-loader"].stage
    assert threads["data-loader"].native_id == loader.native_id
    row = json.loads((only_run(tmp_path) / "manifest.jsonl").read_text().splitlines()[0])
    assert row["host_stacks"]["path"] == stacks_path(trace).name
    assert row["host_stacks"]["bytes"] == stacks_path(trace).stat().st_size


@pytest.mark.parametrize(
    "contents, sampled",
    [
        (None, True),  # contents not listed: on
        ("[cpu]", False),  # listed without it: off
        ("[cpu,stack]", True),  # verl's own key for Python stacks
        ("[cpu,host_stacks]", True),  # rlprof's
    ],
)
def test_a_plans_contents_turn_the_sampler_on_and_off(tmp_path, contents, sampled):
    from rlprof.collect.profiler import Profiler

    extra = [] if contents is None else [f"{A}.tool_config.torch.contents={contents}"]
    plan = load_plan(None, [*TORCH, f"global_profiler.save_path={tmp_path}", *extra])
    assert plan.role("actor").host_stacks is sampled
    with Profiler(plan, rank=0, world_size=1) as prof, prof.step(1), prof.stage("actor_update"):
        time.sleep(0.02)
    assert bool(list(only_run(tmp_path).glob("*.stacks.msgpack.gz"))) is sampled


def test_host_stacks_in_each_dialect_and_a_bad_content_is_one_line_exit_2():
    assert "host_stacks" in " ".join(
        load_plan(None, [*TORCH, f"{A}.tool_config.torch.contents=[host_stacks]"]).warnings
    )
    markers = ["global_profiler.tool=markers", "global_profiler.steps=[1]", f"{A}.enable=true"]
    assert load_plan(None, markers).role("actor").host_stacks
    assert not load_plan(None, [*markers, f"{A}.tool_config.markers.contents=[]"]).role("actor").host_stacks
    integrated = ["profiler_config.integrated.profile=true"]
    assert load_plan(None, integrated).role("actor").host_stacks
    off = [*integrated, "+profiler_config.integrated.profile_with_host_stacks=false"]
    assert not load_plan(None, off).role("actor").host_stacks
    legacy = ["trainer.profile_steps=[1]", "trainer.npu_profile.options.with_cpu=true"]
    assert not load_plan(None, legacy).role("actor").host_stacks
    assert load_plan(None, [*legacy, "trainer.npu_profile.options.with_stack=true"]).role("actor").host_stacks
    proc = run_cli("plan", *TORCH, f"{A}.tool_config.torch.contents=[cpu,stacks]")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "contents" in line and "'stacks'" in line and "host_stacks" in line


def test_the_sampler_stops_at_its_share_of_the_budget_and_the_window_stays_within_it(tmp_path):
    from rlprof.collect.profiler import Profiler
    import torch

    capped = HostSampler(cap_bytes=4096)
    capped.start()
    _through_a(time.perf_counter() + 0.3)
    capped.stop()
    assert capped.truncated and capped.document()["truncated"] and capped.samples < 4096 // 12
    budget = 60_000
    plan = load_plan(None, [*TORCH, f"global_profiler.save_path={tmp_path}", f"{A}.max_bytes_per_window={budget}"])
    x = torch.randn(64, 64)
    with Profiler(plan, rank=0, world_size=1) as prof, prof.step(1), prof.stage("actor_update"):
        for _ in range(3000):  # some 6,000 operators: a trace past the budget whatever the machine's speed
            x = (x @ x).tanh()
    (row,) = [json.loads(x) for x in (only_run(tmp_path) / "manifest.jsonl").read_text().splitlines()]
    assert row["status"] == "truncated" and row["bytes"] + row["host_stacks"]["bytes"] <= budget


# ---- faults ------------------------------------------------------------------------------------------------------------
@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(warn_once, "_said_here", set())


def two_windows(save: Path, caplog) -> None:
    """Steps 1 and 2 profiled, an actor_update in each, the warnings caught."""
    from rlprof.collect.profiler import Profiler

    plan = load_plan(None, [*TORCH, "global_profiler.steps=[1,2]", f"global_profiler.save_path={save}"])
    with caplog.at_level(logging.WARNING, "rlprof"):
        with Profiler(plan, rank=0, world_size=1) as prof:
            for step in (1, 2):
                with prof.step(step), prof.stage("actor_update"):
                    time.sleep(0.03)


def test_a_sampler_fault_is_one_warning_and_the_window_goes_on(tmp_path, monkeypatch, caplog, fresh_warnings):
    from rlprof.collect import host_stacks

    def broken():
        raise RuntimeError("no frames today")

    monkeypatch.setattr(host_stacks.sys, "_current_frames", broken)
    two_windows(tmp_path, caplog)
    said = [r.getMessage() for r in caplog.records if "host sampler" in r.getMessage()]
    assert len(said) == 1 and "no frames today" in said[0] and "training goes on" in said[0]
    rows = [json.loads(x) for x in (only_run(tmp_path) / "manifest.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["complete", "complete"] and not any("host_stacks" in r for r in rows)


def test_stacks_that_cannot_be_written_are_one_line_and_the_trace_is_written(
    tmp_path, monkeypatch, caplog, fresh_warnings
):
    import errno

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(HostSampler, "write", full)
    two_windows(tmp_path, caplog)
    said = [r.getMessage() for r in caplog.records if "host stacks" in r.getMessage()]
    assert len(said) == 1 and "No space left" in said[0]
    run = only_run(tmp_path)
    assert len(list(run.glob("*.pt.trace.json.gz"))) == 2 and not list(run.glob("*.stacks.*"))
    assert not [p for p in run.iterdir() if p.name.endswith(".part")]


SIGTERMED = """
import sys, time
from rlprof.collect.profiler import Profiler
from rlprof.config import load_plan

def waiting_for_the_judge():
    time.sleep(60)

plan = load_plan(None, {overrides!r})
prof = Profiler(plan, rank=0, world_size=1)
with prof.step(1), prof.stage("reward_compute"):
    print("open", flush=True)
    waiting_for_the_judge()
"""


def test_sigterm_writes_the_open_windows_stacks_and_the_signal_goes_on(tmp_path):
    script = tmp_path / "host.py"
    overrides = [*TORCH, "reward_model.profiler.enable=true", f"global_profiler.save_path={tmp_path}"]
    script.write_text(textwrap.dedent(SIGTERMED).format(overrides=overrides))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "open"
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM and "Traceback" not in err, err[-3000:]
    (trace,) = only_run(tmp_path).glob("*.pt.trace.json.gz")
    stacks = read_host_stacks(trace)
    stage = stacks.stage_thread()
    waits = [n for th, n in zip(stacks.samples.thread, stacks.samples.stack) if th == stage]
    leaf = collections.Counter(stacks.frames[stacks.frames_of(n)[0]][3] for n in waits)
    # the stage thread waited for the judge until the signal; a look taken as the handler shuts the window down may
    # see it join a thread (once: 1 of 139 looks)
    assert len(waits) >= 20 and leaf["waiting_for_the_judge"] >= len(waits) - 2, leaf


def _syncing(x, until: float) -> None:
    while time.perf_counter() < until:
        x.sum().item()


def _waiting(until: float) -> None:
    while time.perf_counter() < until:
        time.sleep(0.001)


def _serialising(batch, until: float) -> None:
    import pickle

    while time.perf_counter() < until:
        pickle.loads(pickle.dumps(batch))


def test_the_host_causes_are_told_from_real_stacks_and_collections_are_timed():
    """What a host sync, a wait and serialising a batch look like on the stack, and a collection on the stage thread,
    as the sampler records them (frameworks/host_frames.py reads them). Most samples, not all: a C call that holds
    the GIL (pickle's) is seen where the thread lets the GIL go, often its loop's next line (docs/collect.md)."""
    import gc

    import torch

    from rlprof.frameworks.host_frames import host_kind

    sampler = HostSampler()
    sampler.start()
    spans = {}
    for kind, run in (
        ("host_sync", lambda until: _syncing(torch.ones(256), until)),
        ("host_wait", _waiting),
        ("data_transfer", lambda until: _serialising({"ids": list(range(20_000))}, until)),
    ):
        t0 = time.time_ns() / 1000
        run(time.perf_counter() + 0.25)
        spans[kind] = (t0, time.time_ns() / 1000)
    gc.collect()
    sampler.stop()
    doc = sampler.document()
    main = next(i for i, t in enumerate(doc["threads"]) if t["stage"])
    frames, nodes = doc["frames"], doc["stacks"]

    def stack(node):
        out = []
        while node >= 0:
            node, f = nodes[node]
            out.append(tuple(frames[f]))
        return out

    for kind, (lo, hi) in spans.items():
        told = [
            host_kind(stack(n))
            for t, th, n in zip(doc["samples"]["t_us"], doc["samples"]["thread"], doc["samples"]["stack"])
            if th == main and lo + 20_000 <= t <= hi - 20_000
        ]
        assert told and told.count(kind) > 0.5 * len(told), (kind, told)
    collected = [g for g in doc["gc"] if g[2] == main]
    assert collected and all(g[1] >= g[0] for g in collected) and collected[-1][3] == 2  # gc.collect(): generation 2


def _spin_a(until: float) -> None:
    while time.perf_counter() < until:
        sum(range(300))


def _spin_b(until: float) -> None:
    while time.perf_counter() < until:
        sum(range(300))


def test_a_rows_idle_and_launch_bound_gaps_are_the_frames_the_host_was_in_then():
    """A row whose device was busy while the host ran `_spin_a`, then idle waiting for launches while it ran
    `_spin_b` (the device's side placed over real samples): its idle and its launch-bound gaps are `_spin_b`'s, with
    the line it ran; the idle and launch time no sample stands for is said, not spread."""
    import msgspec
    import numpy as np

    from rlprof.analyze.inputs.host_stacks_file import HostStacks
    from rlprof.analyze.tables.intervals import Coverage
    from rlprof.analyze.window.idle_frames import IdleAttribution

    sampler = HostSampler()
    sampler.start()
    t0 = time.time_ns() / 1000
    _spin_a(time.perf_counter() + 0.2)
    switched = time.time_ns() / 1000
    _spin_b(time.perf_counter() + 0.2)
    t1 = time.time_ns() / 1000
    sampler.stop()
    stacks = msgspec.convert(sampler.document(), HostStacks)
    busy, bound = Coverage(np.array([t0]), np.array([switched])), Coverage(np.array([switched]), np.array([t1]))
    gap_ms = (t1 - switched) / 1e3
    row = {"start_us": t0, "wall_ms": (t1 - t0) / 1e3, "idle_ms": gap_ms, "launch_bound_ms": gap_ms}
    got = IdleAttribution(stacks, busy, 0.0, True, bound).row(row)
    for key in ("idle_frames", "launch_frames"):
        frames = got[key]
        assert frames[0]["function"] == "_spin_b" and frames[0]["library"] == "user code", frames
        assert frames[0]["file"] == "test_host_stacks.py" and frames[0]["share"] > 0.5, frames
        # a look at the end of _spin_a stands for the time up to half-way to the next one, which a loaded machine
        # may delay: at most that edge of the gap, never the bulk of it
        assert sum(f["share"] for f in frames if f["function"] == "_spin_a") < frames[0]["share"], frames
    said = sum(f["ms"] for f in got["idle_frames"]) + got["idle_frames_rest_ms"] + got["idle_unattributed_ms"]
    assert said == pytest.approx(gap_ms) and sum(f["ms"] for f in got["launch_frames"]) <= gap_ms + 1e-6
