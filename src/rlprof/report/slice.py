"""`rlprof slice`: a small, valid Chrome trace of one stage / micro-batch / decode steps / time window.

The window's events are kept byte for byte (args included), and the rollout's samples that ran in it (where the
host recorded them) and the host's sampled Python stacks (report/host_stacks.py) come as tracks of their own; device work goes with the host range that launched
it (Kineto's correlation ids: a micro-batch's slice keeps the kernels it launched, however late they ran, and
leaves out another's that ran in its time); process/thread names and the trace's
top-level objects come along so Perfetto and chrome://tracing show it as the original. The source
window file is decoded whole (its raw events are views into the file's bytes: memory ~ its size).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ..analyze.tables.classify import RLPROF_RANGE
from ..analyze.inputs.manifest import manifest_inputs
from ..errors import RLProfError
from .host_stacks import stack_tracks


class SliceError(RLProfError):
    pass


class Launch(msgspec.Struct):
    correlation: Any = None  # Kineto: a device event's id = its launch call's (any JSON value: never damage)


class Stamp(msgspec.Struct):
    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float | str = 0.0
    dur: float | str = 0.0
    id: Any = None
    args: Launch | list | str | float | bool | None = None


LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _correlation(s: Stamp):
    return s.args.correlation if isinstance(s.args, Launch) else None


def launched_in(stamps: list[Stamp], lo: float, hi: float) -> tuple[set, set]:
    """(the correlation ids launched in [lo, hi], every id launched in the file): a device event belongs to
    the slice of the host range that launched it (docs/analysis_schema.md, attribution by launch)."""
    inside, every = set(), set()
    for s in stamps:
        if s.ph == "X" and s.cat in LAUNCH_CATS and (c := _correlation(s)) is not None:
            every.add(c)
            if lo <= _num(s.ts) <= hi:
                inside.add(c)
    return inside, every


_raw_top = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_raw_events = msgspec.json.Decoder(list[msgspec.Raw]).decode
_stamp = msgspec.json.Decoder(Stamp).decode


@dataclass(frozen=True)
class Selection:
    step: int
    role: str
    stage: str
    micro_batch: int | None = None
    decode_steps: tuple[int, int] | None = None  # [A, B) of the decode_step labels
    window_ms: tuple[float, float] | None = None  # from the stage's start
    rank: int | None = None


def parse_range(text: str, flag: str, cast=int) -> tuple:
    try:
        a, b = (cast(x) for x in text.split(":"))
    except ValueError:
        raise SliceError(f"{flag} {text!r} is not A:B; allowed: two numbers with A < B, e.g. 30:60") from None
    if not a < b or a < 0:
        raise SliceError(f"{flag} {text!r}: allowed: 0 <= A < B")
    return a, b


def _num(x) -> float:
    return float(x) if not isinstance(x, str) else float(x.strip() or 0)


def candidate_files(path: Path, sel: Selection) -> list[Path]:
    """Window files that may hold the stage of that step: its discrete window or an e2e one."""
    if path.is_file() and not path.name.endswith(".jsonl"):
        return [path]
    manifest = path if path.is_file() else path / "manifest.jsonl"
    if not manifest.exists():
        raise SliceError(f"{path} has no manifest.jsonl; allowed: a run directory, its manifest, or one trace file")
    found = []
    for file, meta in manifest_inputs(manifest):
        steps = meta.get("steps") or [meta.get("step")]
        if sel.step not in steps or meta.get("stage") not in (sel.stage, "e2e"):
            continue
        if sel.rank is not None and meta.get("rank") != sel.rank:
            continue
        found.append((meta.get("stage") != sel.stage, meta.get("rank") or 0, file))
    if not found:
        raise SliceError(
            f"no window of step {sel.step} holds {sel.stage}"
            + (f" on rank {sel.rank}" if sel.rank is not None else "")
            + f" in {path}; allowed: a step/stage that `rlprof analyze {path}` lists"
        )
    return [f for *_, f in sorted(found, key=lambda t: (t[0], t[1]))]


def _ranges(stamps: list[Stamp]) -> list[tuple[str, str, float, float]]:
    out = []
    for s in stamps:
        if s.ph == "X" and s.name.startswith("rlprof:"):
            m = RLPROF_RANGE.match(s.name)
            if m:
                lo = _num(s.ts)
                out.append((m.group(1), m.group(2).split("|")[0], lo, lo + _num(s.dur)))  # label, not unit args
    out.sort(key=lambda r: r[2])
    return out


def window(ranges, sel: Selection, steps: list, file: Path) -> tuple[float, float]:
    stages = [r for r in ranges if r[0] == "stage" and r[1] == sel.stage]
    if not stages:
        raise SliceError(
            f"{file.name} has no {sel.stage} range; allowed stages there: "
            + (", ".join(sorted({r[1] for r in ranges if r[0] == "stage"})) or "none")
        )
    k = steps.index(sel.step) if sel.step in steps else 0
    _, _, lo, hi = stages[min(k, len(stages) - 1)]
    inside = [r for r in ranges if lo <= (r[2] + r[3]) / 2 <= hi]
    if sel.micro_batch is not None:
        mb = [r for r in inside if r[0] == "micro_batch" and r[1] == str(sel.micro_batch)]
        if not mb:
            marked = sorted(int(r[1]) for r in inside if r[0] == "micro_batch" and r[1].isdigit())
            raise SliceError(
                f"micro-batch {sel.micro_batch} is not marked in step {sel.step} {sel.stage}; "
                f"allowed: {marked or 'none (collect with micro-batch ranges)'}"
            )
        return mb[0][2], mb[0][3]
    if sel.decode_steps is not None:
        a, b = sel.decode_steps
        ds = [r for r in inside if r[0] == "decode_step" and r[1].isdigit() and a <= int(r[1]) < b]
        if not ds:
            marked = sorted(int(r[1]) for r in inside if r[0] == "decode_step" and r[1].isdigit())
            span = f"{marked[0]}..{marked[-1]}" if marked else "none"
            raise SliceError(
                f"no decode step in {a}:{b} is marked in step {sel.step} {sel.stage}; allowed: within {span}"
            )
        return min(r[2] for r in ds), max(r[3] for r in ds)
    if sel.window_ms is not None:
        a, b = sel.window_ms
        if lo + a * 1e3 >= hi:
            raise SliceError(f"--window-ms {a}:{b} starts after the stage ends ({(hi - lo) / 1e3:.1f} ms long)")
        return lo + a * 1e3, min(hi, lo + b * 1e3)
    return lo, hi


SAMPLES_PID = 990_000  # the samples' own process in the trace (+ rank or replica): beside the host and the device


def sample_tracks(run_dir: Path, sel: Selection, lo: float, hi: float, top: dict) -> list[msgspec.Raw]:
    """The step's rollout samples that ran in [lo, hi], one track each (Perfetto shows them beside the kernels): the
    sample's generation, and its queue, prefill and decode where the host timed them, on the trace's clock (the host's
    epoch microseconds less the trace's baseTimeNanoseconds)."""
    from ..analyze.inputs.samples_file import read_samples

    base = _clock_base_us(top)
    out: list[dict] = []
    named: set = set()
    for r in read_samples(run_dir):
        if r["step"] != sel.step or "start_us" not in r or "end_us" not in r:
            continue
        if sel.rank is not None and r.get("rank", sel.rank) != sel.rank:
            continue
        start, end = r["start_us"] - base, r["end_us"] - base
        if end < lo or start > hi:
            continue
        who = ("replica", r["replica"]) if r.get("replica") is not None else ("rank", r.get("rank", 0))
        pid, tid = SAMPLES_PID + who[1], r["sample"] + 100_000 * r.get("rollout_pass", 0)
        if pid not in named:
            named.add(pid)
            out.append(
                {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rollout samples, {who[0]} {who[1]}"}}
            )
        out.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"sample {r['sample']}"}}
        )
        args = {k: v for k, v in r.items() if k not in ("start_us", "end_us")}
        tokens = f" ({r['response_tokens']} tokens)" if "response_tokens" in r else ""
        out.append(_span(f"sample {r['sample']}{tokens}", pid, tid, start, end, args))
        if "queue_ms" in r:
            out.append(_span("queue", pid, tid, start - r["queue_ms"] * 1e3, start, {}))
        if "prefill_ms" in r:
            out.append(_span("prefill", pid, tid, start, start + r["prefill_ms"] * 1e3, {}))
            if "decode_ms" in r:
                out.append(_span("decode", pid, tid, start + r["prefill_ms"] * 1e3, end, {}))
    return [msgspec.Raw(json.dumps(e).encode()) for e in out]


def _clock_base_us(top: dict) -> float:
    """The trace's baseTimeNanoseconds in µs (0 where it has none): what the hosts' epoch clocks are less."""
    return json.loads(bytes(top["baseTimeNanoseconds"])) / 1e3 if "baseTimeNanoseconds" in top else 0.0


def _span(name: str, pid: int, tid: int, start: float, end: float, args: dict) -> dict:
    return {
        "ph": "X",
        "cat": "rlprof_sample",
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": start,
        "dur": max(0.0, end - start),
        "args": args,
    }


def slice_trace(path: str | Path, sel: Selection, out: str | Path) -> dict:
    from ..vocab import STAGE_ROLE

    if STAGE_ROLE.get(sel.stage, sel.role) != sel.role:
        raise SliceError(
            f"--stage {sel.stage} belongs to role {STAGE_ROLE[sel.stage]}, not {sel.role}; allowed: "
            + ", ".join(s for s, r in STAGE_ROLE.items() if r == sel.role)
        )
    files = candidate_files(Path(path), sel)
    file = files[0]
    opener = gzip.open if file.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(file, "rb") as f:
        data = f.read()
    try:
        top = _raw_top(data)
        raw = _raw_events(top.pop("traceEvents", b"[]"))
    except msgspec.DecodeError as exc:
        raise SliceError(f"{file}: not a readable trace ({exc}); allowed: a Chrome/Kineto trace") from None
    stamps = [_stamp(r) for r in raw]
    meta = json.loads(bytes(top["rlprof"])) if "rlprof" in top else {}
    steps = meta.get("steps") or [meta.get("step", sel.step)]
    lo, hi = window(_ranges(stamps), sel, steps, file)
    mine, linked = launched_in(stamps, lo, hi)
    first = min((c for c in linked if isinstance(c, int)), default=None)  # ids below: launched before the file
    keep, device_end = [], None
    for r, s in zip(raw, stamps):
        if s.ph == "M":
            keep.append(r)
            continue
        ts = _num(s.ts)
        corr = _correlation(s) if s.cat in DEVICE_CATS else s.id if s.cat == "ac2g" and s.ph == "f" else None
        if corr is not None and (corr in linked or isinstance(corr, int) and first is not None and corr < first):
            inside = corr in mine  # device work (and its flow's end) goes with its launch; none launched earlier
            if inside and s.ph == "X":
                device_end = max(device_end or hi, ts + _num(s.dur))
        elif s.ph == "X":
            inside = ts + _num(s.dur) > lo and ts < hi  # overlaps: a neighbour that only touches is left out
        else:
            inside = lo <= ts <= hi
        if inside:
            keep.append(r)
    tracks = sample_tracks(Path(path) if Path(path).is_dir() else file.parent, sel, lo, hi, top)
    keep += tracks
    stacks = stack_tracks(file, lo, hi, _clock_base_us(top))  # the host's stacks, where sampled (host_stacks.py)
    keep += [msgspec.Raw(json.dumps(e).encode()) for e in stacks]
    meta["slice"] = {
        "source": file.name,
        "start_us": lo,
        "end_us": hi,
        "device_end_us": device_end,
        "step": sel.step,
        "role": sel.role,
        "stage": sel.stage,
        "micro_batch": sel.micro_batch,
        "decode_steps": list(sel.decode_steps) if sel.decode_steps else None,
        "window_ms": list(sel.window_ms) if sel.window_ms else None,
        "sample_tracks": sum(1 for t in tracks if b'"thread_name"' in bytes(t)),  # one a sample
        "host_stack_tracks": sum(1 for e in stacks if e["name"] == "thread_name"),  # one a thread
    }
    top["rlprof"] = msgspec.Raw(json.dumps(meta).encode())
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gzip.open if out.name.endswith(".gz") else open
    with writer(out, "wb") as f:
        f.write(b"{")
        for key, value in top.items():
            f.write(json.dumps(key).encode() + b": " + bytes(value) + b",\n")
        f.write(b'"traceEvents": [\n' + b",\n".join(bytes(r) for r in keep) + b"\n]}\n")
    return {
        "source": str(file),
        "out": str(out),
        "events": len(keep),
        "of": len(raw),
        "start_us": lo,
        "end_us": hi,
        "bytes": out.stat().st_size,
    }
