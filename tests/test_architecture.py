"""The layers as contracts (pyproject.toml [tool.importlinter], docs/architecture.md): kept now, and broken by each
of the import circles they were written to stop."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

LINT = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))


def lint(root: Path) -> subprocess.CompletedProcess:
    """lint-imports over the package under `root`/src, with `root`'s pyproject contracts."""
    return subprocess.run([LINT, "--no-cache"], cwd=root, capture_output=True, text=True, timeout=300,
                          env={"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(root / "src")})


def test_the_contracts_hold():
    proc = lint(ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "0 broken" in proc.stdout


# The circles that existed before the contracts (issue 27), each reintroduced by one import line.
CIRCLES = [
    ("rlprof/collect/shutdown.py", "from ..cli import app", "rlprof.collect is not allowed to import rlprof.cli"),
    ("rlprof/analyze/distributed.py", "from .pipeline import analyze", "No cycles are allowed in rlprof.analyze"),
    ("rlprof/analyze/readers/ascend_db.py", "from .ascend import is_ascend",
     "No cycles are allowed in rlprof.analyze.readers"),
    ("rlprof/analyze/findings.py", "from ..cluster import cluster", "rlprof.analyze is not allowed to import rlprof.cluster"),
    ("rlprof/compare.py", "from .report.fragments import compare_html",
     "rlprof.compare is not allowed to import rlprof.report"),
    ("rlprof/report/page.py", "import torch", "is not allowed to import torch"),
]


@pytest.mark.parametrize("module, line, said", CIRCLES, ids=[c[0] for c in CIRCLES])
def test_each_old_circle_breaks_a_contract(tmp_path, module, line, said):
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "src" / "rlprof", tmp_path / "src" / "rlprof",
                    ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "src" / module
    target.write_text(target.read_text() + f"\n{line}  # reintroduced by the test\n")
    proc = lint(tmp_path)
    assert proc.returncode != 0
    assert said in proc.stdout, proc.stdout[-3000:]
