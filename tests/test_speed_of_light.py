"""How far each stage runs from what its device can do (analyze/diagnosis/speed_of_light.py), checked against the
frameworks' own formulas and on real recordings:

- rlprof's trainer at hidden 512 x 4 layers, trained here: its update row's model FLOPs are verl's
  `FlopsCounter.estimate_flops` on the step's sampled sequence lengths (verl 0.9.1 run in bench/.venv-verl), its
  log-prob rows a third of them; its decode steps' context is its samples' own; `rlprof train` prints each stage's
  mfu or mbu and the largest part of its gap, the report draws the roofline, the CSV holds the stages;
- verl's device peaks are verl's own (`get_device_flops`), and verl's formula agrees with rlprof's on the model
  families it shares (dense and MoE);
- the H100 recordings get their mfu and mbu per stage; a device the table does not know is said, the work stands;
- the model recorded, given (`--model`) or said unknown in one line; a bad `--model` is one line and exit code 2;
- no saving brings a stage below its speed-of-light time (the invariant over every input is tests/test_invariants.py;
  here a saving made to cross it, cut, and the same saving uncut caught by that invariant).
A decode step's FLOPs and bytes against vLLM's own per-iteration model are checked in tests/test_vllm_live.py, the
actor update's mfu against verl's logged perf/mfu/actor in tests/test_verl_job.py.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import shutil
import subprocess

import pytest

from conftest import DATA, REAL, ROOT, run_cli, window_row
from test_invariants import savings_below_speed_of_light

from rlprof.analyze.diagnosis import prediction
from rlprof.analyze.diagnosis.findings import diagnose
from rlprof.analyze.diagnosis.model_work import Shape
from rlprof.analyze.diagnosis.speed_of_light import speed_of_light
from rlprof.analyze.pipeline import analyze
from rlprof.frameworks.devices import DEVICES, VERL_PEAK_FLOPS, device_limits, verl_peak

HF_FIELDS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
)


def verl_says(side, request: dict) -> dict:
    """verl's own FlopsCounter and device peaks on `request` (bench/verl_flops.py in verl's side venv)."""
    proc = subprocess.run(
        [str(side.python), str(ROOT / "bench" / "verl_flops.py")],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, VERL_PLATFORM="cpu"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def stage_row(doc: dict, stage: str, step: int = 2) -> dict:
    (row,) = [r for r in doc["rows"] if r["unit"] is None and r["stage"] == stage and r["step"] == step]
    return row


# ---- rlprof's trainer, trained here ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`rlprof train` at hidden 512 x 4 layers, 2 steps, step 2 profiled (the default): what it printed, its run."""
    tmp = tmp_path_factory.mktemp("sol")
    proc = run_cli(
        "train",
        "trainer.steps=2",
        "model.hidden_size=512",
        "model.num_layers=4",
        f"trainer.output_dir={tmp}/train",
        f"global_profiler.save_path={tmp}/p",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        "actor_rollout_ref.actor.profiler.enable=true",
        cwd=tmp,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p for p in (tmp / "p").iterdir() if p.is_dir()]
    return proc, run, json.loads((run / "analysis" / "analysis.json").read_text())


def test_the_update_and_log_prob_flops_are_verls_flops_counter_on_the_steps_samples(trained, verl091):
    _, _, doc = trained
    model = doc["model"]
    assert model["source"].startswith("rlprof's trainer") and (model["hidden_size"], model["num_hidden_layers"]) == (
        512,
        4,
    )
    lengths = [s["prompt_tokens"] + s["response_tokens"] for s in doc["samples"] if s["step"] == 2]
    assert len(lengths) == 64  # every sample of the step: the update computes each once (ppo_epochs 1)
    (flops,) = verl_says(verl091, {"cases": [{"config": {k: model[k] for k in HF_FIELDS}, "lengths": lengths}]})[
        "flops"
    ]
    update = stage_row(doc, "actor_update")
    assert update["model_flops"] == pytest.approx(flops, rel=0.01)
    for stage in ("actor_compute_log_prob", "ref_compute_log_prob"):
        assert stage_row(doc, stage)["model_flops"] == pytest.approx(flops / 3, rel=0.01), stage
    # the update's micro-batches computed padding: the FLOPs on the tokens computed are more than on the real ones
    assert update["padded_flops"] > update["model_flops"]


def test_the_cpu_is_measured_at_collection_start_and_said_with_every_window(trained):
    _, run, doc = trained
    rows = [json.loads(line) for line in (run / "manifest.jsonl").read_text().splitlines()]
    assert rows and all(r["device"]["kind"] == "cpu" for r in rows)
    device = rows[0]["device"]
    assert device["peak_flops"]["float32"] > 1e9 and device["bandwidth"] > 1e8 and device["threads"] >= 1
    (hw,) = {json.dumps(i["hardware"]) for i in doc["inputs"]}
    hw = json.loads(hw)
    assert hw["source"].startswith("measured at collection start") and hw["verl_peak_flops"] == VERL_PEAK_FLOPS["CPU"]
    update = stage_row(doc, "actor_update")
    assert update["mfu"] == pytest.approx(
        update["model_flops"] / (update["wall_ms"] / 1e3) / hw["peak_flops"]["float32"]
    )
    assert update["mfu_verl"] == pytest.approx(update["model_flops"] / (update["wall_ms"] / 1e3) / 448e9)


def test_the_decode_steps_context_is_the_samples_own(trained):
    """Each decode step says the tokens its real rows attend to: step 0 the prompts (the prefill), step k each row
    still generating at its prompt + k tokens, as the step's samples (prompt and response tokens) say."""
    _, _, doc = trained
    samples = [s for s in doc["samples"] if s["step"] == 2]
    steps = sorted((r for r in doc["rows"] if r["unit"] == "decode_step" and r["step"] == 2), key=lambda r: r["index"])
    assert steps and steps[0]["prefill_tokens"] == steps[0]["context_tokens"] == sum(
        s["prompt_tokens"] for s in samples
    )
    for r in steps[1:]:
        k = r["index"]
        generating = [s for s in samples if s["response_tokens"] > k]
        assert r["active"] == len(generating)
        assert r["context_tokens"] == r["query_key_pairs"] == sum(s["prompt_tokens"] + k for s in generating)


def test_rlprof_train_prints_each_stages_distance_from_its_limit_and_the_report_draws_the_roofline(trained):
    proc, run, doc = trained
    lines = proc.stdout.splitlines()
    (head,) = [i for i, line in enumerate(lines) if line.startswith("speed of light (")]
    said = {line.split(":")[0].strip(): line for line in lines[head + 1 : head + 1 + len(doc["stage_limits"])]}
    for s in doc["stage_limits"]:
        line = said[f"{s['role']}/{s['stage']}"]
        ratio = "mfu" if s["bound"] == "compute" else "mbu"
        assert f"{ratio} {s[ratio]:.1%}" in line and f"largest part of the gap: {s['gap_largest']}" in line
    assert {s["stage"] for s in doc["stage_limits"]} == {
        "rollout_generate",
        "ref_compute_log_prob",
        "actor_compute_log_prob",
        "actor_update",
    }
    page = (run / "report.html").read_text()
    figures = json.loads(page.split("var figs=")[1].split(";var cfg=")[0])
    roofline = figures["chart-speed_of_light"]
    (roofs,) = [t for t in roofline["data"] if t["name"].startswith("roofs")]
    hw = doc["inputs"][0]["hardware"]
    assert roofs["y"][1:] == [hw["peak_flops"]["float32"]] * 2 and roofs["x"][1] == pytest.approx(
        hw["peak_flops"]["float32"] / hw["bandwidth"]
    )
    points = {t["name"]: t for t in roofline["data"] if t.get("marker", {}).get("symbol") == "diamond"}
    assert len(points) == len(doc["stage_limits"])
    with open(run / "analysis" / "stage_limits.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["stage"] for r in table] == [s["stage"] for s in doc["stage_limits"]]
    assert float(table[0]["mfu"]) == pytest.approx(doc["stage_limits"][0]["mfu"])


# ---- verl's own peaks and formula ------------------------------------------------------------------------------------
def test_verls_device_peaks_are_verls_own_and_its_formula_agrees_on_the_families_it_shares(verl091):
    names = [
        *VERL_PEAK_FLOPS,
        "NVIDIA H100 80GB HBM3",
        "NVIDIA A100-SXM4-40GB",
        "Ascend910B2",
        "NVIDIA GeForce RTX 4090",
    ]
    dense = {
        "model_type": "qwen2",
        "hidden_size": 256,
        "num_hidden_layers": 3,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 688,
        "vocab_size": 1000,
    }
    moe = {**dense, "model_type": "qwen2_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 96}
    lengths = [37, 5, 120, 64, 64, 9]
    configs = (dense, {**dense, "model_type": "llama"}, moe)
    said = verl_says(verl091, {"cases": [{"config": c, "lengths": lengths} for c in configs], "devices": names})
    for name in names:
        ours = verl_peak(name, "cuda")
        assert (ours if ours is not None else float("inf")) == said["peaks"][name], name
    assert verl_peak(None, "cpu") == said["cpu_peak"]
    for config, flops in zip(configs, said["flops"]):
        shape = Shape.of({**config, "dtype": "float32", "tie_word_embeddings": True})
        ours = shape.train_flops(3, sum(lengths), sum(n * n for n in lengths))
        assert ours == pytest.approx(flops, rel=0.01), config["model_type"]


def test_each_device_is_found_by_the_name_its_runtime_gives():
    found = {
        "NVIDIA H100 80GB HBM3": "NVIDIA H100 SXM",
        "NVIDIA H100 PCIe": "NVIDIA H100 PCIe",
        "NVIDIA H100 NVL": "NVIDIA H100 NVL",
        "NVIDIA H200": "NVIDIA H200",
        "NVIDIA H20": "NVIDIA H20",
        "NVIDIA B200": "NVIDIA B200",
        "NVIDIA GB200": "NVIDIA GB200 (one B200 of it)",
        "NVIDIA A100-SXM4-80GB": "NVIDIA A100 SXM 80GB",
        "NVIDIA A100-SXM4-40GB": "NVIDIA A100 SXM 40GB",
        "NVIDIA A100-PCIE-40GB": "NVIDIA A100 PCIe 40GB",
        "NVIDIA L40S": "NVIDIA L40S",
        "NVIDIA L40": "NVIDIA L40",
        "AMD Instinct MI300X": "AMD Instinct MI300X",
        "Ascend910B2": "Huawei Ascend 910B",
        "Ascend910C": "Huawei Ascend 910C",
    }
    assert {name: device_limits(name).name for name in found} == found
    assert device_limits("NVIDIA GeForce RTX 4090") is None and device_limits("") is None
    for d in DEVICES:  # every entry: a dense peak for the 16-bit types and a bandwidth, each from a named source
        assert d.peak_flops["bfloat16"] > 0 and d.bandwidth > 0 and d.source


# ---- recordings ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("run", ["discrete-windows", "e2e-step"])
def test_the_h100_recordings_get_their_mfu_and_mbu_per_stage(tmp_path, run):
    doc = analyze(shutil.copytree(DATA / "h100" / run, tmp_path / run), workers=1)
    assert doc["model"]["source"].startswith("rlprof's trainer") and doc["model"]["hidden_size"] == 768
    hw = doc["inputs"][0]["hardware"]
    assert hw["name"] == "NVIDIA H100 80GB HBM3" and hw["source"].startswith("NVIDIA H100 SXM")
    stages = {s["stage"]: s for s in doc["stage_limits"]}
    assert set(stages) == {"rollout_generate", "ref_compute_log_prob", "actor_compute_log_prob", "actor_update"}
    for s in stages.values():
        assert 0 < s["mfu"] < 1 and 0 < s["mbu"] < 1 and s["sol_ms"] < s["wall_ms"]
    # the decode loop waits on the host's launches (tests/data/h100/SOURCES.md): the largest part of its gap
    assert stages["rollout_generate"]["gap_largest"] == "launch-bound"


def test_an_unknown_device_is_said_and_the_rows_keep_their_work(tmp_path):
    run = shutil.copytree(DATA / "h100" / "e2e-step", tmp_path / "run")
    (trace,) = run.glob("*.pt.trace.json.gz")
    data = json.load(gzip.open(trace))
    for p in data["deviceProperties"]:
        p["name"] = "NVIDIA GeForce RTX 4090"  # a device the table does not know
    with gzip.open(trace, "wt") as f:
        json.dump(data, f)
    doc = analyze(run, workers=1)
    (hw,) = [i["hardware"] for i in doc["inputs"]]
    assert "NVIDIA GeForce RTX 4090 is not in rlprof's table" in hw["why"] and hw["peak_flops"] == {}
    update = stage_row(doc, "actor_update")
    assert update["model_flops"] > 0 and "mfu" not in update and doc["stage_limits"] == []
    out = run_cli("analyze", run, "-o", tmp_path / "a")
    assert out.returncode == 0 and "device limits not known: NVIDIA GeForce RTX 4090 is not in" in out.stdout


# ---- the model: recorded, given, or said unknown -------------------------------------------------------------------
def test_without_a_model_one_line_says_so_and_the_rest_stands(tmp_path):
    trace = shutil.copy(REAL / "cpu_only_rank34.json.gz", tmp_path)
    out = run_cli("analyze", trace, "-o", tmp_path / "a")
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "a" / "analysis.json").read_text())
    assert doc["model"]["source"] is None and "rlprof analyze --model" in doc["model"]["why"]
    assert doc["rows"] and doc["stage_limits"] == [] and not any("model_flops" in r for r in doc["rows"])
    assert [line for line in out.stdout.splitlines() if line.startswith("speed of light")] == [
        f"speed of light: {doc['model']['why']}"
    ]


def test_a_model_given_with_model_is_read_from_a_checkpoint_its_config_or_json_text(tmp_path):
    run = shutil.copytree(DATA / "h100" / "e2e-step", tmp_path / "run")
    (run / "trainer_config.json").unlink()  # no record of its own: only what is given
    config = {
        "model_type": "qwen2",
        "hidden_size": 768,
        "num_hidden_layers": 6,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "intermediate_size": 3072,
        "vocab_size": 15,
        "torch_dtype": "float32",
    }
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(config))
    recorded = analyze(DATA / "h100" / "e2e-step", workers=1)
    for given in (checkpoint, checkpoint / "config.json", json.dumps(config)):
        out = run_cli("analyze", run, "--model", given, "--json")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["model"]["source"].startswith("given") and doc["model"]["hidden_size"] == 768
        # the model the trainer recorded is this one: the same work on every stage
        for stage in ("rollout_generate", "actor_update"):
            assert stage_row(doc, stage)["model_flops"] == pytest.approx(stage_row(recorded, stage)["model_flops"])


def test_a_model_a_collector_left_beside_its_run_is_read(tmp_path):
    """A run directory's model.json (what verl's agent loop leaves, through rlprof's verl plugin, from the checkpoint
    verl's config names) is the run's model where no window recorded one."""
    from rlprof.analyze.inputs.model_config import write_model_file
    from rlprof.frameworks.hf_models import trainer_model

    save = tmp_path / "save"
    run = shutil.copytree(DATA / "h100" / "e2e-step", save / "run")
    config = json.loads((run / "trainer_config.json").read_text())["config"]
    (run / "trainer_config.json").unlink()
    write_model_file(run, trainer_model(config["model"], "verl's actor_rollout_ref.model.path: /ckpt"))
    for path in (run, save):  # the run directory, or the save_path above it
        doc = analyze(path, workers=1)
        assert doc["model"]["source"] == "verl's actor_rollout_ref.model.path: /ckpt" and doc["stage_limits"], path
        assert doc["warnings"] == [] and len(doc["inputs"]) == 1  # the record is no trace


@pytest.mark.parametrize(
    "given, says",
    [
        ("{not json", "not JSON"),
        ('{"hidden_size": 8}', "not a model's config"),
        ("/nonexistent/ckpt", "cannot be read"),
    ],
)
def test_a_bad_model_is_one_line_and_exit_code_2(tmp_path, given, says):
    out = run_cli("analyze", REAL / "cpu_only_rank34.json.gz", "--model", given, "-o", tmp_path / "a")
    assert out.returncode == 2 and says in out.stderr and "allowed:" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "a").exists()


# ---- savings within physics ----------------------------------------------------------------------------------------
def _tail_doc() -> dict:
    """A rollout of 16 decode steps, 8 rows of which one runs to the end (a long tail), and its speed of light near its
    wall: the tail's predicted saving would take the stage below what its device allows."""
    lengths = [2, 2, 3, 3, 2, 2, 3, 16]
    rows = [window_row("rollout_generate", "rollout", 160.0, sol_ms=150.0)]
    rows += [
        window_row("rollout_generate", "rollout", 10.0, "decode_step", k, seqs=8, active=sum(n > k for n in lengths))
        for k in range(16)
    ]
    rows += [window_row("actor_update", "actor", 100.0, sol_ms=10.0)]
    return {"rows": rows, "inputs": [], "collectives": [], "memory": [], "run_config": None}


def test_a_saving_is_cut_at_its_stages_speed_of_light(monkeypatch):
    doc = _tail_doc()
    doc["measures"], doc["findings"] = diagnose(doc)
    (tail,) = [f for f in doc["findings"] if f["kind"] == "rollout_tail"]
    saving = tail["saving"]
    assert saving["by_stage_ms"]["rollout_generate"] == pytest.approx(160.0 - 150.0)
    assert saving["speed_of_light_ms"] == {"rollout_generate": 150.0} and "speed-of-light" in saving["assumption"]
    assert savings_below_speed_of_light(doc) == []
    # the same document without the cut: the invariant over every input catches the saving below the limit
    monkeypatch.setattr(prediction, "within_speed_of_light", lambda by_stage, stage_ms, sol: (by_stage, {}))
    uncut = _tail_doc()
    uncut["measures"], uncut["findings"] = diagnose(uncut)
    assert [(kind, stage) for kind, stage, *_ in savings_below_speed_of_light(uncut)] == [
        ("rollout_tail", "rollout_generate")
    ]


def test_a_sampled_stage_call_is_said_whole_at_the_rate_verls_mfu_takes():
    """A stage row whose window kept one of four micro-batches, with its call beside it (what verl's plugin records):
    the call's FLOPs are verl's convention on all its tokens and pairs, its mfu those over its own time and the
    peaks (the device's, verl's), the stage's record sums its calls; a call that did not say its tokens has no rate."""
    model = {
        "model_type": "qwen2",
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 512,
        "vocab_size": 1000,
        "dtype": "float32",
    }
    hw = {"peak_flops": {"float32": 200e9}, "bandwidth": 40e9, "verl_peak_flops": 448e9}
    kept = {"unit": "micro_batch", "index": 1, "seqs": 2, "tokens": 256, "real_tokens": 256, "query_key_pairs": 32768}
    rows = []
    for step, call in (
        (1, {"wall_ms": 200.0, "units": 4, "real_tokens": 1024, "query_key_pairs": 131072}),
        (2, {"wall_ms": 300.0, "units": 4}),
    ):
        stage = {
            **window_row("actor_update", "actor", 60.0, step=step, compute_ms=50.0, idle_ms=10.0),
            "file": f"s{step}.json.gz",
            "call": {"timed": "1 x BaseEngine.train_batch", **call},
        }
        unit = {k: v for k, v in stage.items() if k != "call"} | kept | {"wall_ms": 55.0}
        rows += [stage, unit]
    doc = {"rows": rows, "inputs": [{"path": f"/x/s{s}.json.gz", "hardware": hw} for s in (1, 2)], "samples": []}
    (record,) = speed_of_light(doc, model)
    first, second = (r["call"] for r in rows if r["unit"] is None)
    flops = Shape.of(model).train_flops(3, 1024, 131072)
    assert first["model_flops"] == flops
    assert first["mfu"] == pytest.approx(flops / 0.2 / 200e9) and first["mfu_verl"] == pytest.approx(
        flops / 0.2 / 448e9
    )
    assert set(second) == {"wall_ms", "timed", "units"}  # no tokens said: no work, no rate
    assert record["calls"] == {
        "calls": 1,
        "units": 4,
        "wall_ms": 200.0,
        "model_flops": flops,
        "mfu": pytest.approx(first["mfu"]),
        "mfu_verl": pytest.approx(first["mfu_verl"]),
    }
    kept_rows = [r for r in rows if r["unit"] == "micro_batch"]
    assert all("call" not in r and r["mfu"] > 0 for r in kept_rows)  # the kept micro-batches keep their own rate
