"""verl's own code on this machine's CPU, in side venvs (bench/setup_verl.sh), for tests and benches.

`Side(release).ensure()` makes the venv on first use (and again when setup_verl.sh or the CPU shim changed);
`Side(release).run(out, *overrides, ...)` runs bench/verl_plugin_run.py there and returns its JSON, stdout and stderr.
Raises Unavailable when the venv cannot be made here (no registry, no wheel for this Python).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENVS = {"0.9.1": HERE / ".venv-verl", "0.7.1": HERE / ".venv-verl071"}
SETUP = HERE / "setup_verl.sh"
RUN = HERE / "verl_plugin_run.py"
MARK = ".rlprof-setup"  # in the venv: the digest of what made it


class Unavailable(RuntimeError):
    """A side venv with verl could not be made on this machine."""


def _digest() -> str:
    h = hashlib.sha256()
    for p in [SETUP, *sorted((HERE / "verl_cpu_shim").glob("*.py")), HERE / "verl_cpu_shim" / "pyproject.toml"]:
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


@dataclass
class Result:
    data: dict
    stdout: str
    stderr: str

    def rlprof_lines(self) -> list[str]:
        """What rlprof said in verl's processes: its warnings and the files it wrote."""
        return [
            line
            for line in (self.stdout + self.stderr).splitlines()
            if "rlprof" in line and ("rlprof:" in line or "[rlprof]" in line)
        ]


class Side:
    def __init__(self, release: str):
        self.release = release
        self.venv = VENVS[release]
        self.python = self.venv / "bin" / "python"

    def ensure(self) -> "Side":
        mark = self.venv / MARK
        digest = _digest()
        if self.python.exists() and mark.exists() and mark.read_text().strip() == digest:
            return self
        try:
            proc = subprocess.run(["bash", str(SETUP), self.release], capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Unavailable(f"verl {self.release} side venv could not be made: {exc}") from None
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise Unavailable(f"verl {self.release} side venv could not be made in {self.venv}: {' | '.join(tail)}")
        mark.write_text(digest)
        return self

    def run(
        self,
        out: Path,
        *overrides: str,
        mode: str = "inprocess",
        steps: int = 2,
        env: dict | None = None,
        extra: tuple[str, ...] = (),
        timeout: int = 900,
        check: bool = True,
    ) -> Result:
        args = [
            str(self.python),
            "-W",
            "ignore",
            str(RUN),
            "--out",
            str(out),
            "--mode",
            mode,
            "--steps",
            str(steps),
            *extra,
        ]
        for item in overrides:
            args += ["--override", item]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_", "RAY_ADDRESS"))}
        full_env.update({"PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", **(env or {})})
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=str(out))
        data = {}
        for line in reversed(proc.stdout.splitlines()):
            if line.startswith("{") and '"verl"' in line:
                data = json.loads(line)
                break
        if check and (proc.returncode != 0 or not data):
            raise RuntimeError(
                f"verl {self.release} run failed (exit {proc.returncode}):\n"
                f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
            )
        return Result(data, proc.stdout, proc.stderr)
