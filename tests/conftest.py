import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "configs"
REAL = ROOT.parent / "shared" / "fixtures" / "real"


def run_cli(*args, cwd=None, env=None, timeout=300):
    """Run `rlprof ...` as a user would; returns CompletedProcess with text output."""
    full_env = dict(os.environ, KINETO_LOG_LEVEL="5", **(env or {}))
    return subprocess.run([sys.executable, "-m", "rlprof.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=full_env, timeout=timeout)


def plan_json(*args, cwd=None):
    proc = run_cli("plan", *args, "--json", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path
