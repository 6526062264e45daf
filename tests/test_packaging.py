"""rlprof as a user installs it where verl and vLLM live: a wheel built from this checkout, installed into a clean
venv with its dependencies from the registry, imports, runs its command, and carries its entry points; no torch
comes with it."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow


def run(*args, **kwargs):
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900, **kwargs)
    assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


def test_the_wheel_installs_into_a_clean_venv_with_its_entry_points(tmp_path):
    pytest.importorskip("build", reason="the dev extra brings `build`")
    # --no-isolation: the build uses this environment's setuptools (CI installs it), so the test needs no second
    # download of the build backend; the wheel is the same either way.
    run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(ROOT))
    wheel = next((tmp_path / "dist").glob("rlprof-*.whl"))
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", str(venv))  # no system site-packages: only what the wheel asks for
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RLPROF_PLAN")}
    run(str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel), env=env)
    probe = run(
        str(py),
        "-c",
        """
import importlib.metadata as md, json, importlib.util
dist = md.distribution("rlprof")
eps = {g: sorted(e.value for e in md.entry_points(group=g) if e.name == "rlprof")
       for g in ("console_scripts", "vllm.general_plugins", "verl.plugins")}
import rlprof.integrations.vllm.loader as v
v.register()  # no RLPROF_PLAN: returns at once, patches nothing
print(json.dumps({"eps": eps, "licence": dist.metadata.get("License-Expression"),
                  "torch": importlib.util.find_spec("torch") is not None,
                  "file": __import__("rlprof").__file__}))
""",
        env=env,
        cwd=tmp_path,
    )
    facts = json.loads(probe.stdout.strip().splitlines()[-1])
    assert facts["eps"] == {
        "console_scripts": ["rlprof.cli:main"],
        "vllm.general_plugins": ["rlprof.integrations.vllm.loader:register"],
        "verl.plugins": ["rlprof.integrations.verl.loader"],
    }
    assert facts["licence"] == "Apache-2.0"
    assert not facts["torch"], "installing rlprof pulled torch"
    assert str(venv) in facts["file"]
    plan = run(
        str(venv / "bin" / "rlprof"),
        "plan",
        str(ROOT / "examples" / "configs" / "global_role.yaml"),
        "--json",
        env=env,
        cwd=tmp_path,
    )
    assert json.loads(plan.stdout)["roles"]
