"""verl's finish hook (`finish_hook_cmd`), run by rlprof's Profiler as verl's own workers run it: once per process,
after its last profiled step (or at close, when the run ended before it), through the shell with verl's
VERL_PROFILE_* environment. The only part of the collection runtime that knows verl's conventions."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

from ..config.plan import ProfilePlan, RolePlan

log = logging.getLogger("rlprof")


class FinishHook:
    """The hook one process runs: its role's plan and the last step it waits for."""

    def __init__(self, rp: RolePlan):
        self.rp, self.last = rp, max(rp.steps)
        self.profiled: set[int] = set()  # the listed steps this process has run
        self.done = False

    @classmethod
    def of_process(
        cls, plan: ProfilePlan, roles: tuple[str, ...], rank: int, replica: int | None
    ) -> "FinishHook | None":
        """The hook this process runs, as verl's worker does: the first hosted role's (a combined
        actor_rollout_ref worker uses the actor's profiler), when enabled and selected for this rank."""
        for r in roles:
            rp = plan.role(r)
            if rp.enabled and rp.finish_hook is not None and rp.steps:
                index = replica if (r == "rollout" and plan.async_rollout and replica is not None) else rank
                return cls(rp) if rp.finish_hook.runs_on(index, rp.collects_on(index)) else None
        return None

    def step_ended(self, prof, n: int) -> None:
        if n in self.rp.steps:
            self.profiled.add(n)
        if n >= self.last:
            self.run(prof)

    def closing(self, prof) -> None:
        if self.profiled:  # the run ended before the last listed step
            self.run(prof)

    def run(self, prof) -> None:
        """Once, after `prof`'s traces are written. A failing command is a warning, never an error."""
        if self.done:
            return
        self.done = True
        rp = self.rp
        prof.wait_written()
        parts = [r for r in ("actor", "rollout", "ref") if r in prof.roles]
        run_dir = prof.run_dir(rp.role) if prof.run_id else Path(rp.save_path)
        env = dict(
            os.environ,
            VERL_PROFILE_SAVE_PATH=str(run_dir),
            VERL_PROFILE_TOOL=rp.tool or "",
            VERL_PROFILE_RANK=str(prof.rank),
            VERL_PROFILE_PID=str(os.getpid()),
            VERL_PROFILE_ROLE="_".join(parts or prof.roles),
            RLPROF_SAVE_PATH=rp.save_path,
            RLPROF_RUN_DIR=str(run_dir),
        )
        cmd = rp.finish_hook.cmd
        print(f"[rlprof][finish_hook] rank {prof.rank}: running: {cmd}", flush=True)
        try:
            proc = subprocess.run(
                ["/bin/sh", "-c", cmd], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        except Exception as exc:
            log.warning("rlprof: finish hook could not start on rank %s: %s (training goes on)", prof.rank, exc)
            return
        for line in proc.stdout.splitlines():
            print(f"[rlprof][finish_hook] rank {prof.rank}: {line}", flush=True)
        if proc.returncode != 0:
            log.warning(
                "rlprof: finish hook exited with %s on rank %s: %s (training goes on)", proc.returncode, prof.rank, cmd
            )
