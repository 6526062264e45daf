"""Drive a live vLLM (run with the side venv's python, `bash bench/setup_vllm.sh` makes it): rounds of generation
on a tiny Qwen2 built locally, timings and what came back as one JSON object on stdout.

    bench/.venv-vllm/bin/python bench/vllm_drive.py make-model DIR
    bench/.venv-vllm/bin/python bench/vllm_drive.py run --model DIR --rounds '[[64, 64], [34, 38]]' [options]

A round is one `llm.generate` of one request per entry (prompt i: tokens [1, 5+i, 7, 9]), each entry the
request's max_tokens, with ignore_eos so that a request generates exactly that many. Options:
`--profile-rounds 2 3` calls vLLM's own `llm.start_profile()` / `stop_profile()` around those rounds (1-based),
`--profiler-config JSON` starts the engine with that ProfilerConfig, `--driver-steps 5 6 7` says each round's step
to rlprof's plugin (`rlprof.integrations.vllm.loader.step`: round k is the k-th step listed), `--host-slow-from K`
makes this script a host with its own rlprof Profiler (role actor, RLPROF_PLAN's plan and trigger): round k is step
k, timed as its rollout_generate stage, 0.5 s slower from round K on, and the host's trigger decision goes to the
engine with the step, `--log-stats` starts the engine with vLLM's stats on (disable_log_stats=False),
`--kv-cache-bytes N` gives it a KV cache of N bytes (a small one cannot hold a round: its requests queue and are
preempted; `--max-model-len` then no longer than one sequence the cache holds, as vLLM checks at its start).
`--vllm-perf` (in process only) records, for every engine iteration that computes tokens, vLLM's own per-iteration
FLOPs and bytes read and written (`vllm/v1/metrics/perf.py`: the ModelMetrics that `--enable-mfu-metrics` builds from
the engine's config, applied to that iteration's scheduler output) as `vllm_perf` in each round's result. The
environment decides the rest: RLPROF_PLAN (the plugin),
VLLM_ENABLE_V1_MULTIPROCESSING (0: one process), VLLM_PLUGINS (which plugins vLLM loads).
Nothing is downloaded: HF_HUB_OFFLINE=1, the model and its config are written here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

VOCAB, HIDDEN, HEADS, KV_HEADS, LAYERS = 64, 128, 4, 2, 2  # head size 32: one the CPU attention backend takes


def make_model(out: str) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(out)


def engine(
    model: str,
    profiler_config: dict | None,
    log_stats: bool = False,
    kv_cache_bytes: int = 64 << 20,
    max_model_len: int = 512,
    max_num_seqs: int | None = None,
):
    from vllm import LLM

    kwargs = {"profiler_config": profiler_config} if profiler_config else {}
    if max_num_seqs:
        kwargs["max_num_seqs"] = max_num_seqs
    if log_stats:
        kwargs["disable_log_stats"] = False  # vLLM's per-request stats on: rlprof's plugin records each request
    return LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=max_model_len,
        seed=0,
        kv_cache_memory_bytes=kv_cache_bytes,
        enforce_eager=True,
        **kwargs,
    )


class PerfWatch:
    """vLLM's own per-iteration perf model (vllm/v1/metrics/perf.py ModelMetrics, what --enable-mfu-metrics builds)
    applied to each iteration's scheduler output as the worker's runner receives it: a list per round."""

    def __init__(self, vllm_config):
        from vllm.v1.metrics.perf import ModelMetrics

        self.metrics = ModelMetrics(vllm_config)
        self.iterations: list[dict] = []

    def wrap(self, execute_model):
        def watched(scheduler_output, *args, **kwargs):
            if scheduler_output.total_num_scheduled_tokens:
                stats = self.metrics.get_step_perf_stats_per_gpu(scheduler_output)
                self.iterations.append(
                    {
                        "tokens": scheduler_output.total_num_scheduled_tokens,
                        "flops": stats.num_flops_per_gpu,
                        "read_bytes": stats.num_read_bytes_per_gpu,
                        "write_bytes": stats.num_write_bytes_per_gpu,
                    }
                )
            return execute_model(scheduler_output, *args, **kwargs)

        return watched

    def take(self) -> list[dict]:
        out, self.iterations = self.iterations, []
        return out


def watch_perf(llm) -> PerfWatch:
    """In process (VLLM_ENABLE_V1_MULTIPROCESSING=0): the worker's runner watched by vLLM's perf model."""
    watch = PerfWatch(llm.llm_engine.vllm_config)

    def attach(worker_wrapper):
        runner = worker_wrapper.worker.model_runner
        runner.execute_model = watch.wrap(runner.execute_model)

    llm.collective_rpc(attach)
    return watch


def run(args) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = engine(
        args.model,
        json.loads(args.profiler_config) if args.profiler_config else None,
        args.log_stats,
        args.kv_cache_bytes,
        args.max_model_len,
        args.max_num_seqs,
    )
    out = {"pid": os.getpid(), "engine_start_s": time.perf_counter() - t0, "rounds": []}
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":  # in process: is rlprof on the iteration path?
        out["runner_wrapped"] = llm.collective_rpc(
            lambda w: {
                m: getattr(getattr(w.worker.model_runner, m), "rlprof_wrapper", False)
                for m in ("execute_model", "sample_tokens")
            }
        )[0]
    perf = watch_perf(llm) if args.vllm_perf else None
    step = host = None
    if args.driver_steps or args.host_slow_from:
        from rlprof.integrations.vllm.loader import step
    if args.host_slow_from:
        import shlex

        from rlprof import Profiler
        from rlprof.config import load_plan
        from rlprof.config.source import split_config_args

        path, overrides = split_config_args(shlex.split(os.environ["RLPROF_PLAN"]))
        host = Profiler(load_plan(path, overrides), role="actor", run_id=os.environ.get("RLPROF_RUN_ID"))
    for k, lengths in enumerate(json.loads(args.rounds), start=1):
        prompts = [TokensPrompt(prompt_token_ids=[1, 5 + i % 50, 7, 9]) for i in range(len(lengths))]
        params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=1.0, detokenize=False) for n in lengths]
        profiled = k in args.profile_rounds
        if profiled:
            llm.start_profile()
        t = time.perf_counter()
        if host is not None:
            with host.step(k):
                trigger = host.delegated("rollout_generate")
                with host.stage("rollout_generate"):
                    with step(llm, k, trigger=trigger):
                        results = llm.generate(prompts, params, use_tqdm=False)
                    if k >= args.host_slow_from:
                        time.sleep(0.5)  # a slow rollout, as the host's clock sees it
            out.setdefault("delegated", []).append(trigger)
        elif step is not None:
            with step(llm, args.driver_steps[k - 1]):
                results = llm.generate(prompts, params, use_tqdm=False)
        else:
            results = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t
        if profiled:
            llm.stop_profile()
        out["rounds"].append(
            {
                "seconds": seconds,
                "tokens": [len(r.outputs[0].token_ids) for r in results],
                "request_ids": [r.request_id for r in results],
                "prompt_tokens": [len(r.prompt_token_ids) for r in results],
                **({"vllm_perf": perf.take()} if perf is not None else {}),
            }
        )
    if host is not None:
        host.close()
    return out


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-model")
    m.add_argument("out")
    r = sub.add_parser("run")
    r.add_argument("--model", required=True)
    r.add_argument("--rounds", required=True, help="JSON list of rounds, each a list of max_tokens per request")
    r.add_argument("--profile-rounds", type=int, nargs="*", default=[])
    r.add_argument("--profiler-config")
    r.add_argument("--driver-steps", type=int, nargs="*", default=[])
    r.add_argument("--host-slow-from", type=int, default=0)
    r.add_argument("--log-stats", action="store_true", help="the engine with vLLM's stats on (disable_log_stats=False)")
    r.add_argument(
        "--max-model-len", type=int, default=512, help="vLLM's max_model_len (a small KV cache needs it small)"
    )
    r.add_argument(
        "--kv-cache-bytes",
        type=int,
        default=64 << 20,
        help="vLLM's KV cache (kv_cache_memory_bytes): small, a round's requests wait in its queue and are preempted",
    )
    r.add_argument("--vllm-perf", action="store_true", help="vLLM's own FLOPs and bytes of each iteration (in process)")
    r.add_argument("--max-num-seqs", type=int, default=0, help="the engine's max_num_seqs (0: vLLM's default)")
    args = p.parse_args()
    if args.cmd == "make-model":
        make_model(args.out)
        return
    result = run(args)
    sys.stdout.flush()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
