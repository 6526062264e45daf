"""Catching the slow step inside verl's whole job: main_ppo's driver (its single controller, the v1 trainer in
the TaskRunner process) watches every step, decides once, and verl's own profiling path captures the next step on
its workers and rollout replicas.

How it gets there: the verl plugin (verl/loader.py, loaded by verl in every process) calls `attach` right after
`verl.trainer.ppo.v1.trainer_base` is imported; `attach` wraps five methods of its PPOTrainer in memory (no verl
file changes). Each wrapper costs one attribute lookup when the config has no `global_profiler.trigger`.

At each step's end (`_compute_metrics`, where verl builds the metrics it logs for the step; on a trainer without it,
at the next step's head, `_start_profiling`) the driver:
- writes the step that just ended to the timeline (`<save_path>/<run_id>/timeline/rank0.bin`): its wall time and
  each stage's, as verl's own timers measured them (`timing_raw`: gen, reward, old_log_prob, ref, update_actor, ...
  under rlprof's stage names); the driver sees the job, not its ranks, so the timeline holds one row per step;
- reads the request `rlprof capture` left (collect/request.py) and runs the trigger's rule (collect/trigger.py: slow,
  warmup_steps, max_captures, cooldown, request) on that row, its verdict in the row's flags (at the last step
  no request is read: nothing follows it to capture);
- adds rlprof's measures of the step to the metrics verl logs (step_log.py);
- when a capture is due for the step about to start, sets verl's own `curr_step_profile`, so that verl starts and
  stops its workers' profilers (their configured tools, rlprof's micro-batch sampler where asked) and the rollout
  replicas' engine profilers for that step, exactly as it does for a step listed in `global_profiler.steps`;
- indexes the files the captured step wrote under save_path in the run directory's manifest, each row with the
  `trigger` that explains it (reason, the step seen slow, its stage, its time and the baseline), and answers the
  request.
verl's profiling path captures whole steps: a slow stage arms the next step on every role verl profiles (its
stage is in the row); a request's role, stage and ranks do not narrow it. The straggler rule needs each rank's
times, which the driver does not see: in main_ppo it never fires.

Never breaks the host: a fault anywhere here is one warning and main_ppo goes on without the trigger; a bad
trigger config is one warning naming the key (`rlprof plan` refuses it before the job starts).

Over 400 lines because it is one job, the trigger in main_ppo's driver: the wrappers, the timeline of verl's
timers, the requests and the index of what verl wrote all read and change the driver's one state.
"""

from __future__ import annotations

import functools
import math
import os
import time
from pathlib import Path

from ...warn_once import warn_once
from ..vllm.environment import ENV_PLAN
from .rollout_plan import ENV_RUN_ID

WRAPPED = ("fit", "_start_profiling", "_stop_profiling")
_DRIVER = "_rlprof_trigger"  # the trainer's DriverTrigger, False once looked for and absent (or failed)
_STEP_LOG = "_rlprof_step_log"  # the trainer's StepLog (step_log.py), likewise
_said: set = set()  # what the driver's trigger said (its own scope of warn_once, cleared by its tests)


def _say(key, message: str) -> None:
    warn_once(key, "%s", message, said=_said)


def attach(module) -> None:
    """Wrap the v1 trainer's step boundaries (called once verl's trainer module is imported)."""
    cls = getattr(module, "PPOTrainer", None)
    if cls is None or getattr(cls, "_rlprof_trigger_attached", False):
        return
    missing = [name for name in WRAPPED if not callable(getattr(cls, name, None))]
    if missing:
        _say(
            "layout",
            f"rlprof: verl's PPOTrainer has no {', '.join(missing)}: global_profiler.trigger cannot "
            "watch main_ppo's steps here (verl goes on without it)",
        )
        return
    cls.fit = _fit(cls.fit)
    if callable(getattr(cls, "_start_rollout_profiling", None)) and callable(
        getattr(cls, "_rollout_server_managers", None)
    ):
        cls._start_rollout_profiling = _start_rollout(cls._start_rollout_profiling)
    cls._start_profiling = _start(cls._start_profiling)
    cls._stop_profiling = _stop(cls._stop_profiling)
    if callable(getattr(cls, "_compute_metrics", None)):
        cls._compute_metrics = _metrics(cls._compute_metrics)
    cls._rlprof_trigger_attached = True


def _driver(trainer):
    """The trainer's DriverTrigger, made on first use from its config; None without a trigger."""
    found = trainer.__dict__.get(_DRIVER)
    if found is None:
        found = trainer.__dict__[_DRIVER] = _build(trainer) or False
    return found or None


def _build(trainer):
    try:
        block = _select(trainer.config, "global_profiler.trigger")
        if block is None:
            return None
        return DriverTrigger(trainer)
    except Exception as exc:
        from ...errors import ConfigError

        what = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
        _say(("build", what), f"rlprof: global_profiler.trigger is not used: {what}; main_ppo goes on without it")
        return None


def _fault(trainer, phase: str, exc: BaseException) -> None:
    _say(
        ("fault", phase),
        f"rlprof: the trigger failed to {phase} in main_ppo's driver ({type(exc).__name__}: "
        f"{exc}); main_ppo goes on without it",
    )
    driver = trainer.__dict__.get(_DRIVER)
    trainer.__dict__[_DRIVER] = False
    if driver:
        try:
            driver.close(ended=True)
        except Exception:
            pass


def _start(original):
    @functools.wraps(original)
    def _start_profiling(self, *args, **kwargs):
        driver = _driver(self)
        if driver is not None:
            try:
                driver.step_begins(self)
            except Exception as exc:
                _fault(self, "begin a step", exc)
        return original(self, *args, **kwargs)

    return _start_profiling


def _stop(original):
    @functools.wraps(original)
    def _stop_profiling(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        driver = self.__dict__.get(_DRIVER)
        if driver:
            try:
                driver.step_ran(self)
            except Exception as exc:
                _fault(self, "end a step", exc)
        return out

    return _stop_profiling


def _start_rollout(original):
    """Where rlprof's vLLM plugin keeps the rollout's decode window (RLPROF_PLAN, handed over by the verl plugin), the
    replicas' start_profile names the step and, for a capture, why: `profile_prefix`, verl's own argument, which
    reaches the plugin in the engine's worker (integrations/vllm/session.py reads it)."""

    @functools.wraps(original)
    def _start_rollout_profiling(self, *args, **kwargs):
        driver = self.__dict__.get(_DRIVER)
        if driver and os.environ.get(ENV_PLAN) and not args and not kwargs:
            try:
                prefix = driver.rollout_prefix(int(self.global_steps))
                for manager in self._rollout_server_managers():
                    manager.start_profile(profile_prefix=prefix)
                return None
            except Exception as exc:
                _fault(self, "start the rollout's window", exc)
        return original(self, *args, **kwargs)

    return _start_rollout_profiling


def _metrics(original):
    """verl builds the step's metrics dict here, right before `Tracking.log(data=metrics, step=...)` hands it to every
    backend of `trainer.logger`: the watched step ends now (its timeline record, the trigger's verdict), and rlprof's
    measures of it join the dict (step_log.py)."""

    @functools.wraps(original)
    def _compute_metrics(self, batch, metrics, *args, **kwargs):
        out = original(self, batch, metrics, *args, **kwargs)
        step = int(self.global_steps)
        driver = self.__dict__.get(_DRIVER)
        if driver and driver.open_step == step:
            try:
                last = step >= int(getattr(self, "total_training_steps", step + 1) or step + 1)
                driver.timing = getattr(self, "timing_raw", None)
                driver._step_ended(step, requests=not last)
            except Exception as exc:
                _fault(self, "end a step", exc)
                driver = None
        log = _step_log(self)
        if log is not None:
            try:
                captures = [c.trigger for c in driver.taken.get(step, ())] if driver else ()
                log.add(self, metrics, step, captures)
            except Exception as exc:
                self.__dict__[_STEP_LOG] = False
                _say(
                    ("step-log", type(exc).__name__),
                    f"rlprof: rlprof's measures of the step could not join verl's metrics ({type(exc).__name__}: "
                    f"{exc}); main_ppo goes on without them",
                )
        return out

    return _compute_metrics


def _step_log(trainer):
    """The driver's StepLog (step_log.py), made on first use, in the trigger's run directory, else (profiled steps,
    no trigger) in the one the agent loop's samples go to; None where the job neither watches nor profiles."""
    found = trainer.__dict__.get(_STEP_LOG)
    if found is None:
        try:
            driver = trainer.__dict__.get(_DRIVER)
            run_dir = driver.run_dir if driver else _profiled_run_dir(trainer.config)
            if run_dir is not None:
                from .step_log import StepLog

                found = StepLog(run_dir)
            else:
                found = False
        except Exception as exc:
            _say(("step-log", type(exc).__name__), f"rlprof: rlprof's measures do not join verl's metrics ({exc})")
            found = False
        trainer.__dict__[_STEP_LOG] = found
    return found or None


def _profiled_run_dir(config) -> Path | None:
    """Where a job that profiles listed steps (no trigger) keeps its samples: save_path / the run id."""
    profilers = ("actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref", "critic")
    run_id = os.environ.get(ENV_RUN_ID)
    if not (
        run_id
        and _select(config, "global_profiler.steps")
        and any(_select(config, f"{p}.profiler.enable") for p in profilers)
    ):
        return None
    return Path(_select(config, "global_profiler.save_path") or "outputs/profile").resolve() / run_id


def _fit(original):
    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        finally:
            driver = self.__dict__.get(_DRIVER)
            if driver:
                try:
                    driver.close()
                except Exception as exc:
                    _fault(self, "close", exc)

    return fit


def _select(config, key: str):
    """A key of verl's config (an OmegaConf DictConfig) as plain Python, or None."""
    from omegaconf import OmegaConf

    value = OmegaConf.select(config, key, default=None)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


class DriverTrigger:
    """The watch and the trigger of one main_ppo run, in its driver."""

    def __init__(self, trainer):
        from omegaconf import OmegaConf

        from ...collect.naming import new_run_id
        from ...collect.trigger import Trigger
        from ...collect.watch import Watch
        from ...config import resolve_plan

        data = OmegaConf.to_container(trainer.config, resolve=True)
        plan = resolve_plan(data)  # a bad trigger value: ConfigError naming the key
        if plan.trigger.keep != "next":
            from ...errors import ConfigError

            raise ConfigError(
                "global_profiler.trigger.keep",
                plan.trigger.keep,
                "next (in main_ppo verl's own "
                "profiling path captures: it profiles whole steps, it keeps no window it opened)",
            )
        self.plan = plan
        self.steps = set(_select(trainer.config, "global_profiler.steps") or ())
        self.save_path = Path(_select(trainer.config, "global_profiler.save_path") or "outputs/profile").resolve()
        self.run_id = os.environ.get(ENV_RUN_ID) or new_run_id()  # shared with the agent loop's sample records
        self.run_dir = self.save_path / self.run_id
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.enabled = tuple(r.role for r in plan.roles if r.enabled and r.tool and r.stages)
        self.trigger = Trigger(plan.trigger, self.enabled, frozenset(self.steps))
        self.watch = Watch(self.run_dir, 0)
        trainer_cfg = _select(trainer.config, "trainer") or {}
        self.world_size = int(trainer_cfg.get("n_gpus_per_node") or 1) * int(trainer_cfg.get("nnodes") or 1)
        self.requests_seen: set = set()
        self.open_step: int | None = None
        self.timing: dict | None = None
        self.started: dict[int, float] = {}  # profiled step -> its start (epoch seconds): files after it are its
        self.taken: dict[int, list] = {}  # captured step -> its captures
        self.indexed: set = set()  # files already in the manifest
        self.captured: dict[int, list[dict]] = {}  # captured step -> the manifest rows of its files so far
        self.settled: set = set()  # captured steps whose answer says every file is indexed
        self.writing: dict[int, list[str]] = {}  # captured step -> its files seen still being written
        self._last_boundary = 0  # the last step that ended
        self.closed = False
        self.passes: list[
            dict
        ] = []  # this step's rollout passes: verl's gen timer, around the replay buffer's sampling
        _watch_sampling(trainer, self.passes)
        if not self.enabled:
            _say(
                "nothing-enabled",
                "rlprof: global_profiler.trigger is set but no role's profiler is enabled: a "
                "capture would collect nothing (enable actor_rollout_ref.actor.profiler or the rollout's)",
            )
        self._heartbeat(step=0)
        print(
            f"rlprof: watching every step of main_ppo; run directory {self.run_dir}"
            + (f" (rlprof capture {self.run_dir} --next)" if plan.trigger.request else ""),
            flush=True,
        )

    # ---- the step boundaries ------------------------------------------------------------------------------
    def step_begins(self, trainer) -> None:
        n = int(trainer.global_steps)
        if self.open_step is not None:
            self._step_ended(self.open_step)
        due = self.trigger.due(n)
        if n in self.steps or due:
            self.started[n] = time.time()
        if due:
            self.taken[n] = due
            # verl's own switch: its _start_profiling / _stop_profiling and the rollout's stop read it this step
            trainer.curr_step_profile = True
            if n not in self.steps:  # profile_continuous_steps: verl stopped the step before (it was not listed)
                trainer.prev_step_profile = False
            t = due[0].trigger
            print(
                f"rlprof: capturing step {n} ({t['reason']}"
                + (
                    f": {t['stage']} took {t['seconds']:.2f} s at step {t['step']}, baseline "
                    f"{t['baseline_seconds']:.2f} s"
                    if t.get("seconds") is not None
                    else ""
                )
                + ")",
                flush=True,
            )
        self.timing = None
        self.passes.clear()
        self.watch.begin(n)
        self.open_step = n

    def rollout_prefix(self, n: int) -> str:
        """`step<N>`, and for a capture `.rlprof-<reason>-<step seen>-<stage>` (vLLM allows letters, digits, ._-)."""
        caps = self.taken.get(n)
        if not caps:
            return f"step{n}"
        t = caps[0].trigger
        return f"step{n}.rlprof-{t['reason']}-{t['step']}-{t['stage']}"

    def step_ran(self, trainer) -> None:
        # the step's timer dict: verl keeps filling it (update_weights, the whole "step") until the step's end
        self.timing = getattr(trainer, "timing_raw", None)

    def _step_ended(self, n: int, decide: bool = True, requests: bool = True) -> None:
        import numpy as np

        from ...collect.trigger import BUSY_MACHINE, encode_request
        from ...collect.watch import read_request
        from ...collect.watching import say_contention
        from ...frameworks import verl as facts
        from ...analyze.inputs.timeline_file import BUSY, CAPTURED, CONTENTION, PROFILED, WARMUP
        from ...vocab import STAGES

        self.open_step = None
        self._last_boundary = n
        own_s, _, busy, waited = self.watch.end()
        timing = dict(self.timing or {})
        step_s = float(timing.get("step", own_s))
        stages = [math.nan] * len(STAGES)
        for name, seconds in timing.items():
            stage = facts.TIMING_STAGES.get(name)
            if stage in STAGES and isinstance(seconds, (int, float)):
                i = STAGES.index(stage)
                stages[i] = (0.0 if math.isnan(stages[i]) else stages[i]) + float(seconds)
        starts = [math.nan] * len(STAGES)  # verl's timers do not say when each stage began; its gen timer's, watched
        if self.passes:
            starts[STAGES.index("rollout_generate")] = self.passes[0]["start_unix_s"] - self.watch.started_unix_s
        nowait = [math.nan] * 2 * len(STAGES)  # the driver's own waits say nothing of its workers'
        asked = decide and requests and self.trigger.plan.request  # the last step: nothing follows to capture
        req = read_request(self.run_dir, self.requests_seen) if asked else None
        armed = refused = ()
        verdict = 0
        contention = None
        if decide:
            row = [step_s, *stages, *starts, *nowait, float(BUSY_MACHINE if busy else 0), *waited, *encode_request(req)]
            decision = self.trigger.decide(n, np.asarray([row], dtype=np.float64), (req or {}).get("ranks"))
            armed, refused, verdict = decision.armed, decision.refused, decision.flags()
            contention = decision.contention
            if contention is not None:
                say_contention(contention, _said)
        flags = (
            (BUSY if busy else 0)
            | (WARMUP if n <= self.trigger.plan.warmup_steps else 0)
            | (CAPTURED if n in self.taken else 0)
            | (PROFILED if n in self.steps else 0)
            | (CONTENTION if contention is not None else 0)
            | verdict
        )
        self.watch.write(n, flags, step_s, stages + starts + nowait, waited)
        self._write_passes(n, profiled=bool(flags & (CAPTURED | PROFILED)))
        self._index_files()
        self._answer(n, armed, refused)
        self._heartbeat(step=n, step_seconds=step_s)

    def _write_passes(self, n: int, profiled: bool) -> None:
        """The step's rollout passes on the wall clock, to `timeline/rollout.jsonl` (analyze/inputs/timeline_file.py)."""
        import json

        from ...analyze.inputs.timeline_file import rollout_file

        done = [p for p in self.passes if "end_unix_s" in p]
        if not done:
            return
        with open(rollout_file(self.run_dir), "a") as f:
            for k, p in enumerate(done):
                f.write(json.dumps({"step": n, "pass": k, **p, "profiled": profiled}) + "\n")

    # ---- what was captured ---------------------------------------------------------------------------------
    def _index_files(self, settled_s: float = 0.5) -> None:
        """The trace files written under save_path since the first profiled step, each to the latest profiled step
        that began before it was written (or the step its name says); those of captured steps go into the
        manifest with their trigger row. Files still being written at one boundary are indexed at the next (or
        at the end of the run)."""
        if not self.taken:
            return
        if settled_s and self._last_boundary > max(self.taken) + 2 and not any(self.writing.values()):
            self._settle()  # the last capture's files are in: save_path is not listed again until the end
            return
        from ...analyze.inputs.find import TRACE_SUFFIXES
        from ...analyze.inputs.verl_output import file_meta
        from ...collect.manifest import append_row

        first = min(self.started.values())
        rows, writing = [], {}
        for p in sorted(self.save_path.rglob("*")):
            if p in self.indexed or not p.name.endswith(TRACE_SUFFIXES) or self.run_dir in p.parents:
                continue
            try:
                stat = p.stat()
            except OSError:
                continue
            if not p.is_file() or stat.st_mtime < first:
                continue  # written before anything was profiled
            meta = _meta_of(p, self.save_path, file_meta)
            step = meta.get("step")
            if step not in self.started:
                step = max((s for s, t in self.started.items() if t <= stat.st_mtime), default=None)
            if time.time() - stat.st_mtime < settled_s:  # still being written: named to `rlprof capture`
                if step in self.taken:
                    writing.setdefault(step, []).append(os.path.relpath(p, self.run_dir))
                continue
            self.indexed.add(p)
            if step not in self.taken:
                continue  # a step listed in global_profiler.steps
            cap = self.taken[step][0]
            rank = meta.get("rank")
            rows.append(
                {
                    "run_id": self.run_id,
                    "step": step,
                    "role": meta.get("role"),
                    "stage": meta.get("stage"),
                    "rank": int(rank) if rank is not None else int(meta.get("replica") or 0),
                    "replica": meta.get("replica"),
                    "mode": meta.get("mode"),
                    "framework": "verl",
                    "collected_by": "verl",
                    "window": 0,
                    "status": "ok",
                    "bytes": stat.st_size,
                    "path": os.path.relpath(p, self.run_dir),
                    "trigger": cap.trigger,
                }
            )
        for row in rows:
            append_row(self.run_dir, row)
        for row in rows:
            self.captured.setdefault(row["step"], []).append(row)
        before, self.writing = self.writing, writing
        for step in {r["step"] for r in rows} | set(writing) | set(before):
            self._answer_captured(step, writing=writing.get(step, []))
        if not settled_s:
            self._settle()  # the run is over: what is there is written

    def _answer(self, n: int, armed, refused) -> None:
        from ...collect.watch import write_response

        for rid, why in refused:
            write_response(self.run_dir, rid, status="refused", reason=why, step=n)
        for cap in armed:
            if cap.request_id is not None:
                write_response(
                    self.run_dir,
                    cap.request_id,
                    status="armed",
                    at_step=cap.at_step,
                    stage=cap.stage,
                    role=cap.role,
                    ranks=None,
                    note=_WHOLE_STEP,
                )

    def _answer_captured(self, step: int, writing: list[str] = ()) -> None:
        """The request's answer for a captured step: the ranks of every file indexed for it so far, the files seen
        still being written, and whether the driver has them all (`settled`: `rlprof capture` waits for it)."""
        from ...collect.watch import write_response

        rows = self.captured.get(step, [])
        settled = step in self.settled and not writing
        for cap in self.taken.get(step, ()):
            if cap.request_id is not None and (rows or writing or settled):
                write_response(
                    self.run_dir,
                    cap.request_id,
                    status="captured",
                    at_step=step,
                    stage=cap.stage,
                    role=cap.role,
                    ranks=sorted({r["rank"] for r in rows}),
                    note=_WHOLE_STEP,
                    settled=settled,
                    writing=list(writing),
                )

    def _settle(self) -> None:
        """Every captured step's files are indexed: its answer says so, once."""
        for step in sorted(set(self.captured) - self.settled):
            self.settled.add(step)
            self._answer_captured(step)

    def _heartbeat(self, **fields) -> None:
        from ...collect.watch import write_live

        write_live(
            self.run_dir, self.trigger, run_id=self.run_id, world_size=self.world_size, host_framework="verl", **fields
        )

    def close(self, ended: bool = True) -> None:
        """The run ended: its last step's record (not judged: nothing follows it), the files of a capture at the
        end, and a heartbeat saying the job ended."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.open_step is not None:
                self._step_ended(self.open_step, decide=False)
            self._index_files(settled_s=0.0)  # the run is over: what is there is written
        finally:
            self.watch.close()
            self._heartbeat(ended=ended)


_WHOLE_STEP = "verl profiles whole steps: every role its profiler enables, on the ranks it selects"


def _watch_sampling(trainer, passes: list) -> None:
    """verl's gen timer holds on_sample_begin, the replay buffer's sampling (which waits for the agent loop's samples,
    generated and scored) and on_sample_end (the replicas put to sleep; the rollout profiler stopped on a profiled
    step): the trainer's two hooks wrapped on this instance note when each began and ended, one pass per call. With
    DAPO's dynamic sampling, the replay buffer's refills (its `refill_fn`, the trainer's _add_prompts_to_generate:
    when, how many prompts) and the groups its filter dropped (`_evict_terminal_groups`' DAPO count) are noted in the
    pass too. A trainer without these is left as it is (what it lacks stays unknown)."""
    begin, end = getattr(trainer, "on_sample_begin", None), getattr(trainer, "on_sample_end", None)
    if not (callable(begin) and callable(end)):
        return
    buffer = getattr(trainer, "replay_buffer", None)
    refill, evict = getattr(buffer, "refill_fn", None), getattr(buffer, "_evict_terminal_groups", None)
    if callable(refill) and callable(evict):

        @functools.wraps(refill)
        def refill_fn(prompts, *args, **kwargs):
            if passes:
                passes[-1].setdefault("refills", []).append([time.time(), int(prompts)])
            return refill(prompts, *args, **kwargs)

        @functools.wraps(evict)
        def evict_terminal_groups(*args, **kwargs):
            out = evict(*args, **kwargs)
            try:
                if passes and out[2]:  # (evicted uids, stale count, DAPO-filtered count, metrics)
                    passes[-1]["filtered_groups"] = passes[-1].get("filtered_groups", 0) + int(out[2])
            except (TypeError, IndexError, ValueError):
                pass
            return out

        buffer.refill_fn, buffer._evict_terminal_groups = refill_fn, evict_terminal_groups

    @functools.wraps(begin)
    def on_sample_begin(*args, **kwargs):
        passes.append({"start_unix_s": time.time()})
        return begin(*args, **kwargs)

    @functools.wraps(end)
    def on_sample_end(*args, **kwargs):
        now = passes[-1] if passes else {}
        now["sampled_unix_s"] = time.time()
        try:
            return end(*args, **kwargs)
        finally:
            now["end_unix_s"] = time.time()

    trainer.on_sample_begin, trainer.on_sample_end = on_sample_begin, on_sample_end


def _meta_of(path: Path, root: Path, file_meta) -> dict:
    """What a file under save_path is: verl's naming, or the row of the rlprof manifest beside it (rlprof's vLLM
    plugin writes a run directory of its own there)."""
    meta = file_meta(path, root) or {}
    manifest = path.parent / "manifest.jsonl"
    if not meta and manifest.is_file():
        import json

        for line in manifest.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and row.get("path") == path.name:
                return row
    return meta
