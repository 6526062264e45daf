"""The trigger: what arms a capture, decided at each step end from every rank's stage times.

Every rank contributes one vector per step (its step and stage seconds, whether the step was its own -- not beside a
window written in the background -- and whether its machine was busy, its run-queue wait and other processes' share of
its host, and on rank 0 the request `rlprof capture` left); one all_gather over the job's own process group gives
every rank the same matrix, and the same deterministic rule below runs on it everywhere, so a capture is of the same
step on every rank that takes it. Single process: the matrix is the local row.

The rule (steps 1..warmup_steps, steps during which any rank wrote a window in the background and the plan's own
profiled steps are neither judged nor kept as baseline; a busy machine's steps are judged like any other):
- straggler: at this step, in a stage, the slowest rank took more than factor x the median of the other ranks and
  at least min_seconds more (ranks sharing a busy host carry its load alike: the one slower beyond it straggles);
  or, where the ranks' times in the stage are alike (they wait for each other in its collectives), one rank was
  held off its cores (collect/cpu_wait.py's HeldOffClock: stopped, frozen, throttled) so much longer than the others
  that its time less that extra hold is over the same line. Either way, where the extra hold is half the excess or
  more, the finding carries `cause: held_off` and the evidence (its hold, and how much longer than the others'), and
  is captured: the job's rank, held by something outside it;
- slow: the job's time of a stage (its slowest rank) is over factor x the median of the last `window` judged steps
  (since the last slow capture: the baseline restarts after one, so a new level is captured once) and at least
  min_seconds over it; the step itself is judged when no stage is;
- a straggler in the first stage (of the step's order) where any rank straggles wins: the other ranks wait for it at
  their next collective, so they look slow in a later stage; else the slow stage with the largest excess (the step
  itself only when no stage is). It arms a capture of the next step, within max_captures and `cooldown` steps
  after the previous one.
- contention: where the contention explains the finding (analyze/inputs/busy_machine.py's rule: the ranks it held up
  waited for a core in the slow stage beyond the wait their time on a core there would have had at their usual share
  -- the other ranks' at this step for a straggler, each rank's own over the baseline's steps for a slow step -- half
  the excess or more), the finding carries `cause: contention` and the evidence (the rank that waited most, the ranks'
  wait there and the wait expected at their usual share, other processes' share of the host). It is
  recorded, not captured (a trace of a rank waiting for a core shows nothing its wait does not, and the budget and
  the cooldown stay for the job's own slowness): the decision says it (`Decision.contention`) for the host to say
  once and flag on that rank in the timeline (CONTENTION); a slow step so explained is kept out of the baseline.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..analyze.inputs.busy_machine import expected_wait_ms, explains
from ..analyze.inputs.timeline_file import JUDGED, SLOW, STRAGGLER
from ..config.plan import TriggerPlan
from ..vocab import ROLES, STAGE_ROLE, STAGES

TIMES = 1 + len(STAGES)  # the step, then each stage
STARTS = TIMES  # then when each stage was first entered in the step
STAGE_WAITS = STARTS + len(STAGES)  # then the step thread's wait for a core in each stage, ms (NaN: not known)
STAGE_CPUS = STAGE_WAITS + len(STAGES)  # then its time on a core in each stage, ms
BUSY_COL = STAGE_CPUS + len(STAGES)  # BUSY_MACHINE (judged), BACKGROUND_WRITE (not the job's own time: not judged)
BUSY_MACHINE, BACKGROUND_WRITE = 1, 2
CPU_COL = BUSY_COL + 1  # the step thread's time on a core over the step, ms (NaN: the kernel does not say)
WAIT_COL = CPU_COL + 1  # and its run-queue wait, ms
OTHERS_COL = WAIT_COL + 1  # other processes' share of the host's CPUs over the step (NaN: not known)
REQ_COLS = (
    OTHERS_COL + 1
)  # request: id, step (0: next), stage index (-1: the step), role index (-1: every role), ranks?
HELD_COLS = REQ_COLS + 5  # then how long the process was held off its cores in each stage, ms (cpu_wait.HeldOffClock)
WIDTH = HELD_COLS + len(STAGES)
MIN_HISTORY = 3  # judged steps before a median is a baseline


@dataclass
class Capture:
    """A capture armed for `at_step`. ranks None: the ranks the role selects; `extra_ranks` are captured besides
    (a straggler's slow rank and one healthy rank)."""

    at_step: int
    stage: str | None
    role: str | None
    trigger: dict
    ranks: tuple[int, ...] | None = None
    extra_ranks: tuple[int, ...] = ()
    request_id: int | None = None


@dataclass
class Decision:
    armed: list = field(default_factory=list)  # Capture
    refused: list = field(default_factory=list)  # (request id, one line why)
    flagged: dict | None = None  # keep: slow_only: this step's finding, within the budget: its windows are kept
    judged: bool = False  # the rule judged this step (not warm-up or profiled): the timeline's JUDGED flag
    found: dict | None = None  # what it found there (slow, straggler), armed or not (budget, cooldown, contention)
    contention: dict | None = None  # a finding the machine's contention explains: said and flagged, not captured

    def flags(self) -> int:
        """The verdict as the timeline's flags say it (the same on every rank); a finding contention explained is the
        machine's (CONTENTION, on the rank it names), not the job's slow step or straggler."""
        reason = (self.found or {}).get("reason") if self.contention is None else None
        return (
            (JUDGED if self.judged else 0)
            | (SLOW if reason == "slow" else 0)
            | (STRAGGLER if reason == "straggler" else 0)
        )


def encode_request(req: dict | None) -> list[float]:
    if not req:
        return [0.0] * 5
    stage = STAGES.index(req["stage"]) if req.get("stage") in STAGES else -1
    role = ROLES.index(req["role"]) if req.get("role") in ROLES else -1
    return [float(req["id"]), float(req.get("step") or 0), float(stage), float(role), float(bool(req.get("ranks")))]


def _median_rows(rows: np.ndarray) -> np.ndarray:
    """Column medians ignoring NaN, NaN where a column has no number (without numpy's all-NaN warning); one
    vectorised median, a column-by-column one only for columns with some NaN (a stage some steps skip)."""
    out = np.median(rows, axis=0)
    for j in np.flatnonzero(np.isnan(out)):
        col = rows[:, j]
        col = col[~np.isnan(col)]
        if len(col):
            out[j] = np.median(col)
    return out


def sched_columns(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's (time on a core, wait for one) at this step, each [ranks x (the step, then each stage)], ms; NaN
    where not known."""
    cpu = np.concatenate([matrix[:, CPU_COL : CPU_COL + 1], matrix[:, STAGE_CPUS:BUSY_COL]], axis=1)
    waits = np.concatenate([matrix[:, WAIT_COL : WAIT_COL + 1], matrix[:, STAGE_WAITS:STAGE_CPUS]], axis=1)
    return cpu, waits


def wait_share(cpu: np.ndarray, waits: np.ndarray) -> np.ndarray:
    """The wait as a share of the ready time (on a core or waiting for one); NaN where there was none."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cpu + waits > 0, waits / (cpu + waits), np.nan)


def _contention(found: dict, matrix: np.ndarray, cpu, waits, usual: np.ndarray, excess: float, ranks) -> None:
    """Where contention explains the finding (busy_machine.py's rule: the busy `ranks`' waits in the finding's stage
    beyond the wait their time on a core there would have had at their `usual` share, summed): `cause: contention` and
    the evidence, on the finding."""
    busy = [r for r in ranks if int(matrix[r, BUSY_COL]) & BUSY_MACHINE and np.isfinite(waits[r] + cpu[r])]
    expected = {r: expected_wait_ms(float(cpu[r]), float(usual[r])) for r in busy}
    extra = {r: max(0.0, float(waits[r]) - expected[r]) for r in busy}
    if not busy or not explains(sum(extra.values()), excess):
        return
    most = max(busy, key=extra.__getitem__)
    others = matrix[busy, OTHERS_COL]
    found["cause"] = "contention"
    found["evidence"] = {
        "rank": most,
        "run_wait_ms": float(sum(waits[r] for r in busy)),
        "expected_wait_ms": float(sum(expected.values())),
        "others_share": float(np.median(others[np.isfinite(others)])) if np.isfinite(others).any() else None,
        "ranks_busy": int(sum(int(b) & BUSY_MACHINE for b in matrix[:, BUSY_COL])),
        "ranks": len(matrix),
    }


def held_columns(matrix: np.ndarray) -> np.ndarray:
    """Each rank's time held off its cores in each stage at this step, ms [ranks x stages]; NaN where no clock ran (a
    single process, a host that sends no such columns)."""
    if matrix.shape[1] < WIDTH:
        return np.full((len(matrix), len(STAGES)), np.nan)
    return matrix[:, HELD_COLS:WIDTH]


def _held_off(col: np.ndarray, held: np.ndarray, rule) -> tuple[int, float, float] | None:
    """(rank, its stage time had it been held no longer than the others, the others' median hold) where one rank was
    held off its cores so much longer than the others that its stage, less that extra hold, would have been over
    the rule's line: factor x less than it took, and min_seconds less. The ranks wait for each other inside a stage
    with collectives, so their stage times are alike; the hold says which rank they waited for."""
    ok = np.isfinite(held) & np.isfinite(col)
    if ok.sum() < 2:
        return None
    ranks = np.flatnonzero(ok)
    k = int(ranks[np.argmax(held[ranks])])
    others = float(np.median(held[ranks[ranks != k]]))
    extra = (float(held[k]) - others) / 1e3
    stage = float(col[k])
    if extra < rule.min_seconds or extra < (1 - 1 / rule.factor) * stage:
        return None
    return k, stage - extra, others


def _median_others(col: np.ndarray, k: int, empty=None):
    """The median of `col` over the ranks but k, NaN left out; `empty` where none is known."""
    others = np.delete(col, k)
    others = others[~np.isnan(others)]
    return float(np.median(others)) if len(others) else empty


def _over(value: float, base: float, rule) -> float:
    """The excess in seconds when `value` is over the rule's line, else 0."""
    if not (np.isfinite(value) and np.isfinite(base)) or value <= rule.factor * base:
        return 0.0
    excess = value - base
    return excess if excess >= rule.min_seconds else 0.0


class Trigger:
    def __init__(self, plan: TriggerPlan, enabled_roles: tuple[str, ...], fixed_steps=frozenset()):
        self.plan = plan
        # steps profiled anyway (global_profiler.steps) or captured: the profiler's own cost is in their times, so
        # they are neither judged nor kept as baseline (keep: slow_only profiles every step alike: judged)
        self.profiled: set = set(fixed_steps)
        self.enabled_roles = enabled_roles  # roles the plan lets collect (the same on every rank)
        self.history: deque = deque(maxlen=plan.window)
        self.shares: deque = deque(maxlen=plan.window)  # each judged step's wait shares [ranks x (step, stages)]
        self.used = 0
        self.judged = False  # whether the last step judge() saw was judged
        self.last_armed: int | None = None
        self.pending: list[Capture] = []
        if plan.baseline and plan.keep == "next":  # a normal window to put captures beside (outside the budget)
            at = plan.warmup_steps + 1
            self.pending.append(
                Capture(
                    at_step=at,
                    stage=None,
                    role=None,
                    trigger={
                        "reason": "baseline",
                        "step": at,
                        "stage": "step",
                        "rank": None,
                        "seconds": None,
                        "baseline_seconds": None,
                    },
                )
            )

    def budget_left(self) -> int:
        return self.plan.max_captures - self.used

    def judge(self, step: int, matrix: np.ndarray) -> dict | None:
        """This step's finding ({reason, step, stage, rank, seconds, baseline_seconds, ranks}, with `cause` and
        `evidence` where contention explains it) or None; `judged` says whether the step was judged at all."""
        plan = self.plan
        times, unjudged = matrix[:, :TIMES], matrix[:, BUSY_COL].astype(np.int64) & BACKGROUND_WRITE
        self.judged = not (step <= plan.warmup_steps or unjudged.any() or step in self.profiled)
        if not self.judged:
            return None
        found, best = None, 0.0
        if plan.straggler is not None and len(times) > 1:
            first_at = np.inf
            held_ms = held_columns(matrix)
            for j in range(1, TIMES):
                col = times[:, j]
                if np.isnan(col).all():
                    continue
                slow = int(np.nanargmax(col))
                base = _median_others(col, slow)
                excess = _over(float(col[slow]), base, plan.straggler) if base is not None else 0.0
                held = None
                if excess:  # slower than the others: held off its cores for most of its excess, where it was
                    extra = held_ms[slow, j - 1] - _median_others(held_ms[:, j - 1], slow, np.nan)
                    if np.isfinite(extra) and explains(float(extra), excess):  # the same share as a core wait's
                        held = (float(held_ms[slow, j - 1]), float(extra))
                else:  # stage times alike: the rank the others waited for inside it was held off its cores
                    off = _held_off(col, held_ms[:, j - 1], plan.straggler)
                    if off is not None:
                        slow, base, others_held = off
                        excess = float(col[slow]) - base
                        held = (float(held_ms[slow, j - 1]), float(held_ms[slow, j - 1]) - others_held)
                starts = matrix[:, STARTS + j - 1]  # the order of the stages, as the ranks ran them (median)
                start = float(np.median(starts[~np.isnan(starts)])) if (~np.isnan(starts)).any() else np.inf
                if excess and (start < first_at or (start == first_at and excess > best)):
                    others_at = np.array([r for r in range(len(col)) if r != slow and np.isfinite(col[r])])
                    healthy = int(others_at[np.argmin(np.abs(col[others_at] - np.median(col[others_at])))])
                    first_at, best = start, excess
                    found = {
                        "reason": "straggler",
                        "step": step,
                        "stage": STAGES[j - 1],
                        "rank": slow,
                        "seconds": float(col[slow]),
                        "baseline_seconds": base,
                        "ranks": (slow, healthy),
                    }
                    if held is not None:
                        found["cause"] = "held_off"
                        found["evidence"] = {"rank": slow, "held_ms": held[0], "extra_held_ms": held[1]}
        cpu, waits = sched_columns(matrix)
        shares = wait_share(cpu, waits)
        if found is not None and "cause" not in found:  # against the other ranks at this step: the usual share
            slow, j = found["rank"], 1 + STAGES.index(found["stage"])
            others = np.delete(shares[:, j], slow)
            usual = np.full(len(matrix), np.median(others[~np.isnan(others)]) if (~np.isnan(others)).any() else np.nan)
            excess = found["seconds"] - found["baseline_seconds"]
            _contention(found, matrix, cpu[:, j], waits[:, j], usual, excess, (slow,))
        job = np.fmax.reduce(times, axis=0)  # the slowest rank's time, NaN only where no rank ran it
        if found is None and plan.slow is not None and len(self.history) >= MIN_HISTORY:
            base = _median_rows(np.asarray(self.history))
            for j in list(range(1, TIMES)) + [0]:
                if j == 0 and found is not None:
                    break  # the step is judged only when no stage explains it
                excess = _over(float(job[j]), float(base[j]), plan.slow)
                if excess > best:
                    col = times[:, j]
                    best, found = (
                        excess,
                        {
                            "reason": "slow",
                            "step": step,
                            "stage": STAGES[j - 1] if j else "step",
                            "rank": int(np.nanargmax(col)),
                            "seconds": float(job[j]),
                            "baseline_seconds": float(base[j]),
                            "ranks": None,
                        },
                    )
            if found is not None:
                j = 0 if found["stage"] == "step" else 1 + STAGES.index(found["stage"])
                usual = _median_rows(np.asarray(self.shares)[:, :, j]) if self.shares else np.zeros(len(matrix))
                _contention(found, matrix, cpu[:, j], waits[:, j], usual, best, range(len(matrix)))
        if found is None or found.get("cause") != "contention" or found["reason"] == "straggler":
            self.history.append(job)  # a step the machine's contention slowed is no baseline of the job's own
            self.shares.append(shares)
        return found

    def decide(self, step: int, matrix: np.ndarray, ranks_asked=None) -> Decision:
        """What this step end arms; identical on every rank given the same matrix."""
        out = Decision()
        req = matrix[0, REQ_COLS:]
        if req[0] > 0:
            self._request(step, req, ranks_asked, out)
        found = self.judge(step, matrix)
        out.judged, out.found = self.judged, found
        if found is not None and found.get("cause") == "contention":
            out.contention = found  # the machine was slow, not the job: said and flagged, never captured
            return out
        if found is not None and self.plan.keep == "slow_only":
            # this step's windows are kept instead of arming the next (the Profiler keeps them), on the budget:
            # counted here, on every rank alike, whether or not a rank profiled the stage
            if self.used < self.plan.max_captures:
                self.used += 1
                out.flagged = found
                self._restart_baseline(found)
            return out
        if found is None:
            return out
        cooled = self.last_armed is None or step - self.last_armed >= self.plan.cooldown
        if self.used < self.plan.max_captures and cooled and not self.pending:
            self.arm(
                Capture(
                    at_step=step + 1,
                    stage=None if found["stage"] == "step" else found["stage"],
                    role=None if found["stage"] == "step" else STAGE_ROLE[found["stage"]],
                    trigger={k: v for k, v in found.items() if k != "ranks"},
                    extra_ranks=tuple(found["ranks"] or ()),
                ),
                step,
                out,
            )
            self._restart_baseline(found)
        return out

    def _restart_baseline(self, found: dict) -> None:
        """A slow step was captured: the baseline restarts from the judged steps after it, so that a level the job
        moved to (a stage slowed from step N on) is captured once, not again each time the cooldown ends while the
        old steps still hold the median. A spike's next steps are back at the old level: nothing is lost."""
        if found["reason"] == "slow":
            self.history.clear()

    def arm(self, cap: Capture, step: int, out: Decision) -> None:
        self.used += 1
        self.last_armed = step
        self.pending.append(cap)
        out.armed.append(cap)

    def _request(self, step: int, req: np.ndarray, ranks_asked, out: Decision) -> None:
        rid, at, stage_i, role_i = int(req[0]), int(req[1]), int(req[2]), int(req[3])
        stage = STAGES[stage_i] if stage_i >= 0 else None
        role = ROLES[role_i] if role_i >= 0 else (STAGE_ROLE[stage] if stage else None)
        if not self.plan.request:
            out.refused.append(
                (rid, "this run's trigger does not take requests (global_profiler.trigger.request: false)")
            )
        elif at and at <= step:
            out.refused.append((rid, f"step {at} has passed: the job is at the end of step {step}"))
        elif self.used >= self.plan.max_captures:
            out.refused.append((rid, f"the budget is spent: {self.used} of max_captures {self.plan.max_captures} used"))
        elif role is not None and role not in self.enabled_roles:
            out.refused.append(
                (
                    rid,
                    f"role {role} collects nothing in this run's plan (enabled: "
                    f"{', '.join(self.enabled_roles) or 'none'})",
                )
            )
        else:
            trigger = {
                "reason": "request",
                "step": step,
                "stage": stage or "step",
                "rank": None,
                "seconds": None,
                "baseline_seconds": None,
                "request_id": rid,
            }
            self.arm(
                Capture(
                    at_step=at or step + 1,
                    stage=stage,
                    role=role,
                    trigger=trigger,
                    ranks=tuple(ranks_asked) if ranks_asked else None,
                    request_id=rid,
                ),
                step,
                out,
            )

    def due(self, step: int) -> list[Capture]:
        """The captures armed for `step`, taken off the pending list."""
        now = [c for c in self.pending if c.at_step == step]
        if now and self.plan.keep == "next":
            self.profiled.add(step)
        if self.pending:  # and those whose step never came (a host that skipped step numbers)
            self.pending = [c for c in self.pending if c.at_step > step]
        return now
