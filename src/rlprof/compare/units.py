"""Windows holding different numbers of units (decode steps, micro-batches, mini-batches), compared per unit.

A window scheduled by unit (`schedule: {unit: decode_step, active: 10}`) holds a sample of its stage's units: two
such windows holding 10 and 20 decode steps differ 2x in their totals whatever the speed, since their totals are the
profiling schedule's, not the run's. Where either side's window is such a sample (its stage row assembled from its
units, `units_only`) and the counts differ, the window is compared per unit: the mean of its unit rows, their spread
(std, min-max) and the ratio of the means. Whole stages holding different counts (another max_new_tokens or
micro_batch_size) each did their run's whole work: compared as they are, with the counts and per-unit times beside.
Where the counts are equal, or a side marked no units, the windows compare as they are and nothing is said.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean, stdev

from ..vocab import window_label

UNIT_ORDER = ("decode_step", "micro_batch", "mini_batch")  # finest first: the unit a window is counted in


@dataclass
class WindowUnits:
    """One matched window's units: the record compare.json's `units` table holds, and each side's unit rows."""

    record: dict
    base: list[dict]
    new: list[dict]

    @property
    def per_unit(self) -> bool:
        return self.record["basis"] == "per_unit"

    @property
    def unit(self) -> str:
        return self.record["unit"]


def plural(unit: str) -> str:
    return unit + ("es" if unit.endswith("batch") else "s")


def _count(units: int, windows: int) -> int | float:
    """Units per window (a mean where the matched windows are several ranks or steps)."""
    c = units / windows
    return int(c) if c.is_integer() else round(c, 3)


def _spread(units: list[dict]) -> dict:
    walls = [u["wall_ms"] for u in units]
    return {
        "unit_ms": fmean(walls),
        "unit_std_ms": stdev(walls) if len(walls) > 1 else 0.0,  # one unit has no spread
        "unit_min_ms": min(walls),
        "unit_max_ms": max(walls),
    }


def within_spread(b: dict, n: dict, units_b: int, units_n: int) -> bool | None:
    """Whether the per-unit means differ by no more than the units' spread: their ±1 std bands overlap.
    None where neither side has two units (no spread to judge by)."""
    if units_b < 2 and units_n < 2:
        return None
    return abs(n["unit_ms"] - b["unit_ms"]) <= b["unit_std_ms"] + n["unit_std_ms"]


def _ratio(b: float, n: float) -> float | None:
    return n / b if b else None


def _kind(base_units: list[dict], new_units: list[dict]) -> str | None:
    """The finest unit both sides marked in this window."""
    common = {u["unit"] for u in base_units} & {u["unit"] for u in new_units}
    return next((u for u in UNIT_ORDER if u in common), min(common) if common else None)


def _note(key: tuple, rec: dict) -> str | None:
    cb, cn, unit = rec["baseline_units"], rec["new_units"], rec["unit"]
    if cb == cn:
        return None
    label, units = window_label(*key), plural(unit)
    ratio = rec["unit_ratio"]
    ratio_text = f"{ratio:.2f}x" if ratio is not None else "no ratio (a zero baseline)"
    per = (
        f"{rec['baseline_unit_ms']:.3f} ±{rec['baseline_unit_std_ms']:.3f} -> "
        f"{rec['new_unit_ms']:.3f} ±{rec['new_unit_std_ms']:.3f} ms"
    )
    if rec["basis"] == "window":
        return (
            f"{label}: whole stages holding {cb:g} vs {cn:g} {units}, compared as they are (each did its run's "
            f"whole work); per {unit} {per} ({ratio_text})"
        )
    spread = {True: "within the units' spread", False: "beyond the units' spread", None: "one unit a side: no spread"}
    window = rec["window_ratio"]
    return (
        f"{label}: {cb:g} vs {cn:g} {units} in the windows, compared per {unit}: {per} ({ratio_text}, "
        f"{spread[rec['within_spread']]}); the windows' totals ({rec['baseline_window_ms']:.3f} -> "
        f"{rec['new_window_ms']:.3f} ms{f', {window:.2f}x' if window is not None else ''}) count different numbers "
        f"of {units}"
    )


def compare_units(b: dict, n: dict, units_b: dict, units_n: dict) -> dict[tuple, WindowUnits]:
    """Per matched window whose sides both marked units of one kind: the counts per window, each side's per-unit
    time and spread, and the basis it is compared on (`per_unit` where the counts differ and a side is a sample).
    b, n: each side's stage rows by window key; units_b, units_n: its unit rows by the same key."""
    out = {}
    for key in [k for k in n if k in b]:
        unit = _kind(units_b.get(key, []), units_n.get(key, []))
        if unit is None:
            continue
        ub = [u for u in units_b[key] if u["unit"] == unit]
        un = [u for u in units_n[key] if u["unit"] == unit]
        cb, cn = _count(len(ub), len(b[key])), _count(len(un), len(n[key]))
        sample = any(r.get("units_only") for r in (*b[key], *n[key]))
        sb, sn = _spread(ub), _spread(un)
        bw, nw = fmean(r["wall_ms"] for r in b[key]), fmean(r["wall_ms"] for r in n[key])
        rec = {
            "step": key[0],
            "role": key[1],
            "stage": key[2],
            "unit": unit,
            "basis": "per_unit" if cb != cn and sample else "window",
            "baseline_units": cb,
            "new_units": cn,
            **{f"baseline_{k}": v for k, v in sb.items()},
            **{f"new_{k}": v for k, v in sn.items()},
            "unit_ratio": _ratio(sb["unit_ms"], sn["unit_ms"]),
            "within_spread": within_spread(sb, sn, len(ub), len(un)),
            "baseline_window_ms": bw,
            "new_window_ms": nw,
            "window_ratio": _ratio(bw, nw),
        }
        rec["note"] = _note(key, rec)
        out[key] = WindowUnits(rec, ub, un)
    return out


def per_unit_divisors(matched: set, units: dict[tuple, WindowUnits]) -> dict[tuple, tuple[str, int, int]]:
    """(role, stage) -> (unit, baseline units, new units) where operators are compared per unit: some matched window
    of it is compared per unit and every one of them has that unit on both sides."""
    out = {}
    for rs in {k[1:] for k in matched}:
        windows = [units.get(k) for k in matched if k[1:] == rs]
        if not any(w is not None and w.per_unit for w in windows):
            continue
        unit = next(w.unit for w in windows if w is not None and w.per_unit)
        if all(w is not None and w.unit == unit for w in windows):
            out[rs] = (unit, sum(len(w.base) for w in windows), sum(len(w.new) for w in windows))
    return out
