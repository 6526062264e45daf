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
from .watch import LIVE_FILE, REQUEST_FILE, RESPONSE_DIR, _write_atomic, rank_note_path

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


class Answer:
    """What `rlprof capture` learnt of its request: the job's last answer, the manifest rows of the windows it
    captured, and those still being written (or not yet said) when the wait ended. `whole`: every window of the
    capture is listed."""

    def __init__(self, answer: dict | None, rows: list[dict], pending: list[str], whole: bool):
        self.answer, self.rows, self.pending, self.whole = answer, rows, pending, whole


def wait_answer(run_dir: Path, rid: int, wait_s: float) -> Answer:
    """Waits until the request is refused, or captured with every window of the capture listed in the manifest, or
    `wait_s` runs out, or the job is gone. Every window: the rlprof Profiler's ranks each note the windows they took
    for it (`capture/<id>.rank<R>.json`) and the command waits for each one's row; verl's driver, which indexes the
    files verl wrote, says when it has them all (`settled`) and names those it saw still being written."""
    deadline = time.monotonic() + wait_s
    while True:
        answer = _read_json(run_dir / RESPONSE_DIR / f"{rid}.json")
        if answer and answer.get("status") == "refused":
            return Answer(answer, [], [], True)
        got = None
        if answer and answer.get("status") == "captured":
            got = _captured(run_dir, rid, answer)
            if got.whole:
                return got
        gone = not _alive(_read_live(run_dir) or {"ended": True})
        if time.monotonic() >= deadline or gone:
            if gone and answer and answer.get("status") == "captured":
                got = _captured(run_dir, rid, answer)  # what the job wrote before it ended
            return got or Answer(answer, [], [], False)
        time.sleep(0.2)


def _captured(run_dir: Path, rid: int, answer: dict) -> Answer:
    rows = []
    if (run_dir / MANIFEST).exists():
        rows = [r for r in read_rows(run_dir) if (r.get("trigger") or {}).get("request_id") == rid]
    if "settled" in answer:  # verl's driver: it lists what verl wrote, and says when it has it all
        listed = {r.get("path") for r in rows}
        pending = [p for p in answer.get("writing") or () if p not in listed]
        return Answer(answer, rows, pending, bool(answer["settled"]) and not pending)
    have = {(r.get("rank"), r.get("role"), r.get("stage"), r.get("window") or 0) for r in rows}
    pending = []
    for rank in answer.get("ranks") or ():
        note = _read_json(rank_note_path(run_dir, rid, rank))
        if note is None:
            pending.append(f"rank {rank}'s windows (it has not said what it captured)")
            continue
        for w in note.get("windows") or ():
            if (rank, w.get("role"), w.get("stage"), w.get("window") or 0) not in have:
                pending.append(f"rank {rank} {w.get('role')}/{w.get('stage')}: {w.get('path')}")
    return Answer(answer, rows, pending, not pending)


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
