"""The registry of causes (analyze/diagnosis/causes.py): every cause has all its parts, every kind of finding the analysis
emits is in the registry, and each cause, made to fire, is said from its template with its levers and a saving
(predicted, or why not). Adding a cause means adding its record there and its firing case here (FIRING)."""

import ast
import copy
import shutil
import string

import pytest

from conftest import ROOT
from rlprof.analyze.diagnosis import findings as findings_module
from rlprof.analyze.diagnosis.causes import CAUSES, DESCRIPTIONS, THRESHOLDS, Cause, predict, template
from rlprof.analyze.diagnosis.finding import Finding
from rlprof.analyze.diagnosis.samples import step_summaries
from rlprof.analyze.diagnosis.findings import diagnose, prediction_context
from rlprof.analyze.pipeline import analyze
from rlprof.frameworks.levers import DIALECTS, LEVERS
from conftest import window_doc, window_row

SRC = ROOT / "src" / "rlprof" / "analyze" / "diagnosis"


def missing_parts(cause: Cause) -> list[str]:
    """The parts a cause's record lacks (empty: complete)."""
    missing = [part for part in ("title", "measure", "impact") if not str(getattr(cause, part) or "").strip()]
    if cause.threshold is None and cause.name != "slow_rank":  # a slow rank is analyze/diagnosis/ranks.py's own test
        missing.append("threshold")
    if cause.threshold is not None and cause.threshold not in THRESHOLDS:
        missing.append(f"threshold ({cause.threshold} is not in THRESHOLDS)")
    if not (callable(cause.sentence) or str(cause.sentence or "").strip()):
        missing.append("sentence")
    if not (callable(cause.saving) or str(cause.saving or "").strip()):
        missing.append("saving (a formula, or why it cannot be predicted)")
    if not any(LEVERS.get(cause.name, {}).get(d) for d in DIALECTS):
        missing.append("levers (frameworks/levers.py)")
    if cause.judge is None and cause.name not in findings_module.FOUND_BY:
        missing.append("judge (or a finder in findings.FOUND_BY)")
    return missing


@pytest.mark.parametrize("name", sorted(CAUSES))
def test_every_cause_has_all_its_parts(name):
    assert CAUSES[name].name == name
    assert missing_parts(CAUSES[name]) == []


def test_a_cause_missing_a_part_is_caught():
    whole = CAUSES["slow_reward"]
    fields = whole.__dataclass_fields__
    assert missing_parts(whole) == []
    for part, blank in (
        ("title", ""),
        ("measure", ""),
        ("impact", " "),
        ("threshold", None),
        ("sentence", ""),
        ("saving", ""),
        ("judge", None),
    ):
        assert part in fields
        broken = Cause(**{**{f: getattr(whole, f) for f in fields}, part: blank})
        assert missing_parts(broken), part
    unknown = Cause(**{**{f: getattr(whole, f) for f in fields}, "name": "no_such_cause"})
    assert missing_parts(unknown) == ["levers (frameworks/levers.py)"]


def test_levers_are_keyed_by_the_registrys_causes():
    assert set(LEVERS) == set(CAUSES)
    assert set(findings_module.FOUND_BY) <= set(CAUSES)


def _kinds_made_in(path) -> set[str]:
    """The finding kinds a module constructs: Finding("kind", ...) with a literal, the bucket kinds
    (Finding(kind, ...) over BUCKET_KINDS), and the causes judged on a measure (Finding(cause.name, ...))."""
    kinds = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant):
                kinds.add(first.value)
            elif ast.unparse(first) == "cause.name":
                kinds |= {c.name for c in CAUSES.values() if c.judge is not None}
            else:  # the stage buckets' loop over BUCKET_KINDS
                assert ast.unparse(first) == "kind", f"a finding kind the test cannot read: {ast.unparse(first)}"
                kinds |= {kind for kind, _, _ in findings_module.BUCKET_KINDS}
    return kinds


def test_every_finding_kind_the_analysis_emits_is_in_the_registry():
    made = _kinds_made_in(SRC / "findings.py")
    assert {"busy_machine", "dominant_stage", "idle", "truncated", "slow_rank", "unused_reference"} <= made
    registered = set(CAUSES) | set(DESCRIPTIONS)
    assert made <= registered, made - registered
    assert set(CAUSES) <= made, set(CAUSES) - made  # a registered cause nothing finds is a dead record
    with pytest.raises(KeyError):
        template("not_a_kind")


# ---- each cause made to fire -------------------------------------------------------------------------------------


def _tail():
    units = [
        window_row("rollout_generate", "rollout", 1.0, "decode_step", k, seqs=10, active=10 if k < 10 else 2)
        for k in range(20)
    ]
    return window_doc(
        [window_row("rollout_generate", "rollout", 20.0), window_row("actor_update", "actor", 20.0), *units]
    )


def _padding():
    units = [
        window_row("actor_update", "actor", 2.0, "micro_batch", k, seqs=2, tokens=1000, real_tokens=400)
        for k in range(2)
    ]
    return window_doc(
        [window_row("actor_update", "actor", 10.0), window_row("rollout_generate", "rollout", 10.0), *units]
    )


def _small_units():
    rows = [window_row("actor_update", "actor", 100.0), window_row("rollout_generate", "rollout", 100.0)]
    rows += [
        window_row(
            "actor_update",
            "actor",
            20.0 + 0.01 * (100 + 50 * k),
            "micro_batch",
            k,
            seqs=1,
            tokens=100 + 50 * k,
            real_tokens=100 + 50 * k,
        )
        for k in range(8)
    ]
    return window_doc(rows)


def _share(stage, role):
    return lambda: window_doc([window_row(stage, role, 50.0), window_row("actor_update", "actor", 100.0)])


def _exposed_comm():
    row = window_row("actor_update", "actor", 100.0, comm_ms=40.0, compute_ms=60.0)
    return window_doc(
        [row, window_row("rollout_generate", "rollout", 100.0)],
        collectives=[{"role": "actor", "stage": "actor_update", "name": "nccl:all_gather", "total_ms": 40.0}],
    )


def _launch_bound():
    row = window_row("actor_update", "actor", 100.0, launch_bound_ms=50.0, device_gap_ms=50.0, launch_unlinked_ms=0.0)
    return window_doc([row, window_row("rollout_generate", "rollout", 100.0)])


def _memory():
    cap = 80 * 2**30
    return window_doc(
        [window_row("actor_update", "actor", 10.0)],
        memory=[
            {
                "rank": 0,
                "role": "actor",
                "stage": "actor_update",
                "file": "f",
                "peak_bytes": 0.2 * cap,
                "capacity_bytes": cap,
            }
        ],
    )


def _unused_reference():
    return window_doc(
        [window_row("ref_compute_log_prob", "ref", 20.0), window_row("actor_update", "actor", 50.0)],
        run_config={"source": "x/trainer_config.json", "reference_pass": True, "kl_coef": 0.0},
    )


def _recorded(name):
    def make(tmp_path):
        return analyze(shutil.copytree(ROOT / "tests" / "data" / "runs" / name, tmp_path / name), workers=1)

    return make


# cause -> a document where it fires (a function of tmp_path where it is a recorded run)
def _samples_doc(samples, engine=()):
    """A run whose rollout's host recorded its samples (verl's agent loop, a vLLM engine): no decode step says how
    many rows were active; `engine`: what a vLLM engine's scheduler said over each step."""
    return window_doc(
        [window_row("rollout_generate", "rollout", 100.0), window_row("actor_update", "actor", 50.0)],
        samples=samples,
        sample_steps=step_summaries(samples, engine),
    )


def _sample(step, k, ms, **held):
    return {"step": step, "sample": k, "source": "verl", "start_us": 0.0, "end_us": ms * 1e3, **held}


def _slow_tools():
    return _samples_doc(
        [_sample(s, k, 100.0 if k == 0 else 20.0, tool_ms=70.0 if k == 0 else 5.0) for s in (1, 2) for k in range(8)]
    )


def _preemption():
    return _samples_doc([_sample(2, k, 90.0 if k < 2 else 30.0, preemptions=1 if k < 2 else 0) for k in range(16)])


def _queued():
    """rlprof's async replicas: samples wait for a replica before the engine."""
    return _samples_doc(
        [_sample(2, k, 40.0, queue_ms=30.0 if k % 2 else 5.0, source="rlprof", replica=k % 2) for k in range(8)]
    )


def _engine(step=2, kv_full=0, slots_full=0, preempted=0, **limits):
    """A vLLM engine's record of a step: 10 iterations left requests waiting, so many with the cache or the slots full."""
    return {
        "step": step,
        "source": "vllm",
        "replica": 0,
        "iterations": 20,
        "waiting_iterations": 10,
        "kv_full_iterations": kv_full,
        "slots_full_iterations": slots_full,
        "max_running": 4,
        "max_waiting": 4,
        "peak_kv_usage": 1.0 if kv_full else 0.5,
        "preempted": preempted,
        "max_num_seqs": 4 if slots_full else 256,
        "kv_cache_tokens": 1024,
        "block_size": 16,
        **limits,
    }


def _engine_queue(**engine):
    """A vLLM engine's queue (its queued time); `engine`: its scheduler's record, where it kept one."""
    samples = [
        _sample(
            2,
            k,
            40.0,
            queue_ms=30.0 if k % 2 else 5.0,
            source="vllm",
            replica=0,
            response_tokens=20,
            prompt_tokens=4,
            prefill_ms=1.0,
            decode_ms=38.0,
            preemptions=0,
        )
        for k in range(8)
    ]
    return _samples_doc(samples, [_engine(**engine)] if engine else [])


def _refills():
    """DAPO's dynamic sampling, as rlprof's trainer records it: a first pass of 4 groups of 2 samples, 3 dropped, and
    two refill passes after it (each pass its own span: 40 ms, then 50 and 60)."""
    out = []
    for p, (at, ms, dropped) in enumerate([(0.0, 40.0, 3), (40.0, 50.0, 2), (90.0, 60.0, 0)]):
        for k in range(8):
            out.append(
                _sample(
                    2, 8 * p + k, ms, rollout_pass=p, group=k // 2, group_filtered=k // 2 < dropped, source="rlprof"
                )
                | {"start_us": at * 1e3, "end_us": (at + ms) * 1e3}
            )
    return _samples_doc(out)


def _outside():
    """verl's gen timer 400 ms at two watched steps whose 12 samples ran 150 ms: 250 outside generation, 200 of them
    after the handover (the replicas put to sleep), as rollout_account.py accounts for them."""
    doc = _samples_doc([_sample(s, k, 150.0) for s in (2, 3) for k in range(12)])
    doc["rollout_account"] = [
        {
            "step": s,
            "stage_ms": 400.0,
            "generation_ms": 150.0,
            "outside_ms": 250.0,
            "outside_share": 0.625,
            "samples": 12,
            "passes": 1,
            "before_ms": 30.0,
            "after_ms": 220.0,
            "handover_ms": 20.0,
            "release_ms": 200.0,
            "profiled": False,
        }
        for s in (2, 3)
    ]
    return doc


def _tail_of_samples():
    return _samples_doc(
        [_sample(2, k, 100.0 if k == 0 else 20.0, response_tokens=50 if k == 0 else 10) for k in range(8)]
    )


def _host(cause, stage, role, update_ms=100.0):
    """A stage whose thread spent 40 of its 100 ms in one host-side cause, at one call site (the host's stacks), beside
    an update of `update_ms`."""
    site = {"function": "score", "file": "app/verify.py", "line": 12, "library": "user code", "ms": 40.0}
    return lambda: window_doc(
        [window_row(stage, role, 100.0, host_time={cause: site}), window_row("actor_update", "actor", update_ms)]
    )


FIRING = {
    "rollout_tail": _tail,
    "padding": _padding,
    "small_units": _small_units,
    "slow_reward": _share("reward_compute", "reward"),
    "weight_sync": _share("weight_sync", "actor"),
    "exposed_comm": _exposed_comm,
    "launch_bound": _launch_bound,
    "memory_headroom": _memory,
    "unused_reference": _unused_reference,
    "slow_rank": _recorded("slow_rank_2"),
    "slow_tools": _slow_tools,
    "preemption": _preemption,
    "queued": _queued,
    "dynamic_sampling": _refills,
    "rollout_outside": _outside,
    "kv_cache": lambda: _engine_queue(kv_full=8, preempted=2),
    "slot_bound": lambda: _engine_queue(slots_full=9),
    "engine_queue": _engine_queue,
    "host_sync": _host("host_sync", "rollout_generate", "rollout"),
    "data_transfer": _host("data_transfer", "actor_compute_log_prob", "actor"),
    # a reward of 14% of the step: large enough to judge, too small to hold the step (slow_reward, its root there)
    "host_wait": _host("host_wait", "reward_compute", "reward", update_ms=600.0),
    "garbage_collection": _host("garbage_collection", "actor_update", "actor"),
}


def test_every_cause_has_a_firing_case():
    assert set(FIRING) == set(CAUSES)


@pytest.mark.parametrize("name", sorted(CAUSES))
def test_each_cause_fires_and_is_said_from_its_record(name, tmp_path):
    make = FIRING[name]
    doc = make(tmp_path) if make.__code__.co_argcount else make()
    found = doc["findings"] if "findings" in doc else diagnose(doc).findings
    (f, *_) = [f for f in found if f["kind"] == name]
    cause = CAUSES[name]
    assert f["cause"] == cause.title and f["actionable"]
    assert f["text"].strip() and "{" not in f["text"]
    if isinstance(cause.sentence, str):  # the template's words are in the sentence, its fields filled
        words = [lit for lit, _, _, _ in string.Formatter().parse(cause.sentence) if lit.strip()]
        assert all(w in f["text"] for w in words)
    assert set(f["levers"]) == {
        d for d in DIALECTS if any(not lv.stages or f["stage"] in lv.stages for lv in LEVERS[name].get(d, ()))
    }
    assert f["saving"]["status"] in ("predicted", "not predictable") and f["saving_text"]
    if isinstance(cause.saving, str):
        assert f["saving"]["status"] == "not predictable" and f["saving"]["why"] == cause.saving
    ctx = prediction_context({**doc, "findings": found})
    for dialect in DIALECTS:  # the saving in each framework: a prediction or the reason, never an error
        s = predict(ctx, Finding.of(f), dialect)
        assert s["dialect"] == dialect and s["status"] in ("predicted", "not predictable")


@pytest.mark.parametrize("name", sorted(set(FIRING) - {"slow_rank"}))
def test_the_analysis_returns_new_values_and_leaves_the_document_alone(name):
    """diagnose, findings_of and advise --fix's prediction read the document and change nothing in it: the measures
    and findings are returned for the assembly to put in the document."""
    from rlprof.advise import fix_from

    doc = FIRING[name]()
    before = copy.deepcopy(doc)
    found_measures, found = diagnose(doc)
    assert doc == before and found and isinstance(found_measures, list)
    assert findings_module.findings_of(doc) == [f for f in found if f["kind"] != "busy_machine"]
    assert doc == before
    with_findings = {**doc, "findings": found}
    kept = copy.deepcopy(with_findings)
    for dialect in DIALECTS:
        fix_from(with_findings, dialect)
    assert with_findings == kept


def test_the_rollout_tail_from_samples_where_no_decode_step_says_how_many_ran():
    """verl's agent loop and vLLM give each sample's start, end and tokens, not decode steps: the tail is measured from
    the samples and capped by tokens, each sample keeping its own time per token."""
    doc = _tail_of_samples()
    found_measures, found = diagnose(doc)
    (m,) = [m for m in found_measures if m["measure"] == "rollout_tail"]
    assert m["basis"] == "samples" and m["value"] == pytest.approx(0.8)  # 80 of 100 ms with 1 of 8 running
    (f,) = [f for f in found if f["kind"] == "rollout_tail"]
    # verl's first lever changes no response (partial rollout, the fully-async trainer): the tail's time, at most
    first, cap_lever = f["levers"]["verl"]
    assert (first["key"], first["changes_result"]) == ("async_training.partial_rollout", False)
    assert (cap_lever["key"], cap_lever["changes_result"]) == ("data.max_response_length", True)
    assert "samples" in f["text"] and f["saving"]["saving_ms"] == pytest.approx(80.0)
    # rlprof's trainer has no partial rollout: its cap, never below the p95 of the sampled lengths (7 of 10 tokens
    # and one of 50: 36), saying what it cuts; each sample keeps its own time per token
    s = predict(prediction_context({**doc, "findings": found}), Finding.of(f), "rlprof")
    cap = s["setting"]["max_new_tokens"]
    assert cap == 36 and s["saving_ms"] == pytest.approx(100.0 - 100.0 * cap / 50)
    assert (s["responses_cut"], s["tokens_cut"], s["tokens_cut_share"]) == (1 / 8, 14, pytest.approx(14 / 120))
    assert "1 of this run's 8 responses (12%) are longer than 36 and are cut, 14 of their 120 tokens" in s["assumption"]


@pytest.mark.parametrize("name", sorted(set(FIRING) - {"slow_rank"}) + ["rollout_tail_from_samples"])
def test_every_measure_and_finding_a_cause_makes_is_typed(name):
    """What each firing case's measures and findings hold decodes strictly as the typed result's records (an unknown
    key is an error there: a new input of a formula is a new field of `Measure`)."""
    import msgspec

    from rlprof.analyze.result import Finding as TypedFinding, Measure

    doc = _tail_of_samples() if name == "rollout_tail_from_samples" else FIRING[name]()
    found_measures, found = diagnose(doc)
    for m in found_measures:
        msgspec.convert(m, Measure, strict=False)
    for f in found:
        msgspec.convert(f, TypedFinding, strict=False)
