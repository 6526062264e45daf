"""The analysis result as typed values (rlprof/analyze/result.py): every recorded run's and real trace's document
decodes strictly into the Structs and encodes back to the same JSON, key by key and type by type; `rlprof.analyze`
gives the document the CLI writes; analysis.json reads back; a bad one is one line; docs/analysis_schema.md's field
reference is the types'; the README's and the guide's examples run."""

import csv
import gzip
import json
import re
import shutil
import subprocess
import sys
import time

import msgspec
import pytest

import rlprof
from conftest import DATA, REAL, ROOT, run_cli
from data_inputs import FRAMEWORK_OUTPUTS
from rlprof.analyze.pipeline import analyze as analyze_document
from rlprof.analyze.result import REFERENCE_ORDER, Analysis, Finding, Row, schema_reference
from rlprof.errors import AnalyzeError

RUNS = sorted(p.name for p in (DATA / "runs").iterdir() if p.is_dir())
RECORDED_SINCE = ("busy_micro_batches",)  # runs recorded after the older rlprof's documents were written
TRACES = sorted(p.name for p in (DATA / "real").glob("*.json.gz")) + ["ascend"]
OUTPUTS = [*FRAMEWORK_OUTPUTS, "samples/long_sample"]  # and rlprof's trainer with its samples and timeline


def canonical(value) -> str:
    """JSON text that tells 0 from 0.0 and ignores key order (JSON objects have none)."""
    return json.dumps(value, sort_keys=True)


def assert_typed_exactly(doc: dict, same_order: bool = True) -> Analysis:
    """The document decodes strictly (an unknown key, a missing one or a wrong type raises) and its encoding is
    the document's JSON (`same_order`: its top-level keys in the order analyze writes them, too)."""
    written = json.dumps(doc)
    typed = msgspec.json.decode(written, type=Analysis)  # strict: forbid_unknown_fields on every record
    assert Analysis.from_document(doc) == typed
    again = json.loads(typed.to_json())
    assert canonical(again) == canonical(json.loads(written))
    assert list(again) == list(doc) or not same_order
    return typed


@pytest.fixture(scope="module")
def run_copies(tmp_path_factory):
    """The recorded runs, copied (analysis writes nothing into tests/data)."""
    root = tmp_path_factory.mktemp("runs")
    for name in RUNS:
        shutil.copytree(DATA / "runs" / name, root / name)
    return root


@pytest.mark.parametrize("name", RUNS)
def test_each_recorded_runs_document_is_its_typed_values_exactly(run_copies, name):
    typed = assert_typed_exactly(analyze_document(run_copies / name, workers=1))
    assert typed.rows and all(isinstance(r, Row) for r in typed.rows)
    assert typed.findings and all(isinstance(f, Finding) for f in typed.findings)


@pytest.mark.parametrize("name", TRACES)
def test_each_real_traces_document_is_its_typed_values_exactly(name):
    assert_typed_exactly(analyze_document(REAL / name, workers=1))


@pytest.mark.parametrize("name", OUTPUTS)
def test_each_framework_outputs_document_is_its_typed_values_exactly(tmp_path, name):
    shutil.copytree(DATA / name, tmp_path / "copy")
    assert_typed_exactly(analyze_document(tmp_path / "copy", workers=1))


def test_the_documents_recorded_before_the_types_decode_exactly():
    """analysis_before_launch_attribution.json.gz: documents written by an older rlprof (419fa31), schema 1 (saved
    with sorted keys)."""
    before = json.load(gzip.open(DATA / "runs" / "analysis_before_launch_attribution.json.gz"))
    assert sorted(before) == [r for r in RUNS if r not in RECORDED_SINCE]
    for doc in before.values():
        assert_typed_exactly(doc, same_order=False)


def test_a_watched_runs_timeline_and_captures_are_typed(tmp_path):
    """The run over time (timeline, spikes, captures with their trigger) of a run the watch wrote."""
    from rlprof.collect import Profiler
    from rlprof.collect.request import submit
    from rlprof.config import load_plan

    plan = load_plan(
        None,
        [
            "global_profiler.tool=torch",
            f"global_profiler.save_path={tmp_path}/p",
            "actor_rollout_ref.actor.profiler.enable=true",
            "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=true",
            "global_profiler.trigger.request=true",
            "global_profiler.trigger.baseline=true",
        ],
    )
    prof = Profiler(plan, run_id="run")
    submit(prof.watch_dir, step=6, role="actor", stage="actor_update", ranks=None)
    with prof:
        for n in range(1, 8):
            with prof.step(n):
                for stage in ("rollout_generate", "actor_update"):
                    with prof.stage(stage):
                        time.sleep(0.005)
    typed = assert_typed_exactly(analyze_document(prof.watch_dir, workers=1))
    assert typed.timeline.steps == list(range(1, 8))
    reasons = {c.trigger.reason for c in typed.timeline.captures}
    assert "request" in reasons and all(c.path for c in typed.timeline.captures)
    assert set(typed.timeline.per_step) >= {"step", "actor_update"}


def test_rlprof_analyze_is_the_clis_document(run_copies, tmp_path):
    run = run_copies / "slow_reward"
    typed = rlprof.analyze(run, workers=1)
    assert isinstance(typed, rlprof.Analysis)
    printed = run_cli("analyze", run, "--json", "--workers", "1")
    assert printed.returncode == 0, printed.stderr
    assert canonical(json.loads(printed.stdout)) == canonical(json.loads(typed.to_json()))
    written = run_cli("analyze", run, "-o", tmp_path / "out", "--workers", "1")
    assert written.returncode == 0, written.stderr
    assert Analysis.load(tmp_path / "out" / "analysis.json") == typed
    first = typed.findings[0]
    assert (first.kind, first.saving.status) == ("slow_reward", "predicted") and first.saving_ms > 0


def test_load_and_to_json_round_trip_and_tables_as_columns(run_copies, tmp_path):
    typed = rlprof.analyze(run_copies / "even_2", workers=1)
    path = tmp_path / "analysis.json"
    path.write_text(typed.to_json(indent=1))
    loaded = Analysis.load(path)
    assert loaded == typed and loaded.to_json() == typed.to_json()
    assert loaded.to_dict() == json.loads(typed.to_json())
    rows = typed.columns("rows")
    assert {len(col) for col in rows.values()} == {len(typed.rows)}
    assert rows["wall_ms"].dtype.kind == "f" and list(rows["wall_ms"]) == [r.wall_ms for r in typed.rows]
    assert list(rows["stage"]) == [r.stage for r in typed.rows]
    tokens = rows.get("tokens")  # unit rows hold it, stage rows not: a number with gaps is NaN there
    if tokens is not None:
        assert [t != t for t in tokens] == [r.get("tokens") is None for r in typed.rows]
    with pytest.raises(AnalyzeError, match="allowed: rows, ops"):
        typed.columns("kernels")


def test_optional_fields_stay_absent_and_get_reads_them(run_copies):
    typed = rlprof.analyze(run_copies / "healthy", workers=1)
    stage = next(r for r in typed.rows if r.unit is None)
    assert stage.tokens is msgspec.UNSET and stage.get("tokens") is None and stage.get("tokens", 0) == 0
    assert "tokens" not in json.loads(msgspec.json.encode(stage))
    descriptive = [f for f in typed.findings if not f.actionable]
    assert descriptive and all(f.saving is msgspec.UNSET for f in descriptive)
    assert all("saving" not in json.loads(msgspec.json.encode(f)) for f in descriptive)


@pytest.mark.parametrize(
    "content, words",
    [
        ({"schema_version": 7, "rows": []}, ["analysis schema 7 is not readable", "allowed: schema 1"]),
        (
            {
                "schema_version": 1,
                "rows": [{"wall_ms": 1.0, "stage": "x", "colour": "red"}],
                "inputs": [],
                "findings": [],
            },
            ["does not match analysis schema 1", "colour", "$.rows[0]"],
        ),
        (
            {"schema_version": 1, "rows": [{"wall_ms": 1.0, "stage": "x"}], "inputs": []},
            ["not an analysis of schema 1", "compute_ms"],
        ),
    ],
)
def test_a_bad_analysis_json_is_one_line_and_exit_2(tmp_path, content, words):
    path = tmp_path / "analysis.json"
    path.write_text(json.dumps(content))
    with pytest.raises(AnalyzeError) as err:
        Analysis.load(path)
    assert len(str(err.value).splitlines()) == 1 and all(w in str(err.value) for w in words)
    proc = run_cli("analyze", path, "--json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line and all(w in line for w in words), line


def test_load_of_what_is_not_an_analysis_names_the_file(tmp_path):
    for name, text, words in (
        ("trace.json", '{"traceEvents": []}', "no schema_version"),
        ("broken.json", '{"schema_version": 1, "rows": [', "not JSON"),
    ):
        (tmp_path / name).write_text(text)
        with pytest.raises(AnalyzeError, match=re.escape(words)) as err:
            Analysis.load(tmp_path / name)
        assert name in str(err.value) and "allowed" in str(err.value)
    with pytest.raises(AnalyzeError, match="cannot be read"):
        Analysis.load(tmp_path / "missing.json")


def test_the_clis_analyze_reads_an_analysis_json_back(run_copies, tmp_path):
    first = run_cli("analyze", run_copies / "healthy", "-o", tmp_path / "a", "--workers", "1")
    assert first.returncode == 0, first.stderr
    again = run_cli("analyze", tmp_path / "a" / "analysis.json", "-o", tmp_path / "b")
    assert again.returncode == 0, again.stderr
    assert Analysis.load(tmp_path / "b" / "analysis.json") == Analysis.load(tmp_path / "a" / "analysis.json")
    for table in ("rows", "ops", "findings"):  # the same tables (columns in the order of the records they come from)
        assert _csv(tmp_path / "b" / f"{table}.csv") == _csv(tmp_path / "a" / f"{table}.csv")


def _csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_schema_docs_field_reference_is_generated_from_the_types():
    doc = (ROOT / "docs" / "analysis_schema.md").read_text()
    block = re.search(r"<!-- generated: .*? -->\n(.*?)<!-- end of generated -->", doc, re.S)
    assert block, "docs/analysis_schema.md lost its generated field reference"
    assert block.group(1) == schema_reference(), (
        "docs/analysis_schema.md is out of date: paste `python3 -m rlprof.analyze.result` between its markers"
    )
    # every record type the document holds has its table there
    reachable, todo = set(), [Analysis]
    while todo:
        cls = todo.pop()
        if cls in reachable:
            continue
        reachable.add(cls)
        todo += [s.cls for f in msgspec.inspect.type_info(cls).fields for s in _structs(f.type)]
    assert reachable == set(REFERENCE_ORDER)


def _structs(t):
    mi = msgspec.inspect
    if isinstance(t, mi.StructType):
        return [t]
    if isinstance(t, mi.UnionType):
        return [s for x in t.types for s in _structs(x)]
    if isinstance(t, mi.ListType):
        return _structs(t.item_type)
    if isinstance(t, mi.DictType):
        return _structs(t.value_type)
    return []


def test_import_rlprof_stays_light_and_analyze_is_callable_after_its_package_loads():
    probe = (
        "import sys, rlprof; light = not any(m.split('.')[0] in ('numpy', 'msgspec') for m in sys.modules); "
        "import rlprof.analyze.pipeline; print(light, callable(rlprof.analyze), rlprof.Analysis.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT / "src")
    assert out.stdout.split() == ["True", "True", "Analysis"]


def _python_block(text: str, heading: str) -> str:
    return re.search(r"```python\n(.*?)```", text[text.index(heading) :], re.S).group(1)


def test_the_readmes_and_the_guides_examples_run(run_copies, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(run_copies / "slow_reward", run)
    readme = _python_block((ROOT / "README.md").read_text(), "## Analyse your own run")
    assert len(readme.strip().splitlines()) <= 8
    exec(readme.replace("outputs/profile/<run_id>", str(run)), {})
    out = capsys.readouterr().out
    assert out.startswith("slow_reward ") and "slow reward: reward_compute takes" in out
    assert run_cli("analyze", run, "--workers", "1").returncode == 0  # the guide loads what this wrote
    guide = _python_block((ROOT / "docs" / "python_api.md").read_text(), "# The Python API")
    exec(guide.replace("outputs/profile/<run_id>", str(run)), {})
    out = capsys.readouterr().out
    assert "reward_compute: " in out and "{'workers': " in out
