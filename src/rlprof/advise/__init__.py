"""`rlprof advise`, one module per mode: the next profiling config for a budget (next_config.py), a run made with
that advice held against its prediction (check.py), and the next training config that acts on the first cause
(fix.py); shared.py holds what they share."""

from .check import check
from .fix import fix_for_run, fix_from, fix_text, overrides_line
from .next_config import advise, advise_from, advise_from_metrics, parse_size
from .shared import DIALECTS, AdviseError, run_windows

__all__ = [
    "DIALECTS",
    "AdviseError",
    "advise",
    "advise_from",
    "advise_from_metrics",
    "check",
    "fix_for_run",
    "fix_from",
    "fix_text",
    "overrides_line",
    "parse_size",
    "run_windows",
]
