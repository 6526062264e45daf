"""`rlprof compare`: what got slower between two runs, in which stage, and why.

Both sides become analysis documents (traces are read once, streamed); everything here is matching
of aggregates: windows by (step, role, stage), operators by name (or name + input shape), collectives
by name, memory peaks by window. No operator-sequence alignment, so the cost is linear in the traces.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from ..analyze.window.breakdown import BUCKETS, order_key
from ..analyze.pipeline import load_analysis
from ..analyze.inputs.find import is_analysis_file
from ..analyze.inputs.readers.ascend import is_ascend
from ..errors import RLProfError
from ..vocab import window_label
from .units import WindowUnits, compare_units, per_unit_divisors

TABLES = ("stages", "units", "ops", "collectives", "memory")  # the compare document's tables, one CSV each

SCHEMA_VERSION = 2  # 2: windows holding different numbers of units compared per unit (units.py)
INPUTS = "a run directory, a manifest.jsonl, a trace file, an Ascend profiler directory or an analysis.json"


class CompareError(RLProfError):
    pass


def input_kind(path: Path, doc: dict | None = None) -> str:
    """'run' (many windows: a directory, manifest, or a run's analysis.json) or 'trace' (one file)."""
    if doc is not None:
        staged = any(r.get("stage") for r in doc["rows"])
        return "run" if len(doc["inputs"]) > 1 or staged else "trace"
    if path.is_file() and not path.name.endswith(".jsonl"):
        return "trace"
    return "trace" if is_ascend(path) else "run"


def load_side(path: str, flag: str, *, by_shape: bool, workers: int | None, use_ray: bool = False) -> tuple[str, dict]:
    p = Path(path)
    if not p.exists() and not use_ray:  # with --ray the run may live on other nodes only
        raise CompareError(f"{flag} {path} does not exist; allowed: {INPUTS}")
    if is_analysis_file(p):
        if by_shape:
            raise CompareError(
                f"{flag} {path} is an analysis.json, which keeps no input shapes; "
                "allowed with --by-shape: traces or a run directory"
            )
        doc = load_analysis(p)
        return input_kind(p, doc), doc
    doc = load_analysis(p, top=None, by_shape=by_shape, workers=workers, use_ray=use_ray)
    return input_kind(p, doc), doc  # by content: an Ascend directory of ranks and stages is a run


def load_sides(
    new_path: str, base_path: str, names: tuple[str, str] = ("-d", "-bp"), **kw
) -> tuple[tuple[str, dict], tuple[str, dict]]:
    """Both sides; where both are traces or runs to read, their files share the cores in one schedule."""
    from ..analyze.pipeline import analyze_each

    sides = ((new_path, names[0]), (base_path, names[1]))
    if kw["use_ray"] or any(not Path(p).exists() or is_analysis_file(Path(p)) for p, _ in sides):
        return tuple(load_side(p, flag, **kw) for p, flag in sides)
    docs = analyze_each([new_path, base_path], top=None, by_shape=kw["by_shape"], workers=kw["workers"])
    return tuple((input_kind(Path(p), doc), doc) for (p, _), doc in zip(sides, docs))


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def _stage_rows(doc: dict) -> list[dict]:
    return [r for r in doc["rows"] if r.get("unit") is None]


def _unit_rows(doc: dict) -> list[dict]:
    return [r for r in doc["rows"] if r.get("unit") is not None]


def _by_key(rows: list[dict], key) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        out[key(r)].append(r)
    return out


def _step_key(r: dict) -> tuple:
    return (r.get("step"), r.get("role"), r.get("stage"))


def _stage_key(r: dict) -> tuple:
    return (None, r.get("role"), r.get("stage"))


def _label(k: tuple) -> str:
    return window_label(*k)


def match_windows(base: dict, new: dict) -> tuple[str, dict, dict, list[str]]:
    """Pick the finest common grouping: (step, role, stage), else (role, stage) averaged over steps."""
    warnings = []
    for mode, key in (("step", _step_key), ("stage", _stage_key)):
        b, n = _by_key(_stage_rows(base), key), _by_key(_stage_rows(new), key)
        if set(b) & set(n):
            if mode == "stage":
                warnings.append(
                    "the runs profiled different steps (baseline "
                    + _steps(base)
                    + ", new "
                    + _steps(new)
                    + "): stages are compared as their mean over steps"
                )
            return mode, b, n, warnings
    b, n = _by_key(_stage_rows(base), _step_key), _by_key(_stage_rows(new), _step_key)
    raise CompareError(
        "the two sides have no stage in common: baseline has "
        + (", ".join(sorted({_label(_stage_key(r)) for r in _stage_rows(base)})) or "nothing")
        + "; new has "
        + (", ".join(sorted({_label(_stage_key(r)) for r in _stage_rows(new)})) or "nothing")
        + "; allowed: runs profiled on at least one common role/stage"
    )


def _steps(doc: dict) -> str:
    return str(sorted({r["step"] for r in _stage_rows(doc) if r.get("step") is not None}, key=order_key))


def _ratio(b: float, n: float) -> float | None:
    return n / b if b else None


def compare_stages(b: dict, n: dict, units: dict[tuple, WindowUnits]) -> list[dict]:
    """Per matched window and bucket: the mean over ranks (and steps, when matched by stage). A window compared per
    unit (units.py) gives its units' means instead, its windows' own means beside them (`*_window_ms`)."""
    out = []
    for key in [k for k in n if k in b]:  # the new run's order (step, then time)
        step, role, stage = key
        wu = units.get(key)
        for bucket in BUCKETS:
            bv, nv = _mean(r[bucket] for r in b[key]), _mean(r[bucket] for r in n[key])
            rec = {
                "step": step,
                "role": role,
                "stage": stage,
                "bucket": bucket.removesuffix("_ms"),
                "basis": wu.record["basis"] if wu else "window",
                "unit": wu.unit if wu else None,
                "baseline_units": wu.record["baseline_units"] if wu else None,
                "new_units": wu.record["new_units"] if wu else None,
            }
            if wu is not None and wu.per_unit:
                rec.update(baseline_window_ms=bv, new_window_ms=nv, window_ratio=_ratio(bv, nv))
                bv, nv = _mean(u[bucket] for u in wu.base), _mean(u[bucket] for u in wu.new)
            rec.update(baseline_ms=bv, new_ms=nv, diff_ms=nv - bv, ratio=_ratio(bv, nv))
            out.append(rec)
    return out


def _windows(groups: dict, keys) -> dict[tuple, int]:
    """How many (step, rank) windows each (role, stage) averages over, on one side."""
    count: dict[tuple, int] = defaultdict(int)
    for key in keys:
        count[key[1:]] += len(groups[key])
    return count


def _totals(records: list[dict], matched: set, mode: str, fields, value) -> dict[tuple, list[float]]:
    out: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for rec in records:
        key = _step_key(rec) if mode == "step" else _stage_key(rec)
        if key not in matched:
            continue
        slot = out[(rec.get("role"), rec.get("stage")) + tuple(rec.get(f) for f in fields)]
        slot[0] += rec["count"]
        slot[1] += value(rec)
    return out


def _status(bc: float, nc: float, diff: float) -> str:
    if not bc:
        return "added"
    if not nc:
        return "removed"
    return "slower" if diff > 0 else "faster" if diff < 0 else "same"


def compare_records(
    base: list[dict],
    new: list[dict],
    matched: set,
    mode: str,
    windows: tuple[dict, dict],
    fields: tuple[str, ...],
    value,
    per: dict[tuple, str] | None = None,
) -> list[dict]:
    """Aggregates matched by (role, stage, *fields), per window, sorted by |difference|. `windows` holds each
    side's divisor per (role, stage): its windows, or its units where `per` names the unit (units.py)."""
    tb, tn = _totals(base, matched, mode, fields, value), _totals(new, matched, mode, fields, value)
    out = []
    for key in dict.fromkeys([*tb, *tn]):  # first-seen order, not a set's (which varies from run to run)
        (bc, bms), (nc, nms) = tb.get(key, (0.0, 0.0)), tn.get(key, (0.0, 0.0))
        wb, wn = windows[0].get(key[:2], 1) or 1, windows[1].get(key[:2], 1) or 1
        bms, nms, bc, nc = bms / wb, nms / wn, bc / wb, nc / wn
        diff = nms - bms
        out.append(
            {
                "role": key[0],
                "stage": key[1],
                **dict(zip(fields, key[2:])),
                "per": (per or {}).get(key[:2], "window"),
                "status": _status(bc, nc, diff),
                "baseline_count": round(bc, 3),
                "new_count": round(nc, 3),
                "baseline_ms": bms,
                "new_ms": nms,
                "diff_ms": diff,
                "ratio": _ratio(bms, nms),
            }
        )
    out.sort(key=lambda r: (-abs(r["diff_ms"]), r["name"], str(r["role"]), str(r["stage"])))
    return out


def _op_ms(rec: dict) -> float:
    return rec["self_ms"] if rec.get("kind") == "cpu_op" else rec["total_ms"]


def compare_memory(base: dict, new: dict) -> list[dict]:
    def peaks(doc):
        out: dict[tuple, float] = {}
        for m in doc.get("memory", []):
            if m.get("peak_bytes") is not None:
                key = (m.get("role"), m.get("stage"))
                out[key] = max(out.get(key, 0.0), m["peak_bytes"])
        return out

    pb, pn = peaks(base), peaks(new)
    rows = []
    for key in sorted(set(pb) | set(pn), key=str):
        b, n = pb.get(key), pn.get(key)
        rows.append(
            {
                "role": key[0],
                "stage": key[1],
                "baseline_peak_mb": b / 2**20 if b is not None else None,
                "new_peak_mb": n / 2**20 if n is not None else None,
                "diff_mb": (n - b) / 2**20 if b is not None and n is not None else None,
            }
        )
    return rows


def side_summary(doc: dict, path, kind: str, side: str) -> dict:
    """One side of a comparison: what it is and, where some of its input was damaged, which files and why (each
    file's own warning), so every output can say that this side's numbers are lower bounds."""
    damaged = []
    for i in doc["inputs"]:
        if not i.get("partial"):
            continue
        where = str(i.get("path", ""))
        why = [w for w in doc["warnings"] if where and w.startswith(where)] or [
            w for w in doc["warnings"] if where and Path(where).name in w
        ]
        damaged.append({"path": where, "why": why[0] if why else i.get("error") or "marked partial by its reader"})
    partial = bool(doc.get("partial")) or bool(damaged)
    note = None
    if partial:
        note = (
            f"{side} {path} is partial: {len(damaged) or 'some'} of its {len(doc['inputs'])} input(s) damaged or "
            "cut, so its numbers are lower bounds of the whole input's"
        )
    return {
        "path": str(path),
        "kind": kind,
        "inputs": len(doc["inputs"]),
        "partial": partial,
        "partial_note": note,
        "partial_inputs": damaged,
    }


def partial_lines(doc: dict) -> list[str]:
    """Per side, that it is partial and why: one line for the side, one per damaged input."""
    out = []
    for side in ("baseline", "new"):
        s = doc[side]
        if not s.get("partial"):
            continue
        out.append(s.get("partial_note") or f"{side} {s['path']} is partial")
        out += [f"  {side}: {d['why']}" for d in s.get("partial_inputs", [])]
    return out


def compare(
    new_path: str,
    base_path: str,
    *,
    by_shape: bool = False,
    workers: int | None = None,
    new_doc: dict | None = None,
    use_ray: bool = False,
    names: tuple[str, str] = ("-d", "-bp"),
) -> dict:
    """`new_doc`: NEW already analysed with all operators kept (the report passes its own, read once). `names`: how
    messages call the two sides (the flags, or NEW and BASELINE where the paths were given as arguments)."""
    if new_doc is not None:
        new_kind, new = input_kind(Path(new_path), new_doc if is_analysis_file(Path(new_path)) else None), new_doc
        base_kind, base = load_side(base_path, names[1], by_shape=by_shape, workers=workers, use_ray=use_ray)
    else:
        (new_kind, new), (base_kind, base) = load_sides(
            new_path, base_path, names, by_shape=by_shape, workers=workers, use_ray=use_ray
        )
    try:
        mode, b, n, warnings = match_windows(base, new)
    except CompareError:
        if new_kind != base_kind:  # the likelier mistake
            raise CompareError(
                f"{names[0]} {new_path} is a {new_kind} but {names[1]} {base_path} is a {base_kind}; allowed: two "
                "runs (directories, manifests or their analysis.json) or two traces"
            ) from None
        raise
    matched = set(b) & set(n)
    key = _step_key if mode == "step" else _stage_key
    units = compare_units(b, n, _by_key(_unit_rows(base), key), _by_key(_unit_rows(new), key))
    windows = (_windows(b, matched), _windows(n, matched))
    divisors = per_unit_divisors(matched, units)  # operators of a window compared per unit: per unit too
    for rs, (_, units_b, units_n) in divisors.items():
        windows[0][rs], windows[1][rs] = units_b, units_n
    per = {rs: unit for rs, (unit, _, _) in divisors.items()}
    shape = ("shape",) if by_shape else ()
    ops = compare_records(base["ops"], new["ops"], matched, mode, windows, ("kind", "name") + shape, _op_ms, per)
    colls = compare_records(
        base["collectives"], new["collectives"], matched, mode, windows, ("name",), lambda r: r["total_ms"], per
    )
    for doc, side, path in ((base, "baseline", base_path), (new, "new", new_path)):
        warnings += [f"{side}: {w}" for w in doc["warnings"]]
        if is_analysis_file(Path(path)):
            warnings.append(
                f"{side} is an analysis.json: only its top operators per window were kept there, "
                "so an operator below that cut can show as added/removed; pass the traces for all"
            )
    unmatched = [
        {"side": side, "step": k[0], "role": k[1], "stage": k[2]}
        for side, mine, other in (("baseline", b, n), ("new", n, b))
        for k in mine
        if k not in other
    ]
    return {
        "schema_version": SCHEMA_VERSION,
        "matched_by": "trace" if matched == {(None,) * 3} else mode,
        "by_shape": by_shape,
        "baseline": side_summary(base, base_path, base_kind, "baseline"),
        "new": side_summary(new, new_path, new_kind, "new"),
        "stages": compare_stages(b, n, units),
        "units": [units[k].record for k in n if k in units],
        "ops": ops,
        "collectives": colls,
        "memory": compare_memory(base, new),
        "unmatched": unmatched,
        "warnings": warnings,
    }
