"""Inference engines (vLLM, SGLang) as async rollout replicas, profiled on the rollout role's plan.

An engine runs generation in its own processes, so it must profile itself. From the rollout role's
plan this module builds what each engine takes, drives it through the same adapter interface that
rlprof's own replicas use (`start_profile(step)` / `stop_profile()`), and files what the engine
wrote under the run's save_path with manifest rows, so `rlprof analyze` reads them like any window.

Decode-step schedules become engine iterations: iteration 0 is the prefill that yields decode step 0,
so `{unit: decode_step, wait: W, warmup: U, active: A}` skips W+U iterations and records A.
What an engine cannot honour is said once per adapter, as one warning line each.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..collect.engine import replica_profiles
from ..collect.manifest import append_row
from ..config.plan import ProfilePlan, RolePlan
from ..errors import ConfigError
from ..frameworks.engines import EngineFile, recognise  # noqa: F401  (re-exported: the adapters' file names)

ROLLOUT_KEY = "actor_rollout_ref.rollout.profiler"


class EngineClient(Protocol):
    """What adapters call on a running engine (vllm.LLM / AsyncLLM, sglang.Engine, or HttpEngineClient)."""

    def start_profile(self, **kwargs) -> Any: ...

    def stop_profile(self) -> Any: ...


class HttpEngineClient:
    """A served engine's /start_profile and /stop_profile endpoints (both vLLM and SGLang have them)."""

    def __init__(self, base_url: str, timeout: float = 600.0):
        self.base_url, self.timeout = base_url.rstrip("/"), timeout

    def _post(self, path: str, body: dict | None = None) -> int:
        data = json.dumps(body or {}).encode()
        req = urllib.request.Request(
            self.base_url + path, data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            return resp.status

    def start_profile(self, **kwargs) -> int:
        return self._post("/start_profile", kwargs)

    def stop_profile(self) -> int:
        return self._post("/stop_profile")


@dataclass(frozen=True)
class Window:
    """Engine iterations to skip, then record (None: the whole call); and what cannot be honoured."""

    delay: int = 0
    active: int | None = None
    notes: tuple[str, ...] = ()


ENGINE_UNITS = ("decode_step", "step", "stage")  # what an engine's schedule can count: its iterations, or nothing


def check_rollout_schedule(rp: RolePlan) -> None:
    """A schedule no inference engine can follow (micro- or mini-batches), refused in one line naming the key."""
    s = rp.schedule
    if rp.enabled and s is not None and s.unit not in ENGINE_UNITS:
        raise ConfigError(
            f"{ROLLOUT_KEY}.tool_config.{rp.tool}.schedule.unit",
            s.unit,
            "decode_step (engine iterations), or no schedule for the whole generate call",
            problem="has no meaning inside an inference engine",
        )


def engine_window(rp: RolePlan, engine: str) -> Window:
    """The iterations an engine's own profiler is asked to skip and record (one window per start_profile)."""
    check_rollout_schedule(rp)
    s = rp.schedule
    if s is None or s.unit != "decode_step":
        return Window()
    if s.repeat not in (0, 1):
        raise ConfigError(
            f"{ROLLOUT_KEY}.tool_config.{rp.tool}.schedule.repeat",
            s.repeat,
            f"0 or 1: {engine}'s own profiler records one window per start_profile (rlprof's vLLM "
            "plugin follows repeat)",
        )
    return Window(delay=s.skip_first + s.wait + s.warmup, active=s.active or None)


def rollout_plan(plan: ProfilePlan) -> RolePlan:
    rp = plan.role("rollout")
    if rp.enabled and rp.steps and rp.mode != "discrete":
        raise ConfigError(
            f"{ROLLOUT_KEY}.tool_config.{rp.tool}.discrete",
            False,
            "true: an inference engine profiles its own processes, one window per (step, replica)",
        )
    if rp.enabled and rp.steps and rp.tool not in ("torch", "markers"):
        raise ConfigError(f"{ROLLOUT_KEY}.tool", rp.tool, "torch for vLLM / SGLang engines (their torch profiler)")
    check_rollout_schedule(rp)
    return rp


def _version_tuple(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        raise ConfigError("vllm version", version, "a release number such as 0.13.0")
    return int(m.group(1)), int(m.group(2))


# ---- vLLM -------------------------------------------------------------------------------------------

VLLM_CONFIG_SINCE = (0, 13)  # --profiler-config / LLM(profiler_config=...)
VLLM_ITERS_SINCE = (0, 12)  # VLLM_PROFILER_DELAY_ITERS / _MAX_ITERS


def vllm_settings(plan: ProfilePlan, trace_dir: str | Path, version: str) -> tuple[dict, list[str]]:
    """What a vLLM engine takes at launch: {"profiler_config": {...}} (>= 0.13) or {"env": {...}} (older),
    plus one warning line per request it cannot honour."""
    rp = rollout_plan(plan)
    win = engine_window(rp, "vLLM")
    notes = list(win.notes)
    contents = set(rp.contents)
    if rp.analysis:
        notes.append("vLLM: does not run an analysis step itself; `rlprof analyze` reads its traces")
    if rp.level not in (None, "level_none") or not {"cpu", "cuda"} <= contents or "module" in contents:
        notes.append(
            "vLLM: collects at a fixed level (CPU and CUDA activities, no module hierarchy); "
            f"contents {sorted(contents)} and level {rp.level} are not applied as such"
        )
    v = _version_tuple(version)
    stack, shapes, memory = "stack" in contents, "shapes" in contents, "memory" in contents
    # vLLM's WorkerProfiler starts on the delay-th iteration it counts (`_active_iteration_count == delay`, counting
    # from 1), i.e. after delay - 1 skipped: skipping S iterations takes delay S + 1 (checked live on 0.32.0, whose
    # max_iterations then records exactly that many).
    delay = win.delay + 1 if win.delay else 0
    if v >= VLLM_CONFIG_SINCE:
        cfg = {
            "profiler": "torch",
            "torch_profiler_dir": str(trace_dir),
            "torch_profiler_with_stack": stack,
            "torch_profiler_record_shapes": shapes,
            "torch_profiler_with_memory": memory,
            "torch_profiler_with_flops": False,
            "torch_profiler_use_gzip": True,
            "delay_iterations": delay,
            "max_iterations": win.active or 0,
            # the front-end (AsyncLLM) trace ignores delay/limit and would span the whole call
            "ignore_frontend": bool(win.delay or win.active),
        }
        return {"profiler_config": cfg}, notes
    env = {
        "VLLM_TORCH_PROFILER_DIR": str(trace_dir),
        "VLLM_TORCH_PROFILER_WITH_STACK": str(int(stack)),
        "VLLM_TORCH_PROFILER_RECORD_SHAPES": str(int(shapes)),
        "VLLM_TORCH_PROFILER_WITH_PROFILE_MEMORY": str(int(memory)),
    }
    if v >= VLLM_ITERS_SINCE:
        env.update(
            {
                "VLLM_PROFILER_DELAY_ITERS": str(delay),
                "VLLM_PROFILER_MAX_ITERS": str(win.active or 0),
                "VLLM_TORCH_PROFILER_DISABLE_ASYNC_LLM": str(int(bool(win.delay or win.active))),
            }
        )
    elif win.delay or win.active:
        notes.append(
            f"vLLM {version}: cannot delay or limit profiled iterations (needs >= 0.12); the whole "
            "generate call is profiled"
        )
    return {"env": env}, notes


# ---- SGLang -----------------------------------------------------------------------------------------


def sglang_start_args(
    plan: ProfilePlan, output_dir: str | Path, forward_count: int | None = None
) -> tuple[dict, list[str]]:
    """Keyword arguments of SGLang's start_profile (Engine method or POST /start_profile body).

    SGLang's start_step counts the server's forward passes since launch, so a delay needs the engine's
    current count (`forward_count`); without it, recording starts now and spans delay + active steps.
    """
    rp = rollout_plan(plan)
    win = engine_window(rp, "SGLang")
    notes = list(win.notes)
    contents = set(rp.contents)
    if "memory" in contents:
        notes.append("SGLang: its start_profile takes no memory content; memory is not collected on this engine")
    if not rp.analysis:
        notes.append("SGLang: runs its trace export/analysis itself (analysis: false has no effect there)")
    activities = ["CPU"] if "cpu" in contents else []
    if "cuda" in contents or not activities:
        activities.append("GPU")
    args: dict[str, Any] = {
        "output_dir": str(output_dir),
        "activities": activities,
        "with_stack": "stack" in contents,
        "record_shapes": "shapes" in contents,
    }
    if win.delay and forward_count is not None:
        args["start_step"] = forward_count + 1 + win.delay
        if win.active:
            args["num_steps"] = win.active
    elif win.delay:
        notes.append(
            f"SGLang: start_step counts forward passes since the server started and the current count "
            f"is unknown; recording {win.delay + (win.active or 0)} steps from now instead of skipping "
            f"{win.delay}"
        )
        if win.active:
            args["num_steps"] = win.delay + win.active
    elif win.active:
        args["num_steps"] = win.active
    return args, notes


# ---- engine output files ----------------------------------------------------------------------------


def _settled(paths: list[Path], wait_s: float) -> None:
    """Engines write traces after stop returns: wait until sizes stop changing (bounded)."""
    deadline = time.monotonic() + wait_s
    last = None
    while time.monotonic() < deadline:
        now = [p.stat().st_size if p.exists() else -1 for p in paths]
        if now == last:
            return
        last = now
        time.sleep(0.2)


def register_outputs(
    run_dir: Path,
    out_dir: Path,
    *,
    step: int,
    replica: int,
    replicas: int,
    before: set[str],
    tool: str = "torch",
    wait_s: float = 5.0,
) -> list[dict]:
    """Manifest rows for the engine traces that appeared in `out_dir` since `before`."""
    deadline = time.monotonic() + wait_s
    while True:
        new = sorted(p for p in out_dir.rglob("*") if p.is_file() and str(p) not in before and recognise(p.name))
        if new or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    _settled(new, wait_s)
    rows = []
    for k, path in enumerate(new):
        kind = recognise(path.name)
        row = {
            "step": step,
            "role": "rollout",
            "stage": "rollout_generate",
            "rank": replica,
            "world_size": replicas,
            "replica": replica,
            "tool": tool,
            "mode": "discrete",
            "unit": "decode_step",
            "window": k,
            "path": str(path.relative_to(run_dir)),
            "bytes": path.stat().st_size,
            "start_ns": None,
            "end_ns": None,
            "status": "complete",
            "engine": kind.engine,
            "engine_part": kind.part,
            "engine_tp_rank": kind.tp_rank,
            "engine_phase": kind.phase,
        }
        append_row(run_dir, row)
        rows.append(row)
    return rows


# ---- adapters ---------------------------------------------------------------------------------------


@dataclass
class EngineAdapter:
    """start_profile(step) / stop_profile() on one replica's engine, on the rollout role's plan."""

    plan: ProfilePlan
    replica: int
    replicas: int
    run_dir: Path
    client: EngineClient
    notes: list[str] = field(default_factory=list)
    profiled: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.run_dir = Path(self.run_dir)
        rollout_plan(self.plan)  # refuse what no engine can do, before the first step
        self._step: int | None = None
        self._before: set[str] = set()

    def selected(self, step: int) -> bool:
        return replica_profiles(self.plan, self.replica, step)

    def out_dir(self, step: int) -> Path:
        raise NotImplementedError

    def start_kwargs(self, step: int) -> dict:
        return {}

    def auto_stops(self) -> bool:
        return False

    def start_profile(self, step: int) -> None:
        if not self.selected(step):
            return
        out = self.out_dir(step)
        out.mkdir(parents=True, exist_ok=True)
        self._before = {str(p) for p in out.rglob("*")}
        self._step = step
        self.client.start_profile(**self.start_kwargs(step))
        self.profiled.append(step)

    def stop_profile(self) -> list[dict]:
        step, self._step = self._step, None
        if step is None:
            return []
        if not self.auto_stops():
            self.client.stop_profile()
        return register_outputs(
            self.run_dir,
            self.out_dir(step),
            step=step,
            replica=self.replica,
            replicas=self.replicas,
            before=self._before,
        )

    def warn(self) -> None:
        for note in self.notes:
            warnings.warn(f"rlprof: {note}", stacklevel=3)


class VllmAdapter(EngineAdapter):
    """vLLM's trace directory is fixed when the engine starts: one per replica, new files per step."""

    def __init__(self, plan, replica, replicas, run_dir, client, version: str):
        super().__init__(plan, replica, replicas, run_dir, client)
        self.version = version
        self.settings, self.notes = vllm_settings(plan, self.trace_dir, version)
        self.warn()

    @property
    def trace_dir(self) -> Path:
        return Path(self.run_dir) / f"vllm_replica{self.replica}"

    def out_dir(self, step: int) -> Path:
        return self.trace_dir


class SglangAdapter(EngineAdapter):
    """SGLang takes an output directory per start_profile call: one per (replica, step)."""

    def __init__(self, plan, replica, replicas, run_dir, client, forward_count=None):
        super().__init__(plan, replica, replicas, run_dir, client)
        self.forward_count = forward_count  # callable -> the engine's forward passes so far, if it exposes them
        _, self.notes = sglang_start_args(plan, self.out_dir(0), forward_count=0 if forward_count else None)
        self.warn()

    def out_dir(self, step: int) -> Path:
        return Path(self.run_dir) / f"sglang_replica{self.replica}" / f"step{step}"

    def start_kwargs(self, step: int) -> dict:
        count = self.forward_count() if self.forward_count else None
        args, _ = sglang_start_args(self.plan, self.out_dir(step), count)
        self._auto = "num_steps" in args
        return args

    def auto_stops(self) -> bool:
        return getattr(self, "_auto", False)


class ReplicaFleet:
    """The driver side: at each step, ask only the selected replicas' engines to profile."""

    def __init__(self, adapters: list[EngineAdapter]):
        self.adapters = adapters

    def start(self, step: int) -> list[int]:
        chosen = [a for a in self.adapters if a.selected(step)]
        for a in chosen:
            a.start_profile(step)
        return [a.replica for a in chosen]

    def stop(self) -> list[dict]:
        rows = []
        for a in self.adapters:
            rows += a.stop_profile()
        return rows
