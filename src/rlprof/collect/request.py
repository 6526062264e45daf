"""`rlprof capture`: ask a running job for a capture. The request is a file in the run directory that rank 0 reads
at its next step boundary and relays to every rank over the job's own process group (collect/watching.py); the
job answers in `capture/<id>.json` and each rank's captured window carries the request's id in its manifest row."""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from pathlib import Path

from ..errors import RLProfError
from ..vocab import ROLES, STAGE_ROLE, STAGES
from .manifest import read_rows
from .naming import MANIFEST
from .watch import LIVE_FILE, REQUEST_FILE, RESPONSE_DIR, _write_atomic

STALE_STEPS = 20  # a heartbeat older than this many of its steps (and STALE_S) means the job is gone
STALE_S = 120.0


class CaptureRefused(RLProfError):
    """A capture request that cannot be honoured: one line, exit 2."""


def _alive(live: dict) -> bool:
    if live.get("ended"):
        return False
    if live.get("host") == socket.gethostname() and isinstance(live.get("pid"), int):
        try:
            os.kill(live["pid"], 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    age = time.time() - float(live.get("updated") or 0)
    return age <= max(STALE_S, STALE_STEPS * float(live.get("step_seconds") or 0))


def _read_live(d: Path) -> dict | None:
    try:
        return json.loads((d / LIVE_FILE).read_text())
    except (OSError, ValueError):
        return None


def live_run(path: str | os.PathLike) -> tuple[Path, dict]:
    """The live run at `path`: the run directory itself, or the one live run under a save_path."""
    p = Path(path)
    if not p.is_dir():
        raise CaptureRefused(
            f"capture: {path} is not a directory (give the run directory the job printed at its "
            "start, or its save_path)"
        )
    live = _read_live(p)
    if live is not None:
        if not _alive(live):
            raise CaptureRefused(
                f"capture: no live job on {p}: its job "
                + ("ended" if live.get("ended") else "stopped beating (process gone)")
            )
        return p, live
    found = [(d, lv) for d in sorted(p.iterdir()) if d.is_dir() and (lv := _read_live(d)) is not None and _alive(lv)]
    if not found:
        raise CaptureRefused(
            f"capture: no live job on {p} (no run directory under it has a running job with a "
            "trigger: global_profiler.trigger)"
        )
    if len(found) > 1:
        raise CaptureRefused(
            f"capture: {len(found)} live runs under {p}: name one of " + ", ".join(str(d) for d, _ in found)
        )
    return found[0]


def check_request(
    live: dict, *, step: int | None, role: str | None, stage: str | None, ranks: list[int] | None
) -> None:
    """What can be refused before the job is asked: each a one-line CaptureRefused."""
    if role is not None and role not in ROLES:
        raise CaptureRefused(f"capture: --role {role!r} is not allowed; allowed: {', '.join(ROLES)}")
    if stage is not None and stage not in STAGES:
        raise CaptureRefused(f"capture: --stage {stage!r} is not allowed; allowed: {', '.join(STAGES)}")
    if role is not None and stage is not None and STAGE_ROLE[stage] != role:
        raise CaptureRefused(f"capture: --stage {stage} is a stage of role {STAGE_ROLE[stage]}, not of --role {role}")
    if step is not None and step < 1:
        raise CaptureRefused(f"capture: --step {step} is not allowed; allowed: a step >= 1")
    world = int(live.get("world_size") or 1)
    for r in ranks or ():
        if r < 0 or r >= world:
            raise CaptureRefused(f"capture: --ranks {r} is not allowed; allowed: ranks 0..{world - 1} of this job")
    if not live.get("request"):
        raise CaptureRefused("capture: this job takes no requests (global_profiler.trigger.request is false)")
    if step is not None and step <= int(live.get("step") or 0):
        raise CaptureRefused(f"capture: step {step} has passed: the job is at step {live.get('step')}")
    if int(live.get("captures_left") or 0) <= 0:
        raise CaptureRefused(f"capture: the budget is spent: max_captures {live.get('max_captures')} used")


def submit(run_dir: Path, *, step: int | None, role: str | None, stage: str | None, ranks: list[int] | None) -> int:
    rid = secrets.randbits(48)  # exact in the float64 the ranks exchange
    _write_atomic(
        run_dir / REQUEST_FILE,
        json.dumps({"id": rid, "step": step, "role": role, "stage": stage, "ranks": ranks, "asked": time.time()}),
    )
    return rid


def wait_answer(run_dir: Path, rid: int, wait_s: float) -> tuple[dict | None, list[dict]]:
    """(the job's last answer, the manifest rows of the captured windows) once captured and every capturing
    rank's row is in, or when `wait_s` runs out."""
    deadline = time.monotonic() + wait_s
    answer, rows = None, []
    while True:
        try:
            answer = json.loads((run_dir / RESPONSE_DIR / f"{rid}.json").read_text())
        except (OSError, ValueError):
            pass
        if answer and answer.get("status") == "refused":
            return answer, []
        if answer and answer.get("status") == "captured" and (run_dir / MANIFEST).exists():
            rows = [r for r in read_rows(run_dir) if (r.get("trigger") or {}).get("request_id") == rid]
            ranks = answer.get("ranks")
            if isinstance(ranks, list) and {r["rank"] for r in rows} >= set(ranks):
                return answer, rows
        if time.monotonic() >= deadline:
            return answer, rows
        time.sleep(0.2)
