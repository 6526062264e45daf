"""rlprof's measures of each step, as an experiment tracker takes them: flat `rlprof/...` numbers per step, computed
from the run directory's watch timeline (every rank's stage times, the trigger's verdict in its flags), its sample
records and the captures' trigger rows. One module for the three that log them: verl's driver (into the metrics dict
verl hands its `trainer.logger` backends), rlprof's trainer (`trainer.logger`) and `rlprof export` (a past run).

`KEYS` names every key once (docs/verl.md lists them; tests/test_docs.py checks the two agree). `<stage>` is `step`
or a stage of `vocab.STAGES`; `<reason>` a trigger's reason (slow, straggler, request, baseline); `<cause>` a cause of
analyze/diagnosis/causes.py. A key whose input the run did not record is absent at that step, never 0.

`RunReader` reads the directory as it grows: each rank's timeline and each sample file from where its last read
stopped (a record cut by a writer in flight is read at the next look), so a live job pays for the new bytes only.
Samples of a step already measured that arrive later (an async rollout's) are `late`: the step's measures again,
over all its samples; `PAST_STEPS` names the backends that take a number at an earlier step."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import msgspec
import numpy as np

from ..diagnosis.samples import quantiles, step_summaries
from ..inputs.samples_file import is_record, sample_files
from ..inputs.timeline_file import (
    CAPTURED,
    COLUMNS_FILE,
    CONTENTION,
    JUDGED,
    PROFILED,
    STRAGGLER,
    SLOW,
    TIMELINE_DIR,
    WARMUP,
    record_dtype,
    stage_names,
    timeline_ranks,
)

PREFIX = "rlprof/"
QUANTILES = ("p50", "p90", "p99", "max")
REASONS = ("slow", "straggler", "request", "baseline")
NOT_JUDGED = {"warmup": WARMUP, "profiled": PROFILED, "captured": CAPTURED}  # a busy step is judged

# every key, with what it holds (docs/verl.md's table says the same)
KEYS: dict[str, str] = {
    "rlprof/time/<stage>/max_s": "the stage's wall seconds at the step on its slowest rank (the watch's timeline)",
    "rlprof/time/<stage>/spread": "the stage's slowest rank over its median rank (two ranks or more)",
    "rlprof/time/<stage>/slowest_rank": "the rank (or replica) that was slowest in the stage (two ranks or more)",
    "rlprof/rollout/samples": "samples the step's rollout generated (its sample records)",
    "rlprof/rollout/sample_ms/<q>": "a sample's time, start to end, at quantile <q> (p50, p90, p99, max)",
    "rlprof/rollout/response_tokens/<q>": "a sample's response tokens at quantile <q> (p50, p90, p99, max)",
    "rlprof/rollout/tail_share": "share of the rollout's span with fewer than half its samples still running",
    "rlprof/rollout/preemptions": "times the engine preempted the step's samples (where the host reports it)",
    "rlprof/rollout/preempted_samples": "samples preempted at least once (where the host reports it)",
    "rlprof/rollout/queue_ms/<q>": "a sample's wait before its generation began, at <q> (p50, max; where known)",
    "rlprof/trigger/judged": "1 where the trigger judged the step against its baseline, 0 where it did not",
    "rlprof/trigger/not_judged/<why>": "1 for each reason a step was not judged: warmup, profiled, captured",
    "rlprof/trigger/found/<reason>": "1 where the trigger found the step slow or a rank straggling (judged steps), or "
    "contention: slow for the machine's load (the ranks' waits for a core explained it: said, not captured)",
    "rlprof/capture/<reason>": "1 at a step captured for <reason> (slow, straggler, request, baseline)",
    "rlprof/capture/seen_step": "the step the trigger saw, whose slowness armed this capture",
    "rlprof/capture/stage/<stage>": "1: the stage the trigger saw slow (`step`: the whole step)",
    "rlprof/capture/seconds": "the time the trigger saw (the stage's, or the straggler's)",
    "rlprof/capture/baseline_seconds": "what it was judged against (recent median, or the other ranks')",
    "rlprof/capture/cause/<cause>": "rlprof export: 1 for each cause the analysis found in the captured window",
    "rlprof/finding/spike/<stage>": "rlprof export: the stage's seconds at a step the run over time flags a spike",
    "rlprof/finding/level_shift/<stage>": "rlprof export: the stage's new level (s), at the step it moved to it",
    "rlprof/finding/straggler/<stage>": "rlprof export: a straggling rank's median ratio to the others, at its first step",
}
# backends that take a number at an earlier step than the last they logged (late samples go to their own step there)
PAST_STEPS = frozenset({"tensorboard", "mlflow", "console", "file"})
KEEP_STEPS = 64  # measured steps whose samples are kept, for samples that arrive late


def key_pattern(key: str) -> str:
    """The `KEYS` entry a concrete key is an instance of (placeholders for the stage, quantile, reason...)."""
    parts = key.split("/")
    fits = [
        p
        for p in KEYS
        if len(p.split("/")) == len(parts) and all(a == b or a.startswith("<") for a, b in zip(p.split("/"), parts))
    ]
    if not fits:
        raise KeyError(key)
    return min(fits, key=lambda p: p.count("<"))  # `capture/seen_step` before `capture/<reason>`


def time_measures(rows: dict[int, np.void], stages: list[str]) -> dict[str, float]:
    """Each stage's slowest rank and spread from one step's timeline records (rank -> record)."""
    if not rows:
        return {}
    ranks = sorted(rows)
    table = np.asarray([[rows[r]["step_s"], *rows[r]["stage_s"]] for r in ranks], dtype=np.float64)
    out: dict[str, float] = {}
    for j, name in enumerate(["step", *stages]):
        col = table[:, j]
        ran = ~np.isnan(col)
        if not ran.any():
            continue
        worst = int(np.argmax(np.where(ran, col, -np.inf)))
        top, median = float(col[worst]), float(np.median(col[ran]))
        out[f"{PREFIX}time/{name}/max_s"] = top
        if len(ranks) > 1:
            out[f"{PREFIX}time/{name}/spread"] = top / median if median > 0 else 1.0
            out[f"{PREFIX}time/{name}/slowest_rank"] = float(ranks[worst])
    return out


def verdict_measures(flags: int, recorded: bool) -> dict[str, float]:
    """The trigger's verdict from a step's flags OR-ed over the ranks; nothing where the run did not record it."""
    if not recorded:
        return {}
    judged = bool(flags & JUDGED)
    out = {f"{PREFIX}trigger/judged": float(judged)}
    if judged:
        out[f"{PREFIX}trigger/found/slow"] = float(bool(flags & SLOW))
        out[f"{PREFIX}trigger/found/straggler"] = float(bool(flags & STRAGGLER))
        out[f"{PREFIX}trigger/found/contention"] = float(bool(flags & CONTENTION))
    else:
        out |= {f"{PREFIX}trigger/not_judged/{why}": 1.0 for why, bit in NOT_JUDGED.items() if flags & bit}
    return out


def sample_measures(samples: list[dict]) -> dict[str, float]:
    """One step's samples: their count, distribution, tail, preemptions and queue (analyze/diagnosis/samples.py's
    step summary, the document's `sample_steps`)."""
    if not samples:
        return {}
    (s,) = step_summaries(samples)
    out = {f"{PREFIX}rollout/samples": float(s["samples"])}
    for name, dist in (("sample_ms", s["duration_ms"]), ("response_tokens", s["response_tokens"])):
        for q in QUANTILES if dist else ():
            out[f"{PREFIX}rollout/{name}/{q}"] = dist[q]
    if s["tail_share"] is not None:
        out[f"{PREFIX}rollout/tail_share"] = s["tail_share"]
    if "preemptions" in s:
        out[f"{PREFIX}rollout/preemptions"] = float(s["preemptions"])
        out[f"{PREFIX}rollout/preempted_samples"] = float(s["preempted_samples"])
    queue = quantiles([r["queue_ms"] for r in samples if "queue_ms" in r])
    for q in ("p50", "max") if queue else ():
        out[f"{PREFIX}rollout/queue_ms/{q}"] = queue[q]
    return out


def capture_measures(triggers: list[dict]) -> dict[str, float]:
    """A captured step's cause as the trigger saw it: the first capture's trigger row (the one that explains the
    step, as the manifest's rows of it carry), every capture's reason."""
    if not triggers:
        return {}
    out = {f"{PREFIX}capture/{t['reason']}": 1.0 for t in triggers if t.get("reason") in REASONS}
    t = triggers[0]
    if t.get("step") is not None:
        out[f"{PREFIX}capture/seen_step"] = float(t["step"])
    if t.get("stage"):
        out[f"{PREFIX}capture/stage/{t['stage']}"] = 1.0
    for name in ("seconds", "baseline_seconds"):
        if t.get(name) is not None:
            out[f"{PREFIX}capture/{name}"] = float(t[name])
    return out


class RunReader:
    """A run directory read as it grows (the module's text): the timeline records and sample records not read yet,
    and what each step measured."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.offsets: dict[Path, int] = {}  # file -> bytes read (whole records or lines only)
        self.rows: dict[int, dict[int, np.void]] = defaultdict(dict)  # step -> rank -> timeline record
        self.samples: dict[int, list[dict]] = defaultdict(list)  # step -> its sample records read so far
        self.stages: list[str] | None = None
        self.verdicts = False  # the timeline records the trigger's verdict (its columns name the flag)
        self.measured: list[int] = []  # steps measured, in order
        self.late_steps: set[int] = set()  # measured steps whose samples arrived after

    # ---- reading what is new ----------------------------------------------------------------------------------------
    def read(self) -> None:
        for rank, path in timeline_ranks(self.run_dir):
            if self.stages is None:
                self.stages = stage_names(self.run_dir)
                self.verdicts = _flag_named(self.run_dir, "judged")
            for rec in self._new_records(path):
                self.rows[int(rec["step"])][rank] = rec
        done = set(self.measured)
        for path in sample_files(self.run_dir):
            for r in self._new_lines(path):
                if is_record(r):
                    self.samples[r["step"]].append(r)
                    if r["step"] in done:
                        self.late_steps.add(r["step"])

    def _new_records(self, path: Path) -> np.ndarray:
        start = self.offsets.get(path, 0)
        layout = record_dtype(path.parent)  # a version 1 timeline's records hold the fields read here too
        try:
            size = path.stat().st_size
        except OSError:
            return np.zeros(0, layout)
        count = (size - start) // layout.itemsize
        if count <= 0:
            return np.zeros(0, layout)
        records = np.fromfile(path, dtype=layout, count=count, offset=start)
        self.offsets[path] = start + len(records) * layout.itemsize
        return records

    def _new_lines(self, path: Path) -> list[dict]:
        start = self.offsets.get(path, 0)
        try:
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read()
        except OSError:
            return []
        whole = data.rfind(b"\n") + 1  # a line still being written is read at the next look
        self.offsets[path] = start + whole
        out = []
        for line in data[:whole].splitlines():
            try:
                row = msgspec.json.decode(line)
            except (msgspec.DecodeError, UnicodeDecodeError):
                continue  # a line a crash cut (a writer appends whole lines after it)
            if isinstance(row, dict):
                out.append(row)
        return out

    # ---- the measures ------------------------------------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Every step read so far with a timeline record or a sample."""
        return sorted(set(self.rows) | set(self.samples))

    def measures(self, step: int, captures: list[dict] = ()) -> dict[str, float]:
        """The step's measures (`captures`: the trigger rows of the captures taken at it); the step counts as measured
        from now on: its samples read later are late. The records of steps measured KEEP_STEPS steps ago are let go."""
        rows = self.rows.pop(step, {})
        flags = 0
        for rec in rows.values():
            flags |= int(rec["flags"])
        out = time_measures(rows, self.stages or [])
        if rows:
            out |= verdict_measures(flags, self.verdicts)
        out |= sample_measures(self.samples.get(step, []))
        out |= capture_measures(list(captures))
        self.measured.append(step)
        self.late_steps.discard(step)
        for old in self.measured[:-KEEP_STEPS]:
            self.samples.pop(old, None)
        del self.measured[:-KEEP_STEPS]
        return out

    def late(self) -> dict[int, dict[str, float]]:
        """Steps measured before some of their samples arrived: their rollout measures again, over every sample read
        for them (those of steps let go: over the late ones)."""
        out = {step: sample_measures(self.samples.get(step, [])) for step in sorted(self.late_steps)}
        self.late_steps.clear()
        return {step: m for step, m in out.items() if m}


def _flag_named(run_dir: Path, name: str) -> bool:
    try:
        return name in json.loads((Path(run_dir) / TIMELINE_DIR / COLUMNS_FILE).read_text()).get("flags", {})
    except (OSError, ValueError, AttributeError):
        return False


# ---- a past run, whole (rlprof export) -------------------------------------------------------------------------------
def run_measures(run_dir: Path, captures: list[dict] = ()) -> list[tuple[int, dict[str, float]]]:
    """(step, its measures) for every step the run directory recorded; `captures`: the manifest rows a trigger wrote
    (each with its `trigger`), grouped to the step they captured."""
    reader = RunReader(run_dir)
    reader.read()
    taken: dict[int, list[dict]] = defaultdict(list)
    seen = set()
    for c in captures:
        t = c.get("trigger") or {}
        key = (c.get("step"), msgspec.json.encode(t))
        if isinstance(c.get("step"), int) and key not in seen:
            seen.add(key)
            taken[c["step"]].append(t)
    return [(step, reader.measures(step, taken.get(step, []))) for step in sorted(set(reader.steps()) | set(taken))]


def finding_measures(doc: dict) -> list[tuple[int, dict[str, float]]]:
    """What the analysis of a past run found, at the steps it found it: the run over time's spikes, level shifts and
    stragglers, and each captured window's causes (`timeline.beside`)."""
    timeline = doc.get("timeline") or {}
    at: dict[int, dict[str, float]] = defaultdict(dict)
    for s in timeline.get("spikes") or ():
        at[s["step"]][f"{PREFIX}finding/spike/{s['stage']}"] = float(s["seconds"])
    for s in timeline.get("level_shifts") or ():
        at[s["from_step"]][f"{PREFIX}finding/level_shift/{s['stage']}"] = float(s["after_seconds"])
    for s in timeline.get("stragglers") or ():
        at[s["first_step"]][f"{PREFIX}finding/straggler/{s['stage']}"] = float(s["median_ratio"])
    for b in timeline.get("beside") or ():
        if isinstance(b.get("step"), int):
            for c in (b.get("cause") or {}).get("causes") or ():
                at[b["step"]][f"{PREFIX}capture/cause/{c['cause']}"] = 1.0
    return sorted(at.items())


def findings_text(doc: dict) -> str:
    """The document's findings as a Markdown table (kind, cause, where, what it says): a tracker's text panel."""
    lines = ["| kind | cause | role / stage | finding |", "| --- | --- | --- | --- |"]
    for f in doc.get("findings") or ():
        where = " / ".join(str(x) for x in (f.get("role"), f.get("stage")) if x)
        text = str(f.get("text", "")).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {f.get('kind')} | {f.get('cause') or ''} | {where} | {text} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def finite(measures: dict[str, float]) -> dict[str, float]:
    """The numbers a tracker can draw (NaN and infinities left out)."""
    return {k: v for k, v in measures.items() if isinstance(v, (int, float)) and math.isfinite(v)}
