"""The registry of causes: every cause of a slow RL step rlprof can name is one record here, with all its parts:
the measure it is judged on and its threshold, when it fires and what its finding costs per step (impact), the
formula of what its first lever saves (analyze/diagnosis/savings.py) or why that cannot be predicted, its title and the
template of its sentence. Its levers (the config keys that act on it per framework) are the one part kept
elsewhere, as data in frameworks/levers.py under the cause's name: they are facts about verl's, MindSpeed-RL's and
rlprof's configs, checked against those configs like the rest of frameworks/, and the layer of framework facts
sits below analyze. Read by analyze/diagnosis/findings.py (judging), `predict` below (the saving), analyze/diagnosis/sentences.py
(the text), `rlprof advise --fix` (levers, measure, threshold, `--cause`'s names) and, through the findings
rendered from it, the report (title, levers).

The descriptive findings (where the time goes, not why) have their templates here too (DESCRIPTIONS), so that
every kind of finding the analysis emits is in one table (tests/test_causes.py checks both).

Adding a cause: one record in CAUSES (its threshold in THRESHOLDS, its levers in frameworks/levers.py, its formula
beside the others in analyze/diagnosis/savings.py where its saving can be predicted), and its firing case in
tests/test_causes.py. A cause judged on a measure of analyze/diagnosis/measures.py needs nothing else: `judge` says when it
fires and its impact, and findings loop over the records.

Over 400 lines because it is the registry: one record per cause, each with its judge, sentence and formula named,
beside the few helpers their sentences share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from ...frameworks.levers import LEVERS
from . import sample_savings, savings
from .finding import Finding
from .prediction import PredictionContext, not_predictable

THRESHOLDS = {
    "dominant_share": 0.35,  # a stage holding at least this share of the step (with 2+ stages marked)
    "stage_share": 0.10,  # stages below this share of the step get no bucket finding of their own
    "idle_share": 0.25,  # idle (device or thread waiting on nothing) at least this share of a stage
    "comm_share": 0.10,  # communication not hidden behind compute at least this share of a stage
    "memcpy_share": 0.10,  # copies overlapped by neither at least this share of a stage
    "min_ms": 0.5,  # below this a bucket is timer noise, whatever its share
    "variance": 0.25,  # (max - min) / mean of a stage's wall over 2+ steps of one rank
    "repeat_units": 4,  # at least this many units of one kind in a stage window
    "repeat_same_ops": 0.8,  # this share of them run the same set of operators
    "repeat_cv": 0.25,  # and their wall times vary by at most this coefficient of variation
    "tail_share": 0.30,  # decode-step time in the rollout tail (few rows still active), at least this share
    "padding_share": 0.30,  # tokens computed in micro-batches that are padding, at least this share
    "fixed_share": 0.50,  # micro-batch time that does not grow with tokens, at least this share
    "fixed_units": 4,  # with at least this many micro-batches per pass (fewer: nothing to merge)
    "reward_share": 0.15,  # the reward stage, at least this share of the step (it runs on the critical path)
    "weight_sync_share": 0.15,  # weight sync, at least this share of the step
    "launch_bound_share": 0.25,  # device idle waiting on launches, at least this share of a stage
    "memory_use_low": 0.50,  # peak allocated below this share of the device's memory: room left
    "tool_share": 0.30,  # the slowest samples' time in tool calls, at least this share of theirs
    "preempted_share": 0.05,  # samples the engine preempted (and recomputed), at least this share
    "queue_share": 0.20,  # samples' time queued before their generation began, at least this share of their time
    "refill_share": 0.25,  # the rollout's generation time spent in DAPO's refill passes, at least this share
    "outside_share": 0.30,  # the rollout stage's time outside its samples' generation, at least this share
    # a queue inside the engine is held by its KV cache (by its slots) where at least this share of the iterations
    # that left requests waiting had the cache full or preempted (had max_num_seqs running, and nothing preempted)
    "engine_bound_share": 0.50,
    "cap_percentile": 0.95,  # a response cap is offered at or above this percentile of the sampled response lengths
    "host_share": 0.10,  # the stage thread's time in one host-side cause (a sync, a transfer, a wait, the collector)
}

# A template is a str.format string over the finding's fields (its evidence, what only its sentence uses, role,
# stage, rank, `where`), or a function of those fields where the sentence has parts that come and go.
Template = str | Callable[[dict], str]
ENGINE_QUEUES = ("kv_cache", "slot_bound", "engine_queue")  # a queue inside the engine, wherever it is held
Formula = Callable[[PredictionContext, Finding, str], dict]


class Judging(NamedTuple):
    """What a measure-based cause is judged with: the thresholds, whether the measure's stage is large enough to
    matter (`large`), and a stage's time per step."""

    t: dict
    large: Callable[[dict], bool]
    stage_ms: Callable[[object], float]


@dataclass(frozen=True)
class Cause:
    name: str  # also its finding's kind and its key in frameworks/levers.py
    title: str  # the cause in a few words
    measure: str  # what it is judged on: a measure of analyze/diagnosis/measures.py, or a bucket or time named here
    threshold: (
        str | None
    )  # its key in THRESHOLDS (None: slow ranks are judged by analyze/diagnosis/ranks.py's own test)
    impact: str  # what its finding's impact_ms holds
    sentence: Template
    saving: Formula | str  # the formula of its first lever's saving, or why the data cannot predict it
    # measure-based causes: the finding's impact where the measure record fires, else None (findings loop over
    # these); the others are found by a function of analyze/diagnosis/findings.py named in FOUND_BY there
    judge: Callable[[dict, Judging], float | None] | None = None
    # the causes this one can be a symptom of: where one of them is found too, this one is said inside that root's
    # finding, whose levers act on both (preemption inside a queue held by the KV cache; samples finishing in waves
    # behind a queue in the engine look like a long tail; the host waiting in a stage whose reward or tools are slow):
    # a root counts only where it was found in the symptom's stage
    roots: tuple[str, ...] = ()

    @property
    def levers(self) -> dict:
        """{dialect: (Lever, ...)} (frameworks/levers.py)."""
        return LEVERS[self.name]


def _host_judge(m: dict, j: Judging) -> float | None:
    """A host-side cause (analyze/window/idle_frames.py): its share of the stage at least host_share, the stage large
    enough to matter, its time above timer noise."""
    return m["host_ms"] if m["value"] >= j.t["host_share"] and j.large(m) and m["host_ms"] >= j.t["min_ms"] else None


def _host_sentence(label: str, doing: str, why: str) -> Callable[[dict], str]:
    return lambda x: (
        f"{label}: {x['value']:.0%} of {x['where']} ({x['host_ms']:.1f} of {x['wall_ms']:.1f} ms per pass) {doing} "
        f"at {x['file']}:{x['line']} {x['function']}: {why}"
    )


HOST_SAVING = (
    "the host's stacks say where its time went, not what the code would take without it: rlprof cannot predict "
    "the saving"
)


def where(role, stage) -> str:
    """A stage as sentences name it."""
    return f"{role}/{stage}" if stage else "the profiled window"


def queue_bound(m: dict, t: dict) -> str:
    """The cause of a queue of samples, by where it is held: `queued` before the engine (rlprof's async replicas), or
    inside it `kv_cache` (at least engine_bound_share of the iterations that left requests waiting had the cache full
    or preempted), `slot_bound` (as many had max_num_seqs running, and nothing was preempted), else `engine_queue`
    (its scheduler's stats not recorded, or neither bound held)."""
    if not m.get("in_engine", True):
        return "queued"
    waiting = m.get("waiting_iterations")
    if not waiting:
        return "engine_queue"
    if m["kv_full_iterations"] >= t["engine_bound_share"] * waiting:
        return "kv_cache"
    if m["slots_full_iterations"] >= t["engine_bound_share"] * waiting and not m.get("preempted"):
        return "slot_bound"
    return "engine_queue"


def _queued(m: dict, j: Judging, cause: str) -> float | None:
    """A queue past its threshold whose cause (queue_bound) is `cause`: each step's longest wait."""
    fires = m["value"] >= j.t["queue_share"] and j.large(m) and queue_bound(m, j.t) == cause
    return m["longest_queue_ms"] if fires else None


def _queue_cause(name: str, title: str, label: str, tail: Callable[[dict], str], saving: Formula | str) -> Cause:
    """A queue of samples past queue_share, held where `name` says (queue_bound), said `label: samples wait ...` and
    then `tail`."""
    return Cause(
        name,
        title,
        measure="queue_share",
        threshold="queue_share",
        impact="each step's longest wait in the queue",
        sentence=lambda x: (
            f"{label}: samples wait {x['value']:.0%} of their time before their generation starts ({x['queue_ms']:.1f} "
            f"ms a sample; the longest wait {x['longest_queue_ms']:.1f} ms per step)" + tail(x)
        ),
        saving=saving,
        judge=lambda m, j: _queued(m, j, name),
    )


def _memory_sentence(x: dict) -> str:
    return (
        f"memory headroom: the peak is {x['value']:.0%} of the device's memory ({x['peak_bytes'] / 2**30:.1f}"
        f" of {x['capacity_bytes'] / 2**30:.1f} GiB) in {x['file']}: larger micro-batches fit"
    )


def _outside_sentence(x: dict) -> str:
    parts = [
        f"{x[k]:.1f} ms {what}"
        for k, what in (
            ("handover_ms", "after the last sample before the batch was handed over (the replay buffer's poll)"),
            ("release_ms", "after the handover (the replicas put to sleep)"),
        )
        if x.get(k) is not None
    ]
    return (
        f"rollout outside generation: {x['value']:.0%} of the rollout stage is not its samples' generation "
        f"({x['outside_ms']:.1f} of {x['stage_ms']:.1f} ms per step, mean over {x['steps']} unprofiled step(s); "
        f"generation {x['generation_ms']:.1f} ms)" + (": " + "; ".join(parts) if parts else "")
    )


def _refill_sentence(x: dict) -> str:
    passes = "; ".join(
        f"pass {p['pass']} {p['groups']} groups, {p['dropped']} dropped"
        if p["groups"]
        else f"{'the first batch' if p['pass'] == 0 else 'the refills'} {p['samples']} samples"
        for p in x["passes"]
    ) + (f"; the filter dropped {x['filtered_groups']} groups" if x.get("filtered_groups") else "")
    return (
        f"dynamic sampling: {x['value']:.0%} of the rollout's generation time regenerates filtered groups "
        f"({x['refill_ms']:.1f} of {x['rollout_ms']:.1f} ms per step in refill passes, {x['refilled_steps']} of "
        f"{x['steps']} step(s) refilled; {passes}, summed over the steps)"
    )


def _comm_sentence(x: dict) -> str:
    text = _bucket_sentence("exposed communication", "collectives not hidden behind compute")(x)
    if x.get("collectives"):
        text += " (" + ", ".join(f"{c['name']} {c['ms']:.1f} ms" for c in x["collectives"]) + ")"
    return text


def _bucket_sentence(label: str, why: str) -> Callable[[dict], str]:
    return lambda x: (
        f"{label} is {x['share']:.0%} of {x['where']} ({x['bucket_ms']:.1f} of {x['wall_ms']:.1f} ms): {why}"
    )


CAUSES: dict[str, Cause] = {
    c.name: c
    for c in (
        Cause(
            "rollout_tail",
            "long-tail responses: most of the batch has finished and the engine decodes for a few",
            measure="rollout_tail",
            threshold="tail_share",
            impact="the decode-step time in the tail, per pass",
            sentence=lambda x: (
                f"rollout tail: {x['value']:.0%} of {x['where']}'s rollout is spent with fewer than half of its samples "
                f"still running ({x['tail_ms']:.1f} of {x['decode_ms']:.1f} ms per step over {x['steps']} step(s) of "
                f"{x['samples_per_step']:.0f} samples, from the samples' own start and end)"
                if x.get("basis") == "samples"
                else f"rollout tail: {x['value']:.0%} of {x['where']}'s decode time is spent with fewer than half of the "
                f"rows still generating ({x['tail_steps']} of {x['decode_steps']} decode steps; "
                f"{x['mean_active_share']:.0%} of rows active on average)"
            ),
            saving=savings.rollout_tail,
            roots=ENGINE_QUEUES,
            judge=lambda m, j: (
                m["tail_ms"]
                if m["value"] >= j.t["tail_share"] and j.large(m) and m["tail_ms"] >= j.t["min_ms"]
                else None
            ),
        ),
        Cause(
            "padding",
            "padding: micro-batches compute pad tokens that carry no data",
            measure="padding",
            threshold="padding_share",
            impact="the stage's time per step times its pad share",
            sentence="padding: {value:.0%} of the tokens {where} computes are pad ({real_tokens} real of {tokens} "
            "computed over {micro_batches} micro-batches)",
            saving=savings.padding,
            judge=lambda m, j: (
                j.stage_ms(m["stage"]) * m["value"] if m["value"] >= j.t["padding_share"] and j.large(m) else None
            ),
        ),
        Cause(
            "small_units",
            "micro-batches too small: a fixed cost per micro-batch (launches, Python) dominates",
            measure="fixed_cost",
            threshold="fixed_share",
            impact="the fixed cost of a pass's micro-batches",
            sentence="micro-batches too small: {value:.0%} of {where}'s micro-batch time is a fixed {fixed_ms:.2f} ms per "
            "micro-batch that does not grow with tokens ({units_per_pass:.0f} micro-batches of {mean_seqs:.1f} "
            "rows per pass)",
            saving=savings.small_units_lever,
            judge=lambda m, j: (
                m["fixed_ms_per_pass"]
                if m["value"] >= j.t["fixed_share"] and m["units_per_pass"] >= j.t["fixed_units"] and j.large(m)
                else None
            ),
        ),
        Cause(
            "unused_reference",
            "the reference forward runs but its KL term has coefficient 0: no gradient uses it",
            measure="ref_ms",
            threshold="min_ms",
            impact="the reference pass's time per step",
            sentence="unused reference pass: ref_compute_log_prob takes {ref_ms:.1f} ms per step ({step_share:.0%}) and "
            "the run's KL coefficient is 0 ({source}): the log-probs it computes change no gradient",
            saving=savings.unused_reference,
        ),
        Cause(
            "slow_reward",
            "the reward function runs on the critical path: every device waits while it scores",
            measure="reward_share",
            threshold="reward_share",
            impact="the reward stage's time per step",
            sentence="slow reward: {stage} takes {value:.0%} of the step ({stage_ms:.1f} of {step_ms:.1f} ms) on the "
            "critical path: generation is done and training has not begun while it scores",
            saving=savings.slow_reward,
            judge=lambda m, j: m["stage_ms"] if m["value"] >= j.t["reward_share"] else None,
        ),
        Cause(
            "weight_sync",
            "weight sync: the full weights are gathered and copied to the rollout every step",
            measure="weight_sync_share",
            threshold="weight_sync_share",
            impact="the weight-sync stage's time per step",
            sentence="weight sync takes {value:.0%} of the step ({stage_ms:.1f} of {step_ms:.1f} ms)",
            saving=savings.weight_sync,
            judge=lambda m, j: m["stage_ms"] if m["value"] >= j.t["weight_sync_share"] else None,
        ),
        Cause(
            "exposed_comm",
            "communication the compute does not hide (FSDP all-gathers, reduce-scatters)",
            measure="comm_share",
            threshold="comm_share",
            impact="the stage's communication time not hidden behind compute",
            sentence=_comm_sentence,
            saving=savings.exposed_comm,
        ),
        Cause(
            "slow_rank",
            "one rank is slower and every collective waits for it",
            measure="slow_rank",
            threshold=None,
            impact="the other ranks' wait for it in collectives, less its own",
            sentence="{summary}",
            saving=savings.slow_rank,
        ),
        Cause(
            "launch_bound",
            "launch-bound device: the GPU waits for the host to issue the next kernel",
            measure="launch_bound",
            threshold="launch_bound_share",
            impact="the device's gaps the host had not yet launched into, per pass",
            sentence="launch-bound: the device waits on the host to launch work {value:.0%} of {where} "
            "({launch_bound_ms:.1f} of {wall_ms:.1f} ms)",
            saving=savings.launch_bound,
            judge=lambda m, j: m["launch_bound_ms"] if m["value"] >= j.t["launch_bound_share"] and j.large(m) else None,
        ),
        Cause(
            "slow_tools",
            "slow tool calls: the samples the step waits for spend their time waiting on tools",
            measure="tool_share",
            threshold="tool_share",
            impact="the tool time of each step's slowest sample",
            sentence="slow tools: each step's slowest sample spends {value:.0%} of its time in tool calls "
            "({tool_ms:.1f} of {slowest_ms:.1f} ms, mean over {steps} step(s)): the batch waits for it",
            saving=sample_savings.slow_tools,
            judge=lambda m, j: m["tool_ms"] if m["value"] >= j.t["tool_share"] and j.large(m) else None,
        ),
        Cause(
            "preemption",
            "preemption: the engine evicts running samples for lack of KV-cache memory and recomputes them",
            measure="preempted_share",
            threshold="preempted_share",
            impact="how much longer each step's slowest preempted sample took than its median sample",
            sentence="preemption: the engine preempted {value:.0%} of the samples ({preempted} of {samples}, "
            "{preemptions} preemptions); the slowest preempted sample took {excess_ms:.1f} ms more than the median, "
            "per step",
            saving=sample_savings.kv_cache,
            judge=lambda m, j: m["excess_ms"] if m["value"] >= j.t["preempted_share"] and j.large(m) else None,
            roots=("kv_cache",),
        ),
        _queue_cause(
            "kv_cache",
            "KV-cache bound: the engine's KV cache cannot hold the samples it runs, so they wait and are preempted",
            "KV-cache bound",
            lambda x: (
                f" while the engine's KV cache was full ({x['kv_full_iterations']} of the {x['waiting_iterations']} "
                f"iterations that left requests waiting; {x['preempted']} requests preempted; at most {x['max_running']} ran"
                + (f" of max_num_seqs {x['max_num_seqs']}" if x.get("max_num_seqs") else "")
                + (f"; its cache holds {x['kv_cache_tokens']} tokens" if x.get("kv_cache_tokens") else "")
                + ")"
            ),
            sample_savings.kv_cache,
        ),
        _queue_cause(
            "slot_bound",
            "slot-bound engine: samples wait for one of its max_num_seqs slots while its KV cache has room",
            "slot-bound",
            lambda x: (
                f" while max_num_seqs ({x['max_num_seqs']}) requests ran ({x['slots_full_iterations']} of the "
                f"{x['waiting_iterations']} iterations that left requests waiting; its KV cache at most "
                f"{x['peak_kv_usage']:.0%} full, nothing preempted)"
            ),
            sample_savings.slot_bound,
        ),
        _queue_cause(
            "engine_queue",
            "a queue inside the engine whose bound the data cannot tell: its KV cache or its slots (max_num_seqs)",
            "queued",
            lambda x: (
                ": the data cannot tell whether the engine's KV cache or its slots (max_num_seqs) held them"
                + (
                    f" ({x['kv_full_iterations']} of {x['waiting_iterations']} waiting iterations with the cache full, "
                    f"{x['slots_full_iterations']} with every slot taken)"
                    if x.get("waiting_iterations")
                    else " (vLLM's scheduler stats were not recorded: disable_log_stats=False records them)"
                )
                + "; only more KV-cache memory is given, which neither bound makes worse"
            ),
            "the data cannot tell whether the KV cache or the engine's slots hold the queue, so what either lever "
            "saves is not known",
        ),
        _queue_cause(
            "queued",
            "a queue before the engine: samples wait for an agent worker or rollout replica to send them",
            "queued",
            lambda x: " (before the engine: for a worker or replica to take them)",
            sample_savings.queued,
        ),
        Cause(
            "dynamic_sampling",
            "dynamic sampling's refills: the rollout regenerates the groups the filter dropped (rewards all equal)",
            measure="refill_share",
            threshold="refill_share",
            impact="the refill passes' generation time per step",
            sentence=_refill_sentence,
            saving=savings.dynamic_sampling,
            judge=lambda m, j: m["refill_ms"] if m["value"] >= j.t["refill_share"] and j.large(m) else None,
        ),
        Cause(
            "rollout_outside",
            "the rollout stage waits outside generation: no sample is being generated for much of it",
            measure="outside_share",
            threshold="outside_share",
            impact="the rollout stage's time outside its samples' generation per step",
            sentence=_outside_sentence,
            saving=savings.rollout_outside,
            judge=lambda m, j: m["outside_ms"] if m["value"] >= j.t["outside_share"] and j.large(m) else None,
        ),
        Cause(
            "host_sync",
            "host syncs: the host waits for the device's queue to drain (.item(), .cpu(), .tolist(), synchronize), "
            "and the device then waits for the host's next launch",
            measure="host_sync",
            threshold="host_share",
            impact="the stage thread's time in host syncs, per pass",
            sentence=_host_sentence(
                "host sync",
                "is spent in host syncs",
                "the host cannot run ahead of the device there; move the sync out of the loop, or batch it",
            ),
            saving=HOST_SAVING,
            judge=_host_judge,
        ),
        Cause(
            "data_transfer",
            "data moved between roles: batches serialised, put and fetched (TransferQueue, Ray's object store)",
            measure="data_transfer",
            threshold="host_share",
            impact="the stage thread's time moving data, per pass",
            sentence=_host_sentence(
                "data transfer",
                "moves data between roles",
                "the device waits while the batch is serialised, put and fetched",
            ),
            saving=HOST_SAVING,
            judge=_host_judge,
        ),
        Cause(
            "host_wait",
            "the host waits on I/O, a remote call or another thread, with no work of its own",
            measure="host_wait",
            threshold="host_share",
            impact="the stage thread's time waiting, per pass",
            sentence=_host_sentence(
                "waiting",
                "waits on I/O, a remote call or another thread",
                "nothing runs meanwhile; more of those waits in flight at once hide each other",
            ),
            saving=HOST_SAVING,
            judge=_host_judge,
            roots=("slow_reward", "slow_tools"),  # a slow verifier or tool is what the host waits on
        ),
        Cause(
            "garbage_collection",
            "garbage collection: Python's collector pauses the stage thread",
            measure="garbage_collection",
            threshold="host_share",
            impact="the stage thread's time in collections, per pass",
            sentence=_host_sentence(
                "garbage collection",
                "is Python's garbage collector (timed by gc.callbacks), first run into",
                "each collection rescans the long-lived objects",
            ),
            saving=HOST_SAVING,
            judge=_host_judge,
        ),
        Cause(
            "memory_headroom",
            "unused device memory: the peak is far below the device's capacity",
            measure="memory_use",
            threshold="memory_use_low",
            impact="none (memory left unused costs no time by itself): 0",
            sentence=_memory_sentence,
            saving="unused memory costs no time by itself: larger micro-batches use it, and their saving is the fixed "
            "cost per micro-batch's (fixed_cost) where that was measured",
            judge=lambda m, j: 0.0 if m["value"] < j.t["memory_use_low"] else None,
        ),
    )
}


def idle_frames_words(x: dict) -> str:
    """The frames an idle finding names: "idle 202.1 ms: 99% in rlprof/trainer/reward.py:19 score, 1% unattributed"
    ("" where the host's stacks were not sampled)."""
    if not x.get("frames"):
        return ""
    parts = [
        f"{f['share']:.0%} in {f['file']}:{f['line']} {f['function']}"
        + (f" (inside {f['inside']})" if f["inside"] != f["library"] else "")
        for f in x["frames"]
    ]
    if x.get("unattributed_share", 0) >= 0.005:
        parts.append(f"{x['unattributed_share']:.0%} unattributed (no host sample near it)")
    return f"idle {x['bucket_ms']:.1f} ms: " + ", ".join(parts)


def _idle_sentence(x: dict) -> str:
    why = "no operator or kernel running (host overhead, waiting, gaps between launches)"
    if "stages" not in x:
        frames = idle_frames_words(x)
        return _bucket_sentence("idle", why)(x) + (f"; {frames}" if frames else "")
    parts = ", ".join(
        f"{where(s['role'], s['stage'])} {s['share']:.0%} ({s['bucket_ms']:.1f} of {s['wall_ms']:.1f} ms"
        + (f"; {idle_frames_words(s)}" if s.get("frames") else "")
        + ")"
        for s in x["stages"]
    )
    return (
        f"idle is {x['share']:.0%} of {len(x['stages'])} stages ({x['bucket_ms']:.1f} of {x['wall_ms']:.1f} ms): "
        f"{parts}: {why}"
    )


def _busy_sentence(x: dict) -> str:
    step = f" (step {x['step']})" if x.get("step") is not None else ""
    rest = (
        "it is left out of the causes and measures, which come from the quieter windows"
        if x["quiet_left"]
        else "every window was, so the causes below rank timings that are not the program's own: profile again on "
        "a quieter machine, or with fewer threads (rlprof's trainer: trainer.threads)"
    )
    return (
        f"the machine was busy while {x['name']}{step} was recorded: other processes used "
        f"{x['external_share']:.0%} of its CPUs and this process's threads waited for a core "
        f"{x['wait_share']:.0%} of the time they were ready to run ({x['run_wait_ms']:.0f} of "
        f"{x['cpu_ms'] + x['run_wait_ms']:.0f} ms), so its timings are not the program's own; {rest}"
    )


UNIT_WORDS = {"micro_batch": "micro-batches", "mini_batch": "mini-batches", "decode_step": "decode steps"}


def _repeat_sentence(x: dict) -> str:
    unit = x["unit"]
    return (
        f"the {x['units']} {UNIT_WORDS.get(unit, unit)} of {x['role']}/{x['stage']} run the same operators "
        f"({x['same_ops']} of {x['units']} alike) at {x['mean_ms']:.2f} ms ± {x['cv']:.0%}: one of them "
        f"({{unit: {unit}, active: 1}}) represents the rest at 1/{x['units']} of the data"
    )


# The findings that say where the time goes, not why: their sentences, in the order they rank among themselves
# (after the causes; a cause with no lever for its stage ranks here too, by its kind).
DESCRIPTIONS: dict[str, Template] = {
    "busy_machine": _busy_sentence,
    "slow_rank": CAUSES["slow_rank"].sentence,
    "dominant_stage": "{stage} dominates the step: {share:.0%} of the staged time ({stage_ms:.1f} of {step_ms:.1f} ms "
    "per step, mean over {ranks} rank(s)); next is {next} ({next_share:.0%})",
    "exposed_comm": CAUSES["exposed_comm"].sentence,
    "idle": _idle_sentence,
    "memcpy": _bucket_sentence("memcpy", "copies overlapped by neither compute nor communication"),
    "variance": "{role}/{stage} on rank {rank} varies {spread_share:.0%} from step to step ({low_ms:.1f} ms at step "
    "{low_step}, {high_ms:.1f} ms at step {high_step}): profile more than one step before trusting one",
    "truncated": "{path} was cut short by its max_bytes_per_window budget: the stage after the cut is missing from it",
    "repeating_units": _repeat_sentence,
}
ORDER = tuple(DESCRIPTIONS)


def template(kind: str) -> Template:
    """The sentence template of a finding kind (KeyError: a kind the registry does not know)."""
    return CAUSES[kind].sentence if kind in CAUSES else DESCRIPTIONS[kind]


def predict(ctx: PredictionContext, f: Finding, dialect: str | None = None) -> dict:
    """The saving of a cause finding's first lever in `dialect` (the run's own framework by default): its
    formula's prediction, or not predictable with the reason its record gives."""
    dialect = dialect or ctx.dialect
    saving = CAUSES[f.kind].saving
    out = not_predictable(saving) if isinstance(saving, str) else saving(ctx, f, dialect)
    out["dialect"] = dialect
    return out
