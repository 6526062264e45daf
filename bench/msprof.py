"""msprof-analyze 26.2.0 in its own venv (bench/.venv-msprof), the reference rlprof's Ascend numbers are held to.

`ensure_msprof()` makes the venv on first use (pip install msprof-analyze==26.2.0 openpyxl); `overall(base, new)`
runs `msprof-analyze compare -d NEW -bp BASE` and returns the OverallMetrics sheet of its xlsx for both sides:
Computing Time, Uncovered Communication Time, Free Time and E2E Time in ms.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv-msprof"
VERSION = "26.2.0"
METRICS = ("Computing Time", "Uncovered Communication Time", "Free Time", "E2E Time")

_READ_SHEET = """
import glob, json, sys, openpyxl
book = openpyxl.load_workbook(glob.glob(sys.argv[1] + '/performance_comparison_result_*.xlsx')[0], read_only=True)
rows = {r[0]: r for r in book['OverallMetrics'].iter_rows(values_only=True) if r and r[0] in %r}
print(json.dumps({'base': {k: r[1] for k, r in rows.items()}, 'new': {k: r[4] for k, r in rows.items()}}))
""" % (METRICS,)


class Unavailable(RuntimeError):
    """msprof-analyze could not be installed here (no registry, no wheel for this Python)."""


def ensure_msprof() -> Path:
    exe = VENV / "bin" / "msprof-analyze"
    if exe.exists() and (VENV / "bin" / "python").exists():
        return exe
    try:
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, capture_output=True)
        subprocess.run(
            [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", f"msprof-analyze=={VERSION}", "openpyxl"],
            check=True,
            capture_output=True,
            timeout=900,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        raise Unavailable(
            f"msprof-analyze {VERSION} could not be installed in {VENV}: "
            f"{detail.decode(errors='replace').strip().splitlines()[-1:] or exc}"
        ) from None
    return exe


def overall(base: Path, new: Path) -> dict[str, dict[str, float]]:
    """{'base': {metric: ms}, 'new': {metric: ms}} from msprof-analyze's own comparison of two db files."""
    exe = ensure_msprof()
    with tempfile.TemporaryDirectory(prefix="msprof-") as out:
        proc = subprocess.run(
            [str(exe), "compare", "-d", str(new), "-bp", str(base), "-o", out],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"msprof-analyze compare failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        sheet = subprocess.run(
            [str(VENV / "bin" / "python"), "-c", _READ_SHEET, out], capture_output=True, text=True, check=True
        )
    return json.loads(sheet.stdout)
