"""The rollout, sample by sample, analysed: the document's `samples` table on the trace's clock joined to the step's
decode steps and metrics, each step's distribution and tail, and a slow rollout explained by its samples: the
trigger's verdict and the run over time name the long sample, the decode steps it ran alone and the long-tail cause
with its lever; a control run with every sample alike names none; a one-off spike said step by step (the spike's own
samples, then the ordinary step the trigger captured); and the report's lanes, each sample cut into the phases its
host records, read back from the chart Chromium drew."""

import csv
import json
from pathlib import Path

import pytest

from conftest import drawn, open_page, run_cli
from data_inputs import DATA
from helpers import timeline_said, trigger_steps, unjudged_steps
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


def _long_sample_run(tmp_path: Path, long: bool, profiled: int | None = None, once: bool = False) -> Path:
    """16 steps of 4 samples, each exactly 4 tokens (ignore_eos); with `long`, sample 1 generates 24 from step 10 on
    (`once`: at step 10 alone): its batch then decodes 20 steps for it alone. The watch and the slow trigger on, the
    step captured end to end; or, with `profiled`, that step profiled end to end (and the run ends there)."""
    return train(
        tmp_path,
        f"trainer.steps={profiled or (12 if once else 16)}",
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
                *(["trainer.debug.long_sample.to_step=10"] if once else []),
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
    assert shifts and shifts[0]["from_step"] == judged[0], seen
    # and no other, but where the host got busier: a core kept busy beside the run slows even its time on a core
    # (once 39 -> 67 ms from step 14, its wait for a core explaining less than half)
    assert all(s["from_step"] in timeline["busy_steps"] for s in shifts[1:]), seen
    shift = shifts[0]
    why = shift["why"]
    busy = set(timeline["busy_steps"])
    assert why["longest_tokens"] == 24 and why["workload_ratio"] == 6.0, (why, seen)
    # the workload explains the new level, unless the host was busy at most of its steps: a core busy beside the run
    # slows the run's own time on a core too (a quiet 24-token rollout took 36 ms on a core, a busy one 60), which no
    # wait for a core says, and then the samples say each token took longer
    if sum(s in busy for s in why["steps"]) <= len(why["steps"]) / 2:
        assert why["explained_by"] == "response_tokens" and why["cause"] == "rollout_tail", (why, seen)
        assert "rollout.max_new_tokens" in [lv["key"] for lv in why["levers"]["rlprof"]]
    assert why["slowest"][0]["sample"] == 1 and why["slowest"][0]["response_tokens"] == 24
    # the trigger captured the step after the first slow one; its verdict names the sample and where it ran alone
    captured = [b for b in timeline["beside"] if b["step"] >= 10]
    assert captured, seen  # busy steps are judged: the first slow one is captured
    said = captured[0]["samples"]
    assert said["slowest"][0]["sample"] == 1 and said["alone"]["sample"] == 1, (said, seen)
    assert said["alone"]["decode_steps"] == [4, 23] and said["alone"]["kept"] == [4, 23]
    verdict = captured[0]["cause"]
    assert "rollout_tail" in [c["cause"] for c in verdict["causes"] + verdict["in_both"]]
    printed = run_cli("analyze", run, "--workers", "1").stdout
    assert "rollout_generate went from" in printed and "sample 1 of rank 0" in printed
    # the captured step's own samples, said as that step's
    (said_line,) = [line for line in printed.splitlines() if line.strip().startswith(f"step {said['step']}: captured")]
    assert "decode steps 4-23 ran for sample 1 alone" in said_line and f"step {said['step']}'s 4 samples" in said_line
    repeat = captured[0]["repeat"]
    if repeat["spike_step"] != said["step"]:  # the spike went on: the captured step repeated its workload
        spike_why = said["spike"]["why"]
        if spike_why["explained_by"] == "response_tokens":
            assert repeat["repeated"] is True and "the spike repeated" in said_line, (repeat, spike_why, seen)
        else:  # a busy host's spike (above): with no normal window to judge it on, the repeat is not guessed
            assert repeat["spike_step"] in busy and repeat["repeated"] is None, (repeat, spike_why, seen)
            assert "whether the spike repeated cannot be told" in said_line, (said_line, seen)


def _rollout_run_over_time(
    waits: list[float | None], spans: list[float], tokens: list[int], prompt: int | None = None
) -> tuple[dict, list]:
    """The run over time's rollout level shift at step 4 of 6 and each step's samples, as analyze_timeline and
    step_summaries give them; `waits`: the stage's wait for a core per step (None: the watch did not say); `prompt`:
    the samples' prompt length (None: not said)."""
    steps = list(range(1, 7))
    stage_s = [(span + 2.0) / 1e3 for span in spans]  # the stage holds the span and 2 ms around it
    series = {"max": stage_s, "median": stage_s}
    if any(w is not None for w in waits):
        series["wait_ms"] = waits
    timeline = {
        "steps": steps,
        "per_step": {"rollout_generate": series},
        "spikes": [],
        "drift": [],
        "level_shifts": [{"stage": "rollout_generate", "from_step": 4}],
    }
    sample_steps = [
        {
            "step": s,
            "span_ms": span,
            "tail_share": 0.8,
            "response_tokens": {"max": n},
            "slowest": [{"sample": 1, "rank": 0, "response_tokens": n, "duration_ms": span}],
            **({"prompt_tokens": {"max": prompt}} if prompt is not None else {}),
        }
        for s, span, n in zip(steps, spans, tokens)
    ]
    return timeline, sample_steps


def test_a_longer_samples_dearer_tokens_are_its_workload_as_far_as_its_context_grew():
    """24 tokens against 4 after a 5-token prompt, 8.5x the time with no wait (each token 1.42x dearer): a decode step
    reads every cached token, and the longest sample's mean context grew 2.43x (7 -> 17), so the workload explains
    it; after a 500-token prompt the context barely grew (1.02x) and the token rate is said; with no prompt said, the
    rule is the proportion alone."""
    from rlprof.analyze.over_time.rollout_why import explain_rollout

    spans, tokens = [10.0] * 3 + [85.0] * 3, [4] * 3 + [24] * 3
    for prompt, said in ((5, "response_tokens"), (500, "time_per_token"), (None, "time_per_token")):
        timeline, sample_steps = _rollout_run_over_time([0.0] * 6, spans, tokens, prompt)
        explain_rollout(timeline, sample_steps)
        why = timeline["level_shifts"][0]["why"]
        assert why["seconds_ratio"] == pytest.approx(8.5) and why["explained_by"] == said, (prompt, why)
        if prompt is not None:
            assert (why["context_tokens"], why["baseline_context_tokens"]) == (prompt + 12, prompt + 2)
        else:
            assert "context_tokens" not in why


def test_a_rollout_that_waited_for_a_core_is_judged_on_its_time_on_one():
    """Six times the tokens and ten times the span, four tenths of it a wait for a core on a busy host: the wait is the
    host's, so the workload explains the rest (a long-tail rollout, its lever named); the same span with no wait
    said is a slower token rate, and with no wait at all the same growth stays unexplained."""
    from rlprof.analyze.diagnosis.sentences import why_sentence
    from rlprof.analyze.over_time.rollout_why import explain_rollout

    spans, tokens = [10.0] * 3 + [100.0] * 3, [4] * 3 + [24] * 3
    timeline, sample_steps = _rollout_run_over_time([0.0] * 3 + [40.0] * 3, spans, tokens)
    explain_rollout(timeline, sample_steps)
    why = timeline["level_shifts"][0]["why"]
    # of the 40 ms, at least 38 fell inside the span (the stage's other 2 ms could hold the rest)
    assert (why["wait_ms"], why["baseline_wait_ms"]) == (38.0, 0.0)
    assert why["seconds_ratio"] == pytest.approx(6.2) and why["workload_ratio"] == 6.0
    assert why["explained_by"] == "response_tokens" and why["cause"] == "rollout_tail"
    assert why["ms_per_token"] == pytest.approx(62 / 24) and why["baseline_ms_per_token"] == pytest.approx(2.5)
    assert "less its waits for a core (38 ms against 0)" in why_sentence(why)
    for unsaid in ([None] * 6, [0.0] * 6):  # not known, or no wait: the span itself grew 10x for 6x the tokens
        timeline, sample_steps = _rollout_run_over_time(unsaid, spans, tokens)
        explain_rollout(timeline, sample_steps)
        why = timeline["level_shifts"][0]["why"]
        assert why["seconds_ratio"] == pytest.approx(10.0) and why["explained_by"] == "time_per_token"
        assert "waits for a core" not in why_sentence(why)
    # a wait past the stage's time around the span: all but those 2 ms of it fell inside
    timeline, sample_steps = _rollout_run_over_time([0.0] * 3 + [71.0] * 3, spans, tokens)
    explain_rollout(timeline, sample_steps)
    assert timeline["level_shifts"][0]["why"]["wait_ms"] == pytest.approx(69.0)


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
    """The report draws one lane per sample of the profiled step, the long one outlined as the slowest, the decode
    window shaded; a slice of the decode steps it ran alone holds its track and no other sample's, on the trace's
    clock, inside the slice, cut into its prefill and decode as the lanes cut it."""
    from rlprof.report.samples import sample_figures

    run = _long_sample_run(tmp_path, long=True, profiled=11)
    doc = analyze(run, workers=1)
    step = 11
    ((figure, note),) = sample_figures(doc)
    slowest = [t for t in figure["data"] if t["name"].startswith("slowest")]
    assert [t["y"] for t in slowest] == [["rank 0 · sample 1"]]
    assert f"Step {step}" in figure["layout"]["title"]["text"] and figure["layout"]["shapes"]  # the decode window
    assert "shaded: the decode window kept (decode steps 0-23)" in note
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
    phases = sorted(
        (e for e in trace["traceEvents"] if e.get("cat") == "rlprof_sample" and e["name"] in ("prefill", "decode")),
        key=lambda e: e["ts"],
    )
    assert [e["name"] for e in phases] == ["prefill", "decode"]  # the sample's life cut as the lanes cut it
    assert phases[0]["ts"] == pytest.approx(tracks[0]["ts"]) and phases[1]["ts"] + phases[1]["dur"] == pytest.approx(
        tracks[0]["ts"] + tracks[0]["dur"], abs=2
    )
    page = run_cli("report", run, "-o", tmp_path / "report.html")
    assert page.returncode == 0 and "The rollout, sample by sample" in (tmp_path / "report.html").read_text()


def lane_segments(figure: dict) -> dict[tuple[str, str], tuple[float, float]]:
    """A drawn lanes chart's bars: (trace name, lane) -> (start, length) in ms from the step's first arrival."""
    return {
        (t["name"], lane): (base, length)
        for t in figure["traces"]
        if t["type"] == "bar"
        for lane, base, length in zip(t["y"], t["base"], t["x"])
    }


def test_the_trainers_lanes_cut_each_sample_into_the_phases_it_records(browser, tmp_path):
    """rlprof's trainer (tests/data/samples/long_sample, recorded by it): the report shows step 8, where the run
    over time saw rollout_generate go to its new level (a busy step, judged: the samples say the longer response), and the profiled step 12 whose window kept its decode steps
    (shaded), each titled with why; in Chromium each lane is its sample's prefill from its start, then its decode
    to its end, as long as the sample recorded them, and its reward after (its length: the trainer scores the batch
    later); sample 1 (24 tokens against 4) outlined as the slowest; the queue and tools said to be unrecorded."""
    from rlprof.report.page import build_page

    doc = analyze(DATA / "samples" / "long_sample", workers=1)
    out = tmp_path / "report.html"
    out.write_text(build_page(doc, "long_sample"))
    page, seen = open_page(browser, out)
    charts = [drawn(page, "chart-samples"), drawn(page, "chart-samples-1")]
    assert charts[0]["title"].startswith("Step 8: rollout_generate went to a new level at this step")
    assert charts[1]["title"].startswith("Step 12: the profiled step whose rollout lasted longest")
    assert (charts[0]["shapes"], charts[1]["shapes"]) == (0, 1)  # only step 12's decode steps were kept
    notes = page.locator("#samples p.note").all_inner_texts()
    said = "rlprof's trainer does not record tool calls; rlprof's trainer's records here hold no queue"
    assert len(notes) == 2 and all(said in n for n in notes)
    for step, chart in zip((8, 12), charts):
        mine = [s for s in doc["samples"] if s["step"] == step]
        t0 = min(s["start_us"] for s in mine)
        bars = lane_segments(chart)
        names = {t["name"] for t in chart["traces"]}
        assert {"prefill", "decode", "reward (after the batch: its length, not its place)"} <= names
        assert not [n for n in names if n.startswith(("queued", "untimed", "tool"))]  # none recorded, none drawn
        for s in mine:
            lane = f"rank 0 · sample {s['sample']}"
            (pb, pl), (db, dl) = bars[("prefill", lane)], bars[("decode", lane)]
            rb, rl = bars[("reward (after the batch: its length, not its place)", lane)]
            assert pb == pytest.approx((s["start_us"] - t0) / 1e3, abs=1e-6)
            # as recorded, within the records' rounding (whole microseconds at start and end)
            assert (pl, dl, rl) == pytest.approx((s["prefill_ms"], s["decode_ms"], s["reward_ms"]), abs=2e-3)
            assert db == pytest.approx(pb + pl, abs=1e-6) and rb == pytest.approx((s["end_us"] - t0) / 1e3, abs=2e-3)
        slowest = [t for t in chart["traces"] if t["name"].startswith("slowest")]
        assert [t["y"] for t in slowest] == [["rank 0 · sample 1"]]
        assert sum(chart["bars"]) == sum(len(t["x"]) for t in chart["traces"] if t["type"] == "bar")  # all drawn
    assert seen["errors"] == []
    page.close()


@pytest.mark.slow
def test_a_one_off_rollout_spike_is_said_step_by_step_and_the_captured_step_ordinary(tmp_path, browser):
    """Sample 1 generates 24 tokens at step 10 alone (4 otherwise): the trigger sees the rollout slow there and
    captures step 11, an ordinary step. The capture is said step by step: step 10, the spike, with its own samples
    (sample 1's 24 tokens, the decode steps it ran alone) and why (its workload); then step 11, captured, said to be
    ordinary (the spike did not repeat: its longest sample's tokens as the baseline's) with its own samples, which
    no sentence mixes with step 10's; in the terminal and in the report, whose lanes show step 10 then step 11,
    each titled with why."""
    run = _long_sample_run(tmp_path, long=True, once=True)
    judged = trigger_steps(10, unjudged_steps(run), 10)  # a one-off: only step 10 itself can be seen slow
    doc = analyze(run, workers=1)
    beside = [b for b in doc["timeline"].get("beside", []) if (b.get("repeat") or {}).get("spike_step") == 10]
    assert bool(beside) == bool(judged), (judged, doc["timeline"]["captures"])
    if not judged:
        pytest.skip(f"the machine was busy at step 10 or before it ({sorted(unjudged_steps(run))}): nothing judged")
    (b,) = beside
    assert b["step"] == 11 and b["repeat"]["captured_step"] == 11
    spike, said = b["samples"]["spike"], b["samples"]
    assert spike["step"] == 10 and spike["slowest"][0]["sample"] == 1 and spike["slowest"][0]["response_tokens"] == 24
    assert (
        spike["alone"]["sample"] == 1 and spike["alone"]["decode_steps"] == [4, 23] and spike["alone"]["kept"] is None
    )
    assert spike["why"]["explained_by"] == "response_tokens" and spike["why"]["longest_tokens"] == 24
    assert said["step"] == 11 and "alone" not in said and {x["response_tokens"] for x in said["slowest"]} == {4}
    assert b["repeat"]["repeated"] is False and b["repeat"]["basis"] == "workload"
    assert (b["repeat"]["spike_ratio"], b["repeat"]["captured_ratio"]) == (6.0, 1.0)  # 24 / 4 tokens; 4 / 4
    printed = run_cli("analyze", run, "--workers", "1").stdout.splitlines()
    (step10,) = [line for line in printed if line.strip().startswith("step 10: the slow step the trigger saw")]
    (step11,) = [line for line in printed if line.strip().startswith("step 11: captured")]
    assert "24 tokens against 4" in step10 and "decode steps 4-23 ran for sample 1 alone" in step10
    assert (
        "an ordinary step: the spike of step 10 did not repeat" in step11
        and "the spike's own samples are step 10's" in step11
    )
    assert "24 tokens" not in step11 and "step 11's 4 samples" in step11  # its own samples, not the spike's
    out = tmp_path / "report.html"
    assert run_cli("report", run, "-o", out).returncode == 0
    page, seen = open_page(browser, out)
    titles = [drawn(page, "chart-samples")["title"], drawn(page, "chart-samples-1")["title"]]
    assert titles[0].startswith("Step 10: the spike the trigger saw: rollout_generate")
    assert titles[1].startswith("Step 11: the captured step: ordinary, the spike did not repeat")
    said_there = page.locator("#over_time li").all_inner_texts()
    assert any(t.startswith("step 10: the slow step the trigger saw") for t in said_there)
    assert any(t.startswith("step 11: captured") and "did not repeat" in t for t in said_there)
    assert seen["errors"] == []
    page.close()
