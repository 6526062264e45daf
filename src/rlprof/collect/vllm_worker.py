"""Inside a vLLM worker: its execute loop as decode-step units of an rlprof Profiler (below both the vLLM plugin in
integrations/ and the reference trainer's in-process vLLM engine, which use it).

vLLM calls the worker's `model_runner.execute_model(scheduler_output)` once per engine iteration, then
`sample_tokens(...)` where execute_model returned nothing. Wrapping the two on the runner instance (vLLM's classes
stay as they are) makes each iteration that computes tokens one `decode_step` unit, from the start of
execute_model to the end of sampling, its range naming what the scheduler gave it: `active` rows scheduled now,
`seqs` rows of the round so far, `tokens` computed, and the prefill part of both (counted as vLLM's own
per-iteration annotation counts them).
"""

from __future__ import annotations

import functools

from ..frameworks.hf_models import model_record
from ..warn_once import warn_once


class Iterations:
    """The worker's execute loop as decode-step units: execute_model(scheduler_output) opens one where a window is
    open (`recording`), the end of sample_tokens closes it. Subclasses say where the units go."""

    def __init__(self, unit):
        self.unit_of = unit  # (**held) -> a decode_step unit context (rlprof's Profiler.unit)
        self.unit = None  # the decode step's range in flight
        self.round_rows: set = set()
        self.details = iteration_details()

    def recording(self) -> bool:
        raise NotImplementedError

    def instrument(self, worker, version: str) -> bool:
        """Wrap the worker's model runner (instance attributes: vLLM's classes stay as they are)."""
        runner = getattr(worker, "model_runner", None)
        missing = [m for m in ("execute_model", "sample_tokens") if not callable(getattr(runner, m, None))]
        if missing:
            warn_once(
                None,
                f"rlprof: vLLM {version}'s worker {type(worker).__name__} has no model_runner."
                f"{'/'.join(missing)}; nothing is patched and nothing is collected in this worker",
                inherit=True,
            )
            return False
        runner.execute_model = self.wrap_execute(runner.execute_model)
        runner.sample_tokens = self.wrap_sample(runner.sample_tokens)
        return True

    def wrap_execute(self, original):
        @functools.wraps(original)
        def execute_model(scheduler_output, *args, **kwargs):
            if self.recording():
                self._open_unit(scheduler_output)
            try:
                out = original(scheduler_output, *args, **kwargs)
            except BaseException:
                self._close_unit()
                raise
            if out is not None:  # no sample_tokens follows (an empty or pooling iteration, a non-last PP rank)
                self._close_unit()
            return out

        execute_model.rlprof_wrapper = True  # what is on vLLM's iteration path, for a probe to see
        return execute_model

    def wrap_sample(self, original):
        @functools.wraps(original)
        def sample_tokens(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            finally:
                if self.unit is not None:
                    self._close_unit()

        sample_tokens.rlprof_wrapper = True
        return sample_tokens

    def _open_unit(self, scheduler_output) -> None:
        self._close_unit()
        try:
            held = self.details(scheduler_output, self.round_rows)
            if held is None:
                return
            unit = self.unit_of(**held)
            unit.__enter__()
            self.unit = unit
        except Exception as exc:
            warn_once(
                None,
                f"rlprof: could not mark a decode step: {type(exc).__name__}: {exc}; this step's units are not marked",
                inherit=True,
            )
            self.unit = None

    def _close_unit(self) -> None:
        unit, self.unit = self.unit, None
        if unit is not None:
            try:
                unit.__exit__(None, None, None)
            except Exception as exc:
                warn_once(None, f"rlprof: could not close a decode step: {type(exc).__name__}: {exc}", inherit=True)


class HostSession(Iterations):
    """An engine inside a process that already profiles (rlprof's trainer with `rollout.engine=vllm`): its
    iterations become decode-step units of the host's Profiler, in whatever window the host has open."""

    def __init__(self, profiler):
        super().__init__(lambda **held: profiler.unit("decode_step", **held))
        self.profiler = profiler

    def recording(self) -> bool:
        return self.profiler.recording

    def new_round(self) -> None:
        """A generate call begins: `seqs` counts this call's rows."""
        self.round_rows = set()


def attach_host(worker_wrapper, profiler) -> HostSession | None:
    """For `llm.collective_rpc(attach_host, args=(profiler,))` on an in-process engine: mark its iterations in the
    host's Profiler. Returns the session (None where this vLLM's worker has another layout: one warning)."""
    import vllm

    session = HostSession(profiler)
    return session if session.instrument(worker_wrapper.worker, getattr(vllm, "__version__", "unknown")) else None


def iteration_details():
    """scheduler_output -> what the iteration holds, counted as vLLM's own annotation counts it (its
    compute_iteration_details where present); None for an iteration that computes no token."""
    try:
        from vllm.v1.utils import compute_iteration_details
    except ImportError:
        compute_iteration_details = None

    def held(scheduler_output, round_rows: set) -> dict | None:
        scheduled = scheduler_output.num_scheduled_tokens
        tokens = scheduler_output.total_num_scheduled_tokens
        if not tokens:
            return None
        round_rows.update(scheduled)
        if compute_iteration_details is not None:
            d = compute_iteration_details(scheduler_output)
            prefill_seqs, prefill_tokens = d.num_ctx_requests, d.num_ctx_tokens
        else:
            new = {r.req_id for r in scheduler_output.scheduled_new_reqs}
            prefill_seqs = len(new)
            prefill_tokens = sum(scheduled[r] for r in new if r in scheduled)
        context, pairs = attended(scheduler_output)
        return {
            "active": len(scheduled),
            "seqs": len(round_rows),
            "tokens": tokens,
            "prefill_seqs": prefill_seqs,
            "prefill_tokens": prefill_tokens,
            "context_tokens": context,
            "query_key_pairs": pairs,
        }

    return held


def attended(scheduler_output) -> tuple[int, int]:
    """(context tokens, query-key pairs) of an iteration, counted as vLLM's own per-iteration model counts them
    (vllm/v1/metrics/perf.py, get_step_perf_stats_per_gpu): each scheduled request attends to its computed tokens plus
    those scheduled now; summed, and times the tokens scheduled now."""
    scheduled = scheduler_output.num_scheduled_tokens
    context = pairs = 0
    for req in scheduler_output.scheduled_new_reqs:
        n = scheduled.get(req.req_id, 0)
        context += req.num_computed_tokens + n if n else 0
        pairs += n * (req.num_computed_tokens + n)
    cached = scheduler_output.scheduled_cached_reqs
    for i, req_id in enumerate(cached.req_ids):
        n = scheduled.get(req_id, 0)
        context += cached.num_computed_tokens[i] + n if n else 0
        pairs += n * (cached.num_computed_tokens[i] + n)
    return context, pairs


def engine_model(vllm_config) -> dict | None:
    """The model a vLLM engine loaded, as the analysis records a model (frameworks/hf_models.py): its Hugging Face
    config, the dtype it computes in and its KV cache's; None where this vLLM's config has another layout."""
    try:
        model_config = vllm_config.model_config
        cache = getattr(getattr(vllm_config, "cache_config", None), "cache_dtype", None)
        return model_record(
            model_config.hf_text_config.to_dict() | {"model_type": model_config.hf_config.model_type},
            f"vLLM's engine: {model_config.model}",
            dtype=model_config.dtype,
            kv_cache_dtype=None if cache in (None, "auto") else cache,
        )
    except Exception:  # a config of another layout: the model is then not recorded, generation goes on
        return None
