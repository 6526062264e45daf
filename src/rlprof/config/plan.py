"""The one internal model every dialect resolves to: an immutable, validated ProfilePlan."""

from __future__ import annotations

import msgspec

from ..vocab import ROLES


class Schedule(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """torch.profiler-style schedule, driven on ticks of `unit` inside a window.

    Unit index k (0-based, counted from the window's start) is: skipped for k < skip_first,
    then cycles of `wait` idle, `warmup` started-but-discarded and `active` recorded units,
    `repeat` times (0 = until the window closes).
    """

    unit: str = "step"
    skip_first: int = 0
    wait: int = 0
    warmup: int = 0
    active: int = 1
    repeat: int = 1

    def cycle(self) -> int:
        return self.wait + self.warmup + self.active

    def phase(self, k: int) -> tuple[str, int]:
        """('skip'|'wait'|'warmup'|'active'|'done', cycle index) of unit k."""
        if k < self.skip_first:
            return "skip", -1
        k -= self.skip_first
        cycle, pos = divmod(k, self.cycle())
        if self.repeat and cycle >= self.repeat:
            return "done", cycle
        if pos < self.wait:
            return "wait", cycle
        if pos < self.wait + self.warmup:
            return "warmup", cycle
        return "active", cycle


class MemoryOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    max_entries: int = 100_000
    stack_depth: int = 32
    snapshot_steps: int = 1  # profiled steps kept before a snapshot is dumped (verl's memory_snapshot_num_steps)


class FinishHook(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A shell command run once per process after its last profiled step (verl's finish_hook_*)."""

    cmd: str
    all_ranks: bool = False
    ranks: tuple[int, ...] = ()

    def runs_on(self, rank: int, profiled_here: bool) -> bool:
        """verl's rule: all ranks, else the listed ranks, else the ranks that profiled."""
        if self.all_ranks:
            return True
        return rank in self.ranks if self.ranks else profiled_here


class RolePlan(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    role: str
    enabled: bool
    tool: str | None
    ranks: tuple[int, ...]
    all_ranks: bool
    mode: str
    contents: tuple[str, ...]
    level: str | None
    export_type: str | None
    analysis: bool
    schedule: Schedule | None
    stages: tuple[str, ...]
    steps: tuple[int, ...]
    save_path: str
    max_bytes_per_window: int | None = None
    strict: bool = False
    memory: MemoryOptions = MemoryOptions()
    finish_hook: FinishHook | None = None
    relocate_results: bool = False
    # Stages the schedule samples (None: every window of the role). verl samples update mini-batches only.
    schedule_stages: tuple[str, ...] | None = None
    token_window: tuple[int, int | None] | None = None  # rollout decode steps [start, end) (verl's token window)
    # the host's Python stacks sampled inside each window (collect/host_stacks.py); a plan's contents turn it off
    host_stacks: bool = True

    def schedule_for(self, stage: str | None) -> Schedule | None:
        """The schedule of one window: stage None is the end-to-end window."""
        if self.schedule is None or stage is None or self.schedule_stages is None:
            return self.schedule
        return self.schedule if stage in self.schedule_stages else None

    def collects_on(self, rank: int) -> bool:
        """Whether a process of this role with this rank (replica index for async rollout) collects."""
        if not self.enabled or not self.steps or not self.stages:
            return False
        return self.all_ranks or rank in self.ranks


class SlowRule(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A time `factor` x its baseline, and at least `min_seconds` over it (a spike smaller than that in absolute
    terms is noise on any machine, and nothing worth a trace)."""

    factor: float
    min_seconds: float = 0.02


class TriggerPlan(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`global_profiler.trigger` (rlprof's extension): watch every step, capture the anomalous one while the job
    runs. `slow`: a stage (or the step) slower than factor x the median of its last `window` watched steps.
    `straggler`: a rank slower than factor x the median of the other ranks at the same step. `request`: armed from
    outside (`rlprof capture`). Steps 1..warmup_steps and steps carrying the profiler's own cost (a window open or
    written in the background) never trigger; a busy machine's steps are judged, its contention named where it
    explains them (collect/trigger.py)."""

    slow: SlowRule | None = None
    straggler: SlowRule | None = None
    request: bool = False
    max_captures: int = 3
    cooldown: int = 5  # steps after a capture before the next one may be armed
    keep: str = "next"  # next | slow_only
    warmup_steps: int = 3
    window: int = 20  # recent watched steps the median baseline is taken over
    stages: tuple[str, ...] | None = None  # keep: slow_only: the stages profiled every step (None: every selected)
    baseline: bool = False  # capture the first step after the warm-up too: the normal window captures are put beside


class ProfilePlan(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    dialect: str
    roles: tuple[RolePlan, ...]
    continuous_steps: bool = False
    async_rollout: bool = False
    framework: str | None = None  # whose meaning the dialect was read with, e.g. "verl 0.9.1"
    warnings: tuple[str, ...] = ()  # what resolved but deserves a line (one each)
    # verl: the modules its workers import on `import verl` (VERL_USE_EXTERNAL_MODULES in Ray's runtime_env)
    external_modules: tuple[str, ...] = ()
    trigger: TriggerPlan | None = None  # the watch and its triggers (collect/watch.py); None: off

    def role(self, name: str) -> RolePlan:
        for plan in self.roles:
            if plan.role == name:
                return plan
        raise KeyError(name)

    @property
    def collects_nothing(self) -> bool:
        """No role is enabled with a tool, steps and stages: a run with this plan records nothing."""
        return self.trigger is None and not any(r.enabled and r.steps and r.stages for r in self.roles)

    def step_groups(self, steps: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Collection windows over steps: one per step, or runs of consecutive steps if continuous."""
        if not self.continuous_steps:
            return [(s,) for s in steps]
        groups: list[list[int]] = []
        for s in steps:
            if groups and s == groups[-1][-1] + 1:
                groups[-1].append(s)
            else:
                groups.append([s])
        return [tuple(g) for g in groups]


def disabled_plan(dialect: str = "none") -> ProfilePlan:
    """A plan that collects nothing (no profiling keys in the config)."""
    from ..vocab import DEFAULT_SAVE_PATH

    return ProfilePlan(
        dialect=dialect,
        roles=tuple(
            RolePlan(
                role=r,
                enabled=False,
                tool=None,
                ranks=(),
                all_ranks=False,
                mode="e2e",
                contents=(),
                level=None,
                export_type=None,
                analysis=False,
                schedule=None,
                stages=(),
                steps=(),
                save_path=DEFAULT_SAVE_PATH,
            )
            for r in ROLES
        ),
    )
