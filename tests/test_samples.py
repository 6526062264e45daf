"""The rollout, sample by sample, as the hosts record it (issue 48's collection side): rlprof's trainer writes one
record per generated sequence for each step the watch or a window is on (collect/samples.py, trainer/sample_records.py),
in the layout analyze/inputs/samples_file.py reads. The records are checked against what the same run wrote elsewhere: the
step's `response_length` in metrics.jsonl, the `rlprof:decode_step` ranges of the step's trace, the rollout window's
span in the manifest."""

from __future__ import annotations

import csv
import gzip
import json
import logging
from pathlib import Path

import pytest
import torch

from conftest import fill, run_cli
from helpers import A, R, profiler

from rlprof.analyze.inputs.samples_file import FIELDS, REQUIRED, SAMPLES_DIR, read_samples, sample_files, samples_path
from rlprof.collect.samples import SampleWriter

T = "global_profiler.trigger"


def train(tmp_path: Path, *overrides: str, steps: int = 4, timeout: int = 300):
    proc = run_cli(
        "train",
        f"trainer.steps={steps}",
        f"trainer.output_dir={tmp_path}/train",
        f"global_profiler.save_path={tmp_path}/profile",
        *overrides,
        cwd=tmp_path,
        timeout=timeout,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def only_run(path: Path) -> Path:
    (run,) = [p for p in path.iterdir() if p.is_dir()]
    return run


def metrics(tmp_path: Path) -> dict[int, dict]:
    lines = (only_run(tmp_path / "train") / "metrics.jsonl").read_text().splitlines()
    return {m["step"]: m for m in map(json.loads, lines)}


def decode_step_ranges(trace: Path) -> list[dict]:
    """The trace's `rlprof:decode_step:K|active=..` ranges, in order, as {index, active, seqs}."""
    events = json.load(gzip.open(trace))["traceEvents"]
    out = []
    for e in events:
        if e.get("ph") == "X" and e["name"].startswith("rlprof:decode_step:"):
            head, _, tail = e["name"].partition("|")
            args = {k: int(v) for k, v in (p.split("=") for p in tail.split(","))}
            out.append({"index": int(head.rsplit(":", 1)[1]), "ts": e["ts"], **args})
    return sorted(out, key=lambda u: u["ts"])


def check_layout(records: list[dict]) -> None:
    """Every record holds the required fields, only fields the layout names, each of its type, and no null."""
    for r in records:
        assert set(REQUIRED) <= set(r) and set(r) <= set(FIELDS), sorted(set(r) - set(FIELDS))
        for k, v in r.items():
            want = FIELDS[k][0]
            assert v is not None and (isinstance(v, want) or (want is float and isinstance(v, int))), (k, v)


# ---- the trainer's acceptance ------------------------------------------------------------------------------------
def test_a_profiled_steps_64_samples_match_its_response_length_and_its_decode_steps(tmp_path):
    """`rlprof train trainer.steps=4 rollout.max_new_tokens=12 global_profiler.tool=torch global_profiler.steps=[2]
    actor_rollout_ref.rollout.profiler.enable=true`: step 2's 8 prompts x 8 samples, their mean response tokens the
    step's response_length, the longest sample's decode steps those the rollout ran (the rlprof:decode_step ranges of
    step 2's trace), and at each decode step the samples still running the range's `active`."""
    train(
        tmp_path,
        "rollout.max_new_tokens=12",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"{R}.enable=true",
    )
    run = only_run(tmp_path / "profile")
    records = read_samples(run)
    check_layout(records)
    assert sample_files(run) == [samples_path(run, "rlprof", rank=0)]
    assert {r["step"] for r in records} == {2} and sorted(r["sample"] for r in records) == list(range(64))
    assert all(r["source"] == "rlprof" and r["rank"] == 0 and r["turns"] == 1 for r in records)
    mean = sum(r["response_tokens"] for r in records) / len(records)
    assert mean == pytest.approx(metrics(tmp_path)[2]["response_length"], abs=1e-9)
    (row,) = [r for r in map(json.loads, (run / "manifest.jsonl").read_text().splitlines()) if r["role"] == "rollout"]
    units = decode_step_ranges(run / row["path"])
    assert [u["index"] for u in units] == list(range(len(units)))
    longest = max(records, key=lambda r: r["response_tokens"])
    assert longest["last_decode_step"] - longest["first_decode_step"] + 1 == len(units) == longest["response_tokens"]
    for u in units:
        assert u["active"] == sum(r["first_decode_step"] <= u["index"] <= r["last_decode_step"] for r in records)
    # on the manifest's clock: every sample inside the rollout window's span
    for r in records:
        assert row["start_ns"] // 1000 <= r["start_us"] <= r["end_us"] <= row["end_ns"] // 1000
        assert r["prefill_ms"] > 0 and r["decode_ms"] >= 0 and r["reward_ms"] >= 0
        assert r["response_tokens"] == r["last_decode_step"] + 1 and 1 <= r["prompt_tokens"]
    # the longest sample ends last; a one-token sample's decode is empty
    assert max(r["end_us"] for r in records) == longest["end_us"]
    assert all(r["decode_ms"] == 0 for r in records if r["response_tokens"] == 1)


def test_no_window_and_no_watch_records_no_sample_and_makes_no_file(tmp_path):
    """A plan whose windows fall on step 3 only: steps 1 and 2 are bare (no record), and without any window or watch
    the run makes no samples file at all."""
    train(tmp_path, "global_profiler.tool=torch", "global_profiler.steps=[3]", f"{R}.enable=true", steps=3)
    assert {r["step"] for r in read_samples(only_run(tmp_path / "profile"))} == {3}
    bare = tmp_path / "bare"
    bare.mkdir()
    train(bare, steps=2)
    assert not (bare / "profile").exists()  # no window, no watch: nothing on the profile's side at all
    assert not [p for p in bare.rglob("*") if p.name == SAMPLES_DIR] and metrics(bare)[2]


def test_the_watch_records_every_step_and_the_long_sample_aid_makes_one_sample_long(tmp_path):
    """With the watch on (a trigger, no step listed) every step's samples are recorded; trainer.debug.long_sample
    makes sample 5 of steps 2-3 run to max_new_tokens without EOS while the step's others stop where they would."""
    train(
        tmp_path,
        "global_profiler.tool=torch",
        "global_profiler.steps=null",
        f"{R}.enable=true",
        f"+{T}.slow.factor=100",
        "rollout.max_new_tokens=16",
        "trainer.debug.long_sample.from_step=2",
        "trainer.debug.long_sample.to_step=3",
        "trainer.debug.long_sample.sample=5",
        steps=4,
    )
    records = read_samples(only_run(tmp_path / "profile"))
    by_step = {s: {r["sample"]: r for r in records if r["step"] == s} for s in (1, 2, 3, 4)}
    assert all(sorted(samples) == list(range(64)) for samples in by_step.values())
    for step in (2, 3):
        long = by_step[step][5]
        assert long["response_tokens"] == 16 and long["last_decode_step"] == 15
        assert long["end_us"] == max(r["end_us"] for r in by_step[step].values())


def test_a_held_row_never_samples_eos_while_the_others_stop_at_once():
    """generate(hold_eos=[row]): a model that puts nearly all its mass on EOS stops every row at its first token but
    the held one, which generates max_new_tokens tokens, none of them EOS; the clock has one entry per decode step."""
    from rlprof.trainer.config import ModelConfig
    from rlprof.trainer.model import build_model
    from rlprof.trainer.rollout import generate

    vocab, eos, pad = 16, 2, 0
    model = build_model(ModelConfig(), vocab, seed=0).eval()
    with torch.no_grad():
        model.lm_head.weight.zero_()
        head_bias = torch.zeros(vocab)
        head_bias[eos] = 50.0
        model.lm_head.bias = torch.nn.Parameter(head_bias)
    ids = torch.randint(3, vocab, (4, 5))
    clock: list = []
    out = generate(
        model,
        ids,
        torch.ones_like(ids),
        max_new_tokens=7,
        eos_id=eos,
        pad_id=pad,
        hold_eos=[2],
        clock=clock,
        generator=torch.Generator().manual_seed(0),
    )
    lengths = out.response_mask.sum(1).tolist()
    assert lengths == [1, 1, 7, 1]
    assert eos not in out.response_ids[2].tolist() and out.response_ids[[0, 1, 3], 0].tolist() == [eos] * 3
    assert len(clock) == 2 + 7 and clock[2:] == sorted(clock[2:])


def test_a_steps_refill_passes_continue_its_sample_numbers_and_the_long_sample_may_fall_in_one():
    """DAPO's refills: a step's second generation pass numbers its samples after the first's (rollout_pass 1), the
    long-sample aid finds its sample in whichever pass holds it, and each pass's clock gives its own decode steps."""
    import tempfile

    from rlprof.trainer.config import DebugConfig, LongSample, TrainConfig, TrainerSection
    from rlprof.trainer.rollout import Rollout
    from rlprof.trainer.sample_records import TrainerSamples

    cfg = TrainConfig(trainer=TrainerSection(debug=DebugConfig(long_sample=LongSample(from_step=3, sample=5))))
    with tempfile.TemporaryDirectory() as tmp:
        prof = profiler(Path(tmp), steps="[3]")
        samples = TrainerSamples(prof, cfg, rank=0)
        with prof:
            with prof.step(3):
                holds = []
                for rows, lengths in ((4, [1, 2, 3, 3]), (4, [2, 2, 1, 1])):
                    rollout_pass, first, hold = samples.begin_pass(3, rows)
                    holds.append(hold)
                    mask = torch.tensor([[1] * n + [0] * (3 - n) for n in lengths])
                    rollout = Rollout(torch.ones(rows, 2, dtype=torch.long), torch.ones(rows, 2), mask, mask)
                    clock = [1_000_000_000_000, 0, *[(k + 1) * 1_000_000 for k in range(max(lengths))]]
                    samples.end_pass(3, rollout_pass, first, rollout, clock, [500_000] * rows)
        samples.close()
        records = read_samples(prof.run_dir())
    check_layout(records)
    assert holds == [None, [1]]  # sample 5 is row 1 of the second pass
    assert [(r["sample"], r["rollout_pass"], r["last_decode_step"]) for r in records] == [
        (0, 0, 0),
        (1, 0, 1),
        (2, 0, 2),
        (3, 0, 2),
        (4, 1, 1),
        (5, 1, 1),
        (6, 1, 0),
        (7, 1, 0),
    ]
    assert [r["end_us"] - r["start_us"] for r in records[:4]] == [1000, 2000, 3000, 3000]
    assert all(r["reward_ms"] == 0.5 and r["prefill_ms"] == 1.0 for r in records)


@pytest.mark.slow
def test_async_replicas_samples_name_their_replica_its_queue_and_its_decode_steps(tmp_path):
    """rollout.mode=async, 2 replicas (Ray actors): step 2's 64 samples, half from each replica, each with the time it
    waited from the driver's submission to its replica's start; each replica's longest sample as long as the decode
    steps in that replica's own trace; the driver's reward time added. The driver's step profiled end to end too:
    its rollout_generate row (its wait for the replicas) and each replica's are told apart by who wrote them, in the
    terminal, the CSV and the report."""
    proc = train(
        tmp_path,
        "rollout.mode=async",
        "rollout.replicas=2",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"{R}.enable=true",
        f"{R}.all_ranks=true",
        f"{R}.tool_config.torch.discrete=true",
        f"{A}.enable=true",
        steps=2,
        timeout=400,
    )
    run = only_run(tmp_path / "profile")
    records = read_samples(run)
    check_layout(records)
    assert {r["step"] for r in records} == {2} and sorted(r["sample"] for r in records) == list(range(64))
    assert {r["sample"]: r["replica"] for r in records} == {i: i // 32 for i in range(64)}
    assert all(r["queue_ms"] >= 0 and r["reward_ms"] >= 0 and r["rank"] == 0 for r in records)
    mean = sum(r["response_tokens"] for r in records) / 64
    assert mean == pytest.approx(metrics(tmp_path)[2]["response_length"], abs=1e-9)
    rows = [json.loads(line) for line in (run / "manifest.jsonl").read_text().splitlines()]
    for replica in (0, 1):
        (row,) = [r for r in rows if r["role"] == "rollout" and r["replica"] == replica]
        units = decode_step_ranges(run / row["path"])
        longest = max(r["response_tokens"] for r in records if r["replica"] == replica)
        assert longest == len(units) and all(
            u["active"] == sum(r["last_decode_step"] >= u["index"] for r in records if r["replica"] == replica)
            for u in units
        )
    # who wrote each row: the driver (rank 0, waiting on the replicas) and each replica, all three "rank"-numbered
    out = tmp_path / "out"
    assert run_cli("analyze", run, "-o", out, "--workers", "1").returncode == 0
    with open(out / "rows.csv") as f:
        written = {
            (r["writer"], r["file"]) for r in csv.DictReader(f) if r["stage"] == "rollout_generate" and not r["unit"]
        }
    driver = [r for r in rows if r["role"] == "actor"][0]["path"]
    replicas = {r["replica"]: r["path"] for r in rows if r["role"] == "rollout"}
    assert written == {("driver", driver), ("replica 0", replicas[0]), ("replica 1", replicas[1])}
    after = proc.stdout.split("time per window (ms)")[1].splitlines()  # its table
    cells = [[c.strip() for c in line.split("│")] for line in after]
    table = [c for c in cells if len(c) > 6 and c[2:4] == ["rollout", "rollout_generate"]]
    assert sorted(c[5] for c in table) == ["driver (waiting)", "replica 0", "replica 1"]
    page = (run / "report.html").read_text()  # the breakdown: the driver's wait apart from the replicas' generation
    assert "<td>driver (waiting)</td>" in page and "<td>replica 0, replica 1</td>" in page


# ---- on and off, in the Profiler ---------------------------------------------------------------------------------
def test_samples_are_wanted_exactly_where_a_window_is_selected_or_the_watch_is_on(tmp_path):
    prof = profiler(tmp_path, steps="[2]")
    seen = {}
    with prof:
        for n in (1, 2, 3):
            with prof.step(n):
                seen[n] = prof.samples_wanted
    assert seen == {1: False, 2: True, 3: False}
    watched = profiler(tmp_path / "w", f"+{T}.slow.factor=2.0", steps="null")
    with watched:
        with watched.step(1):
            assert watched.samples_wanted


# ---- the file: whole records, faults -----------------------------------------------------------------------------
def test_a_cut_last_line_and_foreign_lines_are_left_out_and_run_directories_below_are_read(tmp_path):
    w = SampleWriter(tmp_path / "run", "rlprof", rank=0)
    assert w.write([{"step": 1, "sample": i, "source": "rlprof", "rank": 0} for i in range(3)])
    w.close()
    with open(w.path, "ab") as f:
        f.write(b'{"step": 1, "sample": 3, "sou')  # the writer was killed mid-line
    assert [r["sample"] for r in read_samples(tmp_path / "run")] == [0, 1, 2]
    other = SampleWriter(tmp_path / "run2", "vllm", replica=1)
    other.write([{"step": 4, "sample": 0, "source": "vllm", "replica": 1}, {"step": "x", "sample": 1}])
    other.close()
    # a save_path holding both run directories: each one's records, the line that is no record left out
    assert sorted((r["source"], r["step"], r["sample"]) for r in read_samples(tmp_path)) == [
        ("rlprof", 1, 0),
        ("rlprof", 1, 1),
        ("rlprof", 1, 2),
        ("vllm", 4, 0),
    ]


def test_sample_records_on_a_full_disk_are_whole_or_absent_and_said_once(small_disk, caplog):
    disk = small_disk("64k")
    w = SampleWriter(disk, "rlprof", rank=0, said=set())
    step = [{"step": 0, "sample": i, "source": "rlprof", "pad": "x" * 200} for i in range(8)]
    with caplog.at_level(logging.WARNING, logger="rlprof"):
        n = 0
        while w.write([dict(r, step=n + 1) for r in step]) and n < 10000:
            n += 1
        for _ in range(3):  # later steps try again, without another line
            assert not w.write([dict(r, step=n + 2) for r in step])
    said = [r.getMessage() for r in caplog.records if "sample records" in r.getMessage()]
    assert len(said) == 1 and "No space left on device" in said[0] and "training goes on" in said[0], said
    lines = w.path.read_bytes().splitlines(keepends=True)
    assert all(line.endswith(b"\n") for line in lines)  # the cut write was taken back
    assert [json.loads(line)["step"] for line in lines] == [s for s in range(1, n + 1) for _ in range(8)]
    assert w.lost == 4 * 8 and w.written == 8 * n


def test_a_full_disk_under_the_samples_costs_the_training_nothing_and_one_line(tmp_path, small_disk):
    """The profile's disk fills once step 1 has ended (the watch on: every step records): the training ends with all
    its steps, and the lost sample records are one line."""
    import subprocess
    import sys

    disk = small_disk("2m")
    args = [
        sys.executable,
        "-m",
        "rlprof.cli",
        "train",
        "trainer.steps=5",
        f"trainer.output_dir={tmp_path}/train",
        f"global_profiler.save_path={disk}",
        "global_profiler.tool=torch",
        "global_profiler.steps=null",
        f"{R}.enable=true",
        f"+{T}.slow.factor=100",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    for line in proc.stdout:
        if line.split()[:2] == ["step", "1"]:  # the trainer's progress line of step 1
            fill(disk)
            break
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert sorted(metrics(tmp_path)) == [1, 2, 3, 4, 5]
    said = [line for line in err.splitlines() if "sample records" in line]
    assert len(said) == 1 and "training goes on" in said[0], err[-3000:]
    kept = read_samples(only_run(disk))
    assert {r["step"] for r in kept} <= {1, 2} and [r["sample"] for r in kept if r["step"] == 1] == list(range(64))


def test_every_field_and_file_of_the_layout_is_in_the_docs():
    from conftest import ROOT

    from rlprof.analyze.inputs.samples_file import SOURCES

    text = (ROOT / "docs" / "collect.md").read_text()
    assert [f for f in FIELDS if f"`{f}`" not in text] == []
    assert all(f"`{source}_" in text for source in SOURCES)


@pytest.mark.parametrize(
    "override,key",
    [
        ("trainer.debug.long_sample.sample=64", "trainer.debug.long_sample.sample"),  # 8 prompts x 8: 0..63
        ("trainer.debug.long_sample.from_step=0", "trainer.debug.long_sample.from_step"),
    ],
)
def test_a_long_sample_outside_the_run_is_one_line_and_exit_2(tmp_path, override, key):
    proc = run_cli("train", override, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert key in line and "allowed" in line, line
