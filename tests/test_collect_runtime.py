"""The collection runtime on a small real CPU loop with roles, stages, mini/micro-batches, decode steps."""

import json
import socket

from helpers import A, R, load_trace, names, rows, run, trace_files

from rlprof.vocab import STAGES

DEMO_STAGES = [
    "rollout_generate",
    "reward_compute",
    "ref_compute_log_prob",
    "actor_compute_log_prob",
    "advantage_compute",
    "actor_update",
]


def test_e2e_one_file_per_selected_step_with_stage_ranges(tmp_path):
    d = run(tmp_path, steps="[1,3]")
    assert trace_files(d) == ["step1_actor_e2e_rank0.pt.trace.json.gz", "step3_actor_e2e_rank0.pt.trace.json.gz"]
    for step, name in ((1, "step1_actor_e2e_rank0.pt.trace.json.gz"), (3, "step3_actor_e2e_rank0.pt.trace.json.gz")):
        trace = load_trace(d / name)
        assert isinstance(trace["traceEvents"], list)
        meta = trace["rlprof"]
        assert (meta["step"], meta["role"], meta["stage"], meta["rank"]) == (step, "actor", "e2e", 0)
        stages = [n.split(":")[2] for n in names(trace, "rlprof:stage:")]
        assert stages == DEMO_STAGES  # every stage, in order, inside the one window
    assert [r["step"] for r in rows(d)] == [1, 3]


def test_discrete_one_file_per_selected_stage(tmp_path):
    d = run(tmp_path, f"{A}.tool_config.torch.discrete=true", steps="[2]")
    expected = {
        f"step2_{role}_{stage}_rank0.pt.trace.json.gz"
        for role, stage in [
            ("rollout", "rollout_generate"),
            ("ref", "ref_compute_log_prob"),
            ("actor", "actor_compute_log_prob"),
            ("actor", "advantage_compute"),
            ("actor", "actor_update"),
        ]
    }  # reward role is not enabled
    assert set(trace_files(d)) == expected
    for row in rows(d):
        trace = load_trace(d / row["path"])
        assert trace["rlprof"]["stage"] == row["stage"] and trace["rlprof"]["role"] == row["role"]
        assert names(trace, "rlprof:stage:") == [f"rlprof:stage:{row['stage']}"]
        assert row["mode"] == "discrete" and row["status"] == "complete"


def test_only_selected_stages_roles_and_ranks(tmp_path):
    d = run(tmp_path / "a", f"{A}.tool_config.torch.discrete=true", f"{A}.stages=[actor_update]", role="actor")
    assert trace_files(d) == ["step2_actor_actor_update_rank0.pt.trace.json.gz"]
    d = run(tmp_path / "b", f"{A}.tool_config.torch.discrete=true", role="ref")
    assert trace_files(d) == ["step2_ref_ref_compute_log_prob_rank0.pt.trace.json.gz"]
    d = run(tmp_path / "c", f"{A}.ranks=[0]", rank=1, world_size=2)
    assert trace_files(d) == [] and rows(d) == []
    d = run(tmp_path / "d", f"{A}.ranks=[1]", rank=1, world_size=2)
    assert trace_files(d) == ["step2_actor_e2e_rank1.pt.trace.json.gz"]
    assert rows(d)[0]["world_size"] == 2


def _count(trace, name):
    return sum(1 for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"] == name)


def test_micro_batch_schedule_holds_exactly_one_micro_batch(tmp_path):
    full = run(tmp_path / "full", f"{A}.tool_config.torch.discrete=true", f"{A}.stages=[actor_update]", role="actor")
    one = run(
        tmp_path / "one",
        f"{A}.tool_config.torch.discrete=true",
        f"{A}.stages=[actor_update]",
        f"{A}.tool_config.torch.schedule={{unit: micro_batch, active: 1}}",
        role="actor",
    )
    name = "step2_actor_actor_update_rank0.pt.trace.json.gz"
    t_full, t_one = load_trace(full / name), load_trace(one / name)
    assert len(names(t_full, "rlprof:micro_batch:")) == 8  # 2 mini-batches x 4 micro-batches
    assert names(t_one, "rlprof:micro_batch:") == ["rlprof:micro_batch:0"]
    backward = "autograd::engine::evaluate_function: EmbeddingBackward0"
    assert _count(t_full, backward) == 8 and _count(t_one, backward) == 1  # one micro-batch's ops only
    assert _count(t_one, "Optimizer.step#AdamW.step") == 0
    row = rows(one)[0]
    assert row["unit"] == "micro_batch" and row["window"] == 0 and row["status"] == "complete"


def test_decode_step_schedule_holds_decode_steps_31_to_60(tmp_path):
    d = run(
        tmp_path,
        f"{R}.tool_config.torch.discrete=true",
        f"{R}.tool_config.torch.schedule={{unit: decode_step, wait: 29, warmup: 1, active: 30}}",
        role="rollout",
    )
    trace = load_trace(d / "step2_rollout_rollout_generate_rank0.pt.trace.json.gz")
    steps = sorted(int(n.split(":")[2]) for n in names(trace, "rlprof:decode_step:"))
    assert steps == list(range(30, 60))  # 0-based 30..59 = decode steps 31-60
    assert _count(trace, "aten::multinomial") == 30


def test_schedule_repeat_writes_one_file_per_cycle(tmp_path):
    d = run(
        tmp_path,
        f"{A}.tool_config.torch.discrete=true",
        f"{A}.stages=[actor_update]",
        f"{A}.tool_config.torch.schedule={{unit: micro_batch, wait: 1, active: 1, repeat: 2}}",
        role="actor",
    )
    assert trace_files(d) == [
        "step2_actor_actor_update_rank0_w0.pt.trace.json.gz",
        "step2_actor_actor_update_rank0_w1.pt.trace.json.gz",
    ]
    assert [names(load_trace(d / f), "rlprof:micro_batch:") for f in trace_files(d)] == [
        ["rlprof:micro_batch:1"],
        ["rlprof:micro_batch:3"],
    ]
    assert sorted(r["window"] for r in rows(d)) == [0, 1]


def test_continuous_steps_share_one_window(tmp_path):
    d = run(tmp_path, "global_profiler.continuous_steps=true", steps="[1,2]")
    assert trace_files(d) == ["step1_actor_e2e_rank0.pt.trace.json.gz"]
    trace = load_trace(d / trace_files(d)[0])
    assert trace["rlprof"]["steps"] == [1, 2]
    assert names(trace, "rlprof:stage:").count("rlprof:stage:actor_update") == 2
    assert rows(d)[0]["steps"] == [1, 2]


def test_manifest_rows_match_files(tmp_path):
    d = run(tmp_path, f"{A}.tool_config.torch.discrete=true", steps="[1,2]")
    listed = rows(d)
    assert sorted(r["path"] for r in listed) == trace_files(d)
    required = {
        "step",
        "role",
        "stage",
        "rank",
        "world_size",
        "replica",
        "tool",
        "mode",
        "unit",
        "window",
        "path",
        "bytes",
        "start_ns",
        "end_ns",
        "status",
    }
    for r in listed:
        assert required <= set(r)
        assert (d / r["path"]).stat().st_size == r["bytes"]
        assert r["start_ns"] < r["end_ns"] and r["tool"] == "torch"
        assert r["path"].startswith(f"step{r['step']}_{r['role']}_{r['stage']}_rank{r['rank']}")
        assert r["stage"] in STAGES


def test_markers_timeline(tmp_path):
    d = run(tmp_path, tool="markers", steps="[1,2]")
    files = sorted(p.name for p in d.glob("*.timeline.json.gz"))
    assert files == ["step1_actor_e2e_rank0.timeline.json.gz", "step2_actor_e2e_rank0.timeline.json.gz"]
    trace = load_trace(d / files[0])
    assert trace["rlprof"]["tool"] == "markers"
    assert [n.split(":")[2] for n in names(trace, "rlprof:stage:")] == DEMO_STAGES
    assert len(names(trace, "rlprof:decode_step:")) == 64
    assert len(names(trace, "rlprof:micro_batch:")) == 8 * 3  # ref, old log-probs, update
    assert all(e["ph"] in ("X", "M") for e in trace["traceEvents"])


def test_mark_ranges_and_analysis_hook(tmp_path):
    from rlprof.collect import Profiler, mark
    from rlprof.config import load_plan

    plan = load_plan(
        None,
        [
            "global_profiler.tool=torch",
            "global_profiler.steps=[1]",
            f"global_profiler.save_path={tmp_path}",
            f"{A}.enable=true",
            f"{A}.tool_config.torch.analysis=true",
        ],
    )
    with Profiler(plan, run_id="r") as prof:
        with prof.step(1), prof.stage("actor_update"), mark("my_region"):
            sum(range(1000))
        with mark("outside"):  # no window open: a no-op
            pass
    trace = load_trace(tmp_path / "r" / "step1_actor_e2e_rank0.pt.trace.json.gz")
    assert names(trace, "rlprof:mark:") == ["rlprof:mark:my_region"]
    analysis = json.loads((tmp_path / "r" / "step1_actor_e2e_rank0.analysis.json").read_text())
    assert [(r["step"], r["stage"], r["rank"]) for r in analysis["rows"]] == [(1, "actor_update", 0)]
    assert analysis["input"]["events"] > 0
    # the manifest says where the window was written; `rlprof analyze` reuses the background tables
    from rlprof.analyze.pipeline import analyze
    from rlprof.collect.manifest import read_rows

    (row,) = read_rows(tmp_path / "r")
    assert row["host"] == socket.gethostname() and row["node_id"] is None
    reused = analyze(tmp_path / "r")
    assert [i["analysed_on"]["reused"] for i in reused["inputs"]] == [True]
    (tmp_path / "r" / "step1_actor_e2e_rank0.analysis.json").unlink()
    fresh = analyze(tmp_path / "r")
    assert [i["analysed_on"] for i in fresh["inputs"]] == [
        {"host": socket.gethostname(), "node_id": None, "reused": False}
    ]
    for doc in (reused, fresh):
        del doc["inputs"][0]["analysed_on"]
    assert json.dumps(reused, sort_keys=True) == json.dumps(fresh, sort_keys=True)


def test_stage_decorator_uses_current_profiler(tmp_path):
    import rlprof
    from rlprof.collect import Profiler
    from rlprof.config import load_plan

    class Worker:
        @rlprof.stage("actor_update", role="actor")
        def update(self, x):
            return x * 2

    assert Worker().update(2) == 4  # no profiler: a plain call
    plan = load_plan(
        None,
        [
            "global_profiler.tool=torch",
            "global_profiler.steps=[1]",
            f"global_profiler.save_path={tmp_path}",
            f"{A}.enable=true",
            f"{A}.tool_config.torch.discrete=true",
        ],
    )
    with Profiler(plan, run_id="r") as prof:
        with prof.step(1):
            assert Worker().update(3) == 6
        with prof.step(2):
            Worker().update(3)
    assert trace_files(tmp_path / "r") == ["step1_actor_actor_update_rank0.pt.trace.json.gz"]


def test_unselected_boundaries_return_the_shared_noop(tmp_path):
    from rlprof.collect import NULL

    from helpers import profiler

    prof = profiler(tmp_path, steps="[5]")
    with prof.step(1):
        assert prof.stage("actor_update") is NULL
        assert prof.unit("micro_batch") is NULL
        assert prof.mark("x") is NULL
        prof.tick("decode_step")
    prof.close()
    assert rows(tmp_path / "profile" / "run") == []
