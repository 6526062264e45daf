"""`rlprof train`'s first screen is rlprof's own, each finding said once: no C++ log line of Kineto's and no
library deprecation warning in the middle of it, while what a user must see (errors, warnings of rlprof's) still
reaches stderr; `--verbose` keeps Kineto's lines."""

import os
import re
import subprocess
import sys
import textwrap

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
            os.write(2, b"no newline at the end")
        print("after", file=sys.stderr)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("RLPROF_VERBOSE", None)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "rlprof: warning: kept\na C library line\nno newline at the endafter\n"
