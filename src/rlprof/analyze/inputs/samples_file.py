"""The rollout's samples, one record each (collect/samples.py writes them, the analysis reads them here): one JSON
object per line, appended a step (or an engine iteration) at a time by the process that ran the rollout, in
`<run_dir>/samples/<source>_<who>.jsonl`: `rlprof_rank<R>.jsonl` (rlprof's trainer: one file per rank, its async
replicas' samples included, each naming its replica), `vllm_rank<R>.jsonl` (the trainer's in-process vLLM engine),
`vllm_replica<K>.jsonl` (a vLLM engine through rlprof's vLLM plugin, written in its front end),
`verl_worker<K>.jsonl` (one of verl's agent-loop workers). One writer per file: no lock, no interleaving.

Each record holds the fields its host knows, and only those: a field the host does not know is absent, never 0 or
null (`FIELDS`). The clock of `start_us` / `end_us`: the writing host's wall clock, in microseconds since the Unix
epoch (`time.time_ns() // 1000`), the clock of the manifest's `start_ns` / `end_ns`; the analysis maps them onto each
trace's clock as it maps the windows. Durations (`*_ms`) are milliseconds of the host's own measure.

Beside its samples, a vLLM engine writes one record per step of what its scheduler said after each iteration of
that step (`ENGINE_FIELDS`: vLLM's SchedulerStats, the KV cache's usage and the requests running and waiting, with the
engine's limits): what tells a queue bound by KV-cache memory from one bound by the engine's slots. Such a record has
`iterations` and no `sample` (`is_engine_record`); older readers pass over it.

A process killed mid-write leaves a cut last line: `read_samples` reads every whole line (a cut line up to the cut,
as a manifest's, analyze/inputs/salvage.py), so a crash loses at most the records in flight."""

from __future__ import annotations

from pathlib import Path

from .salvage import read_manifest

SAMPLES_DIR = "samples"
SUFFIX = ".jsonl"
SOURCES = ("rlprof", "vllm", "verl")  # the host that wrote a record: rlprof's trainer, a vLLM engine, verl's agent loop

# name -> (type, meaning). Every record has `step`, `sample` and `source`; the rest where its host knows them.
FIELDS: dict[str, tuple[type, str]] = {
    "step": (int, "the training step (1-based) whose rollout generated the sample"),
    "rank": (int, "the data-parallel rank that generated it (rlprof's sync rollout)"),
    "replica": (int, "the rollout replica or engine that generated it (async rollout, a vLLM engine, verl's server)"),
    "sample": (
        int,
        "the sample's index in its step on its rank (0-based, in batch order); a vLLM engine's and a verl worker's "
        "count their step's samples in the order they finished",
    ),
    "start_us": (int, "when its generation began: the host's wall clock, microseconds since the epoch"),
    "end_us": (int, "when its last token was generated, same clock"),
    "prompt_tokens": (int, "prompt tokens (padding excluded)"),
    "response_tokens": (int, "generated tokens (EOS included, as the response mask counts them)"),
    "turns": (int, "assistant turns (1 for a single-turn rollout)"),
    "queue_ms": (float, "waiting before its generation began (submitted -> started)"),
    "prefill_ms": (float, "its prefill: the prompt's forward pass to its first token"),
    "decode_ms": (float, "its decode: first token to last"),
    "generate_ms": (float, "generation as a host times it whole where it does not split it (verl's agent loop)"),
    "tool_ms": (float, "time in tool calls"),
    "reward_ms": (float, "scoring it (its own reward call)"),
    "preemptions": (int, "times the engine preempted it"),
    "source": (str, "the host that wrote it: " + ", ".join(SOURCES)),
    "rollout_pass": (int, "rlprof's trainer: the step's generation pass (0; DAPO's refills 1, 2, ...)"),
    "group": (int, "rlprof's trainer: its prompt's group in its pass (the prompt's rollout.n samples share it)"),
    "group_filtered": (
        bool,
        "rlprof's trainer with DAPO's dynamic sampling: its group's rewards were all equal, so the filter dropped it",
    ),
    "first_decode_step": (int, "rlprof's trainer: its first decode step, numbered as the rlprof:decode_step:K ranges"),
    "last_decode_step": (int, "rlprof's trainer: the decode step that produced its last token"),
    "request_id": (str, "vLLM: the request's id"),
    "finish_reason": (str, "vLLM: why it stopped (stop, length, abort, ...)"),
    "cached_tokens": (int, "vLLM: prompt tokens served from the prefix cache"),
    "worker": (int, "verl: the agent-loop worker that ran it (step, worker and sample name one sample)"),
}
REQUIRED = ("step", "sample", "source")

# A sample's timed phases, in the order a sample lives them (a host records those it knows).
PHASES = ("queue_ms", "prefill_ms", "decode_ms", "generate_ms", "tool_ms", "reward_ms")
# Where each host's phases lie against its record's `start_us` .. `end_us` (what its clock marks):
# "inside": between them, one after the other from the end INSIDE_FROM names; "before": ending at `start_us`
# (rlprof's async replica starts after the driver's submission, its queue before); "after": after the batch was
# generated, at a time the host does not record (the trainer scores a batch in its reward stage).
PHASE_PLACES: dict[str, dict[str, str]] = {
    "vllm": {"queue_ms": "inside", "prefill_ms": "inside", "decode_ms": "inside", "reward_ms": "after"},
    "rlprof": {"queue_ms": "before", "prefill_ms": "inside", "decode_ms": "inside", "reward_ms": "after"},
    "verl": {"generate_ms": "inside", "tool_ms": "inside", "reward_ms": "inside"},
}
# The end of a record the inside phases are laid from: vLLM's queue begins as the request arrives (the engine core
# queues it at once) while its end is when the front end returned its last token, later on a loaded front end;
# verl's scoring ends with the record, its start is before the agent loop's own preparation; rlprof's phases fill
# the record exactly.
INSIDE_FROM = {"vllm": "start", "rlprof": "start", "verl": "end"}
# An iteration that left requests waiting is counted as held by the KV cache where the cache was at least this full
# after it, or it preempted a request (vLLM preempts only for want of KV-cache blocks); as held by the engine's slots
# where as many requests ran as max_num_seqs allows. The collector counts with this rule, the analysis reads the counts.
KV_FULL = 0.9

# name -> (type, meaning) of a vLLM engine's record of one step (collect/vllm_samples.py), besides step, source and
# rank or replica. Every count is over the engine's iterations of the step; limits where this vLLM says them.
ENGINE_FIELDS: dict[str, tuple[type, str]] = {
    "iterations": (int, "engine iterations of the step that reported scheduler stats"),
    "waiting_iterations": (int, "of them, those after which requests were still waiting to start"),
    "kv_full_iterations": (
        int,
        f"of the waiting ones, those with the KV cache at least {KV_FULL:.0%} full or a request preempted",
    ),
    "slots_full_iterations": (int, "of the waiting ones, those with max_num_seqs requests running"),
    "max_running": (int, "the most requests running after an iteration"),
    "max_waiting": (int, "the most requests waiting after an iteration"),
    "peak_kv_usage": (float, "the KV cache's fullest after an iteration (0-1, vLLM's kv_cache_usage)"),
    "preempted": (int, "requests preempted over the step (vLLM's num_preempted_reqs, summed)"),
    "max_num_seqs": (int, "the engine's max_num_seqs (requests it runs at once, at most)"),
    "max_num_batched_tokens": (int, "the engine's max_num_batched_tokens (tokens an iteration computes, at most)"),
    "kv_cache_tokens": (int, "tokens the KV cache holds (vLLM's num_gpu_blocks x block_size)"),
    "block_size": (int, "tokens per KV-cache block"),
    "rollout_pass": (int, "rlprof's trainer: the step's generation pass"),
}


def file_name(source: str, *, rank: int | None = None, replica: int | None = None, worker: int | None = None) -> str:
    """`<source>_rank<R>.jsonl`, `<source>_replica<K>.jsonl`, `<source>_worker<K>.jsonl`, or `<source>_driver.jsonl`
    (none given)."""
    if rank is not None:
        who = f"rank{rank}"
    elif replica is not None:
        who = f"replica{replica}"
    else:
        who = f"worker{worker}" if worker is not None else "driver"
    return f"{source}_{who}{SUFFIX}"


def samples_path(run_dir: Path, source: str, **who: int | None) -> Path:
    """Where one writer's records go (`who`: rank, replica or worker, as `file_name` takes them)."""
    return Path(run_dir) / SAMPLES_DIR / file_name(source, **who)


def sample_files(run_dir: Path) -> list[Path]:
    """The sample files of a run directory, and of the run directories right under it (a save_path that holds
    several: verl's driver and each vLLM engine write their own), by path."""
    run_dir = Path(run_dir)
    found = list((run_dir / SAMPLES_DIR).glob("*" + SUFFIX)) + list(run_dir.glob(f"*/{SAMPLES_DIR}/*{SUFFIX}"))
    return sorted(p for p in found if p.is_file())


def read_samples(run_dir: Path) -> list[dict]:
    """Every sample record under a run directory (`sample_files`), file by file in the order written. A line cut by a
    crash is read up to the cut; a line that is no record (no step, sample or source) is left out. [] where the run
    recorded none (nothing was watched or profiled, or its host records no samples)."""
    return read_rollout_records(run_dir)[0]


def read_rollout_records(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """(the sample records, the engines' per-step records) under a run directory, in one pass over its files."""
    samples, engine = [], []
    for path in sample_files(run_dir):
        try:
            rows = read_manifest(path)[0]
        except OSError:
            continue
        samples += [r for r in rows if is_record(r)]
        engine += [r for r in rows if is_engine_record(r)]
    return samples, engine


def is_record(row: dict) -> bool:
    return isinstance(row.get("step"), int) and isinstance(row.get("sample"), int) and row.get("source") in SOURCES


def is_engine_record(row: dict) -> bool:
    return (
        isinstance(row.get("step"), int)
        and isinstance(row.get("iterations"), int)
        and "sample" not in row
        and row.get("source") in SOURCES
    )
