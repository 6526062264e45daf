"""The analysis result as typed values: one msgspec Struct per record of analysis.json (a row, an operator, a
collective, a launch record, a memory record, an input, a measure, a finding and its saving, the run over time)
and `Analysis`, the whole document, with `rlprof.analyze(path)` as its front door.

The Structs mirror the JSON exactly: a field that is sometimes absent from a record is `UNSET` there (and stays
absent when encoded), one that is always present but may be null is `... | None`. Encoding an Analysis made from
a document gives that document's keys and values (tests/test_analysis_result.py). docs/analysis_schema.md's field
reference is generated from these types (`schema_reference`; a test checks that it is up to date). The document
is still assembled as dicts (analyze/document.py, findings.py, savings.py); `Analysis.from_document` types it at
the end, strictly: a key the types do not know is an error, never dropped.

Over 400 lines because it is the schema: one line per field of every record.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Union

import msgspec
from msgspec import UNSET, UnsetType

from ..errors import AnalyzeError
from .tables.schema import SCHEMA_VERSION

# Numbers a sum over nothing leaves as the integer 0 (or a count) and otherwise floats: kept as written.
Number = Union[int, float]
# Steps, ranks and indices are integers from rlprof and the frameworks it reads; other tools' traces may name them.
Label = Union[int, str, None]


class Record(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A record of analysis.json (an unknown key is an error, an absent optional one stays absent)."""

    def get(self, key: str, default=None):
        """The field's value as the JSON gives it: `default` where the record does not hold it."""
        value = getattr(self, key, default)
        return default if value is UNSET else value


class Buckets(Record, kw_only=True):
    """Where a window's time went (ms); compute + comm + memcpy + idle = wall."""

    wall_ms: Number
    compute_ms: Number
    comm_ms: Number
    overlap_ms: Number
    memcpy_ms: Number
    idle_ms: Number


class Limits(Record, kw_only=True):
    """The work a row did and how far it ran from its device's limits (analyze/diagnosis/speed_of_light.py): present
    where the model and what the row computed are known; the limits where its device's are too."""

    work_from: str | UnsetType = UNSET
    model_flops: Number | UnsetType = UNSET
    padded_flops: Number | UnsetType = UNSET
    min_bytes: Number | UnsetType = UNSET
    achieved_tflops: Number | UnsetType = UNSET
    achieved_gbps: Number | UnsetType = UNSET
    mfu: Number | UnsetType = UNSET
    mbu: Number | UnsetType = UNSET
    mfu_verl: Number | UnsetType = UNSET
    sol_ms: Number | UnsetType = UNSET
    bound: str | UnsetType = UNSET
    gap_ms: Number | UnsetType = UNSET
    gap_idle_ms: Number | UnsetType = UNSET
    gap_launch_ms: Number | UnsetType = UNSET
    gap_comm_ms: Number | UnsetType = UNSET
    gap_memcpy_ms: Number | UnsetType = UNSET
    gap_padding_ms: Number | UnsetType = UNSET
    gap_small_batches_ms: Number | UnsetType = UNSET
    gap_kernels_ms: Number | UnsetType = UNSET
    gap_largest: str | None | UnsetType = UNSET


class StageCall(Record, kw_only=True):
    """The whole stage call a window kept some micro-batches of (verl's plugin records it): its wall time as verl's own
    mfu takes it (`timed`: the calls verl's timers wrap), the micro-batches it ran, and all of their real tokens and
    query-key pairs; its model FLOPs and mfu (also against verl's peak: `mfu_verl`) where the model and device are
    known. The rate the framework's own mfu states for the call, beside the kept micro-batches' own."""

    wall_ms: Number
    timed: str | UnsetType = UNSET
    units: int
    real_tokens: int | UnsetType = UNSET
    query_key_pairs: int | UnsetType = UNSET
    tallied_units: int | UnsetType = UNSET
    model_flops: Number | UnsetType = UNSET
    mfu: Number | UnsetType = UNSET
    mfu_verl: Number | UnsetType = UNSET


class Row(Limits, kw_only=True):
    """One (step, role, stage, rank) window, or one unit (micro-/mini-batch, decode step) inside it. `step_source`: where
    a window whose file names no step took it from (analyze/over_time/row_steps.py: `samples`, the samples that ran
    in its time range; `watch`, the watch's step boundaries; `windows`, the windows of the other files); absent where
    its file or manifest row says it."""

    step: Label
    role: str | None
    stage: str | None
    rank: Label
    replica: Label
    file: str | None
    unit: str | None
    index: Label
    start_us: float | None
    wall_ms: Number
    compute_ms: Number
    comm_ms: Number
    overlap_ms: Number
    memcpy_ms: Number
    idle_ms: Number
    unknown_ms: Number | UnsetType = UNSET
    host_start_us: float | UnsetType = UNSET
    host_wall_ms: float | UnsetType = UNSET
    device_start_us: float | None | UnsetType = UNSET
    attribution: str | UnsetType = UNSET
    unlinked_events: int | UnsetType = UNSET
    device_overlap_next_ms: float | UnsetType = UNSET
    device_gap_ms: float | UnsetType = UNSET
    launch_bound_ms: float | UnsetType = UNSET
    launch_unlinked_ms: float | UnsetType = UNSET
    ops_sig: str | None | UnsetType = UNSET
    seqs: int | UnsetType = UNSET
    tokens: int | UnsetType = UNSET
    real_tokens: int | UnsetType = UNSET
    active: int | UnsetType = UNSET
    prefill_seqs: int | UnsetType = UNSET
    prefill_tokens: int | UnsetType = UNSET
    context_tokens: int | UnsetType = UNSET
    query_key_pairs: int | UnsetType = UNSET
    units_only: int | UnsetType = UNSET
    call: StageCall | UnsetType = UNSET
    writer: str | None | UnsetType = UNSET
    step_source: str | UnsetType = UNSET
    idle_frames: list[IdleFrame] | UnsetType = UNSET
    idle_frames_rest_ms: Number | UnsetType = UNSET
    idle_unattributed_ms: Number | UnsetType = UNSET
    idle_libraries: dict[str, Number] | UnsetType = UNSET
    idle_tree: list[IdleNode] | UnsetType = UNSET
    host_time: dict[str, HostSite] | UnsetType = UNSET
    host_samples: int | UnsetType = UNSET
    launch_frames: list[IdleFrame] | UnsetType = UNSET


class Frame(Record, kw_only=True):
    """A Python frame of the host (analyze/window/idle_frames.py): its function, its file from its package's root, its
    line and the library it belongs to."""

    function: str
    file: str
    line: int
    library: str


class IdleFrame(Frame, kw_only=True):
    """A frame a row's idle is charged to: the innermost frame of the code that drives the stage (a framework or the
    user's own) on the stage thread's stack while nothing ran; `inside`: the library the thread was in then."""

    inside: str
    ms: Number
    share: Number  # of the row's idle_ms (launch_frames: of its launch_bound_ms)


class IdleNode(Frame, kw_only=True):
    """A node of a row's idle icicle: a frame under its parent (-1: a root), with the idle time of the stacks through
    it."""

    id: int
    parent: int
    ms: Number


class HostSite(Frame, kw_only=True):
    """The stage thread's time in one host-side cause (host_sync, data_transfer, host_wait, garbage_collection) over
    the row, and its top call site."""

    ms: Number


class StageLimits(Limits, kw_only=True):
    """One (role, stage) against its device's limits: its stage rows' work, wall, speed of light and gap summed over
    its `rows`, its ratios the sums' (analyze/diagnosis/speed_of_light.py)."""

    role: str | None
    stage: str | None
    rows: int
    wall_ms: Number
    calls: StageCalls | UnsetType = UNSET


class StageCalls(Record, kw_only=True):
    """A stage's whole calls summed, where its windows kept some micro-batches of each (`StageCall`): how many, their
    wall time and FLOPs, and their mfu (FLOPs over the sum of each call's time x the peak)."""

    calls: int
    units: int
    wall_ms: Number
    model_flops: Number
    mfu: Number | UnsetType = UNSET
    mfu_verl: Number | UnsetType = UNSET


class Model(Record, kw_only=True):
    """The model the run computed with, in Hugging Face's terms, and where it was read (`source`); `why` where none
    is known."""

    source: str | None
    why: str | UnsetType = UNSET
    model_type: str | None | UnsetType = UNSET
    hidden_size: int | UnsetType = UNSET
    num_hidden_layers: int | UnsetType = UNSET
    num_attention_heads: int | UnsetType = UNSET
    num_key_value_heads: int | UnsetType = UNSET
    head_dim: int | UnsetType = UNSET
    intermediate_size: int | UnsetType = UNSET
    vocab_size: int | UnsetType = UNSET
    tie_word_embeddings: bool | UnsetType = UNSET
    num_experts: int | UnsetType = UNSET
    num_experts_per_tok: int | UnsetType = UNSET
    moe_intermediate_size: int | UnsetType = UNSET
    num_shared_experts: int | UnsetType = UNSET
    dtype: str | UnsetType = UNSET
    kv_cache_dtype: str | UnsetType = UNSET


class Hardware(Record, kw_only=True):
    """The device a window ran on and its limits: peak dense FLOP/s per dtype and memory bandwidth (bytes/s), from
    rlprof's table of devices or, for a CPU, measured at collection start (`source`); `why` where not known."""

    kind: str | None
    name: str | None
    count: int | None
    peak_flops: dict[str, Number]
    bandwidth: Number | None
    source: str | None
    verl_peak_flops: Number | None
    cores: int | None | UnsetType = UNSET
    threads: int | None | UnsetType = UNSET
    why: str | UnsetType = UNSET


class InWindow(Record, kw_only=True):
    """A record totalled per stage window: the window it belongs to and its file."""

    rank: Label
    step: Label
    role: str | None
    stage: str | None
    file: str


class Op(InWindow, kw_only=True):
    """A CPU operator or a kernel, totalled per stage window."""

    name: str
    kind: str
    count: int
    total_ms: Number
    self_ms: Number
    mean_ms: Number
    max_ms: Number
    share: Number
    shape: str | UnsetType = UNSET


class Collective(InWindow, kw_only=True):
    """A collective by name, totalled per stage window."""

    name: str
    count: int
    total_ms: Number
    mean_ms: Number
    max_ms: Number


class Launch(InWindow, kw_only=True):
    """A device trace's host-side launch calls and the device's idle gaps over the file."""

    launches: int
    total_ms: Number
    mean_us: Number
    device_span_ms: Number | UnsetType = UNSET
    device_gap_ms: Number | UnsetType = UNSET
    launch_bound_ms: Number | UnsetType = UNSET
    launch_unlinked_ms: Number | UnsetType = UNSET


class Memory(InWindow, kw_only=True):
    """One allocator's peak, its timeline of [ts_us, allocated_bytes], the device's capacity (or why unknown)."""

    peak_bytes: Number | None
    device: int | str | None | UnsetType = UNSET
    timeline: list[list[Number]]
    capacity_bytes: Number | UnsetType = UNSET
    reserved_bytes: Number | UnsetType = UNSET
    live_bytes: Number | UnsetType = UNSET
    device_name: str | None | UnsetType = UNSET
    free_bytes: Number | UnsetType = UNSET
    max_reserved_bytes: Number | UnsetType = UNSET
    capacity_why: str | UnsetType = UNSET


class AnalysedOn(Record, kw_only=True):
    """Where an input was analysed."""

    host: str | None
    node_id: str | None
    reused: bool | UnsetType = UNSET


class Input(Record, kw_only=True):
    """One file or Ascend directory read."""

    path: str
    kind: str | UnsetType = UNSET
    export: str | UnsetType = UNSET
    files: list[str] | UnsetType = UNSET
    device_totals: Buckets | None | UnsetType = UNSET
    device_totals_all_tasks: Buckets | None | UnsetType = UNSET
    events: int
    device: bool | UnsetType = UNSET
    rank: Label | UnsetType = UNSET
    partial: bool
    bytes_read: int | UnsetType = UNSET
    clock_base_ns: int | UnsetType = UNSET
    error: str | UnsetType = UNSET
    window_status: str | None | UnsetType = UNSET
    window_bytes: int | None | UnsetType = UNSET
    tool: str | None | UnsetType = UNSET
    step: Label | UnsetType = UNSET
    cpu_ms: Number | None | UnsetType = UNSET
    run_wait_ms: Number | None | UnsetType = UNSET
    span_ms: Number | None | UnsetType = UNSET
    host_busy_ms: Number | None | UnsetType = UNSET
    job_cpu_ms: Number | None | UnsetType = UNSET
    host_cpus: int | None | UnsetType = UNSET
    hardware: Hardware | UnsetType = UNSET
    analysed_on: AnalysedOn | None | UnsetType = UNSET


class Unprofiled(Record, kw_only=True):
    """The run's steady unprofiled steps, from the metrics.jsonl beside its traces."""

    source: str
    steps: list[Label]
    step_ms: Number | None
    stage_ms: dict[str, Number]


class RunConfig(Record, kw_only=True):
    """What the run that wrote the traces left beside them."""

    source: str
    framework: str | None
    reference_pass: bool
    kl_coef: Number
    config: dict[str, Any] | None
    unprofiled: Unprofiled | None


class RefillPass(Record, kw_only=True):
    """One generation pass of DAPO's dynamic sampling (0: the first; refills after), summed over the watched steps:
    its samples, its groups and those the filter dropped (0 where the host does not say its groups)."""

    # `pass` is a Python keyword: the field keeps its JSON name
    pass_: int = msgspec.field(name="pass")
    samples: int
    groups: int
    dropped: int


class Measure(Record, kw_only=True):
    """An RL measure, with the inputs of its formula (those of its kind; `why` where not measurable)."""

    measure: str
    role: str | None
    stage: str | None
    value: Number | None
    status: str
    why: str | UnsetType = UNSET
    tail_ms: Number | UnsetType = UNSET
    decode_ms: Number | UnsetType = UNSET
    tail_steps: int | UnsetType = UNSET
    decode_steps: int | UnsetType = UNSET
    mean_active_share: Number | UnsetType = UNSET
    tokens: int | UnsetType = UNSET
    real_tokens: int | UnsetType = UNSET
    micro_batches: int | UnsetType = UNSET
    fixed_ms: Number | UnsetType = UNSET
    per_token_us: Number | UnsetType = UNSET
    units_per_pass: Number | UnsetType = UNSET
    mean_seqs: Number | UnsetType = UNSET
    fixed_ms_per_pass: Number | UnsetType = UNSET
    ref_ms: Number | UnsetType = UNSET
    old_log_prob_ms: Number | UnsetType = UNSET
    update_ms: Number | UnsetType = UNSET
    reference_needed: bool | None | UnsetType = UNSET
    stage_ms: Number | UnsetType = UNSET
    step_ms: Number | UnsetType = UNSET
    launch_bound_ms: Number | UnsetType = UNSET
    device_gap_ms: Number | UnsetType = UNSET
    unlinked_ms: Number | UnsetType = UNSET
    wall_ms: Number | UnsetType = UNSET
    rank: Label | UnsetType = UNSET
    file: str | None | UnsetType = UNSET
    device: int | str | None | UnsetType = UNSET
    peak_bytes: Number | UnsetType = UNSET
    capacity_bytes: Number | UnsetType = UNSET
    basis: str | UnsetType = UNSET
    steps: int | UnsetType = UNSET
    samples_per_step: Number | UnsetType = UNSET
    tail_running: Number | UnsetType = UNSET
    tool_ms: Number | UnsetType = UNSET
    slowest_ms: Number | UnsetType = UNSET
    preempted: int | UnsetType = UNSET
    samples: int | UnsetType = UNSET
    preemptions: int | UnsetType = UNSET
    excess_ms: Number | UnsetType = UNSET
    queue_ms: Number | UnsetType = UNSET
    longest_queue_ms: Number | UnsetType = UNSET
    refill_ms: Number | UnsetType = UNSET
    rollout_ms: Number | UnsetType = UNSET
    outside_ms: Number | UnsetType = UNSET
    generation_ms: Number | UnsetType = UNSET
    handover_ms: Number | UnsetType = UNSET
    release_ms: Number | UnsetType = UNSET
    refilled_steps: int | UnsetType = UNSET
    passes: list[RefillPass] | UnsetType = UNSET
    filtered_groups: int | UnsetType = UNSET
    in_engine: bool | UnsetType = UNSET
    iterations: int | UnsetType = UNSET
    waiting_iterations: int | UnsetType = UNSET
    kv_full_iterations: int | UnsetType = UNSET
    slots_full_iterations: int | UnsetType = UNSET
    max_running: int | UnsetType = UNSET
    max_waiting: int | UnsetType = UNSET
    peak_kv_usage: Number | UnsetType = UNSET
    max_num_seqs: int | UnsetType = UNSET
    max_num_batched_tokens: int | UnsetType = UNSET
    kv_cache_tokens: int | UnsetType = UNSET
    block_size: int | UnsetType = UNSET
    fit_scatter: Number | UnsetType = UNSET
    token_counts: int | UnsetType = UNSET
    fit: str | UnsetType = UNSET
    host_ms: Number | UnsetType = UNSET
    function: str | UnsetType = UNSET
    line: int | UnsetType = UNSET
    library: str | UnsetType = UNSET


class Lever(Record, kw_only=True):
    """A config key that acts on a cause in one framework."""

    key: str
    set: str
    why: str
    text: str
    changes_result: bool | UnsetType = UNSET
    effect: str | UnsetType = UNSET
    needs: str | UnsetType = UNSET


class Saving(Record, kw_only=True):
    """What turning a cause's first lever is predicted to save per step."""

    status: str
    saving_ms: Number | None
    saving_share: Number | None
    assumption: str | UnsetType = UNSET
    why: str | UnsetType = UNSET
    setting: dict[str, Any]
    by_stage_ms: dict[str, Number] | UnsetType = UNSET
    profiled_ms: dict[str, Number] | UnsetType = UNSET
    step_ms: Number | UnsetType = UNSET
    basis: str | UnsetType = UNSET
    reward_after_ms: Number | UnsetType = UNSET
    responses_cut: Number | UnsetType = UNSET
    speed_of_light_ms: dict[str, Number] | UnsetType = UNSET
    responses_cut_count: int | UnsetType = UNSET
    tokens_cut: int | UnsetType = UNSET
    tokens_cut_share: Number | UnsetType = UNSET
    dialect: str | UnsetType = UNSET


class PlanCause(Record, kw_only=True):
    """A cause whose first lever's saving the plan counts."""

    kind: str
    stage: str | None
    saving_ms: Number


class PlanLeft(Record, kw_only=True):
    """A cause the plan cannot count: its saving is not predictable."""

    kind: str
    stage: str | None
    why: str


class Plan(Record, kw_only=True):
    """The findings' first levers applied together: savings on the same stage counted once, the total a share of the
    real step (its basis named), and the keys the levers pull two ways (none)."""

    basis: str
    basis_words: str
    step_ms: Number
    total_ms: Number
    total_share: Number | None
    by_stage_ms: dict[str, Number]
    causes: list[PlanCause]
    not_predicted: list[PlanLeft]
    conflicts: dict[str, dict[str, list[str]]]


class Finding(Record, kw_only=True):
    """One ranked sentence with its numbers. `evidence` is the record it rests on, whose keys depend on the kind
    (a cause's measure record, a slow rank's comparison, a bucket's share): a mapping, as the JSON gives it."""

    kind: str
    impact_ms: Number
    text: str
    evidence: dict[str, Any]
    role: str | None
    stage: str | None
    rank: Label
    cause: str | None
    levers: dict[str, list[Lever]]
    actionable: bool
    levers_text: str
    saving: Saving | UnsetType = UNSET
    saving_ms: Number | None | UnsetType = UNSET
    saving_share: Number | None | UnsetType = UNSET
    saving_text: str | UnsetType = UNSET


class PerStep(Record, kw_only=True):
    """One stage's time per watched step (seconds; null where no rank ran it); for rollout_generate, `wait_ms`: its
    slowest rank's wait for a core there (ms; null where not known)."""

    max: list[Number | None]
    median: list[Number | None]
    wait_ms: list[Number | None] | UnsetType = UNSET


class RolloutWhy(Record, kw_only=True):
    """Why rollout_generate was slow at flagged steps, from the samples: their workload against the baseline steps'."""

    steps: list[int]
    baseline_steps: list[int]
    span_ms: Number | None
    baseline_span_ms: Number | None
    longest_tokens: Number | None
    baseline_longest_tokens: Number | None
    ms_per_token: Number | None
    baseline_ms_per_token: Number | None
    context_tokens: Number | UnsetType = UNSET
    baseline_context_tokens: Number | UnsetType = UNSET
    tool_ms: Number | UnsetType = UNSET
    baseline_tool_ms: Number | UnsetType = UNSET
    wait_ms: Number | UnsetType = UNSET
    baseline_wait_ms: Number | UnsetType = UNSET
    seconds_ratio: Number | None
    workload_ratio: Number | None
    explained_by: str | None
    cause: str | UnsetType = UNSET
    levers: dict[str, list[Lever]] | UnsetType = UNSET
    slowest: list[SlowSample] | UnsetType = UNSET


class Spike(Record, kw_only=True):
    """A stage's job time (its slowest rank) over the spike factor x the median of the steps before."""

    step: int
    stage: str
    seconds: Number
    baseline_seconds: Number
    rank: Label
    why: RolloutWhy | UnsetType = UNSET


class LevelShift(Record, kw_only=True):
    """A stage that went from one level to another at a step and stayed there (one change point, not a spike a step)."""

    stage: str
    from_step: int
    before_seconds: Number
    after_seconds: Number
    ratio: Number | None
    steps: int
    rank: Label
    why: RolloutWhy | UnsetType = UNSET


class Drift(Record, kw_only=True):
    """A stage whose last quarter of judged steps is the drift factor x slower than its first."""

    stage: str
    first_seconds: Number
    last_seconds: Number
    ratio: Number | None
    why: RolloutWhy | UnsetType = UNSET


class Straggler(Record, kw_only=True):
    """A rank slower than the others in one stage, step after step; with `cause: contention` where its wait for a core
    in the stage beyond the wait expected at the other ranks' share there explains its excess at half of its steps or
    more (its median wait there, the median expected, other processes' share of its host)."""

    rank: Label
    stage: str
    steps: int
    first_step: int
    median_ratio: Number
    cause: str | UnsetType = UNSET
    run_wait_ms: Number | None | UnsetType = UNSET
    expected_wait_ms: Number | None | UnsetType = UNSET
    others_share: Number | None | UnsetType = UNSET


class Contention(Record, kw_only=True):
    """Slow steps the machine's contention explained (the busy ranks' wait for a core in the stage beyond the wait
    expected at their usual share there, summed, at least `contention_share` of the excess), said once: for every
    rank alike (the whole machine) or for one rank; medians over its steps."""

    every_rank: bool
    ranks: list[Label]
    steps: list[int]
    stages: list[str]
    excess_seconds: Number
    run_wait_ms: Number | None
    expected_wait_ms: Number | None
    others_share: Number | None


class Trigger(Record, kw_only=True):
    """Why a window was captured (its manifest row's `trigger`)."""

    reason: str
    step: Label
    stage: str | None
    rank: Label
    seconds: Number | None
    baseline_seconds: Number | None
    request_id: int | str | UnsetType = UNSET
    cause: str | UnsetType = UNSET
    evidence: dict[str, Number] | UnsetType = UNSET


class Capture(Record, kw_only=True):
    """A manifest row of a window a trigger captured."""

    step: Label
    role: str | None
    stage: str | None
    rank: Label
    path: str | None
    status: str | None
    trigger: Trigger


class BucketPair(Record, kw_only=True):
    """One bucket of the compared stage in the normal and the captured window (ms)."""

    normal_ms: Number
    captured_ms: Number


class OperatorGrowth(Record, kw_only=True):
    """An operator whose time grew from the normal window to the captured one."""

    kind: str
    name: str
    normal_ms: Number
    captured_ms: Number
    diff_ms: Number
    status: str


class CaptureCause(Record, kw_only=True):
    """A cause judged on a captured window against its normal window."""

    cause: str
    title: str | None
    how: str
    role: str | None
    stage: str | None
    rank: Label
    text: str
    impact_ms: Number
    normal_impact_ms: Number | None
    levers: dict[str, list[Lever]]
    saving: Saving | None
    saving_ms: Number | None
    saving_text: str | None


class CaptureVerdict(Record, kw_only=True):
    """Why a captured window was slow, against its normal window."""

    verdict: str
    causes: list[CaptureCause]
    in_both: list[CaptureCause]
    text: str


class AloneSample(Record, kw_only=True):
    """The decode steps a captured step's slowest sample ran alone, after the next longest had finished."""

    sample: int
    response_tokens: int | None
    next_longest_tokens: int | None
    decode_steps: list[int]
    kept: list[int] | None
    window: list[int] | None


class StepSamples(Record, kw_only=True):
    """One step's samples as a capture says them: the slowest, where the slowest ran alone, and its rollout against
    the judged steps before the spike."""

    step: Label
    samples: int
    slowest: list[SlowSample]
    alone: AloneSample | UnsetType = UNSET
    why: RolloutWhy | UnsetType = UNSET


class CapturedSamples(StepSamples, kw_only=True):
    """The captured step's samples, and the spike's own step's where the trigger saw it at an earlier step."""

    spike: StepSamples | UnsetType = UNSET


class Repeat(Record, kw_only=True):
    """Whether the captured step repeated what the trigger saw at its step (a one-off spike does not)."""

    spike_step: Label
    captured_step: Label
    repeated: bool | None
    basis: str | None
    spike_ratio: Number
    captured_ratio: Number | None


class Beside(Record, kw_only=True):
    """A captured window beside a normal window of the same stage."""

    capture: str | None
    step: Label
    rank: Label
    stage: str | None
    reason: str | None
    normal: str | None
    why: str
    buckets: dict[str, BucketPair] | UnsetType = UNSET
    grew: list[OperatorGrowth] | UnsetType = UNSET
    cause: CaptureVerdict
    samples: CapturedSamples | UnsetType = UNSET
    repeat: Repeat | UnsetType = UNSET


class Timeline(Record, kw_only=True):
    """The run over time, from the per-rank timeline the watch wrote."""

    rules: dict[str, Number]
    ranks: list[Label]
    steps: list[int]
    busy_steps: list[int]
    warmup_steps: list[int]
    captured_steps: list[int]
    profiled_steps: list[int]
    contention_steps: list[int] | UnsetType = UNSET
    per_step: dict[str, PerStep]
    spikes: list[Spike]
    level_shifts: list[LevelShift]
    drift: list[Drift]
    stragglers: list[Straggler]
    contention: list[Contention] | UnsetType = UNSET
    captures: list[Capture]
    beside: list[Beside] | UnsetType = UNSET


class Salvaged(Record, kw_only=True):
    """A window of an rlprof run its manifest does not list as written: recovered from the directory, or lost.

    After a crash, a fault or a terminating signal's grace time (analyze/inputs/salvage.py)."""

    window: str
    step: Label
    role: str | None
    stage: str | None
    rank: Label
    fate: str
    source: str | None
    reason: str


class Sample(Record, kw_only=True):
    """One rollout sample as its host recorded it (a field the host does not know is absent, never 0)."""

    step: int
    rank: int | UnsetType = UNSET
    replica: int | UnsetType = UNSET
    sample: int
    source: str
    start_us: float | UnsetType = UNSET
    end_us: float | UnsetType = UNSET
    prompt_tokens: int | UnsetType = UNSET
    response_tokens: int | UnsetType = UNSET
    turns: int | UnsetType = UNSET
    queue_ms: Number | UnsetType = UNSET
    prefill_ms: Number | UnsetType = UNSET
    decode_ms: Number | UnsetType = UNSET
    generate_ms: Number | UnsetType = UNSET
    tool_ms: Number | UnsetType = UNSET
    reward_ms: Number | UnsetType = UNSET
    preemptions: int | UnsetType = UNSET
    rollout_pass: int | UnsetType = UNSET
    group: int | UnsetType = UNSET
    group_filtered: bool | UnsetType = UNSET
    first_decode_step: int | UnsetType = UNSET
    last_decode_step: int | UnsetType = UNSET
    request_id: str | UnsetType = UNSET
    finish_reason: str | UnsetType = UNSET
    cached_tokens: int | UnsetType = UNSET
    worker: int | UnsetType = UNSET


class RolloutAccount(Record, kw_only=True):
    """One watched step's rollout stage split (analyze/over_time/rollout_account.py): the host's stage time, its
    samples' generation (each pass's first start to last end, summed) and the rest; where the host says when its stage
    began and ended (verl's driver), the time before the first sample and after the last, of which the wait for the
    batch's handover and what followed it (the replicas put to sleep; a rollout profiler stopped on a profiled step);
    with DAPO's dynamic sampling the time its refills added (`refill_ms`), verl's refill dispatches, the samples they
    started and the groups its filter dropped; ms."""

    step: int
    stage_ms: Number
    generation_ms: Number
    outside_ms: Number
    outside_share: Number | None
    samples: int
    passes: int
    before_ms: Number | UnsetType = UNSET
    after_ms: Number | UnsetType = UNSET
    handover_ms: Number | UnsetType = UNSET
    release_ms: Number | UnsetType = UNSET
    refill_ms: Number | UnsetType = UNSET
    refill_samples: int | UnsetType = UNSET
    refills: int | UnsetType = UNSET
    filtered_groups: int | UnsetType = UNSET
    profiled: bool


class Quantiles(Record, kw_only=True):
    """A distribution over a step's samples."""

    p50: Number
    p90: Number
    p99: Number
    max: Number


class SlowSample(Record, kw_only=True):
    """One of a step's slowest samples."""

    sample: int
    rank: int | UnsetType = UNSET
    replica: int | UnsetType = UNSET
    worker: int | UnsetType = UNSET
    response_tokens: int | UnsetType = UNSET
    tool_ms: Number | UnsetType = UNSET
    turns: int | UnsetType = UNSET
    duration_ms: Number


class SampleStep(Record, kw_only=True):
    """One step's samples together: their distribution, the rollout's tail, the slowest, phases and preemptions."""

    step: int
    samples: int
    duration_ms: Quantiles | None
    response_tokens: Quantiles | None
    prompt_tokens: Quantiles | UnsetType = UNSET
    span_ms: Number | None
    tail_ms: Number | None
    tail_share: Number | None
    slowest: list[SlowSample]
    phases_ms: dict[str, Number]
    preemptions: int | UnsetType = UNSET
    preempted_samples: int | UnsetType = UNSET
    engine: EngineStep | UnsetType = UNSET


class EngineStep(Record, kw_only=True):
    """What a step's vLLM engines' schedulers said over its iterations (counts summed over its engines and passes)."""

    iterations: int
    waiting_iterations: int
    kv_full_iterations: int
    slots_full_iterations: int
    max_running: int
    max_waiting: int
    peak_kv_usage: Number
    preempted: int
    max_num_seqs: int | UnsetType = UNSET
    max_num_batched_tokens: int | UnsetType = UNSET
    kv_cache_tokens: int | UnsetType = UNSET
    block_size: int | UnsetType = UNSET


class Analysis(Record, kw_only=True):
    """The analysis of one run, trace or directory: analysis.json as typed values.

    `rlprof.analyze(path)` makes one; `Analysis.load(path)` reads an analysis.json; `to_json()` writes one.
    `columns(table)` gives a table (rows, ops, collectives, launch, inputs, findings, measures, stage_limits, memory;
    samples and sample_steps where the rollout's host recorded its samples) as
    numpy columns, the same scalar columns the CSV / DuckDB export writes."""

    schema_version: int
    inputs: list[Input]
    warnings: list[str]
    partial: bool
    salvage: list[Salvaged] | UnsetType = UNSET
    rows: list[Row]
    ops: list[Op]
    collectives: list[Collective]
    launch: list[Launch]
    memory: list[Memory]
    timeline: Timeline | UnsetType = UNSET
    run_config: RunConfig | None
    samples: list[Sample] | UnsetType = UNSET
    sample_steps: list[SampleStep] | UnsetType = UNSET
    rollout_account: list[RolloutAccount] | UnsetType = UNSET
    model: Model | UnsetType = UNSET
    stage_limits: list[StageLimits] | UnsetType = UNSET
    measures: list[Measure]
    findings: list[Finding]
    plan: Plan | UnsetType = UNSET

    @classmethod
    def from_document(cls, doc: dict) -> Analysis:
        """The typed form of a document as analyze assembles it (its JSON: keys as `json.dumps` writes them)."""
        return _typed(json.loads(json.dumps(doc)), "the analysis document")

    @classmethod
    def load(cls, path: str | Path) -> Analysis:
        """An analysis.json written by `rlprof analyze` (one line naming what is wrong otherwise)."""
        from .pipeline import read_document

        return _typed(read_document(path), str(path))

    def to_json(self, indent: int | None = None) -> str:
        """analysis.json's text: the same keys and values as the document it was made from."""
        try:
            text = msgspec.json.encode(self)
        except UnicodeEncodeError:  # a file name that is not UTF-8 (its bytes surrogate-escaped): JSON escapes
            return json.dumps(_finite(self.to_dict()), indent=indent)  # as json.loads gives the same name back
        return (msgspec.json.format(text, indent=indent) if indent is not None else text).decode()

    def to_dict(self) -> dict:
        """The document as plain dicts and lists (what the report, compare, cluster and advise read)."""
        return msgspec.to_builtins(self)

    def columns(self, table: str) -> dict[str, Any]:
        """One table as numpy columns, name -> array: bool, int64 or float64 where every value is one (float64
        with NaN for a number some records lack), else object. The columns are the export's (scalar fields)."""
        import numpy as np

        from .export import analysis_tables, scalar_columns, sql_type

        tables = analysis_tables(self.to_dict())
        if table not in tables:
            raise AnalyzeError(f"no table {table!r} in an analysis; allowed: {', '.join(tables)}")
        records = tables[table]
        out = {}
        for name in scalar_columns(records):
            values = [r.get(name) for r in records]
            kind = sql_type(values)
            missing = any(v is None for v in values)
            if kind == "BOOLEAN" and not missing:
                out[name] = np.array(values, dtype=bool)
            elif kind == "BIGINT" and not missing:
                out[name] = np.array(values, dtype=np.int64)
            elif kind in ("BIGINT", "DOUBLE"):
                out[name] = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
            else:
                out[name] = np.array(values, dtype=object)
        return out


def _finite(value):
    """NaN and infinities as null, as msgspec writes them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _typed(doc: dict, what: str) -> Analysis:
    try:
        return msgspec.convert(doc, Analysis)
    except msgspec.ValidationError as exc:
        raise AnalyzeError(
            f"{what} does not match analysis schema {SCHEMA_VERSION}: {exc} (docs/analysis_schema.md lists its fields)"
        ) from None


def analyze(
    path: str | Path,
    *,
    workers: int | None = None,
    use_ray: bool = False,
    top: int | None = 50,
    by_shape: bool = False,
    progress=None,
) -> Analysis:
    """Analyse a run directory, manifest, trace file or Ascend directory: what `rlprof analyze PATH` writes to
    analysis.json, as an Analysis. `workers`: processes (default: every core); `use_ray`: each file on the Ray
    node that holds it; `top`: operators kept per window (None: all); `by_shape`: operators by input shape too."""
    from .pipeline import analyze as analyze_document

    return Analysis.from_document(
        analyze_document(path, workers=workers, use_ray=use_ray, progress=progress, top=top, by_shape=by_shape)
    )


# ---- docs/analysis_schema.md's field reference, generated from the types above -----------------------------------
REFERENCE_ORDER = (
    Analysis,
    Input,
    Salvaged,
    AnalysedOn,
    Buckets,
    Row,
    StageCall,
    IdleFrame,
    IdleNode,
    HostSite,
    StageLimits,
    StageCalls,
    Model,
    Hardware,
    Op,
    Collective,
    Launch,
    Memory,
    RunConfig,
    Unprofiled,
    Sample,
    SampleStep,
    RolloutAccount,
    EngineStep,
    Quantiles,
    SlowSample,
    Measure,
    RefillPass,
    Finding,
    Lever,
    Saving,
    Plan,
    PlanCause,
    PlanLeft,
    Timeline,
    PerStep,
    Spike,
    LevelShift,
    RolloutWhy,
    Drift,
    Straggler,
    Contention,
    Capture,
    Trigger,
    Beside,
    Repeat,
    CapturedSamples,
    StepSamples,
    AloneSample,
    BucketPair,
    OperatorGrowth,
    CaptureVerdict,
    CaptureCause,
)


def _type_words(t) -> str:
    from msgspec import inspect as mi

    simple = {
        mi.IntType: "int",
        mi.FloatType: "float",
        mi.StrType: "str",
        mi.BoolType: "bool",
        mi.NoneType: "null",
        mi.AnyType: "any",
    }
    if type(t) in simple:
        return simple[type(t)]
    if isinstance(t, mi.UnionType):
        words = [_type_words(x) for x in t.types]  # UNSET is not among them: `present` says it
        if "int" in words and "float" in words:
            words = ["number" if w == "int" else w for w in words if w != "float"]
        return " \\| ".join(words)
    if isinstance(t, mi.ListType):
        return f"list of {_type_words(t.item_type)}"
    if isinstance(t, mi.DictType):
        return f"object of {_type_words(t.value_type)}"
    if isinstance(t, mi.StructType):
        return f"`{t.cls.__name__}`"
    raise TypeError(f"no words for {t!r}")


def schema_reference() -> str:
    """The field reference of docs/analysis_schema.md: each Struct's fields, their JSON types and whether a
    record always holds them (`python3 -m rlprof.analyze.result` prints it)."""
    from msgspec import inspect as mi

    out = []
    for cls in REFERENCE_ORDER:
        info = mi.type_info(cls)
        out += [
            f"### `{cls.__name__}`",
            "",
            (cls.__doc__ or "").strip().split("\n\n")[0].replace("\n", " "),
            "",
            "| field | type | present |",
            "| --- | --- | --- |",
        ]
        bases = [b for b in cls.__mro__[1:] if issubclass(b, Record) and b is not Record]
        inherited = {f.name for base in bases for f in mi.type_info(base).fields}
        for f in sorted(info.fields, key=lambda f: f.name in inherited):
            out.append(f"| `{f.encode_name}` | {_type_words(f.type)} | {'always' if f.required else 'optional'} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(schema_reference(), end="")
