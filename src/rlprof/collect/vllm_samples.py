"""A vLLM engine's finished requests as sample records (below both the vLLM plugin in integrations/ and the reference
trainer's in-process vLLM engine, which use it).

vLLM computes, for every request that finishes, its own `FinishedRequestStats` (vllm/v1/metrics/stats.py: time
queued, in prefill, in decode; prompt and generated tokens; finish reason; request id; preemptions of that request;
prompt tokens served from the prefix cache) and hands them, with the iteration's wall-clock timestamp, to its stat
loggers: in the engine's front end (the process that holds `LLM` / `AsyncLLM`), and only while its stats are on
(`disable_log_stats=False`; with them off vLLM builds no stat logger and nothing here runs). `install` adds rlprof's
stat logger to every stat logger manager vLLM builds in this process from then on (vLLM's class patched in memory,
no file changed); each engine's logger asks `samples_of(vllm_config, engine_index)` where its records go
(an `EngineSamples`, or None: this engine records nothing).

The request's record: `start_us` its arrival in the front end (the iteration's timestamp less vLLM's e2e latency),
`end_us` the iteration that returned its last token, both on the front end's wall clock; `queue_ms`, `prefill_ms`,
`decode_ms` vLLM's queued, prefill and decode intervals; `prompt_tokens`, `response_tokens`, `cached_tokens`,
`preemptions`, `finish_reason`, `request_id` as vLLM counted them. Turns and tools are not vLLM's to know: absent.

The same logger gets vLLM's SchedulerStats after each iteration (the KV cache's usage, the requests running and
waiting) and IterationStats' preemptions: one record per recorded step sums them (analyze/inputs/samples_file.py,
ENGINE_FIELDS), with the engine's limits (max_num_seqs, the KV cache's tokens), so that the analysis can tell a
queue held by KV-cache memory from one held by the engine's slots.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

from ..analyze.inputs.samples_file import KV_FULL
from ..warn_once import warn_once
from .samples import SampleWriter, record

_samples_of: Callable | None = None  # (vllm_config, engine_index) -> EngineSamples | None, set by `install`
_quiet = False  # rlprof turned vLLM's stats on itself: vLLM's own periodic stat lines stay off


class EngineSamples:
    """Where one engine's finished requests go while a step is recorded (`begin(step)` .. `end()`): straight to a
    writer (one write per engine iteration that finished any), or kept for the host to `take` (the trainer adds
    what only it knows: the sample's index in its batch, its reward time)."""

    def __init__(self, writer: SampleWriter | None = None, *, rank: int | None = None, replica: int | None = None):
        self.writer, self.rank, self.replica = writer, rank, replica
        self.step: int | None = None
        self.count = 0  # requests of this step recorded so far: the next one's `sample`
        self.kept: list[dict] = []
        self.config = None  # the engine's VllmConfig (its limits), where its stat logger was given one
        self.state: dict | None = None  # the scheduler's counts over this step's iterations so far

    def begin(self, step: int) -> None:
        self.end()
        self.step, self.count = step, 0

    def end(self) -> None:
        """The step ends: its engine record written (or kept) where any iteration reported scheduler stats."""
        state, self.state = self.state, None
        if state is not None and self.step is not None:
            self._out([{**record(step=self.step, rank=self.rank, replica=self.replica, source="vllm"), **state}])
        self.step = None

    def take(self) -> list[dict]:
        kept, self.kept = self.kept, []
        return kept

    def iteration(self, scheduler_stats, iteration_stats) -> None:
        """What vLLM hands its stat loggers after an engine iteration (either may be None)."""
        finished = getattr(iteration_stats, "finished_requests", None)
        if finished:
            self.finished(finished, iteration_stats.iteration_timestamp)
        if scheduler_stats is not None and self.step is not None:
            self.scheduled(scheduler_stats, getattr(iteration_stats, "num_preempted_reqs", 0) or 0)

    def scheduled(self, stats, preempted: int) -> None:
        """One iteration's SchedulerStats (and the requests it preempted), added to the step's counts."""
        if self.state is None:
            self.state = {**self._limits(), **dict.fromkeys(COUNTS, 0), "peak_kv_usage": 0.0}
        s = self.state
        running, waiting = int(stats.num_running_reqs), int(stats.num_waiting_reqs)
        usage = float(stats.kv_cache_usage)
        s["iterations"] += 1
        s["preempted"] += int(preempted)
        s["max_running"] = max(s["max_running"], running)
        s["max_waiting"] = max(s["max_waiting"], waiting)
        s["peak_kv_usage"] = max(s["peak_kv_usage"], usage)
        if waiting:
            s["waiting_iterations"] += 1
            s["kv_full_iterations"] += usage >= KV_FULL or preempted > 0
            s["slots_full_iterations"] += "max_num_seqs" in s and running >= s["max_num_seqs"]

    def _limits(self) -> dict:
        """The engine's limits as its config says them now (the KV cache's size is known once it is allocated)."""
        sched = getattr(self.config, "scheduler_config", None)
        cache = getattr(self.config, "cache_config", None)
        blocks, block = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
        return record(
            max_num_seqs=getattr(sched, "max_num_seqs", None),
            max_num_batched_tokens=getattr(sched, "max_num_batched_tokens", None),
            kv_cache_tokens=blocks * block if blocks and block else None,
            block_size=block,
        )

    def _out(self, records: list[dict]) -> None:
        if self.writer is not None:
            self.writer.write(records)
        else:
            self.kept += records

    def finished(self, requests: list, timestamp: float) -> None:
        """vLLM's FinishedRequestStats of one iteration, `timestamp` its wall-clock time (seconds)."""
        if self.step is None:
            return
        end_us = int(timestamp * 1e6)
        records = []
        for r in requests:
            records.append(
                record(
                    step=self.step,
                    rank=self.rank,
                    replica=self.replica,
                    sample=self.count,
                    start_us=end_us - int(r.e2e_latency * 1e6),
                    end_us=end_us,
                    prompt_tokens=r.num_prompt_tokens,
                    response_tokens=r.num_generation_tokens,
                    queue_ms=r.queued_time * 1e3,
                    prefill_ms=r.prefill_time * 1e3,
                    decode_ms=r.decode_time * 1e3,
                    preemptions=getattr(r, "num_preemptions", None),  # per request where vLLM counts it (0.32.0 does)
                    source="vllm",
                    request_id=getattr(r, "request_id", None),  # absent before vLLM named it here
                    finish_reason=None if r.finish_reason is None else str(r.finish_reason),
                    cached_tokens=getattr(r, "num_cached_tokens", None),
                )
            )
            self.count += 1
        self._out(records)


COUNTS = (
    "iterations",
    "waiting_iterations",
    "kv_full_iterations",
    "slots_full_iterations",
    "max_running",
    "max_waiting",
    "preempted",
)


def install(samples_of: Callable, quiet: bool = False) -> bool:
    """Add rlprof's stat logger to every StatLoggerManager vLLM builds in this process from now on; `samples_of`
    says, per engine, where its records go. `quiet`: vLLM's own periodic stat lines are left off (rlprof turned
    the stats on, the user did not). False (one warning) where this vLLM has no such manager."""
    global _samples_of, _quiet
    try:
        from vllm.v1.metrics.loggers import StatLoggerManager
    except ImportError as exc:
        warn_once(None, f"rlprof: this vLLM has no stat logger manager ({exc}); no sample records", inherit=True)
        return False
    _samples_of, _quiet = samples_of, quiet
    init = StatLoggerManager.__init__
    if getattr(init, "_rlprof_samples", False):
        return True
    signature = inspect.signature(init)
    if "custom_stat_loggers" not in signature.parameters:
        warn_once(
            None, "rlprof: this vLLM's StatLoggerManager takes no custom_stat_loggers; no sample records", inherit=True
        )
        return False
    logger = stat_logger_class()

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        given = bound.arguments.get("custom_stat_loggers") or []
        bound.arguments["custom_stat_loggers"] = [*given, logger]
        if _quiet and "enable_default_loggers" in signature.parameters:
            bound.arguments["enable_default_loggers"] = False
        init(*bound.args, **bound.kwargs)

    __init__._rlprof_samples = True
    StatLoggerManager.__init__ = __init__
    return True


@functools.cache
def stat_logger_class():
    """rlprof's per-engine stat logger (a subclass of vLLM's StatLoggerBase, made when vLLM is there)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class RlprofSamples(StatLoggerBase):
        """One engine's finished requests, as sample records (collect/vllm_samples.py)."""

        def __init__(self, vllm_config, engine_index: int = 0):
            self.samples = None
            try:
                self.samples = _samples_of(vllm_config, engine_index) if _samples_of is not None else None
                if self.samples is not None:
                    self.samples.config = vllm_config
            except Exception as exc:
                _fault(exc)

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            samples = self.samples
            if samples is None:
                return
            try:
                samples.iteration(scheduler_stats, iteration_stats)
            except Exception as exc:
                _fault(exc)

        def log_engine_initialized(self):
            pass

    return RlprofSamples


def _fault(exc: BaseException) -> None:
    warn_once(
        ("vllm samples", type(exc).__name__),
        f"rlprof: could not record vLLM's finished requests ({type(exc).__name__}: {exc}); generation goes on",
        inherit=True,
    )
