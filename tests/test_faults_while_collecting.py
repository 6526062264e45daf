"""Faults while collecting, as a cluster treats a job: the profile's disk fills mid-run (a real tmpfs), the job is
preempted (SIGTERM), interrupted (SIGINT) or killed (SIGKILL) at whatever moment. The training never pays: it ends
as it would have without rlprof, with its metrics; and every window the run started is whole and listed, listed as
partial with what was kept, or recovered and named by `rlprof analyze` (collect/preemption.py, collect/window.py,
analyze/salvage.py). The assertions hold whatever moment the signal lands (the busy-machine style)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import ROOT, fill, run_cli
from rlprof.analyze.salvage import classify, read_manifest, window_key

A = "actor_rollout_ref.actor.profiler"
PROFILED = (2, 3, 4, 5, 6)
TRAIN = (
    "trainer.steps=7",
    "global_profiler.tool=torch",
    f"{A}.enable=true",
    f"global_profiler.steps=[{','.join(map(str, PROFILED))}]",
)


def start_train(tmp_path: Path, save: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlprof.cli",
            "train",
            f"trainer.output_dir={tmp_path}/train",
            f"global_profiler.save_path={save}",
            *TRAIN,
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, KINETO_LOG_LEVEL="5", **(env or {})),
    )


def printed_step(line: str) -> int | None:
    parts = line.split()
    return int(parts[1]) if len(parts) > 1 and parts[0] == "step" and parts[1].isdigit() else None


def run_until(proc: subprocess.Popen, step: int, sig: int | None, delay: float) -> tuple[list[int], str]:
    """Reads the progress lines; once `step` is printed, waits `delay` s and sends `sig`. (printed steps, stderr)"""
    printed = []
    for line in proc.stdout:
        n = printed_step(line)
        if n is not None:
            printed.append(n)
        if sig is not None and n is not None and n >= step:
            time.sleep(delay)
            proc.send_signal(sig)
            break
    out, err = proc.communicate(timeout=240)
    printed += [n for n in map(printed_step, out.splitlines()) if n is not None]
    return printed, err


def only_dir(path: Path) -> Path:
    (d,) = [p for p in path.iterdir() if p.is_dir()]
    return d


def metrics_steps(tmp_path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (only_dir(tmp_path / "train") / "metrics.jsonl").open()]


def whole_trace(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)  # a cut or empty file raises here


def analyze_json(run: Path) -> tuple[dict, str]:
    proc = run_cli("analyze", run, "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc.stderr


# ---- the profile's disk fills mid-run ----------------------------------------------------------------------------
def test_disk_full_mid_run_train_exits_0_with_its_metrics_and_one_line_per_lost_window(tmp_path, small_disk):
    disk = small_disk("16m")  # step 2's raw export (~10 MB) fits; the disk is filled once step 2 has ended
    proc = start_train(tmp_path, disk)
    for line in proc.stdout:
        if printed_step(line) == 2:
            fill(disk)
            break
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert metrics_steps(tmp_path) == list(range(1, 8))  # in the trainer's own output directory
    run = only_dir(disk)
    rows = {r["step"]: r for r in read_manifest(run / "manifest.jsonl")[0]} if (run / "manifest.jsonl").exists() else {}
    lost = []
    for step in PROFILED:
        name = f"step{step}_actor_e2e_rank0"
        row = rows.get(step)
        if row is not None and row["status"] == "complete":
            assert whole_trace(run / row["path"])["rlprof"]["step"] == step
        else:
            lost.append(name)
            assert sum(name in line for line in err.splitlines()) == 1, err  # one line names it
    assert lost, "the full disk cost no window: the test filled nothing"
    left = sorted(p.name for p in run.rglob("*") if p.is_file())
    for name in left:  # nothing temporary left, nothing empty or cut under a trace's name
        assert not name.endswith((".tmp", ".part")) and (classify(name) or ("trace",))[0] == "trace", left
        if classify(name) is not None:
            assert whole_trace(run / name)


# ---- preempted: SIGTERM, and SIGINT ------------------------------------------------------------------------------
@pytest.mark.parametrize("delay", [0.0, 0.15])
def test_sigterm_during_windows_ends_by_the_signal_with_every_started_window_whole_or_partial(tmp_path, delay):
    save = tmp_path / "profile"
    proc = start_train(tmp_path, save)
    printed, err = run_until(proc, 3, signal.SIGTERM, delay)
    assert proc.returncode == -signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err
    steps = metrics_steps(tmp_path)
    assert steps == list(range(1, len(steps) + 1)) and set(printed) <= set(steps)  # every step that ended
    run = only_dir(save)
    rows, cut = read_manifest(run / "manifest.jsonl")
    assert not cut
    by_step = {r["step"]: r for r in rows}
    assert len(by_step) == len(rows)  # one row per window
    for step, row in by_step.items():
        if row["status"] == "complete":
            assert whole_trace(run / row["path"])["rlprof"]["step"] == step
        else:  # the grace time ran out while it was written: listed as partial, its raw export kept
            assert row["status"] == "partial" and json.loads((run / row["path"]).read_text())["traceEvents"]
    ended = [s for s in PROFILED if s in steps]
    assert all(by_step[s]["status"] in ("complete", "partial") for s in ended)  # every window of a step that ended
    started = set(ended) | {s for s in PROFILED if s == max(steps) + 1}  # and the one in flight, if it opened
    assert set(by_step) <= started
    assert not [p.name for p in run.iterdir() if classify(p.name) and classify(p.name)[0] == "open"]
    doc, _ = analyze_json(run)
    complete = {s for s, r in by_step.items() if r["status"] == "complete"}
    assert complete <= {r["step"] for r in doc["rows"]}  # analyze has rows for every complete window
    assert {s["step"] for s in doc.get("salvage", [])} == {s for s, r in by_step.items() if r["status"] == "partial"}


def test_sigterm_past_the_grace_time_lists_the_window_as_partial_and_analyze_recovers_it(tmp_path):
    save = tmp_path / "profile"
    proc = start_train(tmp_path, save, env={"RLPROF_SIGNAL_GRACE_S": "0"})
    printed, err = run_until(proc, 3, signal.SIGTERM, 0.0)
    assert proc.returncode == -signal.SIGTERM and "Traceback" not in err, err[-3000:]
    run = only_dir(save)
    rows = read_manifest(run / "manifest.jsonl")[0]
    partial = [r for r in rows if r["status"] == "partial"]
    doc, stderr = analyze_json(run)
    recovered = {s["step"] for s in doc.get("salvage", []) if s["fate"] == "recovered"}
    assert {r["step"] for r in partial} == recovered
    assert {r["step"] for r in rows} <= {r["step"] for r in doc["rows"]}  # complete and partial alike read
    said = [line for line in stderr.splitlines() if "recovered from" in line]
    assert len(said) == len(partial) and stderr.splitlines()[: len(said)] == said  # said first


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_signal_ends_the_process_with_the_status_it_has_without_rlprof(tmp_path, sig):
    codes = []
    for tool in ("torch", "null"):
        (tmp_path / tool).mkdir()
        proc = start_train(tmp_path / tool, tmp_path / tool / "profile", f"global_profiler.tool={tool}")
        run_until(proc, 3, sig, 0.0)
        codes.append(proc.returncode)
    assert codes[0] == codes[1] and codes[0] != 0, codes


# ---- killed: SIGKILL (the OOM killer) ----------------------------------------------------------------------------
@pytest.mark.parametrize("delay", [0.05, 0.3])
def test_sigkill_during_a_window_leaves_every_started_window_analysed_or_named(tmp_path, delay):
    save = tmp_path / "profile"
    proc = start_train(tmp_path, save)
    printed, _ = run_until(proc, 3, signal.SIGKILL, delay)
    assert proc.returncode == -signal.SIGKILL
    run = only_dir(save)
    doc, stderr = analyze_json(run)
    analysed = {r["step"] for r in doc["rows"]}
    named = {s["step"] for s in doc.get("salvage", [])}
    for step in PROFILED:
        if step <= max(printed):  # its window was started (and ended) before the kill
            assert step in analysed or step in named, (step, stderr)
    for p in run.iterdir():  # whatever the kill left: each file of a window is read or named
        c = classify(p.name)
        if c is not None and window_key(c[1]) is not None:
            assert window_key(c[1])[0] in analysed | named, (p.name, stderr)
    for s in doc.get("salvage", []):
        line = f"window {s['window']} " + ("recovered from" if s["fate"] == "recovered" else "lost:")
        assert any(line in x for x in stderr.splitlines()), stderr


# ---- the signal handler, inside a host that owns its own -----------------------------------------------------------
HOST = """
import os, signal, sys, time
from rlprof.collect import Profiler
from rlprof.config import load_plan

calls = []
{install}
plan = load_plan(None, ["global_profiler.tool=torch", "global_profiler.steps=[1]",
                        "global_profiler.save_path={save}", "actor_rollout_ref.actor.profiler.enable=true"])
prof = Profiler(plan, run_id="run")
print("installed", signal.getsignal(signal.SIGTERM) is not {host_handler}, flush=True)
with prof.step(1):
    with prof.stage("actor_update"):
        sum(i * i for i in range(10000))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)
        print("after", calls, flush=True)
"""


def host_script(tmp_path, install: str, handler: str) -> subprocess.CompletedProcess:
    script = tmp_path / "host.py"
    script.write_text(textwrap.dedent(HOST).format(install=install, save=tmp_path / "p", host_handler=handler))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_a_host_handler_is_chained_never_replaced_after_the_window_is_written(tmp_path):
    install = (
        "def host(signum, frame):\n"
        "    calls.append((signum, os.path.exists('{}')))\n"
        "signal.signal(signal.SIGTERM, host)".format(tmp_path / "p" / "run" / "manifest.jsonl")
    )
    proc = host_script(tmp_path, install, "host")
    assert proc.returncode == 0, proc.stderr
    # rlprof's handler sits in front of the host's, which ran once, after the window's row was written
    assert "installed True" in proc.stdout and f"after [({int(signal.SIGTERM)}, True)]" in proc.stdout, proc.stdout
    (row,) = read_manifest(tmp_path / "p" / "run" / "manifest.jsonl")[0]
    assert row["status"] == "complete" and whole_trace(tmp_path / "p" / "run" / row["path"])


def test_an_ignored_signal_stays_ignored(tmp_path):
    proc = host_script(tmp_path, "signal.signal(signal.SIGTERM, signal.SIG_IGN)", "signal.SIG_IGN")
    assert proc.returncode == 0 and "installed False" in proc.stdout and "after []" in proc.stdout, proc.stderr


def test_a_handler_installed_from_a_thread_is_not_attempted_and_collection_goes_on(tmp_path):
    code = textwrap.dedent(
        f"""
        import signal, threading
        from rlprof.collect import Profiler
        from rlprof.config import load_plan
        plan = load_plan(None, ["global_profiler.tool=torch", "global_profiler.steps=[1]",
                                "global_profiler.save_path={tmp_path}/p", "actor_rollout_ref.actor.profiler.enable=true"])
        def work():
            with Profiler(plan, run_id="run") as prof, prof.step(1), prof.stage("actor_update"):
                sum(range(1000))
        t = threading.Thread(target=work); t.start(); t.join()
        print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr
    (row,) = read_manifest(tmp_path / "p" / "run" / "manifest.jsonl")[0]
    assert row["status"] == "complete" and whole_trace(tmp_path / "p" / "run" / row["path"])
