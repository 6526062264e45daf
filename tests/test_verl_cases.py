"""Every profiler-setting line of verl's example scripts, e2e and NPU test scripts and profiling docs (at the commit
in tests/data/verl/profiler_lines.yaml) resolves with the meaning verl's own code gives it, or is refused as verl
refuses it. verl's meaning was computed by verl itself (bench/verl_cases.py: Hydra's compose of its trainer config,
then each role's DistProfiler, in a side venv) and committed as tests/data/verl/head_meanings.json. rlprof reads
each command as verl does: over the generated trainer YAML of that commit."""

import json

import pytest
import yaml

from conftest import DATA
from rlprof.config import load_plan
from rlprof.errors import ConfigError

CASES = {c["id"]: c for c in yaml.safe_load((DATA / "verl" / "profiler_lines.yaml").read_text())["cases"]}
VERL = json.loads((DATA / "verl" / "head_meanings.json").read_text())
BASE = DATA / "verl" / "config" / "v0.10.0.dev_1dda039_generated_ppo_trainer.yaml"


def test_the_cases_cover_the_files_and_carry_verls_meaning():
    assert VERL["commit"] == yaml.safe_load((DATA / "verl" / "profiler_lines.yaml").read_text())["commit"]
    assert set(VERL["cases"]) == set(CASES) and len(CASES) >= 15
    assert {c["source"].split("/")[0] for c in CASES.values()} == {"examples", "tests", "docs"}


def _merged(base: dict, edit: dict) -> dict:
    out = dict(base)
    for k, v in edit.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _config(case: str, tmp_path) -> tuple:
    """(config file, overrides): a command over the head YAML, or the head YAML edited by a doc's YAML block."""
    c = CASES[case]
    if "block" not in c:
        return BASE, c["overrides"]
    edited = tmp_path / "edited_ppo_trainer.yaml"
    edited.write_text(yaml.safe_dump(_merged(yaml.safe_load(BASE.read_text()), c["block"])))
    return edited, []


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_command_means_what_verl_makes_of_it(case, tmp_path):
    verl = VERL["cases"][case]
    config, overrides = _config(case, tmp_path)
    if "refused" in verl:
        with pytest.raises(ConfigError):
            load_plan(config, overrides, device="npu")
        return
    plan = load_plan(config, overrides, device="npu")
    steps = verl["steps"] or []
    for role, v in verl["roles"].items():
        rp = plan.role(role)
        verl_ranks = [r for r in VERL["ranks"] if v["tool"] is not None and steps and r in v["ranks"]]
        mine = [r for r in VERL["ranks"] if rp.collects_on(r)]
        assert mine == verl_ranks, (role, rp)
        if verl_ranks:
            assert rp.tool == v["tool"] and rp.steps == tuple(steps)
            assert (rp.mode == "discrete") == v["discrete"], (role, rp.mode)


def test_the_docs_table_has_one_row_per_command_with_verls_meaning():
    import sys

    sys.path.insert(0, str(DATA.parents[1] / "bench"))
    from verl_cases import _who

    table = (DATA.parents[1] / "docs" / "framework_configs.md").read_text()
    verl_part = table.split("## MindSpeed-RL")[0]
    rows = [line for line in verl_part.splitlines() if line.startswith("| `")]
    assert len(rows) == len(CASES)
    for case in CASES:
        (row,) = [r for r in rows if r.startswith(f"| `{case}`")]
        assert row.rstrip(" |").endswith(_who(VERL["cases"][case])), row
