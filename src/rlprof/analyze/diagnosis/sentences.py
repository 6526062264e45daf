"""The rendering step of the analysis: a computed finding (analyze/diagnosis/finding.py: numbers and evidence) and its
predicted saving become the document's finding, with its sentence made from its kind's template in the registry
(analyze/diagnosis/causes.py), the cause's title, its levers and the saving said in words. Nothing here computes a number
the findings rank by; the calculations make no text."""

from __future__ import annotations

from ...frameworks.levers import levers
from .causes import CAUSES, template, where
from .finding import Finding
from .prediction import BASES


def sentence(f: Finding) -> str:
    """The finding's sentence, from its template and fields (its evidence, what only the sentence uses, where)."""
    fields = {
        **f.evidence,
        **f.said,
        "role": f.role,
        "stage": f.stage,
        "rank": f.rank,
        "impact_ms": f.impact_ms,
        "where": where(f.role, f.stage),
    }
    form = template(f.kind)
    text = form(fields) if callable(form) else form.format(**fields)
    for symptom in f.evidence.get("symptoms", []) if f.kind in CAUSES else []:  # one root, its symptoms inside it
        text += "; with it, " + sentence(
            Finding(symptom["kind"], symptom["impact_ms"], symptom["evidence"], symptom["role"], symptom["stage"])
        )
    others = f.evidence.get("stages", [])[1:] if f.kind in CAUSES else []
    if others:  # a cause found in several stages (findings.one_per_cause): the first stage's sentence, then the rest
        text += "; also in " + ", ".join(
            where(s["role"], s["stage"])
            + (f" rank {s['rank']}" if f.kind == "slow_rank" or s.get("file") else "")
            + f" ({_share(s)}{s['impact_ms']:.1f} ms per step)"
            for s in others
        )
    return text


def _share(part: dict) -> str:
    value = part.get("value", part.get("share"))
    return f"{value:.0%}, " if isinstance(value, (int, float)) else ""


def render(f: Finding, saving: dict | None = None) -> dict:
    """The document's finding: kind, impact, text, evidence, where; the cause's title and levers (none for a
    descriptive finding); and, for a cause whose saving was predicted or said unpredictable, the saving."""
    out = {
        "kind": f.kind,
        "impact_ms": float(f.impact_ms),
        "text": sentence(f),
        "evidence": f.evidence,
        "role": f.role,
        "stage": f.stage,
        "rank": f.rank,
    }
    cause = CAUSES.get(f.kind)
    found = _levers(cause.name, [s["stage"] for s in f.evidence.get("stages", [])] or [f.stage]) if cause else {}
    out.update(
        cause=cause.title if cause else None,
        levers=found,
        actionable=bool(found),
        levers_text="; ".join(f"{d}: " + ", ".join(lv["text"] for lv in lvs) for d, lvs in found.items()),
    )
    if saving is not None:
        out.update(
            saving=saving,
            saving_ms=saving["saving_ms"],
            saving_share=saving["saving_share"],
            saving_text=saving_text(saving),
        )
    return out


def _levers(cause: str, stages: list) -> dict[str, list[dict]]:
    """The levers of a cause found in these stages, per dialect: the first stage's first, each lever once."""
    out: dict[str, list[dict]] = {}
    for stage in stages:
        for dialect, found in levers(cause, stage).items():
            mine = out.setdefault(dialect, [])
            mine += [lv for lv in found if lv not in mine]
    return out


def saving_text(s: dict) -> str:
    """A predicted saving in one sentence (or why it is not predictable)."""
    if s["status"] != "predicted":
        return f"saving not predictable from this data: {s['why']}"
    return f"predicted saving {s['saving_ms']:.1f} ms per step{share_words(s)}: {s['assumption']}"


def share_words(s: dict) -> str:
    """A saving's share of the step with the step it is a share of (its basis), in a few words."""
    basis = s.get("basis")
    if s.get("saving_share") is not None:
        return f" ({s['saving_share']:.0%} of the {s['step_ms']:.1f} ms step: {BASES.get(basis, 'the step')})"
    if basis == "window":
        return " (no share given: only a window of some units is known, not the step)"
    return ""


# ---- a captured window's cause (analyze/diagnosis/capture_cause.py) -----------------------------------------------------------
def timeline_slow_rank_sentence(slow, healthy, stage: str, excess_ms: float, extra_wait_ms: float) -> str:
    """A straggler's slow rank where findings' own rule does not hold and the timeline's straggler rule did."""
    return (
        f"slow rank: rank {slow} spends {excess_ms:.1f} ms more than rank {healthy} in {stage} (the timeline's "
        f"straggler rule), and rank {healthy} waits {extra_wait_ms:.1f} ms more in collectives"
    )


def verdict_sentence(verdict: dict, contrasted: bool) -> str:
    """What made a captured window slow, in words: its causes (new, or grown from the normal window), those the
    normal window has too, or that rlprof names none."""
    causes, in_both = verdict["causes"], verdict["in_both"]
    if not contrasted:
        return (
            "no normal window to contrast with; in the captured window: " + "; ".join(c["title"] for c in causes)
            if causes
            else "no cause rlprof names in the captured window"
        )
    parts = []
    if causes:
        parts.append(
            "; ".join(
                f"{c['title']} ({c['cause']}, {_where_captured(c)}, "
                + (
                    "not in the normal window"
                    if c["how"] == "new"
                    else f"{c['normal_impact_ms']:.1f} -> {c['impact_ms']:.1f} ms"
                )
                + ")"
                for c in causes
            )
        )
    if in_both:
        parts.append(
            "in the normal window too, so not why this step was slow: "
            + "; ".join(f"{c['title']} ({c['cause']}, {_where_captured(c)})" for c in in_both)
        )
    if not causes and not in_both:
        parts.append(
            "no cause rlprof names in the captured window: what grew is above, its cause is not one rlprof knows"
        )
    elif not causes:
        parts.insert(0, "no cause of this slow step: every cause found in it is the run's own")
    return "; ".join(parts)


def _where_captured(c: dict) -> str:
    where = f"{c['role']}/{c['stage']}" if c.get("stage") else "the window"
    return where + (f" rank {c['rank']}" if c.get("rank") is not None else "")


# ---- the rollout's samples (analyze/over_time/rollout_why.py) ----------------------------------------------------------
WHY_WORDS = {
    "response_tokens": "its workload explains it: the longest sample generated {longest_tokens:.0f} tokens against "
    "{baseline_longest_tokens:.0f}",
    "tool_time": "its workload explains it: the slowest sample waited {tool_ms:.1f} ms on tools against "
    "{baseline_tool_ms:.1f}",
    "time_per_token": "not its workload: each token took {ms_per_token:.2f} ms against {baseline_ms_per_token:.2f} "
    "(the longest sample {longest_tokens:.0f} tokens against {baseline_longest_tokens:.0f})",
}


def why_sentence(why: dict) -> str:
    """Whether the samples' workload explains a slow rollout, in words."""
    if why.get("explained_by") is None:
        return "the samples do not say whether their workload explains it"
    ratio = f"the rollout took {why['seconds_ratio']:.2f}x its baseline" if why.get("seconds_ratio") else ""
    if ratio and why.get("wait_ms"):  # the host's share, taken out before the ratio
        ratio += f" less its waits for a core ({why['wait_ms']:.0f} ms against {why['baseline_wait_ms']:.0f})"
    ratio += "; " if ratio else ""
    text = ratio + WHY_WORDS[why["explained_by"]].format(**why)
    if why.get("slowest"):
        text += " (slowest: " + _slowest_words(why["slowest"]) + ")"
    if why.get("cause"):
        firsts = "; ".join(f"{d}: {lvs[0]['text']}" for d, lvs in why["levers"].items())
        text += f"; cause: {CAUSES[why['cause']].title}" + (f"; lever ({firsts})" if firsts else "")
    return text


def _slowest_words(slowest: list[dict]) -> str:
    return ", ".join(
        f"sample {s['sample']}"
        + (f" of rank {s['rank']}" if s.get("rank") is not None else "")
        + (f" of replica {s['replica']}" if s.get("replica") is not None else "")
        + (f" of worker {s['worker']}" if s.get("worker") is not None else "")
        + f" ({s['duration_ms']:.1f} ms"
        + (f", {s['response_tokens']} tokens" if s.get("response_tokens") is not None else "")
        + (f", {s['tool_ms']:.1f} ms in tools" if s.get("tool_ms") is not None else "")
        + ")"
        for s in slowest
    )


def samples_sentence(said: dict, why: bool = True) -> str:
    """One step's samples as a capture says them: the slowest named, where the slowest ran alone, and (`why`) its
    rollout against the baseline, in words; the step named."""
    text = f"the slowest of step {said['step']}'s {said['samples']} samples: {_slowest_words(said['slowest'])}"
    alone = said.get("alone")
    if alone:
        a, b = alone["decode_steps"]
        text += (
            f"; decode steps {a}-{b} ran for sample {alone['sample']} alone ({alone['response_tokens']} tokens, the next "
            f"longest {alone['next_longest_tokens']})"
        )
        if alone["kept"]:
            text += f", {alone['kept'][0]}-{alone['kept'][1]} of them in the captured window"
        elif alone["window"]:
            text += f", none of them in the captured window ({alone['window'][0]}-{alone['window'][1]})"
    if why and said.get("why"):
        text += "; " + why_sentence(said["why"])
    return text


def held_off_words(trigger: dict) -> str:
    """A straggler the trigger found held off its cores (collect/trigger.py's `cause: held_off`), in words; "" else."""
    ev = trigger.get("evidence") or {}
    if trigger.get("cause") != "held_off" or ev.get("extra_held_ms") is None:
        return ""
    return (
        f"rank {ev['rank']} was held off its cores {ev['extra_held_ms']:.0f} ms longer than the other ranks there "
        "(stopped, frozen or throttled from outside the job: neither running nor waiting for a core), and they "
        "waited for it"
    )
