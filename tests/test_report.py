"""The HTML report in a real browser (playwright + Debian's chromium), the viewer, slice and show()."""

import gzip
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, open_page, run_cli
from helpers import A

SECTIONS = ("timeline", "breakdown", "ops", "memory", "cluster", "compare")
ARTIFACTS = Path(os.environ.get("RLPROF_TEST_ARTIFACTS", ROOT / "outputs" / "test-artifacts"))
EVIL = "<img src=x onerror=alert(1)>"


def _train(tmp_path, name, *overrides):
    proc = run_cli(
        "train",
        "trainer.steps=3",
        f"trainer.output_dir={tmp_path}/t_{name}",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2,3]",
        f"global_profiler.save_path={tmp_path}/{name}",
        f"{A}.enable=true",
        f"{A}.tool_config.torch.contents=[cpu,memory]",
        *overrides,
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run_dir,) = list((tmp_path / name).iterdir())
    return run_dir, proc.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    new, stdout = _train(tmp, "new", "actor.micro_batch_size=4")
    base, _ = _train(tmp, "base", "actor.micro_batch_size=16")
    return new, base, stdout


@pytest.mark.slow
def test_report_of_a_trainer_run_in_chromium(runs, browser, tmp_path):
    new, base, train_stdout = runs
    assert re.search(r"report: \S*report\.html", train_stdout.replace("\n", "")) and (new / "report.html").exists()
    out = tmp_path / "report.html"
    proc = run_cli("report", new, "-bp", base, "-o", out)
    assert proc.returncode == 0, proc.stderr
    page, seen = open_page(browser, out)
    for key in SECTIONS:
        assert page.locator(f"section#{key}").count() == 1, key
        traces = page.locator(f"#chart-{key} .trace").count()
        marks = page.locator(f"#chart-{key} .point, #chart-{key} .js-line").count()
        assert traces > 0 and marks > 0, (key, traces, marks)
    assert page.locator("#compare table tbody tr").count() > 0
    assert "actor_update" in page.locator("#breakdown").inner_text()
    page.locator("#chart-timeline").scroll_into_view_if_needed()  # below the findings: bring it on screen
    boxes = [b for b in (p.bounding_box() for p in page.locator("#chart-timeline .point").all()) if b]
    box = max(boxes, key=lambda b: b["width"])  # interactive: hovering the widest bar shows its hover label
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_selector(".hoverlayer .hovertext", timeout=5000)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    assert seen["errors"] == [] and seen["dialogs"] == []
    assert all(u.startswith(("file:", "data:", "blob:", "about:")) for u in seen["requests"]), seen["requests"]
    page.close()


@pytest.mark.slow
def test_report_loads_nothing_from_the_network(runs):
    new, base, _ = runs
    page = (new / "report.html").read_text()
    scripts = re.findall(r"<script>(.*?)</script>", page, re.DOTALL)
    assert len(scripts) == 2 and "Plotly.newPlot" in scripts[1]  # plotly.js inline, then the figures
    assert not re.search(r"<script[^>]+src", page)
    markup = re.sub(r"<script>.*?</script>", "", page, flags=re.DOTALL)
    # no element or stylesheet pulls a remote resource (plotly.js's code holds URLs in strings, never loaded:
    # the browser test records every request, and the page's CSP forbids them)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", markup, re.IGNORECASE)
    assert not re.search(r"""url\(\s*["']?(https?:)?//|@import|https?://""", markup, re.IGNORECASE)
    assert "default-src 'none'" in page  # and the page's CSP forbids any load the browser might try


def _evil_trace(path: Path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": EVIL, "pid": 1, "tid": 1, "ts": 1000, "dur": 300},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1400, "dur": 50},
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": f"rlprof:stage:{EVIL}",
            "pid": 1,
            "tid": 1,
            "ts": 990,
            "dur": 500,
        },
    ]
    path.write_text(json.dumps({"traceEvents": events, "rlprof": {"step": 1, "role": EVIL, "stage": "e2e", "rank": 0}}))


def test_hostile_operator_name_is_text_not_markup(browser, tmp_path):
    trace = tmp_path / "evil.pt.trace.json"
    _evil_trace(trace)
    proc = run_cli("report", trace, "-o", tmp_path / "r.html")
    assert proc.returncode == 0, proc.stderr
    raw = (tmp_path / "r.html").read_text()
    assert EVIL not in raw  # escaped everywhere: tables, labels and the figure JSON
    page, seen = open_page(browser, tmp_path / "r.html")
    page.wait_for_timeout(500)
    assert seen["dialogs"] == [] and seen["errors"] == []
    assert page.locator("img").count() == 0
    cells = page.locator("#ops table td").all_inner_texts()
    assert EVIL in cells  # shown as the literal text
    ticks = page.locator("#chart-ops .ytick text").all_text_contents()
    assert EVIL in ticks
    page.close()


def _replicate(run_dir: Path, dest: Path, ranks: int) -> Path:
    """A run of `ranks` ranks made of one real run's windows (each rank's files are real traces)."""
    dest.mkdir(parents=True)
    rows = [json.loads(x) for x in (run_dir / "manifest.jsonl").read_text().splitlines() if x.strip()]
    out = []
    for rank in range(ranks):
        for row in rows:
            name = row["path"].replace("_rank0", f"_rank{rank}")
            shutil.copy(run_dir / row["path"], dest / name)
            out.append({**row, "rank": rank, "path": name})
    (dest / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
    return dest


@pytest.mark.slow
def test_eight_ranks_five_steps_stays_under_10_mb(tmp_path):
    proc = run_cli(
        "train",
        "trainer.steps=5",
        f"trainer.output_dir={tmp_path}/t",
        "global_profiler.tool=torch",
        "global_profiler.steps=[1,2,3,4,5]",
        f"global_profiler.save_path={tmp_path}/one",
        f"{A}.enable=true",
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (one,) = list((tmp_path / "one").iterdir())
    big = _replicate(one, tmp_path / "eight", 8)
    proc = run_cli("report", big, "-o", tmp_path / "big.html")
    assert proc.returncode == 0, proc.stderr
    size = (tmp_path / "big.html").stat().st_size
    assert size < 10e6, size
    page = (tmp_path / "big.html").read_text()
    assert all(f"rank {r}" in page for r in range(8))


def _listening_address(port: int) -> str:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if int(p, 16) == port and state == "0A":  # LISTEN
                return addr
    raise AssertionError(f"nothing listens on {port}")


def test_view_serves_on_loopback_and_refuses_escapes(runs_small):
    run_dir = runs_small
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlprof.cli", "view", str(run_dir), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        hint = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, line + proc.stderr.read() if proc.poll() is not None else line
        port = int(match.group(1))
        assert _listening_address(port) == "0100007F"  # 127.0.0.1, not 0.0.0.0
        assert "ssh -N -L" in hint
        # not reachable on another address of this machine
        other = socket.gethostbyname(socket.gethostname())
        if not other.startswith("127."):
            with pytest.raises(OSError):
                socket.create_connection((other, port), timeout=2).close()

        def get(path):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()

        status, body = get("/")
        assert status == 200 and b"rlprof report" in body
        trace = next(p for p in run_dir.glob("*.pt.trace.json.gz"))
        status, body = get(f"/files/{trace.name}")
        assert status == 200 and body == trace.read_bytes()
        status, body = get("/files/")
        assert status == 200 and trace.name.encode() in body
        for escape in (
            "/files/../../../../etc/passwd",
            "/files/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
            "/files/..%2f..%2f..%2fetc%2fpasswd",
            f"/files/../{run_dir.name}/../../x",
        ):
            status, body = get(escape)
            assert status == 403 and b"root:" not in body, escape
        assert get("/files/nope.json")[0] == 404
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def runs_small(tmp_path_factory):
    """A real run whose update marks micro-batches and whose rollout marks decode steps."""
    tmp = tmp_path_factory.mktemp("small")
    proc = run_cli(
        "train",
        "trainer.steps=2",
        f"trainer.output_dir={tmp}/t",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"global_profiler.save_path={tmp}/p",
        f"{A}.enable=true",
        cwd=tmp,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run_dir,) = list((tmp / "p").iterdir())
    return run_dir


def _load(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _ranges(doc, kind):
    """rlprof's ranges of `kind`, named without the `|key=value` part unit ranges carry."""
    return [
        {**e, "name": e["name"].split("|")[0]}
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and e["name"].startswith(f"rlprof:{kind}:")
    ]


def test_slice_holds_only_the_requested_slice(runs_small, tmp_path):
    src = _load(next(runs_small.glob("*.pt.trace.json.gz")))
    (stage,) = [e for e in _ranges(src, "stage") if e["name"] == "rlprof:stage:actor_update"]
    mb3 = next(
        e
        for e in _ranges(src, "micro_batch")
        if e["name"].split("|")[0] == "rlprof:micro_batch:3" and stage["ts"] <= e["ts"] <= stage["ts"] + stage["dur"]
    )
    out = tmp_path / "mb3.json.gz"
    proc = run_cli(
        "slice", runs_small, "--step", 2, "--role", "actor", "--stage", "actor_update", "--micro-batch", 3, "-o", out
    )
    assert proc.returncode == 0, proc.stderr
    doc = _load(out)  # valid Chrome-trace JSON
    stacks = [e for e in doc["traceEvents"] if e.get("cat") == "rlprof_host_stack"]  # the host's, a track of its own
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "rlprof_host_stack"]
    lo, hi = mb3["ts"], mb3["ts"] + mb3["dur"]
    assert xs and all(e["ts"] + e["dur"] > lo and e["ts"] < hi for e in xs)
    assert all(lo <= e["ts"] and e["ts"] + e["dur"] <= hi + 1e-3 for e in stacks)  # cut to the slice
    assert [e["name"] for e in _ranges(doc, "micro_batch")] == ["rlprof:micro_batch:3"]
    assert any(e.get("ph") == "M" for e in doc["traceEvents"])  # process / thread names kept
    assert doc["rlprof"]["slice"]["micro_batch"] == 3 and doc["rlprof"]["step"] == 2
    inside = [e for e in src["traceEvents"] if e.get("ph") == "X" and e["ts"] + e["dur"] > lo and e["ts"] < hi]
    assert len(xs) == len(inside) < len([e for e in src["traceEvents"] if e.get("ph") == "X"])
    assert out.stat().st_size < (next(runs_small.glob("*.pt.trace.json.gz"))).stat().st_size / 4

    out = tmp_path / "decode.json"
    proc = run_cli(
        "slice",
        runs_small,
        "--step",
        2,
        "--role",
        "rollout",
        "--stage",
        "rollout_generate",
        "--decode-steps",
        "2:5",
        "-o",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(e["name"] for e in _ranges(_load(out), "decode_step")) == [
        f"rlprof:decode_step:{i}" for i in (2, 3, 4)
    ]
    out = tmp_path / "window.json.gz"
    proc = run_cli(
        "slice", runs_small, "--step", 2, "--role", "actor", "--stage", "actor_update", "--window-ms", "0:2", "-o", out
    )
    assert proc.returncode == 0, proc.stderr
    span = _load(out)["rlprof"]["slice"]
    assert span["end_us"] - span["start_us"] == pytest.approx(2000.0)


@pytest.mark.parametrize(
    "args,words",
    [
        (["--micro-batch", "99"], ["micro-batch 99", "allowed"]),
        (["--decode-steps", "5:2"], ["--decode-steps", "A < B"]),
        (["--micro-batch", "1", "--window-ms", "0:1"], ["at most one"]),
        (["--stage", "rollout_generate"], ["belongs to role rollout"]),
    ],
)
def test_bad_slice_requests_exit_2(runs_small, tmp_path, args, words):
    base = {"--step": "2", "--role": "actor", "--stage": "actor_update"}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    flat = [x for kv in base.items() for x in kv]
    proc = run_cli("slice", runs_small, *flat, "-o", tmp_path / "x.json.gz")
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and all(w in line for w in words), line
    assert not (tmp_path / "x.json.gz").exists()


def test_show_renders_inline_for_jupyter(tmp_path):
    from rlprof.report import show

    trace = tmp_path / "evil.pt.trace.json"
    _evil_trace(trace)
    shown = show(trace)
    frame = shown._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts"' in frame
    assert "<script" not in frame  # the page is an escaped attribute value, parsed only inside the frame
    assert "Plotly.newPlot" in shown.page and "&amp;lt;img" in frame


def test_findings_box_next_step_and_stage_selector_in_chromium(runs, browser, tmp_path):
    new, _, _ = runs
    out = tmp_path / "report.html"
    assert run_cli("report", new, "-o", out).returncode == 0
    page, seen = open_page(browser, out)
    assert page.locator("section#findings").count() == 1
    assert page.locator("section#findings .finding").count() >= 1  # the answer leads the page
    assert "global_profiler" in page.locator("#next-config").inner_text()  # the config to paste
    options = page.locator("#stage-select option").all_inner_texts()
    assert options[0] == "all stages" and "actor/actor_update" in options and len(options) >= 3

    def visible_stages():
        rows = page.locator("#ops-table tbody tr")
        return {rows.nth(k).get_attribute("data-stage") for k in range(rows.count()) if rows.nth(k).is_visible()}

    assert len(visible_stages()) > 1  # all stages: the top overall, from several stages
    page.select_option("#stage-select", "actor/actor_update")
    assert visible_stages() == {"actor/actor_update"}
    other = next(o for o in options[1:] if o != "actor/actor_update")
    page.select_option("#stage-select", other)
    assert visible_stages() == {other}
    assert seen["errors"] == []
    page.close()
