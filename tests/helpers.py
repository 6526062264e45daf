import csv
import gzip
import json
from pathlib import Path

from rlprof.collect import Profiler
from rlprof.collect.manifest import read_rows
from rlprof.config import load_plan
from rlprof.demo import DemoShape, run_demo

A = "actor_rollout_ref.actor.profiler"
R = "actor_rollout_ref.rollout.profiler"


def profiler(tmp_path, *overrides, tool="torch", steps="[2]", **kwargs):
    plan = load_plan(
        None,
        [
            f"global_profiler.tool={tool}",
            f"global_profiler.steps={steps}",
            f"global_profiler.save_path={tmp_path}/profile",
            f"{A}.enable=true",
            *overrides,
        ],
    )
    return Profiler(plan, run_id="run", **kwargs)


def run(tmp_path, *overrides, shape=None, **kwargs):
    prof = profiler(tmp_path, *overrides, **kwargs)
    with prof:
        run_demo(prof, shape or DemoShape(steps=3))
    return run_dir(tmp_path)


def run_dir(tmp_path) -> Path:
    return tmp_path / "profile" / "run"


def load_trace(path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def names(trace, prefix) -> list[str]:
    """Range names under `prefix`, without the `|key=value` part a unit range carries (unit_args reads that)."""
    return [
        e["name"].split("|")[0] for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"].startswith(prefix)
    ]


def unit_args(trace, prefix) -> list[dict]:
    """The `|key=value,...` part of each range under `prefix`, as integers."""
    out = []
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e["name"].startswith(prefix):
            tail = e["name"].partition("|")[2]
            out.append({k: int(v) for k, v in (p.split("=") for p in tail.split(",") if p)})
    return out


def rows(d):
    return read_rows(d) if (Path(d) / "manifest.jsonl").exists() else []


def trace_files(d):
    return sorted(p.name for p in Path(d).glob("*.json.gz")) if Path(d).exists() else []


def complete_events(data: bytes) -> tuple[list[dict], int]:
    """The tests' own tolerant parse (independent of rlprof's reader): the complete events of the traceEvents
    array in `data` up to any damage, and the character offset where the last one ends ([] when no array)."""
    text = data.decode("utf-8", errors="replace")  # ASCII traces: byte and character offsets agree
    at = text.find('"traceEvents"')
    if at < 0 or text.find("[", at) < 0:
        return [], 0
    pos = end = text.find("[", at) + 1
    decoder, events = json.JSONDecoder(), []
    while True:
        while pos < len(text) and text[pos] in " \n\r\t,":
            pos += 1
        try:
            event, pos = decoder.raw_decode(text, pos)
        except ValueError:
            return events, end
        events.append(event)
        end = pos


def set_csv_cells(path, column: str, values: dict[int, str]) -> None:
    """Rows (1-based after the header) of one column set to the given text, the rest as written."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    col = rows[0].index(column)
    for row, value in values.items():
        rows[row][col] = value
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)


# ---- catching the slow step: what the trigger may do, from the busy flags a loaded machine sets ---------------
def unjudged_steps(run_dir, rank=0):
    """The steps the trigger captured nothing at for this rank's sake, whatever the job did: the profiler's own cost
    in the step (the plan's window, or one written in the background meanwhile), or a slow step the machine's
    contention explained (the rank's wait for a core: said, flagged, not captured). A busy machine's other steps are
    judged."""
    from rlprof.analyze.inputs.timeline_file import CONTENTION, PROFILED, read_rank

    rec = read_rank(run_dir / "timeline" / f"rank{rank}.bin")
    return {int(s) for s, f in zip(rec["step"], rec["flags"]) if f & (PROFILED | CONTENTION)}


def timeline_said(run_dir, ranks=(0,)) -> str:
    """What the watch saw, for a failing test's message: per rank and step, the step's seconds, busy, its run-queue
    wait (ms) and the flags (b busy, w warm-up, c captured, p profiled, j judged, s slow, t straggler, x contention)."""
    from rlprof.analyze.inputs.timeline_file import read_rank

    lines = []
    for rank in ranks:
        rec = read_rank(run_dir / "timeline" / f"rank{rank}.bin")
        cells = [
            f"{int(r['step'])}:{r['step_s']:.3f}s/{r['run_wait_ms']:.0f}ms"
            + "".join(c for bit, c in zip((1, 2, 4, 8, 16, 32, 64, 128), "bwcpjstx") if int(r["flags"]) & bit)
            for r in rec
        ]
        lines.append(f"rank {rank}: " + " ".join(cells))
    return "\n".join(lines)


def first_judged(onset, busy):
    """The first step at or after the onset that is not unjudged (a straggler is judged against the other ranks of
    the same step: no history needed)."""
    step = onset
    while step in busy:
        step += 1
    return step


def trigger_steps(onset, busy, last, warmup=3):
    """The steps the slow rule may first fire at, from the busy flags alone (the only thing a loaded machine
    changes): steps after the warm-up that are not busy are judged, each against the median of the judged steps
    before it (>= 3 of them), which is a fast one while fast steps outnumber slow ones. On a quiet machine: {onset},
    so the capture is of the first step after the onset. Empty: the machine was too busy for any judgement."""
    fast = slow = 0
    maybe = set()
    for step in range(warmup + 1, last + 1):
        if step in busy:
            continue
        if step >= onset and fast + slow >= 3 and fast >= slow:
            maybe.add(step)
            if fast > slow:
                return maybe
        fast, slow = fast + (step < onset), slow + (step >= onset)
    return maybe


def union(intervals):
    """Plain-Python union length (the test's own arithmetic, independent of rlprof's numpy code)."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + ((cur_e - cur_s) if cur_e is not None else 0.0)


def stays_near_its_reference(history: list[dict], proc) -> None:
    """What the defaults promise of a run (docs/trainer.md): KL from the reference below 1 per token at every step,
    the last five steps' mean reward above the first five's, the entropy never below half its start, no divergence
    line. Says the run's own numbers where it fails."""
    kl = [round(m["kl"], 3) for m in history]
    reward = [m["reward_mean"] for m in history]
    entropy = [m["entropy"] for m in history]
    assert max(kl) < 1, f"KL per step: {kl}"
    first, last = sum(reward[:5]) / 5, sum(reward[-5:]) / 5
    assert last > first + 0.1, f"reward first 5 steps {first:.3f}, last 5 {last:.3f}: {[round(r, 3) for r in reward]}"
    assert min(entropy) > entropy[0] / 2, f"entropy per step: {[round(e, 2) for e in entropy]}"
    assert "diverges" not in proc.stderr, proc.stderr[-2000:]
