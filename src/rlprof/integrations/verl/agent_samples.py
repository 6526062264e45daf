"""verl's agent loop, sample by sample: in each agent-loop worker (a Ray actor of main_ppo's rollout), every sample's
`AgentLoopMetrics` as verl computes them (generate_sequences, tool_calls, compute_score, num_preempted), which verl
itself then reduces to min/max/mean or never reads, kept as one sample record each with its prompt and response
lengths, its turns, its step and its worker, written to `<save_path>/<run_id>/samples/verl_worker<K>.jsonl`
(analyze/inputs/samples_file.py) for each step the job watches (`global_profiler.trigger`) or profiles
(`global_profiler.steps` with a role's profiler enabled); validation samples never.

How: the verl plugin (loader.py) calls `attach` once verl's agent-loop module is imported in a process; `attach`
wraps two methods of its AgentLoopWorker in memory, no verl file changed, which every agent-loop worker inherits
(main_ppo's TransferQueue worker of the v1 trainer and the DataProto one alike):
- `_run_agent_loop` (one sample's whole life in the worker): its start on the worker's wall clock, and the step and
  whether it validates, from verl's own trajectory argument;
- `_compute_score` (called once the sample is generated, where verl scores it and times the scoring): the record, from
  the sample's output as verl holds it then, its end the end of its scoring.
Record: `start_us`, `end_us` (the worker's wall clock), `prompt_tokens` (the prompt's ids), `response_tokens` (tokens
the model generated: verl's response mask, tool responses left out), `turns` (the model's turns: runs of generated
tokens in that mask), `generate_ms` (verl's generate_sequences: the server's queue, prefill and decode together),
`tool_ms` (tool_calls, where the sample took more than one turn or a tool ran), `reward_ms` (compute_score, where
verl scored it in the agent loop), `preemptions` (num_preempted, where vLLM reported it), `worker`; `sample` counts
the worker's samples of the step in the order they finished.

Costs a wrapper call per sample where nothing is recorded. A fault is one warning and verl goes on; a verl whose
AgentLoopWorker lacks these methods is one warning and no patching.
"""

from __future__ import annotations

import contextvars
import functools
import os
import time

from ...warn_once import warn_once
from .rollout_plan import ENV_RUN_ID

WRAPPED = ("_run_agent_loop", "_compute_score")
_sample: contextvars.ContextVar = contextvars.ContextVar("rlprof_verl_sample", default=None)


def attach(module) -> None:
    cls = getattr(module, "AgentLoopWorker", None)
    if cls is None or getattr(cls, "_rlprof_samples", False):
        return
    missing = [name for name in WRAPPED if not callable(getattr(cls, name, None))]
    if missing:
        warn_once(
            "agent-loop layout",
            f"rlprof: verl's AgentLoopWorker has no {', '.join(missing)}: its samples are not recorded (verl goes on)",
        )
        return
    cls._run_agent_loop = _run(cls._run_agent_loop)
    cls._compute_score = _scored(cls._compute_score)
    cls._rlprof_samples = True


def _run(original):
    @functools.wraps(original)
    async def _run_agent_loop(self, sampling_params, trajectory, *args, **kwargs):
        recorder = _recorder(self)
        if recorder is None or not isinstance(trajectory, dict) or not recorder.wanted(trajectory):
            return await original(self, sampling_params, trajectory, *args, **kwargs)
        token = _sample.set((time.time_ns(), trajectory))
        try:
            return await original(self, sampling_params, trajectory, *args, **kwargs)
        finally:
            _sample.reset(token)

    return _run_agent_loop


def _scored(original):
    @functools.wraps(original)
    async def _compute_score(self, outputs, *args, **kwargs):
        begun = _sample.get()
        if begun is None:
            return await original(self, outputs, *args, **kwargs)
        try:
            final = outputs[-1]
            here = final.reward_score is None and getattr(self, "reward_loop_worker_handles", None) is not None
        except Exception:
            here = False
        out = await original(self, outputs, *args, **kwargs)
        try:
            _recorder(self).record(begun, outputs[-1], scored_here=here)
        except Exception as exc:
            _fault(exc)
        return out

    return _compute_score


def _recorder(worker) -> "Recorder | None":
    """The worker's Recorder, made on first use from its config; None where the job records no sample."""
    found = worker.__dict__.get("_rlprof_recorder")
    if found is None:
        try:
            found = Recorder.of(worker) or False
        except Exception as exc:
            _fault(exc)
            found = False
        worker.__dict__["_rlprof_recorder"] = found
    return found or None


class Recorder:
    """One agent-loop worker's sample records."""

    @classmethod
    def of(cls, worker) -> "Recorder | None":
        from omegaconf import OmegaConf

        config = getattr(worker, "config", None)
        if config is None:
            return None

        def select(key):
            value = OmegaConf.select(config, key, default=None)
            return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value

        watched = select("global_profiler.trigger") is not None
        profilers = ("actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref", "critic")
        enabled = any(select(f"{p}.profiler.enable") for p in profilers)
        steps = set(select("global_profiler.steps") or ()) if enabled else set()
        if not watched and not steps:
            return None
        save_path = select("global_profiler.save_path") or "outputs/profile"
        return cls(os.path.abspath(save_path), watched, steps, select("actor_rollout_ref.model.path"))

    def __init__(self, save_path: str, watched: bool, steps: set, model_path: str | None = None):
        self.save_path, self.watched, self.steps = save_path, watched, steps
        self.model_path = model_path  # the checkpoint verl loads (actor_rollout_ref.model.path)
        self.counts: dict[int, int] = {}
        self.worker: int | None = None
        self._writer = None

    def wanted(self, trajectory: dict) -> bool:
        step = trajectory.get("step")
        return not trajectory.get("validate") and isinstance(step, int) and (self.watched or step in self.steps)

    def record(self, begun: tuple, output, scored_here: bool) -> None:
        from ...collect.samples import SampleWriter, record

        start_ns, trajectory = begun
        step = int(trajectory["step"])
        if self._writer is None:
            self.worker = _worker_index()
            run_id = os.environ.get(ENV_RUN_ID) or _job_run_id()
            self._writer = SampleWriter(os.path.join(self.save_path, run_id), "verl", worker=self.worker)
            _record_model(os.path.join(self.save_path, run_id), self.model_path)
        sample = self.counts.get(step, 0)
        self.counts[step] = sample + 1
        metrics = output.metrics
        mask = list(output.response_mask)
        turns = sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))
        tool_s = float(metrics.tool_calls)
        preempted = int(metrics.num_preempted)
        self._writer.write(
            [
                record(
                    step=step,
                    worker=self.worker,
                    sample=sample,
                    start_us=start_ns // 1000,
                    end_us=time.time_ns() // 1000,
                    prompt_tokens=len(output.prompt_ids),
                    response_tokens=sum(1 for m in mask if m),
                    turns=turns,
                    generate_ms=float(metrics.generate_sequences) * 1e3,
                    tool_ms=tool_s * 1e3 if (turns > 1 or tool_s > 0) else None,
                    reward_ms=float(metrics.compute_score) * 1e3 if scored_here else None,
                    preemptions=preempted if preempted >= 0 else None,
                    source="verl",
                )
            ]
        )


def _record_model(run_dir: str, model_path: str | None) -> None:
    """The model verl trains, from the checkpoint's config.json its config names, beside the run's samples (the
    analysis's speed of light counts each pass's work with it); nothing where it cannot be read."""
    import json

    from ...analyze.inputs.model_config import write_model_file
    from ...frameworks.hf_models import model_record

    try:
        with open(os.path.join(str(model_path), "config.json")) as f:
            record = model_record(json.load(f), f"verl's actor_rollout_ref.model.path: {model_path}")
        if record is not None:
            write_model_file(run_dir, record)
    except (OSError, ValueError, TypeError):
        return


def _worker_index() -> int:
    """The agent-loop worker's index in verl's naming of its actors (agent_loop_worker_{i}_{id}), else the pid."""
    try:
        import ray

        name = ray.get_runtime_context().get_actor_name() or ""
    except Exception:
        name = ""
    parts = name.split("_")
    if name.startswith("agent_loop_worker_") and len(parts) > 3 and parts[3].isdigit():
        return int(parts[3])
    return os.getpid()


def _job_run_id() -> str:
    """Without main_ppo's run id in the environment (a config given only as a file): one per Ray job."""
    try:
        import ray

        return f"verl-job-{ray.get_runtime_context().get_job_id()}"
    except Exception:
        return f"verl-pid-{os.getpid()}"


def _fault(exc: BaseException) -> None:
    warn_once(
        ("agent-loop samples", type(exc).__name__),
        f"rlprof: could not record an agent-loop sample ({type(exc).__name__}: {exc}); verl goes on",
    )
