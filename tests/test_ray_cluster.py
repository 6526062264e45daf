"""`--ray` on a real two-node Ray cluster started on this machine: each file is analysed on the node that wrote
it, the tables equal the local analysis, and a node lost mid-run is one warning and a partial result."""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time

import psutil
import pytest

from conftest import ROOT, run_cli
from helpers import A

sys.path.insert(0, str(ROOT / "bench"))
from ingest import stop_tree  # noqa: E402  (bench/ingest.py: kill a process tree by PID)

pytestmark = pytest.mark.skipif(shutil.which("ray") is None, reason="ray is not installed (pip install rlprof[all])")

NODE_IDS = """
import json, sys, ray
ray.init(address=sys.argv[1], include_dashboard=False, configure_logging=False, log_to_driver=False)
print(json.dumps({r: n["NodeID"] for n in ray.nodes() if n["Alive"] for r in n["Resources"] if r.startswith("node_")}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Ray's token authentication, as a real cluster runs it: every process of the test cluster and every client
# (the probe, rlprof) holds the same token.
AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_USAGE_STATS_ENABLED": "0"}


class Node:
    """One `ray start --block` and every process under it, stopped by PID."""

    def __init__(self, args: list[str], log):
        env = dict(os.environ, **AUTH)
        self.proc = psutil.Popen(
            [shutil.which("ray"), "start", "--block", "--num-cpus=1", *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        stop_tree(self.proc)

    def running(self, fragment: str) -> bool:
        try:
            return any(fragment in " ".join(p.cmdline()) for p in self.proc.children(recursive=True))
        except psutil.Error:
            return False


@pytest.fixture
def cluster(tmp_path):
    port = free_port()
    address = f"127.0.0.1:{port}"
    temp = f"/tmp/rlprof-ray-{port}"
    with open(tmp_path / "ray.log", "wb") as log:
        head = Node(
            [
                "--head",
                f"--port={port}",
                '--resources={"node_a": 1}',
                "--include-dashboard=false",
                f"--temp-dir={temp}",
            ],
            log,
        )
        nodes = [head]
        try:
            ids = {}
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if len(nodes) == 1 and head.proc.is_running():
                    time.sleep(3)
                    nodes.append(Node([f"--address={address}", '--resources={"node_b": 1}'], log))
                probe = subprocess.run(
                    [sys.executable, "-c", NODE_IDS, address],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    env=dict(os.environ, **AUTH),
                )
                if probe.returncode == 0:
                    ids = json.loads(probe.stdout.strip().splitlines()[-1])
                    if set(ids) == {"node_a", "node_b"}:
                        break
                time.sleep(2)
            assert set(ids) == {"node_a", "node_b"}, (tmp_path / "ray.log").read_text()[-3000:]
            yield {
                "address": address,
                "ids": ids,
                "nodes": dict(zip(("node_a", "node_b"), nodes)),
                "env": {"RAY_ADDRESS": address, **AUTH},
            }
        finally:
            for node in reversed(nodes):
                node.stop()
            shutil.rmtree(temp, ignore_errors=True)


def two_node_torchrun(tmp_path, node_ids: list[str]):
    """A 2-rank torchrun run laid out as two nodes (one torchrun per node, as a cluster launches it), each
    node's rank writing its windows with that node's Ray id in its manifest rows."""
    port = free_port()
    procs = []
    for node_rank, node_id in enumerate(node_ids):
        env = dict(
            os.environ, KINETO_LOG_LEVEL="5", OMP_NUM_THREADS="1", RLPROF_NODE_ID=node_id, RLPROF_RUN_ID="tworun"
        )
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--node_rank",
            str(node_rank),
            "--nproc_per_node",
            "1",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(port),
            "-m",
            "rlprof.trainer",
            "trainer.steps=2",
            f"trainer.output_dir={tmp_path}/t",
            "global_profiler.tool=torch",
            "global_profiler.steps=[2]",
            f"global_profiler.save_path={tmp_path}/runs",
            f"{A}.enable=true",
            f"{A}.all_ranks=true",
        ]
        procs.append(
            subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    return tmp_path / "runs" / "tworun"


def tables(doc: dict) -> str:
    return json.dumps(
        {k: doc[k] for k in ("rows", "ops", "collectives", "launch", "memory", "findings")}, sort_keys=True
    )


@pytest.mark.slow
def test_each_file_is_analysed_on_the_node_that_wrote_it(cluster, tmp_path):
    ids = cluster["ids"]
    run = two_node_torchrun(tmp_path, [ids["node_a"], ids["node_b"]])
    rows = [json.loads(line) for line in (run / "manifest.jsonl").read_text().splitlines()]
    assert {(r["rank"], r["node_id"]) for r in rows} == {(0, ids["node_a"]), (1, ids["node_b"])}
    assert {r["host"] for r in rows} == {socket.gethostname()}

    local = run_cli("analyze", run, "--json")
    assert local.returncode == 0, local.stderr
    on_ray = run_cli("analyze", run, "--json", "--ray", env=cluster["env"])
    assert on_ray.returncode == 0, on_ray.stderr
    local, on_ray = json.loads(local.stdout), json.loads(on_ray.stdout)
    by_rank = {0: ids["node_a"], 1: ids["node_b"]}
    assert len(on_ray["inputs"]) == len(rows) == 2
    for item in on_ray["inputs"]:
        assert item["analysed_on"]["node_id"] == by_rank[item["rank"]], item
    assert all(i["analysed_on"]["node_id"] is None for i in local["inputs"])
    assert tables(on_ray) == tables(local)
    assert not on_ray["partial"] and not on_ray["warnings"]

    # cluster and compare take --ray too, with the same answers as locally
    for args in (("cluster", run), ("compare", "-d", run, "-bp", run)):
        a = run_cli(*args, "--json")
        b = run_cli(*args, "--json", "--ray", env=cluster["env"])
        assert a.returncode == b.returncode == 0, b.stderr
        assert json.loads(a.stdout).keys() == json.loads(b.stdout).keys()
        assert json.dumps(json.loads(a.stdout), sort_keys=True) == json.dumps(json.loads(b.stdout), sort_keys=True)
    report = run_cli("report", run, "-o", tmp_path / "report.html", "--ray", env=cluster["env"])
    assert report.returncode == 0, report.stderr
    assert "actor_update" in (tmp_path / "report.html").read_text()


@pytest.mark.slow
def test_a_node_lost_mid_run_is_a_warning_and_a_partial_result(cluster, tmp_path):
    ids = cluster["ids"]
    run = two_node_torchrun(tmp_path, [ids["node_a"], ids["node_b"]])
    # node b also holds a large window, so that its analysis is still running when the node goes
    from synth_trace import write_trace

    write_trace(run / "step2_actor_big_rank1.pt.trace.json", 150, seed=3, rank=1)
    with open(run / "manifest.jsonl", "a") as f:
        f.write(
            json.dumps(
                {
                    "step": 2,
                    "role": "actor",
                    "stage": "actor_update",
                    "rank": 1,
                    "window": 1,
                    "path": "step2_actor_big_rank1.pt.trace.json",
                    "status": "ok",
                    "host": socket.gethostname(),
                    "node_id": ids["node_b"],
                }
            )
            + "\n"
        )
    env = dict(os.environ, **cluster["env"], RLPROF_RAY_TIMEOUT_S="300")
    # the document goes to a file: a pipe nobody reads until the end would hold the process at its last write
    out_file, err_file = open(tmp_path / "analysis.json", "w+"), open(tmp_path / "analysis.err", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlprof.cli", "analyze", str(run), "--json", "--ray"],
        env=env,
        stdout=out_file,
        stderr=err_file,
        text=True,
    )
    node_b = cluster["nodes"]["node_b"]
    deadline = time.monotonic() + 120
    seen = False  # a Ray worker names itself ray::run_job while it runs a task
    while time.monotonic() < deadline and proc.poll() is None and not (seen := node_b.running("run_job")):
        time.sleep(0.05)
    if seen:
        time.sleep(0.5)
        node_b.stop()
    proc.wait(timeout=400)
    out, err = (tmp_path / "analysis.json").read_text(), (tmp_path / "analysis.err").read_text()
    out_file.close(), err_file.close()
    assert proc.returncode == 0 and out.startswith("{"), (out[:2000], err[-3000:])
    doc = json.loads(out)
    if not seen:
        # node b's task ran and ended between two looks (a loaded machine): no loss to exercise, a whole result
        assert not doc["partial"] and not [w for w in doc["warnings"] if "not analysed on node" in w], doc["warnings"]
        assert any(i["path"].endswith("step2_actor_big_rank1.pt.trace.json") for i in doc["inputs"])
        return
    assert doc["partial"]
    lost = [w for w in doc["warnings"] if "step2_actor_big_rank1" in w]
    assert len(lost) == 1 and ids["node_b"] in lost[0] and "not analysed on node" in lost[0], doc["warnings"]
    rank0 = [i for i in doc["inputs"] if i.get("rank") == 0]
    assert rank0 and all(i["analysed_on"]["node_id"] == ids["node_a"] and not i.get("error") for i in rank0)
    assert any(r["rank"] == 0 and r["stage"] == "actor_update" for r in doc["rows"])


def test_where_a_file_was_written_decides_its_node():
    from rlprof.analyze.workers.distributed import place

    nodes = {"n1": "hostA", "n2": "hostB", "n3": "hostB"}
    # the manifest's node id wins among the nodes that see the file; soft only where another node sees it too
    assert place({"where": {"node_id": "n2", "host": "hostB"}}, ["n1", "n2"], nodes) == ("n2", True)
    assert place({"where": {"node_id": "n2", "host": "hostB"}}, ["n2"], nodes) == ("n2", False)
    # no (known) node id: the host name, where exactly one seeing node has it
    assert place({"where": {"node_id": None, "host": "hostA"}}, ["n2", "n1"], nodes) == ("n1", True)
    assert place({"where": {"node_id": "gone", "host": "hostB"}}, ["n1", "n2", "n3"], nodes) == ("n1", True)
    # nothing recorded: the first node that listed it
    assert place({}, ["n3"], nodes) == ("n3", False)


def test_hosts_from_the_names_torchs_handlers_write(tmp_path):
    from rlprof.analyze.inputs.find import find_inputs
    from rlprof.frameworks.torch_profiler import host_of

    assert host_of(tmp_path / "gpu-node-7_4242.1732300000123.pt.trace.json.gz") == "gpu-node-7"
    assert host_of(tmp_path / "node0_4100_20261122120500_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "x.db") == "node0"
    assert (
        host_of(tmp_path / "actor-rollout-ref_actor-update_step3_rank1-of-2_pid3764_20261122185742361.json.gz") is None
    )  # verl's own names carry no host
    mindspeed = ROOT / "tests" / "data" / "ascend" / "mindspeed" / "profiler_data"
    inputs = find_inputs(mindspeed)
    assert inputs and all(meta["where"] == {"host": "node0", "node_id": None} for _, meta in inputs)


def test_ray_missing_is_one_clear_error(tmp_path, monkeypatch):
    from rlprof.analyze.pipeline import analyze
    from rlprof.errors import AnalyzeError

    monkeypatch.setitem(sys.modules, "ray", None)  # as on an install without Ray
    with pytest.raises(AnalyzeError, match="--ray needs the ray package"):
        analyze(tmp_path, use_ray=True)
