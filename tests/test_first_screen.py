"""`rlprof train`'s first screen is rlprof's own, each finding said once: no C++ log line of Kineto's and no
library deprecation warning in the middle of it, while what a user must see (errors, warnings of rlprof's) still
reaches stderr; `--verbose` keeps Kineto's lines."""

import gzip
import json
import os
import signal
import re
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT

FOREIGN = ("USDT:", "STAGE:", "FutureWarning", "DeprecationWarning", "[transformers]")


def train(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("RLPROF_VERBOSE", None)
    return subprocess.run(
        [sys.executable, "-m", "rlprof.cli", "train", *args, "trainer.steps=3"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_no_foreign_line_on_the_first_screen_and_verbose_keeps_kinetos(tmp_path):
    quiet = train(tmp_path)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    lines = (quiet.stdout + quiet.stderr).splitlines()
    assert [line for line in lines if any(mark in line for mark in FOREIGN)] == []
    assert any(line.startswith("step   2") for line in lines) and "findings" in quiet.stdout
    numbered = [re.sub(r"^\s+\d+\. ", "", line) for line in lines if re.match(r"^\s+\d+\. ", line)]
    assert numbered
    assert sum(text.startswith("idle is") for text in numbered) <= 1  # one idle finding for the run
    verbose = train(tmp_path, "--verbose")
    assert verbose.returncode == 0
    assert any(line.startswith("USDT:") and "profiler_start" in line for line in verbose.stderr.splitlines())


def test_the_filter_passes_everything_else_through(tmp_path):
    """Python's and C's own writes to fd 2 inside the filter reach stderr whole and in order; only Kineto's go."""
    script = textwrap.dedent("""
        import os, sys
        from rlprof.collect.foreign_logs import foreign_log_filter
        with foreign_log_filter():
            print("rlprof: warning: kept", file=sys.stderr, flush=True)
            os.write(2, b"USDT:2026-11-25 17:44:11 5938:5938 SyncActivityProfilerHandler.cpp:52] profiler_start\\n")
            os.write(2, b"a C library line\\n")
            os.write(2, b"[W1127 10:55:30.52 collection.cpp:664] Warning: rlprof:mini_batch:0 (function operator())\\n")
            os.write(2, b"[W1127 10:55:30.52 collection.cpp:664] Warning: a user's range (function operator())\\n")
            os.write(2, b"no newline at the end")
        print("after", file=sys.stderr)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("RLPROF_VERBOSE", None)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == (
        "rlprof: warning: kept\na C library line\n"
        "[W1127 10:55:30.52 collection.cpp:664] Warning: a user's range (function operator())\n"
        "no newline at the endafter\n"
    )


def test_a_crash_inside_the_filter_is_reported_on_the_real_stderr_with_each_threads_stack(tmp_path):
    """A crash in C (a segmentation fault) while the filter holds fd 2: faulthandler's report of every thread reaches
    the real stderr (the pipe's pump dies with the process); after the filter, a host's own faulthandler is as it was."""
    script = textwrap.dedent("""
        import ctypes, faulthandler, sys, threading, time
        from rlprof.collect.foreign_logs import foreign_log_filter
        with foreign_log_filter():
            pass
        print("after a filter:", faulthandler.is_enabled(), file=sys.stderr, flush=True)
        def a_waiting_thread():
            time.sleep(60)
        threading.Thread(target=a_waiting_thread, daemon=True).start()
        with foreign_log_filter():
            print("before the crash", file=sys.stderr, flush=True)
            ctypes.string_at(0)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("RLPROF_VERBOSE", None)
    env.pop("PYTHONFAULTHANDLER", None)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGSEGV, proc
    assert "after a filter: False\n" in proc.stderr  # the host's own setting restored
    assert "Fatal Python error: Segmentation fault" in proc.stderr, proc.stderr
    assert "in a_waiting_thread" in proc.stderr and "in string_at" in proc.stderr, proc.stderr


A = "actor_rollout_ref.actor.profiler"


@pytest.mark.parametrize(
    "schedule, cycles",
    [
        ("{unit: micro_batch, active: 1}", ["ProfilerStep#0"]),
        ("{unit: micro_batch, wait: 1, active: 2}", ["ProfilerStep#1", "ProfilerStep#2"]),
    ],
)
def test_a_range_open_at_a_windows_edge_is_closed_in_the_trace_and_torch_says_nothing(tmp_path, schedule, cycles):
    """A micro-batch window closes inside the still-open mini-batch (and stage) range: torch once printed
    `[W... collection.cpp:665] Warning: rlprof:mini_batch:0` between the step lines and kept the range with a
    borrowed end. Now the range ends inside the window's recorded cycle; one opened before the cycle began recording
    (wait: 1) is in the trace too, from the cycle's start."""
    proc = train(
        tmp_path,
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"{A}.enable=true",
        f"{A}.tool_config.torch.discrete=true",
        f"{A}.stages=[actor_update]",
        f"{A}.tool_config.torch.schedule={schedule}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (proc.stdout + proc.stderr).splitlines()
    assert [line for line in lines if "collection.cpp" in line or re.match(r"^\[W\d{4} ", line)] == []
    (trace,) = (tmp_path / "outputs" / "profile").glob("*/step2_actor_actor_update_rank0.pt.trace.json.gz")
    with gzip.open(trace, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    span = lambda e: (e["ts"], e["ts"] + e["dur"])  # noqa: E731
    recorded = sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    assert [e["name"] for e in recorded] == cycles
    lo, hi = span(recorded[0])[0], span(recorded[-1])[1]  # what the window recorded
    (mini,) = [e for e in events if e["name"].startswith("rlprof:mini_batch:")]
    (stage,) = [e for e in events if e["name"] == "rlprof:stage:actor_update"]
    micro = [span(e) for e in events if e["name"].startswith("rlprof:micro_batch:")]
    assert len(micro) == len(cycles)
    for e in (mini, stage):  # closed at the window's end, holding the micro-batches sampled inside them
        assert lo <= e["ts"] and e["ts"] + e["dur"] <= hi, (e["name"], span(e), (lo, hi))
        assert all(span(e)[0] <= a and b <= span(e)[1] for a, b in micro)


def test_step_lines_reach_a_log_file_while_the_run_goes_on(tmp_path):
    """`rlprof train > log`: each step's line is in the file as soon as it is printed, not when the run is over. The
    80 step lines (~6 KB) fit in one block of a buffered stdout (8 KB): unflushed, the first text in the file would
    come with the summary, all 80 lines at once."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("PYTHONUNBUFFERED", None)  # as a user's shell has it: stdout to a file is block-buffered by default
    log = tmp_path / "log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlprof.cli", "train", "trainer.steps=80", "global_profiler.tool=null"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and not log.read_text():
            time.sleep(0.05)
        first = log.read_text().splitlines()  # the first text the file shows
        assert first and first[0].startswith("step   1 "), first[:3]
        assert len([line for line in first if line.startswith("step ")]) < 80
        assert not any(line.startswith("GRPO:") for line in first)  # before the summary
    finally:
        proc.kill()
        proc.wait(timeout=60)
