"""The findings of one run read as one plan a senior engineer would apply: no two causes pull one key two ways (over
the whole lever registry), the levers that change no result come first, symptoms of one root are one finding with the
root's levers (a queue and preemption under a full KV cache), a queue's bound is told from vLLM's scheduler stats (or
said unknown, with no lever that could make it worse), a saving is a share of the real step and bounded by the stages
it acts on, a fit that breaks physics is not measurable, and `rlprof advise --fix --plan` writes one consistent config.

The KV-bound and slot-bound engines are live vLLM runs recorded by bench/record_samples.py (tests/data/samples)."""

import itertools
import math
import shutil

import numpy as np
import pytest
import yaml

from conftest import ROOT, run_cli, window_doc, window_row
from rlprof.analyze.diagnosis.causes import CAUSES, THRESHOLDS, predict
from rlprof.analyze.diagnosis.finding import Finding
from rlprof.analyze.diagnosis.findings import diagnose, prediction_context
from rlprof.analyze.diagnosis.measures import fixed_cost
from rlprof.analyze.pipeline import analyze
from rlprof.frameworks.levers import DIALECTS, LEVERS, Lever, levers_for, pulled_both_ways

SAMPLES = ROOT / "tests" / "data" / "samples"
RUNS = ROOT / "tests" / "data" / "runs"


def _copy(src, tmp_path):
    return shutil.copytree(src, tmp_path / src.name)


# ---- the lever registry: one key one way, results kept first ------------------------------------------------------
def test_no_two_causes_pull_one_key_two_ways_in_any_dialect():
    """Every pair of causes (those that can fire together among them), every dialect, every stage: the keys their
    levers turn are raised or lowered one way and set to one value, so one run's findings make one config."""
    for a, b in itertools.combinations_with_replacement(sorted(CAUSES), 2):
        for dialect in DIALECTS:
            turned = [(lv.key, lv.set) for c in (a, b) for lv in LEVERS[c].get(dialect, ())]
            assert pulled_both_ways(turned) == {}, (a, b, dialect)
    # the check finds a pair that does: a queue's "raise max_num_seqs" beside preemption's old "lower max_num_seqs"
    old = [("actor_rollout_ref.rollout.max_num_seqs", "raise"), ("actor_rollout_ref.rollout.max_num_seqs", "lower")]
    assert pulled_both_ways(old) == {"actor_rollout_ref.rollout.max_num_seqs": {"raise", "lower"}}
    assert pulled_both_ways([("k", "True"), ("k", "False")]) and not pulled_both_ways([("k", "raise"), ("k", "42")])


def test_levers_that_change_no_result_come_before_those_that_do_and_say_their_side_effect():
    for cause, by_dialect in LEVERS.items():
        for dialect, levers in by_dialect.items():
            changes = [lv.changes_result for lv in levers]
            assert changes == sorted(changes), (cause, dialect)
            for lv in levers:
                if lv.changes_result:  # what it changes is said
                    assert lv.effect and lv.effect in lv.text(), (cause, lv.key)
    # a response cap changes the experiment; partial rollout (MindSpeed-RL, verl's fully-async trainer) does not
    verl = levers_for("rollout_tail", "verl")
    assert [lv.key for lv in verl] == ["async_training.partial_rollout", "data.max_response_length"]
    assert "fully-async" in verl[0].text() and verl[1].changes_result
    assert levers_for("rollout_tail", "mindspeed")[0].key == "rl_config.partial_rollout_max_split"


# ---- one root, one finding: the host waiting on a slow reward --------------------------------------------------------
def _waiting(stage: str, role: str) -> list[dict]:
    """A 100 ms reward beside a 100 ms update (the reward holds half the step), and a stage whose thread waited 40 ms
    at one call site (the host's stacks)."""
    site = {"function": "score", "file": "app/verify.py", "line": 12, "library": "user code", "ms": 40.0}
    rows = [window_row("reward_compute", "reward", 100.0), window_row("actor_update", "actor", 100.0)]
    rows.append(window_row(stage, role, 100.0, host_time={"host_wait": site}))
    return rows


def test_the_host_waiting_on_a_slow_reward_is_said_inside_the_reward_finding():
    """The reward stage's thread waiting (host_wait) where the reward itself holds the step (slow_reward) is one root:
    one finding with the reward's levers, the wait inside it; the same wait in another stage is its own finding."""
    rows = _waiting("reward_compute", "reward")
    del rows[0]  # the waiting stage is the reward itself
    _, found = diagnose(window_doc(rows))
    causes = [f for f in found if f["kind"] in CAUSES]
    assert [f["kind"] for f in causes] == ["slow_reward"], [f["kind"] for f in causes]
    (symptom,) = causes[0]["evidence"]["symptoms"]
    assert symptom["kind"] == "host_wait" and symptom["stage"] == "reward_compute"
    assert causes[0]["levers"]["verl"][0]["key"] == "reward.num_workers"
    _, found = diagnose(window_doc(_waiting("actor_compute_log_prob", "actor")))
    by_kind = {f["kind"]: f for f in found}
    assert {"host_wait", "slow_reward"} <= set(by_kind) and "symptoms" not in by_kind["slow_reward"]["evidence"]


# ---- one root, one finding: the engine's queue told by its scheduler ------------------------------------------------
def _keys(found: dict, dialect: str) -> list[tuple[str, str]]:
    return [(lv["key"], lv["set"]) for lv in found["levers"].get(dialect, [])]


def test_a_kv_bound_engine_is_one_finding_with_kv_levers_first(tmp_path):
    """A live vLLM whose 1,024-token KV cache cannot hold 32 requests that grow to 168 tokens: its scheduler left
    requests waiting with the cache full, and preempted; one KV-bound finding holds the queue and the preemption, its
    levers are KV memory first and none raises max_num_seqs, and its saving lies within the rollout's span (the
    step's profiled window held 3 decode steps: a share of those would be 291x)."""
    doc = analyze(_copy(SAMPLES / "kv_bound", tmp_path), workers=1)
    causes = [f for f in doc["findings"] if f.get("actionable")]
    assert [f["kind"] for f in causes] == ["kv_cache"], [f["kind"] for f in causes]
    (f,) = causes
    assert [s["kind"] for s in f["evidence"]["symptoms"]] == ["preemption"] and "with it, preemption" in f["text"]
    (step,) = doc["sample_steps"]
    engine = step["engine"]
    assert engine["kv_full_iterations"] >= THRESHOLDS["engine_bound_share"] * engine["waiting_iterations"]
    assert engine["preempted"] > 0 and engine["max_running"] < engine["max_num_seqs"]
    assert _keys(f, "verl")[0] == ("actor_rollout_ref.rollout.gpu_memory_utilization", "raise")
    assert _keys(f, "mindspeed")[0] == ("generate_config.gpu_memory_utilization", "raise")
    assert _keys(f, "rlprof") == [("rollout.kv_cache_memory_bytes", "raise")]
    assert not any("max_num_seqs" in key for d in DIALECTS for key, _ in _keys(f, d))
    s = f["saving"]
    assert s["status"] == "predicted" and s["basis"] == "profiled_step_and_samples"
    assert s["step_ms"] == pytest.approx(step["span_ms"]) and 0 < s["saving_ms"] <= step["span_ms"]
    # the setting: a cache that holds the 32 requests at their 164 tokens, in blocks of the engine's size
    block = engine["block_size"]
    assert s["setting"]["kv_cache_tokens"] == 32 * math.ceil((4 + 164) / block) * block
    assert doc["plan"]["conflicts"] == {} and doc["plan"]["total_ms"] == pytest.approx(s["saving_ms"])


def test_a_slot_bound_engine_raises_its_slots_and_nothing_else(tmp_path):
    """A live vLLM with room in its KV cache and 4 slots for 16 requests: the queue is the slots', its lever
    max_num_seqs (set to the batch), and nothing preempted."""
    doc = analyze(_copy(SAMPLES / "slot_bound", tmp_path), workers=1)
    causes = [f for f in doc["findings"] if f.get("actionable")]
    assert [f["kind"] for f in causes] == ["slot_bound"], [f["kind"] for f in causes]
    (f,) = causes
    assert _keys(f, "verl")[0] == ("actor_rollout_ref.rollout.max_num_seqs", "raise")
    assert f["saving"]["setting"]["max_num_seqs"] == 16 and f["evidence"]["preempted"] == 0


def _engine_queue(engine: dict | None):
    from test_causes import FIRING

    return FIRING["engine_queue"]() if engine is None else FIRING[engine]()


def test_a_queue_whose_bound_the_data_cannot_tell_gets_only_more_kv_memory():
    """vLLM's queued time without its scheduler's stats: KV-bound or slot-bound is not known; the finding says so and
    gives more KV memory only (a slot-bound engine is not made worse by it; more slots would worsen a KV-bound one)."""
    found = diagnose(_engine_queue(None)).findings
    (f,) = [f for f in found if f.get("actionable")]
    assert f["kind"] == "engine_queue" and "cannot tell" in f["text"] and "disable_log_stats=False" in f["text"]
    assert {d: [k for k, _ in _keys(f, d)] for d in f["levers"]} == {
        "verl": ["actor_rollout_ref.rollout.gpu_memory_utilization"],
        "mindspeed": ["generate_config.gpu_memory_utilization"],
        "rlprof": ["rollout.kv_cache_memory_bytes"],
    }
    assert f["saving"]["status"] == "not predictable"


# ---- the basis of a share, the bounds of a saving ---------------------------------------------------------------------
def test_a_window_of_some_units_gives_no_share_of_a_step_it_does_not_know():
    """A rollout window made of 4 decode steps only (no stage range, no samples, no step timing): a saving is said
    in ms of that window, with no share of a step."""
    units = [
        window_row("rollout_generate", "rollout", 5.0, "decode_step", k, launch_bound_ms=4.0, device_gap_ms=4.0)
        for k in range(4)
    ]
    stage = window_row("rollout_generate", "rollout", 20.0, launch_bound_ms=16.0, device_gap_ms=16.0)
    stage["units_only"] = 4
    for u in units + [stage]:
        u["launch_unlinked_ms"] = 0.0
    doc = window_doc([stage, *units])
    (f,) = [f for f in diagnose(doc).findings if f["kind"] == "launch_bound"]
    s = f["saving"]
    assert s["basis"] == "window" and s["saving_share"] is None and s["saving_ms"] == pytest.approx(16.0)
    assert "only a window of some units is known" in f["saving_text"] or "window" in s["assumption"]


def test_the_watch_gives_the_step_where_no_step_timing_was_left():
    """The watch's timeline (its unprofiled, unbusy steps) is the step where the run left no metrics."""
    doc = window_doc(
        [window_row("reward_compute", "reward", 50.0), window_row("actor_update", "actor", 100.0)],
        timeline={
            "steps": [1, 2, 3, 4],
            "profiled_steps": [2],
            "captured_steps": [],
            "warmup_steps": [1],
            "busy_steps": [],
            "per_step": {
                "step": {"max": [1.0, 0.5, 0.2, 0.3], "median": [1.0, 0.5, 0.2, 0.3]},
                "reward_compute": {"max": [0.5, 0.06, 0.05, 0.07], "median": [0.5, 0.06, 0.05, 0.07]},
            },
        },
    )
    (f,) = [f for f in diagnose(doc).findings if f["kind"] == "slow_reward"]
    s = f["saving"]
    assert s["basis"] == "watched_steps" and s["step_ms"] == pytest.approx(250.0)  # steps 3 and 4
    assert s["by_stage_ms"]["reward_compute"] <= 60.0 + 1e-9  # at most the watched reward's median
    assert s["saving_share"] == pytest.approx(s["saving_ms"] / 250.0)


def test_no_part_of_a_saving_is_negative_and_none_passes_its_stage(tmp_path):
    """Weight sync on two ranks: the rollout takes on the actor's gathers, netted into the sync's own part (once a
    part of -25.9 ms); every part at least 0 and at most its stage's time."""
    doc = analyze(_copy(RUNS / "even_2", tmp_path), workers=1)
    (f,) = [f for f in doc["findings"] if f["kind"] == "weight_sync"]
    s = f["saving"]
    assert set(s["by_stage_ms"]) == {"weight_sync"} and 0 <= s["by_stage_ms"]["weight_sync"]
    assert "taken from the sync's saving" in s["assumption"]


# ---- fits that obey physics, and the load that does not move them --------------------------------------------------
def _micro_doc(walls: list[float], tokens: list[int]):
    rows = [window_row("actor_update", "actor", sum(walls)), window_row("rollout_generate", "rollout", sum(walls))]
    rows += [
        window_row("actor_update", "actor", w, "micro_batch", k, seqs=1, tokens=t, real_tokens=t)
        for k, (w, t) in enumerate(zip(walls, tokens))
    ]
    return window_doc(rows)


def test_a_fit_with_a_negative_part_is_not_measurable_and_nothing_uses_it():
    """Micro-batches whose time falls as their tokens grow: 'fixed + -25.8 us per token' is no cost; the fit is not
    measurable, with its numbers, no cause is judged on it and no saving rests on it."""
    tokens = [100 + 50 * k for k in range(8)]
    doc = _micro_doc([3.0 - 0.0258 * (t - 100) / 10 for t in tokens], tokens)
    (m,) = fixed_cost(doc)
    assert m["status"] == "not measurable" and m["per_token_us"] < 0 and "negative" in m["why"]
    found = diagnose(doc).findings
    assert "small_units" not in [f["kind"] for f in found]
    assert not prediction_context({**doc, "measures": [m]}).measures[("fixed_cost", "actor_update")]["value"]


def test_too_few_token_counts_or_too_much_scatter_is_not_measurable():
    two = _micro_doc([2.0, 3.0] * 4, [100, 200] * 4)
    assert "too few different token counts" in fixed_cost(two)[0]["why"]
    rng = np.random.default_rng(0)
    tokens = [100 + 10 * k for k in range(12)]
    noisy = _micro_doc(list(1.0 + rng.uniform(0, 4, 12)), tokens)
    (m,) = fixed_cost(noisy)
    assert m["status"] == "not measurable", m


def test_micro_batches_a_busy_machine_slowed_are_left_out_of_the_fit():
    """Load adds time and never takes it away: two micro-batches held up 30 ms by a neighbour are left out, and the
    fit is the quiet ones' (5 ms fixed + 10 us per token), so the cause found is the same as on a quiet machine."""
    tokens = [100 + 20 * k for k in range(10)]
    quiet = [5.0 + 0.01 * t for t in tokens]
    busy = [w + (30.0 if k in (3, 7) else 0.0) for k, w in enumerate(quiet)]
    (m,) = fixed_cost(_micro_doc(busy, tokens))
    assert m["status"] == "measured" and m["micro_batches"] == 8
    assert m["fixed_ms"] == pytest.approx(5.0) and m["per_token_us"] == pytest.approx(10.0)
    assert [f["kind"] for f in diagnose(_micro_doc(busy, tokens)).findings if f.get("actionable")][:1] == [
        "small_units"
    ]


# ---- response caps that keep the experiment ----------------------------------------------------------------------
def test_the_cap_on_a_recorded_long_tail_is_at_the_p95_and_says_what_it_cuts(tmp_path):
    """rlprof's trainer with room for 48 tokens (recorded): the tail's own cap (11 tokens) would cut 43% of the
    responses; the cap offered is the p95 of the step's lengths, and says how many responses and tokens it cuts."""
    doc = analyze(_copy(RUNS / "skewed_lengths", tmp_path), workers=1)
    (f,) = [f for f in doc["findings"] if f["kind"] == "rollout_tail"]
    s = f["saving"]
    ctx = prediction_context(doc)
    (lengths,) = ctx.lengths.values()
    assert s["setting"]["max_new_tokens"] == math.ceil(np.percentile(lengths, 95))
    cut = [L for L in lengths if L > s["setting"]["max_new_tokens"]]
    assert s["responses_cut"] == pytest.approx(len(cut) / len(lengths)) and s["responses_cut"] <= 0.05
    assert s["tokens_cut"] == sum(L - s["setting"]["max_new_tokens"] for L in cut)
    assert "cuts more than 5% of the responses" in s["assumption"]
    # MindSpeed-RL's first lever keeps every response: partial rollout, the tail's time at most
    ms = predict(ctx, Finding.of(f), "mindspeed")
    assert ms["setting"] == {} and ms["saving_ms"] <= s["saving_ms"] + f["evidence"]["tail_ms"]


# ---- rlprof advise --fix --plan: one consistent config --------------------------------------------------------------
def test_fix_plan_writes_every_causes_first_lever_once_and_the_plans_saving(tmp_path):
    run = _copy(RUNS / "skewed_lengths", tmp_path)
    out = tmp_path / "plan.yaml"
    proc = run_cli("advise", run, "--fix", "--plan", "--dialect", "rlprof", "-o", out)
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(out.read_text())
    assert config["rollout"]["max_new_tokens"] >= 1 and config["actor"]["use_dynamic_bsz"] is True
    import json

    fx = json.loads(out.with_suffix(".fix.json").read_text())["fix"]
    doc = json.loads((run / "analysis" / "analysis.json").read_text()) if (run / "analysis").exists() else None
    ranked = [f["kind"] for f in (doc or analyze(run, workers=1))["findings"] if f.get("actionable")]
    assert fx["cause"] == "plan" and fx["causes"] == ranked and set(ranked) == {"rollout_tail", "padding"}
    parts = [p["saving"]["saving_ms"] for p in fx["parts"]]
    assert max(parts) <= fx["saving"]["saving_ms"] <= sum(parts) + 1e-9
    assert fx["plan"]["conflicts"] == {} and fx["saving"]["saving_share"] <= 1
    assert f"# plan: {', '.join(ranked)}" in out.read_text()
    bad = run_cli("advise", run, "--fix", "--plan", "--cause", "padding")
    assert bad.returncode == 2 and "--plan writes every cause's first lever" in bad.stderr


def test_a_plan_of_two_levers_on_one_stage_counts_it_once():
    from rlprof.analyze.diagnosis.plan import plan_of

    doc = window_doc([window_row("rollout_generate", "rollout", 100.0), window_row("actor_update", "actor", 100.0)])
    ctx = prediction_context(doc)
    half = {"status": "predicted", "saving_ms": 50.0, "by_stage_ms": {"rollout_generate": 50.0}}
    plan = plan_of(ctx, [{"kind": "a", "saving": half}, {"kind": "b", "saving": half}])
    assert plan["by_stage_ms"]["rollout_generate"] == pytest.approx(75.0)  # half, then half of what is left
    assert plan["total_share"] == pytest.approx(75.0 / 200.0)
    both = Lever("k", "raise", "x"), Lever("k", "lower", "y")
    entries = [{"kind": "a", "levers": {"verl": [{"key": lv.key, "set": lv.set}]}} for lv in both]
    assert plan_of(ctx, entries)["conflicts"] == {"verl": {"k": ["lower", "raise"]}}


def test_a_larger_micro_batch_stays_within_the_memory_headroom_where_it_is_known():
    """Micro-batches too small, with the update's peak at 40% of the device's memory: the size offered keeps the peak,
    taken to grow with the rows, under 90% of it (2 rows, not the 8 the fixed cost alone would pick), and says so."""
    tokens = [100 + 50 * k for k in range(8)]
    walls = [20.0 + 0.01 * t for t in tokens]
    free = _micro_doc(walls, tokens)
    cap = 80 * 2**30
    bound = _micro_doc(walls, tokens)
    bound["memory"] = [
        {
            "rank": 0,
            "role": "actor",
            "stage": "actor_update",
            "file": "f",
            "peak_bytes": 0.4 * cap,
            "capacity_bytes": cap,
        }
    ]
    sizes = {}
    for name, doc in (("free", free), ("bound", bound)):
        (f,) = [f for f in diagnose(doc).findings if f["kind"] == "small_units"]
        sizes[name] = f["saving"]["setting"]["micro_batch_size"]["actor_update"]
        words = f["saving"]["assumption"]
    assert sizes == {"free": 8, "bound": 2}
    assert "stays under 90% of the device's up to 2 rows" in words


def test_the_same_first_cause_on_a_busy_machine(tmp_path):
    """One-row micro-batches recorded with two busy loops beside the trainer (other processes used 82% of the CPUs):
    least squares over every micro-batch of a log-prob pass gives a negative cost per token; fitted over the quickest
    micro-batches (load adds time and never takes it away), the cause is the one a quiet run names."""
    doc = analyze(_copy(RUNS / "busy_micro_batches", tmp_path), workers=1)
    assert [f for f in doc["findings"] if f["kind"] == "busy_machine"] and "every window was" in doc["findings"][0][
        "text"
    ]
    ranked = [(f["kind"], f.get("stage"), f.get("saving_ms")) for f in doc["findings"] if f.get("actionable")]
    assert ranked and ranked[0][0] == "small_units", ranked  # which cause came first, where the test fails
    fits = {m["stage"]: m for m in doc["measures"] if m["measure"] == "fixed_cost"}
    assert {m["fit"] for m in fits.values()} == {"quickest"} and all(m["status"] == "measured" for m in fits.values())
    assert all(m["fixed_ms"] >= 0 and m["per_token_us"] >= 0 for m in fits.values())
    plain = []
    for stage in fits:
        units = [r for r in doc["rows"] if r["unit"] == "micro_batch" and r["stage"] == stage]
        plain.append(np.polyfit([u["tokens"] for u in units], [u["wall_ms"] for u in units], 1)[0])
    assert min(plain) < 0, plain  # what every unit's least squares gives: no cost
