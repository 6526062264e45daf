"""Faults while collecting, as a cluster treats a job: the profile's disk fills mid-run (a real tmpfs), the job is
preempted (SIGTERM), interrupted (SIGINT) or killed (SIGKILL) at whatever moment. The training never pays: it ends
as it would have without rlprof, with its metrics; and every window the run started is whole and listed, listed as
partial with what was kept, or recovered and named by `rlprof analyze` (collect/preemption.py, collect/window.py,
analyze/inputs/salvage.py). The assertions hold whatever moment the signal lands (the busy-machine style)."""

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
from rlprof.analyze.inputs.salvage import classify, read_manifest, window_key

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


# ---- a run directory after a crash: every window accounted for ---------------------------------------------------
def crashed_run(tmp_path) -> Path:
    """A real run's directory, then left as a crash leaves one, window by window: step 3's trace unlisted (killed
    before its row), step 2 only its raw export (killed while its trace was written), step 1 only its trace cut
    mid-write, step 4 open when the run ended, step 5 failed; the manifest's last line cut mid-line."""
    from helpers import run

    from rlprof.demo import DemoShape

    d = run(tmp_path, steps="[1,2,3]", shape=DemoShape(steps=3))
    rows = read_manifest(d / "manifest.jsonl")[0]
    assert [r["step"] for r in rows] == [1, 2, 3]
    traces = {r["step"]: d / r["path"] for r in rows}
    raw = gzip.decompress(traces[2].read_bytes())
    (d / ".raw-step2_actor_e2e_rank0-k2x9q1.json").write_bytes(raw)
    traces[2].unlink()
    whole = traces[1].read_bytes()
    (d / ".step1_actor_e2e_rank0.pt.trace.json.gz.part").write_bytes(whole[: len(whole) // 2])
    traces[1].unlink()
    (d / ".step4_actor_e2e_rank0.open").touch()
    failed = dict(rows[0], step=5, steps=[5], status="failed", path=None, bytes=0, error="torch backend failed")
    text = json.dumps(failed) + "\n" + json.dumps(rows[2])[:40]  # step 3's row cut by the crash
    (d / "manifest.jsonl").write_text(text)
    return d


def test_analyze_after_a_crash_recovers_or_names_every_window_and_says_so_first(tmp_path):
    from rlprof.analyze.pipeline import analyze
    from rlprof.analyze.result import Analysis

    d = crashed_run(tmp_path)
    doc = analyze(d, workers=1)
    fates = {s["step"]: (s["fate"], s["source"]) for s in doc["salvage"]}
    assert fates == {
        1: ("recovered", ".step1_actor_e2e_rank0.pt.trace.json.gz.part"),
        2: ("recovered", ".raw-step2_actor_e2e_rank0-k2x9q1.json"),
        3: ("recovered", "step3_actor_e2e_rank0.pt.trace.json.gz"),
        4: ("lost", None),
        5: ("lost", None),
    }
    assert "open when the run ended" in next(s["reason"] for s in doc["salvage"] if s["step"] == 4)
    assert "torch backend failed" in next(s["reason"] for s in doc["salvage"] if s["step"] == 5)
    inputs = {Path(i["path"]).name: i for i in doc["inputs"]}
    assert {i["window_status"] for i in inputs.values()} == {"recovered"}
    assert inputs[".step1_actor_e2e_rank0.pt.trace.json.gz.part"]["partial"]  # what was readable of the cut file
    assert not inputs[".raw-step2_actor_e2e_rank0-k2x9q1.json"]["partial"]  # the complete raw export: whole
    assert {r["step"] for r in doc["rows"]} == {1, 2, 3}
    warnings = doc["warnings"]
    assert [w.split(" ")[1] for w in warnings[:5]] == [f"step{n}_actor_e2e_rank0" for n in (1, 2, 3, 4, 5)]
    assert "manifest.jsonl: line 2 is cut" in warnings[5]
    typed = Analysis.from_document(doc)  # the typed result knows the field
    assert [s.fate for s in typed.salvage] == ["recovered"] * 3 + ["lost"] * 2
    assert json.loads(typed.to_json())["salvage"] == doc["salvage"]


def test_analyze_and_report_say_the_recovered_and_lost_windows_in_their_first_lines(tmp_path):
    d = crashed_run(tmp_path)
    for args in (("analyze", d), ("report", d, "-o", tmp_path / "report.html")):
        proc = run_cli(*args)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        first = proc.stderr.splitlines()[:5]
        assert [" ".join(line.split()[3:5]) for line in first] == [
            f"step{n}_actor_e2e_rank0 {fate}" for n, fate in [(1, "recovered"), (2, "recovered"), (3, "recovered")]
        ] + [f"step{n}_actor_e2e_rank0 lost:" for n in (4, 5)], first
    page = (tmp_path / "report.html").read_text()
    assert "recovered after the run stopped: step1_actor_e2e_rank0" in page and "lost: step4_actor_e2e_rank0" in page


def test_a_run_killed_before_its_first_manifest_row_is_analysed_from_what_it_left(tmp_path):
    from rlprof.analyze.pipeline import analyze

    d = crashed_run(tmp_path)
    (d / "manifest.jsonl").unlink()
    doc = analyze(d, workers=1)
    assert {s["step"]: s["fate"] for s in doc["salvage"]} == {1: "recovered", 2: "recovered", 3: "recovered", 4: "lost"}


def test_a_cut_line_is_read_up_to_the_cut_and_the_row_after_it_kept(tmp_path):
    rows = [
        {"run_id": "r", "step": n, "role": "actor", "stage": "e2e", "rank": 0, "status": "complete"} for n in (1, 2)
    ]
    path = tmp_path / "manifest.jsonl"
    # a writer cut mid-row; a later one appended its whole row right after, on the same line
    path.write_text(json.dumps(rows[0])[:30] + json.dumps(rows[1]) + "\n")
    read, warnings = read_manifest(path)
    assert read == [rows[1]] and len(warnings) == 1 and "line 1 is cut" in warnings[0]


def test_manifest_rows_on_a_full_disk_are_whole_or_absent(small_disk):
    from rlprof.collect.manifest import append_row

    disk = small_disk("64k")
    row = {"run_id": "r", "step": 1, "role": "actor", "stage": "e2e", "rank": 0, "pad": "x" * 900}
    written = 0
    with pytest.raises(OSError):
        for written in range(1000):
            append_row(disk, dict(row, step=written + 1))
    rows, cut = read_manifest(disk / "manifest.jsonl")
    assert not cut and [r["step"] for r in rows] == list(range(1, written + 1))  # no half row left by the full disk


def test_the_watch_timeline_and_heartbeat_on_a_full_disk_keep_whole_records_and_no_temporary(small_disk):
    from rlprof.analyze.inputs.timeline_file import RECORD
    from rlprof.collect.watch import Watch, write_live
    from rlprof.vocab import STAGES

    disk = small_disk("64k")
    watch = Watch(disk, 0)
    n = 0
    with pytest.raises(OSError):
        for n in range(1, 100000):
            watch.write(n, 0, 1.0, [0.5] * (4 * len(STAGES)))  # times, starts, waits for a core, times on one
    size = watch.path.stat().st_size
    assert size % RECORD.size == 0 and size // RECORD.size == n - 1  # the cut record was taken back
    fill(disk)
    with pytest.raises(OSError):
        write_live(disk, step=n)
    assert not [p.name for p in disk.rglob("*") if p.name.endswith(".tmp")]


def test_a_vanished_run_directory_loses_the_window_in_flight_with_one_line_and_training_goes_on(tmp_path, caplog):
    import logging
    import shutil

    from helpers import profiler, rows

    prof = profiler(tmp_path, steps="[1,2,3]")
    with caplog.at_level(logging.WARNING, logger="rlprof"), prof:
        for n in (1, 2, 3):
            with prof.step(n), prof.stage("actor_update"):
                sum(i * i for i in range(20000))
                if n == 2:
                    prof.wait_written()
                    shutil.rmtree(prof.run_dir())  # a cleanup job removes the run directory mid-run
    said = [r.getMessage() for r in caplog.records if "step2_actor_e2e_rank0" in r.getMessage()]
    assert len(said) == 1 and "FileNotFoundError" in said[0] and "training goes on" in said[0], said
    listed = rows(prof.run_dir())
    assert [(r["step"], r["status"]) for r in listed] == [(3, "complete")]  # the directory made again for step 3
    assert whole_trace(prof.run_dir() / listed[0]["path"])


def test_an_io_error_on_the_manifest_keeps_the_trace_for_analyze_to_recover(tmp_path, monkeypatch, caplog):
    import errno
    import logging

    import rlprof.collect.window as window
    from helpers import run
    from rlprof.analyze.pipeline import analyze

    append_row = window.append_row

    def eio_for_step_2(run_dir, row):  # the disk fails under step 2's row (and under its failed row)
        if row["step"] == 2:
            raise OSError(errno.EIO, "Input/output error")
        append_row(run_dir, row)

    monkeypatch.setattr(window, "append_row", eio_for_step_2)
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        d = run(tmp_path, steps="[1,2,3]")
    said = [r.getMessage() for r in caplog.records if "manifest row" in r.getMessage()]
    assert len(said) == 1 and "step2_actor_e2e_rank0" in said[0] and "Input/output error" in said[0], said
    assert "rlprof analyze` recovers it" in said[0]
    assert [r["step"] for r in read_manifest(d / "manifest.jsonl")[0]] == [1, 3]
    doc = analyze(d, workers=1)
    assert [(s["step"], s["fate"]) for s in doc["salvage"]] == [(2, "recovered")]
    assert {r["step"] for r in doc["rows"]} == {1, 2, 3}
