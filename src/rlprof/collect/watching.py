"""The Profiler's side of catching the slow step: every step timed into the per-rank timeline (`watch.py`), the
trigger's decision taken alike on every rank (`trigger.py`), captures opened where it armed them, `keep: slow_only`
probe windows kept or dropped once the step is judged, and rank 0's heartbeat and answers to `rlprof capture`
(`request.py` is the other side). A mixin of `profiler.Profiler`, whose state it reads and keeps."""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

import msgspec

from ..analyze.inputs.timeline_file import BUSY, CAPTURED, CONTENTION, PROFILED, WARMUP
from ..vocab import STAGE_ROLE, STAGES
from ..warn_once import warn_once
from .cpu_wait import HeldOffClock
from .exchange import Exchange
from .trigger import BACKGROUND_WRITE, BUSY_MACHINE, REQ_COLS, Capture, Trigger, encode_request
from .watch import Timers, Watch, read_request, write_live, write_rank_note, write_response

HEARTBEAT_S = 1.0  # rank 0 rewrites its heartbeat (rlprof_live.json) at most this often, and on every capture event


class Watching:
    """Steps watched and captured by a trigger in the plan (a mixin of the Profiler)."""

    def _init_watching(self, watched: bool, decides: bool) -> None:
        self._watch: Watch | None = None
        self._trigger: Trigger | None = None
        self._exchange: Exchange | None = None
        self._capture_rows: dict = {}  # stage (or "e2e") -> the trigger row of the capture open this step
        self._taken: list = []  # the captures taken this step
        self._held: list = []  # keep: slow_only: (window, outputs) waiting for their step's decision
        self._probing: set = set()
        self.probes = {"windows": 0, "kept": 0, "backend_ns": 0}
        self._requests_seen: set = set()
        self._beat_at = 0.0
        self._delegated: dict = {}
        self._captured: dict = {}  # request id -> the windows this rank closed for it this step
        self.step_captures: list[dict] = []  # the trigger rows of the captures the last step ended took
        self._writes_at_start = (0, 0)  # the window writer's (in flight, ended) when the step started
        if watched:
            self._start_watch(decides)

    @property
    def watch_dir(self) -> Path:
        """Where the timeline, the heartbeat and capture requests live: the run directory of the plan's first
        enabled role (the same on every rank and replica)."""
        role = next((r.role for r in self.plan.roles if r.enabled and r.tool), "actor")
        return self.run_dir(role)

    def _start_watch(self, decides: bool) -> None:
        try:
            trigger = self.plan.trigger
            self._watch = Watch(self.watch_dir, self.rank if self.replica is None else self.replica)
            enabled = tuple(r.role for r in self.plan.roles if r.enabled and r.tool and r.stages)
            fixed = {n for r in self.plan.roles if r.enabled for n in r.steps}
            self._trigger = Trigger(trigger, enabled, fixed)
            self._exchange = Exchange(self.world_size) if decides else None
            if trigger.straggler is not None and self.world_size > 1 and decides:
                self._watch.clock = HeldOffClock().start()  # which rank the others waited for (trigger.py)
            self.stage = Timers(self._watch, self._scopes).__getitem__
            if self.rank == 0 and decides:
                self.watch_dir.mkdir(parents=True, exist_ok=True)
                self._heartbeat(step=0)
                print(
                    f"rlprof: watching every step; run directory {self.watch_dir}"
                    + (f" (rlprof capture {self.watch_dir} --next)" if trigger.request else ""),
                    flush=True,
                )
        except Exception as exc:
            self._watch_fault("start", exc, disable=True)

    def _heartbeat(self, **fields) -> None:
        write_live(self.watch_dir, self._trigger, run_id=self.run_id, world_size=self.world_size, **fields)

    def _stop_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is None:
            return
        self.stage = self._scopes.__getitem__
        try:
            watch.close()
            if self.rank == 0 and self._exchange is not None:
                self._heartbeat(ended=True)
            if self.probes["windows"] and self.rank == 0:
                p = self.probes
                print(
                    f"rlprof: keep: slow_only profiled {p['windows']} stage windows on rank 0 and kept "
                    f"{p['kept']}; starting and stopping them took {p['backend_ns'] / 1e9:.2f} s "
                    f"({p['backend_ns'] / 1e6 / p['windows']:.1f} ms per window, besides the profiler's cost "
                    "inside each stage)",
                    flush=True,
                )
        except Exception as exc:
            self._watch_fault("close", exc)

    def _watch_fault(self, phase: str, exc: BaseException, disable: bool = False) -> None:
        """A fault inside the watch or the trigger: one warning, training goes on (without the watch when the
        decision itself cannot be made)."""
        warn_once(
            ("watch", phase),
            "rlprof: the watch failed to %s: %s: %s (training goes on%s)",
            phase,
            type(exc).__name__,
            exc,
            " without it" if disable else "",
            said=self.said,
        )
        if disable:
            self._watch = self._trigger = self._exchange = None
            self.stage = self._scopes.__getitem__

    @property
    def samples_wanted(self) -> bool:
        """Whether the rollout running now records its samples (collect/samples.py): the watch is on, or a window is
        selected for this step on this process. A bare check, asked once per rollout."""
        return self._watch is not None or bool(self._stage_now)

    def arm(self, step: int, stage: str | None, trigger: dict) -> None:
        """Capture `stage` (None: the whole step) at `step` here, as another process decided (the driver of async
        rollout replicas). Needs a trigger in the plan."""
        if self._trigger is not None:
            role = STAGE_ROLE[stage] if stage else None
            self._trigger.pending.append(
                Capture(at_step=step, stage=stage, role=role, trigger=trigger, ranks=(self._watch.rank,))
            )

    def delegated(self, stage: str) -> dict | None:
        """The trigger row of a capture this step of `stage` that a process following this one takes (an async
        rollout replica), or None. Asked by the host between the step's start and the stage."""
        if self._watch is None:
            return None
        return self._delegated.get(stage)

    def _index(self, role: str) -> int:
        async_rollout = role == "rollout" and self.plan.async_rollout and self.replica is not None
        return self.replica if async_rollout else self.rank

    def _watch_begin(self, n: int) -> tuple:
        """The step starts: its stage clocks, and what the trigger armed for it on this process."""
        try:
            self._watch.begin(n)
            self._writes_at_start = self._writer.writes_seen()
            trig = self._trigger
            self._capture_rows, self._probing = {}, set()
            e2e, stages = None, {}
            self._taken = trig.due(n)
            self._delegated = {}
            for cap in self._taken:
                if cap.role is not None and cap.role in trig.enabled_roles and cap.role not in self._capturable:
                    # a role another process hosts (async rollout replicas, a vLLM engine): they follow through
                    # `delegated`, and this process opens nothing, so that its windows and theirs never overlap on a
                    # device they share. A whole-step capture stays here (the rollout is a range of this window).
                    self._delegated.setdefault(cap.stage or "step", cap.trigger)
                # a stage of a role the plan does not collect (the reward's, with only the actor enabled): the
                # whole step is captured with the roles the plan does collect
                whole = cap.role is not None and cap.role not in trig.enabled_roles
                for role, rp in self._capturable.items():
                    if cap.role is not None and role != cap.role and not whole:
                        continue
                    index = self._index(role)
                    here = (index in cap.ranks) if cap.ranks is not None else (rp.all_ranks or index in rp.ranks)
                    if not (here or index in cap.extra_ranks):
                        continue
                    if rp.mode == "e2e" or whole:
                        rp = msgspec.structs.replace(rp, mode="e2e") if whole else rp
                        e2e = e2e or rp
                        self._capture_rows.setdefault("e2e", cap.trigger)
                    else:
                        for stage in (cap.stage,) if cap.stage else rp.stages:
                            stages.setdefault(stage, rp)
                            self._capture_rows.setdefault(stage, cap.trigger)
            plan = trig.plan
            if (
                plan.keep == "slow_only"
                and e2e is None
                and not stages
                and n > plan.warmup_steps
                and trig.budget_left() > 0
            ):
                for role, rp in self._capturable.items():
                    if rp.all_ranks or self._index(role) in rp.ranks:
                        probe = msgspec.structs.replace(rp, mode="discrete")
                        for stage in plan.stages or rp.stages:
                            if stage in rp.stages:
                                stages.setdefault(stage, probe)
                                self._probing.add(stage)
            return e2e, stages
        except Exception as exc:
            self._watch_fault("begin a step", exc)
            return None, {}

    def _watch_end(self, n: int) -> None:
        """The step ended: its record, the decision every rank makes alike, the heartbeat and request answers."""
        watch, trig = self._watch, self._trigger
        try:
            step_s, stages, busy, waited = watch.end()
            held = watch.held_ms()
        except Exception as exc:
            self._watch_fault("time the step", exc)
            step_s, stages, busy, waited = math.nan, [math.nan] * 4 * len(STAGES), False, (math.nan,) * 3
            held = [math.nan] * len(STAGES)
        if self._exchange is None:  # a follower: the host decides and keeps the timeline
            self._capture_rows, self._taken = {}, []
            return
        req = None
        if self.rank == 0 and trig.plan.request:
            try:
                req = read_request(self.watch_dir, self._requests_seen)
            except Exception as exc:
                self._watch_fault("read a capture request", exc)
        # a window written in the background while the step ran: its cost is in the step's times (not the job's own)
        writing = self._wrote_during_step()
        load = (BUSY_MACHINE if busy else 0) | (BACKGROUND_WRITE if writing else 0)
        try:
            matrix = self._exchange.gather([step_s, *stages, float(load), *waited, *encode_request(req), *held])
            ranks = self._exchange.relay(req.get("ranks") if req else None) if matrix[0, REQ_COLS + 4] else None
            decision = trig.decide(n, matrix, ranks)
        except Exception as exc:
            self._watch_fault("decide", exc, disable=True)
            return
        kept = self._settle_probes(decision.flagged) if self._held else False
        if decision.contention is not None and self.rank == 0:
            say_contention(decision.contention, self.said)
        self._record(
            n,
            step_s,
            stages,
            busy,
            captured=bool(self._capture_rows) or kept,
            writing=writing,
            waited=waited,
            contention=decision.contention is not None and decision.contention["rank"] == self._watch.rank,
            verdict=decision.flags(),
        )
        self.step_captures = [c.trigger for c in self._taken]  # what a tracker logs as the step's capture
        if kept:
            self.step_captures.append({k: v for k, v in decision.flagged.items() if k != "ranks"})
        if self._captured:
            try:
                for rid, windows in self._captured.items():
                    write_rank_note(self.watch_dir, rid, self.rank, step=n, windows=windows)
            except Exception as exc:
                self._watch_fault("say what it captured", exc)
            self._captured = {}
        if self.rank == 0:
            try:
                self._answer(n, decision)
                now = time.monotonic()
                if now - self._beat_at >= HEARTBEAT_S or decision.armed or decision.refused or self._taken:
                    self._beat_at = now  # a rename per step costs ms on some disks: at most one a second
                    self._heartbeat(step=n, step_seconds=step_s)
            except Exception as exc:
                self._watch_fault("write the heartbeat", exc)
        self._capture_rows, self._taken = {}, []

    def _note_captured(self, w, outputs) -> None:
        """A window taken for a `rlprof capture` request closed: the rank's note at the step's end lists it (each
        output by the (role, stage, window) of its manifest row), so that the command waits for its row."""
        spec = w.spec
        base = {"role": spec.role, "stage": spec.stage or "e2e"}
        listed = [
            {**base, "window": out.index or 0, "path": out.finalize_to or (out.path.name if out.path else None)}
            for out in outputs or ()
        ] or [{**base, "window": 0, "path": spec.base_name(None), "failed": True}]
        self._captured.setdefault(w.trigger["request_id"], []).extend(listed)

    def _wrote_during_step(self) -> bool:
        """Whether a window was being written in the background at the step's start or end, or one ended during it."""
        (busy_then, ended_then), (busy_now, ended_now) = self._writes_at_start, self._writer.writes_seen()
        return bool(busy_then or busy_now or ended_now != ended_then)

    def _record(
        self,
        n: int,
        step_s: float,
        stages: list,
        busy: bool,
        captured: bool,
        writing: bool,
        waited,
        contention: bool,
        verdict: int = 0,
    ) -> None:
        # profiled: the plan's own window on this rank, or one written in the background while the step ran; either
        # way the profiler's cost is in the step's times
        fixed = any(n in rp.steps for rp in self._collecting.values())
        flags = (
            (BUSY if busy else 0)
            | (WARMUP if n <= self._trigger.plan.warmup_steps else 0)
            | (CAPTURED if captured else 0)
            | (PROFILED if fixed or writing else 0)
            | (CONTENTION if contention else 0)
            | verdict
        )
        try:
            self._watch.write(n, flags, step_s, stages, waited)
        except Exception as exc:
            self._watch_fault("write the timeline", exc)

    def _settle_probes(self, flagged: dict | None) -> bool:
        """keep: slow_only: the windows of this step's slow stage are written, the others dropped."""
        held, self._held = self._held, []
        keep = set()
        if flagged is not None:  # the trigger counted it on the budget
            keep = {w.spec.stage for w, _ in held} if flagged["stage"] == "step" else {flagged["stage"]}
        row = {k: v for k, v in (flagged or {}).items() if k != "ranks"}
        for w, outputs in held:
            if w.spec.stage in keep:
                w.trigger = row
                self.probes["kept"] += 1
                self._writer.write(w, outputs)
                continue
            for out in outputs:
                if out.path is not None and out.path.is_dir():
                    shutil.rmtree(out.path, ignore_errors=True)
                elif out.path is not None:
                    out.path.unlink(missing_ok=True)
        return bool(keep)

    def _answer(self, n: int, decision) -> None:
        """Rank 0 tells `rlprof capture` what became of its request: armed, refused, captured."""
        for rid, why in decision.refused:
            write_response(self.watch_dir, rid, status="refused", reason=why, step=n)
        for cap in decision.armed:
            if cap.request_id is not None:
                write_response(
                    self.watch_dir,
                    cap.request_id,
                    status="armed",
                    at_step=cap.at_step,
                    stage=cap.stage,
                    role=cap.role,
                    ranks=self._capture_ranks(cap),
                )
        for cap in self._taken:
            if cap.request_id is not None:
                write_response(
                    self.watch_dir,
                    cap.request_id,
                    status="captured",
                    at_step=n,
                    stage=cap.stage,
                    role=cap.role,
                    ranks=self._capture_ranks(cap),
                )

    def _capture_ranks(self, cap) -> list[int]:
        """The ranks a capture is taken on, as the plan says (the same answer on every rank)."""
        if cap.ranks is not None:
            return sorted(set(cap.ranks) | set(cap.extra_ranks))
        roles = [r for r in self._trigger.enabled_roles if cap.role in (None, r)]
        if any(self.plan.role(r).all_ranks for r in roles):
            return list(range(self.world_size))
        return sorted({i for r in roles for i in self.plan.role(r).ranks} | set(cap.extra_ranks))


def say_contention(found: dict, said: set) -> None:
    """Once a run: the first straggler or slow step the machine's contention explained (the trigger's
    `Decision.contention`), with its evidence; the later ones are flagged in the timeline (CONTENTION) on the rank
    named, not said again, never captured."""
    ev = found["evidence"]
    others = (
        f", other processes used {ev['others_share']:.0%} of the host" if ev.get("others_share") is not None else ""
    )
    alike = "every rank" if ev["ranks_busy"] == ev["ranks"] else f"{ev['ranks_busy']} of {ev['ranks']} ranks"
    what = (
        f"rank {found['rank']} straggled at step {found['step']} ({found['stage']} {found['seconds']:.3f} s against "
        f"the other ranks' {found['baseline_seconds']:.3f} s)"
        if found["reason"] == "straggler"
        else f"step {found['step']} was slow ({found['stage']} {found['seconds']:.3f} s against "
        f"{found['baseline_seconds']:.3f} s)"
    )
    warn_once(
        "contention",
        "rlprof: %s on a busy machine (%s busy): waited %.0f ms for a core there (%.0f at the usual share), most on "
        "rank %d%s; "
        "contention, not the job: not captured (later such steps are flagged in the timeline)",
        what,
        alike,
        ev["run_wait_ms"],
        ev["expected_wait_ms"],
        ev["rank"],
        others,
        said=said,
    )
