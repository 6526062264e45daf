"""The layers as contracts (pyproject.toml [tool.importlinter], docs/architecture.md): kept now, and broken by each
of the import circles they were written to stop."""

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import ROOT

LINT = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))


def lint(root: Path) -> subprocess.CompletedProcess:
    """lint-imports over the package under `root`/src, with `root`'s pyproject contracts."""
    return subprocess.run(
        [LINT, "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(root / "src")},
    )


def test_the_contracts_hold():
    proc = lint(ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "0 broken" in proc.stdout


# The circles that existed before the contracts (issue 27), each reintroduced by one import line.
CIRCLES = [
    ("rlprof/collect/shutdown.py", "from ..cli import app", "rlprof.collect is not allowed to import rlprof.cli"),
    (
        "rlprof/analyze/workers/distributed.py",
        "from ..pipeline import analyze",
        "rlprof.analyze.workers is not allowed to import rlprof.analyze.pipeline",
    ),
    (
        "rlprof/analyze/inputs/readers/ascend_db.py",
        "from .ascend import is_ascend",
        "No cycles are allowed in rlprof.analyze.inputs.readers",
    ),
    (
        "rlprof/analyze/diagnosis/findings.py",
        "from ...cluster import cluster",
        "rlprof.analyze is not allowed to import rlprof.cluster",
    ),
    # and the arrows up between analyze's rooms (issue 47): the schema version the window room once took from the
    # document, a reader reaching for a diagnosis, a measure for the run over time, the ground for a reader
    (
        "rlprof/analyze/window/per_file.py",
        "from ..document import document",
        "rlprof.analyze.window is not allowed to import rlprof.analyze.document",
    ),
    (
        "rlprof/analyze/inputs/find.py",
        "from ..diagnosis.findings import diagnose",
        "rlprof.analyze.inputs is not allowed to import rlprof.analyze.diagnosis",
    ),
    (
        "rlprof/analyze/diagnosis/measures.py",
        "from ..over_time.timeline import run_timeline",
        "rlprof.analyze.diagnosis is not allowed to import rlprof.analyze.over_time",
    ),
    (
        "rlprof/analyze/tables/table.py",
        "from ..inputs.readers.kineto import read_kineto",
        "rlprof.analyze.tables is not allowed to import rlprof.analyze.inputs",
    ),
    (
        "rlprof/compare/__init__.py",
        "from ..report.fragments import compare_html",
        "rlprof.compare is not allowed to import rlprof.report",
    ),
    ("rlprof/report/page.py", "import torch", "is not allowed to import torch"),
    # and the ones the plugin packages could grow (issue 41)
    (
        "rlprof/integrations/verl/loader.py",
        "import torch",
        "rlprof.integrations.verl.loader is not allowed to import torch",
    ),
    (
        "rlprof/integrations/verl/config_keys.py",
        "from ...collect import Profiler",
        "rlprof.integrations.verl.loader is not allowed to import rlprof.collect",
    ),
    (
        "rlprof/integrations/vllm/loader.py",
        "from ...config import load_plan",
        "rlprof.integrations.vllm.loader is not allowed to import rlprof.config",
    ),
    (
        "rlprof/integrations/verl/layouts.py",
        "from .sampler import take_over",
        "No cycles are allowed in rlprof.integrations.verl",
    ),
    (
        "rlprof/collect/window.py",
        "from ..integrations.verl import sampler",
        "rlprof.collect is not allowed to import rlprof.integrations",
    ),
]


@pytest.mark.parametrize("module, line, said", CIRCLES, ids=[c[0] for c in CIRCLES])
def test_each_old_circle_breaks_a_contract(tmp_path, module, line, said):
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "src" / "rlprof", tmp_path / "src" / "rlprof", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "src" / module
    target.write_text(target.read_text() + f"\n{line}  # reintroduced by the test\n")
    proc = lint(tmp_path)
    assert proc.returncode != 0
    assert said in proc.stdout, proc.stdout[-3000:]


def _imported(node, package: str) -> set[str]:
    """The modules one import statement names (a relative `from .x import y` resolved within `package`)."""
    if isinstance(node, ast.ImportFrom):
        if node.level == 1:
            return {f"{package}.{node.module}" if node.module else package}
        return {node.module or ""}
    return {a.name for a in node.names} if isinstance(node, ast.Import) else set()


def test_each_lazy_hand_off_the_light_loader_contract_ignores_sits_inside_a_function():
    """The contract ignores each loader's hand-off by name (import-linter reads a function's imports too): the
    hand-off must stay where it costs nothing until a config asks, inside a function, never at module level."""

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (light,) = [c for c in contracts if c["name"].startswith("The plugin entry points stay light")]
    assert light["ignore_imports"]
    for rule in light["ignore_imports"]:
        importer, imported = (part.strip() for part in rule.split("->"))
        tree = ast.parse((ROOT / "src" / (importer.replace(".", "/") + ".py")).read_text())
        package, target = importer.rsplit(".", 1)[0], imported.rsplit(".", 1)[-1]

        at_module_level = set().union(*(_imported(n, package) for n in tree.body))
        anywhere = set().union(*(_imported(n, package) for n in ast.walk(tree)))
        assert imported in anywhere, f"{rule}: the hand-off is gone; drop the rule"
        assert imported not in at_module_level, f"{importer} imports {target} at module level"


LONG_MODULE = 430  # lines, as the formatter lays them out: ~400 and a little slack
SAYS_WHY = "Over 400 lines because"


def test_a_long_module_says_at_its_top_why_it_is_long():
    """One job per module: a module past ~400 lines states, in its docstring, why it is still one job."""
    unexplained = []
    for path in sorted((ROOT / "src" / "rlprof").rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > LONG_MODULE and SAYS_WHY not in (ast.get_docstring(ast.parse(text)) or ""):
            unexplained.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not unexplained, "modules over ~400 lines with no reason at their top: " + ", ".join(unexplained)


ROOMS = {"tables", "inputs", "window", "diagnosis", "over_time", "workers"}
DOOR = {"__init__.py", "pipeline.py", "document.py", "result.py", "export.py"}


def test_the_analysis_is_in_its_rooms_and_at_its_door():
    """No module of analyze/ stands outside its rooms but the door's; each room says what it holds and may use."""
    analyze = ROOT / "src" / "rlprof" / "analyze"
    loose = {p.name for p in analyze.glob("*.py")} - DOOR
    rooms = {p.name for p in analyze.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert not loose and rooms == ROOMS, (loose, rooms)
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c.get("containers") == ["rlprof.analyze"]]
    listed = {name.strip() for layer in layers["layers"] for name in layer.split("|")}
    assert listed == ROOMS | {p.removesuffix(".py") for p in DOOR - {"__init__.py"}} and layers["exhaustive"]
    for room in ROOMS:
        said = ast.get_docstring(ast.parse((analyze / room / "__init__.py").read_text())) or ""
        assert "Uses" in said or "Imports nothing" in said, room  # what it may use, in one or two lines
