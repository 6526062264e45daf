"""The rollout, sample by sample, analysed: the document's `samples` table on the trace's clock joined to the step's
decode steps and metrics, each step's distribution and tail, and a slow rollout explained by its samples: the
trigger's verdict and the run over time name the long sample, the decode steps it ran alone and the long-tail cause
with its lever; a control run with every sample alike names none."""

import csv
import json
from pathlib import Path

import pytest

from conftest import run_cli
from helpers import timeline_said, unjudged_steps
from rlprof.analyze.pipeline import analyze

A = "actor_rollout_ref.actor.profiler"
T = "global_profiler.trigger"


def train(tmp_path: Path, *overrides: str) -> Path:
    proc = run_cli(
        "train",
        f"trainer.output_dir={tmp_path}/train",
        "global_profiler.tool=torch",
        f"global_profiler.save_path={tmp_path}/p",
        *overrides,
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (run,) = [p for p in (tmp_path / "p").iterdir() if p.is_dir()]
    return run


def test_the_samples_of_a_profiled_step_join_its_metrics_and_its_decode_steps(tmp_path):
    """The issue's acceptance: step 2's 64 samples; their mean response tokens are the step's response_length in
    metrics.jsonl; the longest sample's decode steps are the decode steps the rollout ran (its trace's ranges), and
    the samples lie inside the rollout's window on the trace's clock."""
    run = train(
        tmp_path,
        "trainer.steps=4",
        "rollout.max_new_tokens=12",
        "global_profiler.steps=[2]",
        "actor_rollout_ref.rollout.profiler.enable=true",
    )
    doc = analyze(run, workers=1)
    samples = [s for s in doc["samples"] if s["step"] == 2]
    assert len(samples) == 64 and {s["sample"] for s in samples} == set(range(64))
    metrics = {m["step"]: m for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    mean = sum(s["response_tokens"] for s in samples) / 64
    assert mean == pytest.approx(metrics[2]["response_length"], rel=1e-6)
    decode = [r for r in doc["rows"] if r["unit"] == "decode_step" and r["step"] == 2]
    longest = max(samples, key=lambda s: s["response_tokens"])
    assert longest["last_decode_step"] + 1 == longest["response_tokens"] == len(decode)
    (rollout,) = [r for r in doc["rows"] if r["unit"] is None and r["stage"] == "rollout_generate" and r["step"] == 2]
    lo, hi = rollout["start_us"], rollout["start_us"] + rollout["wall_ms"] * 1e3
    assert all(lo - 1e3 <= s["start_us"] <= s["end_us"] <= hi + 1e3 for s in samples)  # the same clock, within 1 ms
    # the longest sample ends with the last decode step, on the trace's clock
    last = max(decode, key=lambda r: r["index"])
    assert longest["end_us"] == pytest.approx(last["start_us"] + last["wall_ms"] * 1e3, abs=2e3)
    (step,) = [s for s in doc["sample_steps"] if s["step"] == 2]
    assert step["samples"] == 64 and step["response_tokens"]["max"] == longest["response_tokens"]
    assert step["slowest"][0]["response_tokens"] == longest["response_tokens"]
    out = tmp_path / "out"
    assert run_cli("analyze", run, "-o", out, "--workers", "1").returncode == 0
    with open(out / "samples.csv") as f:
        assert len(list(csv.DictReader(f))) == len(doc["samples"])


def _long_sample_run(tmp_path: Path, long: bool, profiled: int | None = None) -> Path:
    """16 steps of 4 samples, each exactly 4 tokens (ignore_eos); with `long`, sample 1 generates 24 from step 10 on:
    its batch then decodes 20 steps for it alone. The watch and the slow trigger on, the step captured end to end;
    or, with `profiled`, that step profiled end to end (and the run ends there)."""
    return train(
        tmp_path,
        f"trainer.steps={profiled or 16}",
        *([f"global_profiler.steps=[{profiled}]"] if profiled else [f"{T}.slow.factor=2.0"]),
        f"{A}.enable=true",
        "data.prompts_per_step=2",
        "rollout.n=2",
        "actor.mini_batch_size=2",
        "actor.micro_batch_size=2",
        "rollout.max_new_tokens=4",
        "rollout.ignore_eos=true",
        *(
            [
                "trainer.debug.long_sample.from_step=10",
                "trainer.debug.long_sample.sample=1",
                "trainer.debug.long_sample.tokens=24",
            ]
            if long
            else []
        ),
    )


@pytest.mark.slow
@pytest.mark.timing
def test_a_long_sample_is_named_by_the_captured_windows_verdict_and_the_run_over_time(tmp_path):
    run = _long_sample_run(tmp_path, long=True)
    doc = analyze(run, workers=1)
    timeline = doc["timeline"]
    # busy steps are judged: left out of the levels are only the captured and profiled ones and those contention
    # slowed (the live trigger's, and the run over time's own contention records)
    contended = {s for c in timeline["contention"] if set(c["stages"]) & {"rollout_generate"} for s in c["steps"]}
    unjudged = unjudged_steps(run) | set(timeline["captured_steps"]) | contended
    judged = [s for s in range(10, 17) if s not in unjudged]
    seen = f"judged from step 10: {judged}; timeline:\n{timeline_said(run)}\nlevel shifts {timeline['level_shifts']}"
    assert len(judged) >= 3, seen  # a capture (and its neighbour) and at most a contended step or two are left out
    # the run over time: rollout_generate went to a new level at the first judged step from 10 on, explained by the
    # long sample's tokens, the long-tail cause with its lever named
    shifts = [s for s in timeline["level_shifts"] if s["stage"] == "rollout_generate"]
    assert len(shifts) == 1 and shifts[0]["from_step"] == judged[0], seen
    shift = shifts[0]
    why = shift["why"]
    assert why["explained_by"] == "response_tokens" and why["longest_tokens"] == 24 and why["cause"] == "rollout_tail"
    assert why["slowest"][0]["sample"] == 1 and why["slowest"][0]["response_tokens"] == 24
    assert "rollout.max_new_tokens" in [lv["key"] for lv in why["levers"]["rlprof"]]
    # the trigger captured the step after the first slow one; its verdict names the sample and where it ran alone
    captured = [b for b in timeline["beside"] if b["step"] >= 10]
    assert captured, seen  # busy steps are judged: the first slow one is captured
    said = captured[0]["samples"]
    assert said["slowest"][0]["sample"] == 1 and said["alone"]["sample"] == 1, (said, seen)
    assert said["alone"]["decode_steps"] == [4, 23] and said["alone"]["kept"] == [4, 23]
    verdict = captured[0]["cause"]
    assert "rollout_tail" in [c["cause"] for c in verdict["causes"] + verdict["in_both"]]
    assert "sample 1" in verdict["text"] and "decode steps 4-23 ran for sample 1 alone" in verdict["text"]
    printed = run_cli("analyze", run, "--workers", "1").stdout
    assert "rollout_generate went from" in printed and "sample 1 of rank 0" in printed


@pytest.mark.slow
@pytest.mark.timing
def test_a_control_run_with_every_sample_alike_names_no_sample(tmp_path):
    run = _long_sample_run(tmp_path, long=False)
    doc = analyze(run, workers=1)
    timeline = doc["timeline"]
    seen = f"timeline:\n{timeline_said(run)}\nlevels {timeline['level_shifts']}\nspikes {timeline['spikes']}"
    assert {s["response_tokens"] for s in doc["samples"]} == {4}  # every sample alike
    assert not [s for s in timeline["level_shifts"] if s["stage"] == "rollout_generate"], seen
    for entry in timeline["spikes"] + timeline["drift"]:  # a busy machine's spike is not the workload's
        assert entry.get("why", {}).get("explained_by") != "response_tokens", seen
    for record in timeline.get("beside", []):
        assert "alone" not in record.get("samples", {})
    assert not [f for f in doc["findings"] if f["kind"] == "rollout_tail"]


@pytest.mark.slow
def test_the_report_and_a_slice_show_the_samples_beside_the_trace(tmp_path):
    """The report draws one lane per sample of the profiled step, the long one in red; a slice of the decode steps it
    ran alone holds its track and no other sample's, on the trace's clock, inside the slice."""
    from rlprof.report.samples import HIGHLIGHT, sample_lanes

    run = _long_sample_run(tmp_path, long=True, profiled=11)
    doc = analyze(run, workers=1)
    step = 11
    figure = sample_lanes(doc)
    (bars,) = figure["data"]
    colors = dict(zip(bars["y"], bars["marker"]["color"]))
    assert colors["rank 0 · sample 1"] == HIGHLIGHT and list(colors.values()).count(HIGHLIGHT) == 1
    assert f"Step {step}" in figure["layout"]["title"]["text"] and figure["layout"]["shapes"]  # the decode window
    out = tmp_path / "slice.json"
    proc = run_cli(
        "slice",
        run,
        "--step",
        step,
        "--role",
        "rollout",
        "--stage",
        "rollout_generate",
        "--decode-steps",
        "4:24",
        "-o",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    trace = json.loads(out.read_text())
    tracks = [e for e in trace["traceEvents"] if e.get("cat") == "rlprof_sample" and e["name"].startswith("sample")]
    assert [e["name"] for e in tracks] == ["sample 1 (24 tokens)"] and trace["rlprof"]["slice"]["sample_tracks"] == 1
    lo, hi = trace["rlprof"]["slice"]["start_us"], trace["rlprof"]["slice"]["end_us"]
    assert tracks[0]["ts"] <= lo and tracks[0]["ts"] + tracks[0]["dur"] >= hi - 2e3  # it runs through the slice
    page = run_cli("report", run, "-o", tmp_path / "report.html")
    assert page.returncode == 0 and "The rollout, sample by sample" in (tmp_path / "report.html").read_text()
