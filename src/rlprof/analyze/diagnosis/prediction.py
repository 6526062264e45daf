"""What the savings formulas (analyze/diagnosis/savings.py) predict from: one document's stage means, the real step
(PredictionContext.basis), the run's own config and unprofiled steps, the rows' response lengths, the micro-batch cost
model, and how a prediction is said and bounded (`predicted`, `not_predictable`).

What the predictions rest on, besides the stage and unit times:
- the step a saving is a share of (`basis`, said in every saving): the run's own unprofiled steps (the trainer's
  metrics.jsonl), else the watch's steps (its timeline), else the profiled step's stages, the rollout's time taken
  from its samples where its window holds only some of its decode steps; where only such a window is known, no
  share is given (a window of a few units is not the step);
- a saving is bounded by what it saves from: each stage's part at least 0 and at most the stage's time, their sum at
  most the step;
- the rows' response lengths, from the decode steps (`active`: rows still generating at each step, so the rows
  of length >= k+1 are those active at step k); prompts of about equal length (their mean, from the log-prob
  pass's real tokens less the response tokens);
- the micro-batch cost `wall = fixed + per_token x tokens` fitted by the fixed_cost measure; where it could not be
  fitted, all of a micro-batch's time is taken to grow with its tokens (no fixed part), and a setting may not add
  micro-batches (their fixed cost is unknown);
- rows in random order of length (fixed-size micro-batches are random subsets: the expected longest row of m
  rows drawn from the batch sets their width).

Over 400 lines because it is one context: every number a saving's formula reads from a document, and the rules that
bound and word every prediction, kept together so that no formula reads the step or a stage's time its own way.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from ...frameworks.levers import DIALECTS
from .measures import _passes, _units_by_stage
from .speed_of_light import sol_per_step, within_speed_of_light

ROLLOUT = "rollout_generate"
MARGIN = 0.5  # a setting computed from the run aims the cause's measure at this share of its threshold
# what a saving's share is of (Saving.basis), best first
BASES = {
    "unprofiled_steps": "the run's unprofiled steps (its own step timing)",
    "watched_steps": "the watch's steps (its timeline)",
    "profiled_step": "the profiled step's stages",
    "profiled_step_and_samples": "the profiled step's stages, the rollout's time from its samples",
    "window": "a window holding some of a stage's units only: the step is not known, no share of it is given",
}


def predicted(
    ctx: PredictionContext,
    parts: dict[str, float],
    assumption: str,
    setting: dict | None = None,
    scaled: bool = True,
    **detail,
) -> dict:
    """A prediction from what each stage saves in the profiled step (`parts`), as ms per step and share of the step.
    `scaled`: the parts are operators' time, inflated by the profiler's own cost per operator, and are scaled stage
    by stage to the run's unprofiled steps where the run left them; a difference between ranks that run the same
    operators holds none of that cost and is taken as it is. Each part is then bounded by what it saves from
    (`bounded`)."""
    by_stage = {stage: float(ms * (ctx.scale(stage) if scaled else 1.0)) for stage, ms in parts.items()}
    basis = ctx.basis()
    words = (
        ctx.basis_words()
        if scaled
        else (
            "not scaled to the unprofiled steps: the ranks run the same operators, so the profiler's own cost per "
            "operator is in each rank's time alike and not in the difference"
        )
    )
    by_stage, held = bounded(ctx, by_stage)
    if held:
        words += "; " + held
    stage_ms = {stage: ctx.stage_ms(stage) * (ctx.scale(stage) if scaled else 1.0) for stage in by_stage}
    by_stage, cut = within_speed_of_light(by_stage, stage_ms, ctx.speed_of_light)  # no stage below its limit
    if cut:
        detail["speed_of_light_ms"] = cut
        assumption += f"; cut where it would bring {', '.join(cut)} below its speed-of-light time"
    saving = sum(by_stage.values())
    return {
        "status": "predicted",
        "saving_ms": float(saving),
        "saving_share": share_of(saving, basis),
        "assumption": assumption + "; " + words,
        "setting": setting or {},
        "by_stage_ms": by_stage,
        "profiled_ms": {k: float(v) for k, v in parts.items()},
        "step_ms": basis["step_ms"],
        "basis": basis["basis"],
        **detail,
    }


def all_of(ctx: PredictionContext, f, field: str, assumption: str) -> dict:
    """A saving that is all of one number of the finding's evidence, in its stage (an upper bound, said)."""
    return predicted(ctx, {f.stage: f.evidence[field]}, assumption)


def share_of(saving: float, basis: dict) -> float | None:
    """A saving's share of the step: none where only a window is known."""
    return saving / basis["step_ms"] if basis["basis"] != "window" and basis["step_ms"] > 0 else None


def bounded(ctx: PredictionContext, by_stage: dict[str, float]) -> tuple[dict[str, float], str]:
    """Each stage's part between 0 and the stage's time per step (ctx.stage_bound), their sum at most the step (the
    parts scaled down alike where they pass it); and what was held back, in words ('' where nothing was)."""
    out, held = {}, []
    for stage, ms in by_stage.items():
        top = ctx.stage_bound(stage)
        part = min(max(ms, 0.0), top) if top is not None else max(ms, 0.0)
        if abs(part - ms) > 1e-9:
            what = "below 0: none" if ms < 0 else f"over the stage's {top:.1f} ms"
            held.append(f"{stage or 'the window'} {ms:.1f} ms ({what})")
        out[stage] = part
    basis = ctx.basis()
    total = sum(out.values())
    if basis["basis"] != "window" and 0 < basis["step_ms"] < total:
        held.append(f"the parts' {total:.1f} ms over the {basis['step_ms']:.1f} ms step: scaled down to it")
        out = {k: v * basis["step_ms"] / total for k, v in out.items()}
    return out, ("bounded by what it saves from: " + ", ".join(held)) if held else ""


def not_predictable(why: str, setting: dict | None = None) -> dict:
    return {"status": "not predictable", "saving_ms": None, "saving_share": None, "why": why, "setting": setting or {}}


class PredictionContext:
    """What the predictions read from one analysis document: stage means, the staged step, the run's own config,
    the units per stage and the rows' lengths per (step, rank), the real step and each stage's time in it."""

    def __init__(self, doc: dict, means: dict, step_ms: float, thresholds: dict):
        self.doc, self.means, self.step_ms, self.t = doc, means, step_ms, thresholds
        self.cfg = ((doc.get("run_config") or {}).get("config")) or {}
        self.micro = _units_by_stage(doc, "micro_batch")
        self.mini = _units_by_stage(doc, "mini_batch")
        self.measures = {(m["measure"], m.get("stage")): m for m in doc.get("measures", [])}
        self.lengths = response_lengths(doc)
        self.dialect = dialect_of(doc)
        self.speed_of_light = sol_per_step(doc)  # stage -> its speed-of-light time per step, where known
        self.span = rollout_span(doc)
        self.units_only = partial_stages(doc)  # stages whose window holds some of their units only
        # and of them, those whose time is not known otherwise (the rollout's is, from its samples)
        self.partial = self.units_only - ({ROLLOUT} if self.span else set())
        self._unprofiled = (((doc.get("run_config") or {}).get("unprofiled")) or {}) or watched(doc)
        self._basis: dict | None = None

    def stage_ms(self, stage) -> float:
        return sum(v["wall_ms"] for k, v in self.means.items() if k[1] == stage)

    def unprofiled(self) -> dict:
        """The run's steps outside the profiled ones: its own step timing (run_config.unprofiled), else the watch's."""
        return self._unprofiled

    def scale(self, stage) -> float:
        """The stage's median time in the run's unprofiled steps over its time in the profiled one (1 where the run
        left no step metrics, and for a stage whose window holds only some of its units: no ratio to the whole)."""
        u = self.unprofiled().get("stage_ms") or {}
        profiled = self.stage_ms(stage)
        if stage in self.partial or (stage == ROLLOUT and self.span and self.span > profiled):
            return 1.0  # no ratio of a whole stage to a window of some of its units
        return u[stage] / profiled if u.get(stage) and profiled > 0 else 1.0

    def stage_time(self, stage) -> float:
        """The stage's time in the profiled step: its mean over ranks and steps, the rollout's from its samples where
        they span more (its window holds some of its decode steps)."""
        ms = self.stage_ms(stage)
        return max(ms, self.span) if stage == ROLLOUT and self.span else ms

    def stage_bound(self, stage) -> float | None:
        """The most a saving can take from a stage per step, in the basis' terms: its unprofiled median where the run
        left one, else its time in the profiled step; None for a stage no row holds (nothing to bound by)."""
        u = (self.unprofiled().get("stage_ms") or {}).get(stage)
        mine = self.stage_time(stage)
        if u and stage not in self.partial:
            return max(u, mine * self.scale(stage))
        return mine if mine > 0 else None

    def basis(self) -> dict:
        """{basis, step_ms, words}: the real step a saving is a share of (BASES, best first)."""
        if self._basis is None:
            self._basis = self._find_basis()
        return self._basis

    def _find_basis(self) -> dict:
        u = self.unprofiled()
        if u.get("step_ms"):
            name = "watched_steps" if u.get("source") == WATCH else "unprofiled_steps"
            steps = u.get("steps") or []
            return {
                "basis": name,
                "step_ms": float(u["step_ms"]),
                "words": f"{BASES[name]} {steps} (median step {u['step_ms']:.1f} ms; the profiled step {self.step_ms:.1f} "
                "ms of stages)",
            }
        staged = [k[1] for k in self.means if k[1] is not None]
        total = sum(self.stage_time(s) for s in staged)
        if staged and not (self.partial & set(staged)) and total > 0:
            name = "profiled_step_and_samples" if self.stage_time(ROLLOUT) > self.stage_ms(ROLLOUT) else "profiled_step"
            return {
                "basis": name,
                "step_ms": total,
                "words": f"{BASES[name]} ({total:.1f} ms; the profiler's own cost included)",
            }
        window = self.step_ms or sum(v["wall_ms"] for v in self.means.values())
        return {"basis": "window", "step_ms": window, "words": f"{BASES['window']} (the window: {window:.1f} ms)"}

    def step_basis(self) -> float:
        return self.basis()["step_ms"]

    def basis_words(self) -> str:
        b = self.basis()
        if b["basis"] in ("unprofiled_steps", "watched_steps"):
            return "scaled stage by stage to " + b["words"]
        return "times of " + b["words"]

    def stage_mean(self, stage, bucket: str) -> float:
        return sum(v[bucket] for k, v in self.means.items() if k[1] == stage)

    def conf(self, dotted: str, default=None):
        node = self.cfg
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return default if node is None else node

    def micro_stages(self) -> list[str]:
        """The stages whose micro-batches say what they hold."""
        return sorted({stage for (_, stage), units in self.micro.items() if any(u.get("tokens") for u in units)})

    def units(self, stage) -> list[dict]:
        return [u for (_, s), us in self.micro.items() if s == stage for u in us if u.get("tokens")]


def dialect_of(doc: dict) -> str:
    """The framework whose first levers a finding's prediction is made for: the run's own (rlprof's trainer
    leaves trainer_config.json), MindSpeed-RL for Ascend collections, else verl."""
    framework = (doc.get("run_config") or {}).get("framework")
    if framework in DIALECTS:
        return framework
    if any(i.get("kind") == "ascend" for i in doc.get("inputs", [])):
        return "mindspeed"
    return "verl"


def response_lengths(doc: dict) -> dict[tuple, list[int]]:
    """(step, rank) -> the response length of every row generated in that step, sorted, from the decode steps'
    active rows (a row of length L is active in decode steps 0..L-1). A new generation pass starts where the
    active rows rise or the rows change."""
    per: dict[tuple, list[dict]] = defaultdict(list)
    for r in doc["rows"]:
        if (
            r.get("unit") == "decode_step"
            and r.get("stage") == "rollout_generate"
            and r.get("active") is not None
            and r.get("seqs")
        ):
            per[(r.get("step"), r.get("rank"))].append(r)
    out = {}
    for key, units in per.items():
        units.sort(key=lambda u: (u.get("file") or "", u.get("start_us") or 0.0, u.get("index") or 0))
        lengths: list[int] = []
        run: list[int] = []
        seqs = None
        for u in units:
            if run and (u["active"] > run[-1] or u["seqs"] != seqs):
                lengths += _lengths_of(run, seqs)
                run = []
            run.append(u["active"])
            seqs = u["seqs"]
        lengths += _lengths_of(run, seqs)
        out[key] = sorted(lengths)
    return out


WATCH = "the watch's timeline"


def watched(doc: dict) -> dict:
    """The watch's steps as the run's unprofiled ones: the median over its judged steps (not profiled, captured,
    warming up or busy) of the job's step and stage times, in ms; {} where the run kept no timeline."""
    tl = doc.get("timeline") or {}
    per = tl.get("per_step") or {}
    if "step" not in per:
        return {}
    left_out = set(tl.get("profiled_steps", [])) | set(tl.get("captured_steps", [])) | set(tl.get("warmup_steps", []))
    quiet = left_out | set(tl.get("busy_steps", []))
    steps = tl.get("steps", [])
    keep = [i for i, s in enumerate(steps) if s not in quiet] or [i for i, s in enumerate(steps) if s not in left_out]

    def median(name):
        values = [per[name]["max"][i] for i in keep if per[name]["max"][i] is not None]
        return statistics.median(values) * 1e3 if values else None

    step = median("step")
    if step is None:
        return {}
    stages = {name: median(name) for name in per if name != "step"}
    return {
        "source": WATCH,
        "steps": [steps[i] for i in keep],
        "step_ms": step,
        "stage_ms": {k: v for k, v in stages.items() if v},
    }


def partial_stages(doc: dict) -> set:
    """Stages whose every row was made from its units (a window holding some of the stage's decode steps or
    micro-batches, not the stage whole)."""
    whole: dict = {}
    for r in doc["rows"]:
        if r.get("unit") is None and r.get("stage") is not None:
            whole[r["stage"]] = whole.get(r["stage"], False) or not r.get("units_only")
    return {s for s, w in whole.items() if not w}


def rollout_span(doc: dict) -> float | None:
    """The rollout's time per step from its samples (first start to last end of each generation pass, summed over a
    step's passes; mean over steps), where the host recorded them."""
    spans = [s["span_ms"] for s in doc.get("sample_steps") or [] if s.get("span_ms")]
    return sum(spans) / len(spans) if spans else None


def _lengths_of(active: list[int], seqs) -> list[int]:
    out = []
    for k, a in enumerate(active):
        after = active[k + 1] if k + 1 < len(active) else 0
        out += [k + 1] * max(0, a - after)
    return out


def prompt_width(ctx: PredictionContext, key: tuple) -> float | None:
    """Mean prompt tokens of a row in (step, rank): a log-prob pass's real tokens less the response tokens."""
    lengths = ctx.lengths.get(key)
    if not lengths:
        return None
    for stage in ("actor_compute_log_prob", "ref_compute_log_prob"):
        units = [
            u
            for u in ctx.units(stage)
            if (u.get("step"), u.get("rank")) == key and u.get("real_tokens") is not None and u.get("seqs")
        ]
        if units and sum(u["seqs"] for u in units) == len(lengths):
            return max(0.0, (sum(u["real_tokens"] for u in units) - sum(lengths)) / len(lengths))
    return None


def rows_of(ctx: PredictionContext) -> tuple[list[int], float] | None:
    """The lengths and prompt width of one profiled (step, rank) that has both (the first in order)."""
    for key in sorted(ctx.lengths, key=lambda k: (str(k[0]), str(k[1]))):
        p = prompt_width(ctx, key)
        if p is not None:
            return ctx.lengths[key], p
    return None


class Cost:
    """A stage's micro-batch time: fixed + per_token x tokens, from the fixed_cost fit where it was measured,
    else all of it per token (fitted = False)."""

    def __init__(self, ctx: PredictionContext, stage: str):
        units = ctx.units(stage)
        self.units = units
        self.passes = _passes(units) if units else 1
        m = ctx.measures.get(("fixed_cost", stage))
        tokens = sum(u["tokens"] for u in units)
        wall = sum(u["wall_ms"] for u in units)
        self.fitted = bool(m and m.get("status") == "measured" and m.get("fixed_ms") is not None)
        if self.fitted:
            self.fixed, self.per_token = m["fixed_ms"], m["per_token_us"] / 1e3
        else:
            self.fixed, self.per_token = 0.0, (wall / tokens if tokens else 0.0)
        self.count = len(units) / self.passes  # micro-batches per pass
        self.rows = sum(u.get("seqs") or 0 for u in units) / self.passes  # rows computed per pass (x epochs)
        mini = [u for (_, s), us in ctx.mini.items() if s == stage for u in us]
        self.minis = (len(mini) / _passes(mini)) if mini else 1.0  # optimizer steps x epochs per pass
        self.has_minis = bool(mini)  # the update: a micro-batch size must divide the mini-batch
        self.tokens = tokens / self.passes
        self.seqs_now = (self.rows / self.count) if self.count else 0.0

    def time(self, groups: float, tokens: float) -> float:
        return self.fixed * groups + self.per_token * tokens

    def now(self) -> float:
        return self.time(self.count, self.tokens)

    def words(self) -> str:
        if self.fitted:
            return (
                f"{self.fixed:.2f} ms fixed + {self.per_token * 1e3:.1f} us per token computed per micro-batch "
                "(the fixed_cost fit)"
            )
        return (
            "all of a micro-batch's time taken to grow with its tokens (no fixed part could be fitted: "
            f"{self.per_token * 1e3:.1f} us per token)"
        )


def expected_max(lengths: list[int], m: int) -> float:
    """E[the longest of m rows drawn at random, without replacement, from `lengths` (sorted)]."""
    n = len(lengths)
    m = min(m, n)
    if m <= 0:
        return 0.0
    out, prev = 0.0, 0.0
    below = 0
    for value in sorted(set(lengths)):
        below += lengths.count(value)
        p = 1.0
        for i in range(m):  # P(all m drawn rows are <= value)
            p *= max(0, below - i) / (n - i)
        out += value * (p - prev)
        prev = p
    return out


def fixed_groups(lengths: list[int], width: float, rows: int, m: int) -> tuple[int, float]:
    """(micro-batches, tokens computed) for `rows` rows split in groups of m in random order of length, each
    padded to its longest row (width: the prompt's tokens)."""
    groups, tokens = 0, 0.0
    left = rows
    while left > 0:
        size = min(m, left)
        groups += 1
        tokens += size * (width + expected_max(lengths, size))
        left -= size
    return groups, tokens


def dynamic_groups(lengths: list[int], width: float, budget: float) -> tuple[int, float]:
    """(micro-batches, tokens computed) of rlprof's trainer's token-budget packing (trainer/actor.py
    plan_micro_batches): rows sorted by length, a group grows while rows x its longest row stays in the budget."""
    w = [width + L for L in sorted(lengths)]
    groups, tokens, start = 0, 0.0, 0
    for i in range(1, len(w) + 1):
        if i == len(w) or (i - start + 1) * w[i] > budget:
            groups += 1
            tokens += (i - start) * w[i - 1]
            start = i
    return groups, tokens


def stratified(lengths: list[int], rows: int) -> list[int]:
    """`rows` of the sorted lengths spread evenly: what a random mini-batch holds on average."""
    n = len(lengths)
    return [lengths[min(n - 1, int((j + 0.5) * n / rows))] for j in range(rows)] if rows < n else list(lengths)
