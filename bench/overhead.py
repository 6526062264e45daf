"""Cost of rlprof's boundaries when nothing is selected, next to verl's disabled DistProfiler.annotate.

Prints one JSON object measured in one run. verl is taken from this interpreter, else from the side
venv that bench/setup_verl.sh makes (the script re-runs itself there); null where neither has it.
Timings: best of 7 repeats of N calls each, minus the empty-loop cost, in nanoseconds per call.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import timeit
from pathlib import Path

HERE = Path(__file__).resolve().parent
VERL_PYTHON = HERE / ".venv-verl" / "bin" / "python"
N = 200_000


def per_call_ns(stmt: str, env: dict, number: int = N) -> float:
    empty = min(timeit.repeat("pass", number=number, repeat=7))
    best = min(timeit.repeat(stmt, globals=env, number=number, repeat=7))
    return max(0.0, (best - empty) / number * 1e9)


def verl_annotate_ns() -> tuple[float | None, float | None, str | None]:
    """(decorated call cost minus a plain method call, plain method call, verl version)."""
    try:
        import verl
        from verl.utils.profiler import DistProfiler
    except Exception:
        return None, None, None

    class Worker:
        def __init__(self):
            self.profiler = DistProfiler(rank=0)  # verl's default: profiling disabled

        @DistProfiler.annotate(color="red", role="actor_update")
        def update(self):
            return None

        def plain(self):
            return None

    w = Worker()
    plain = per_call_ns("w.plain()", {"w": w})
    return per_call_ns("w.update()", {"w": w}) - plain, plain, getattr(verl, "__version__", None)


def main() -> int:
    try:
        import verl  # noqa: F401
    except Exception:
        if VERL_PYTHON.exists() and os.environ.get("RLPROF_BENCH_REEXEC") != "1":
            os.environ["RLPROF_BENCH_REEXEC"] = "1"
            os.execv(str(VERL_PYTHON), [str(VERL_PYTHON), __file__, *sys.argv[1:]])

    import rlprof
    from rlprof.collect import Profiler
    from rlprof.config import load_plan

    tmp = tempfile.mkdtemp(prefix="rlprof-overhead-")
    base = [f"global_profiler.save_path={tmp}", "actor_rollout_ref.actor.profiler.enable=true"]
    # A plan that selects step 1000 only: every boundary below is on an unselected step.
    idle = Profiler(
        load_plan(None, base + ["global_profiler.tool=torch", "global_profiler.steps=[1000]"]), run_id="idle"
    )
    markers = Profiler(
        load_plan(None, base + ["global_profiler.tool=markers", "global_profiler.steps=[1]"]), run_id="markers"
    )

    def bare():
        return None

    class Worker:
        @rlprof.stage("actor_update", role="actor")
        def update(self):
            return None

        def plain(self):
            return None

    worker = Worker()
    results = {"bare_call_ns": per_call_ns("bare()", {"bare": bare})}
    with idle.step(1):
        results["unselected_stage_ns"] = per_call_ns("with p.stage('actor_update'):\n    pass", {"p": idle})
        results["unselected_tick_ns"] = per_call_ns("p.tick('micro_batch')", {"p": idle})
        results["unselected_mark_ns"] = per_call_ns("with p.mark('x'):\n    pass", {"p": idle})
        plain = per_call_ns("w.plain()", {"w": worker})
        results["unselected_decorator_ns"] = per_call_ns("w.update()", {"w": worker}) - plain
    idle.close()
    with markers.step(1):
        results["markers_stage_ns"] = per_call_ns(
            "with p.stage('actor_update'):\n    pass", {"p": markers}, number=20_000
        )
    markers.close(wait_analysis=False)
    verl_ns, verl_plain, verl_version = verl_annotate_ns()
    results["verl_disabled_annotate_ns"] = verl_ns
    results["verl_version"] = verl_version
    if verl_ns:
        results["verl_over_rlprof_stage"] = round(verl_ns / max(results["unselected_stage_ns"], 1e-9), 1)
        results["verl_over_rlprof_decorator"] = round(verl_ns / max(results["unselected_decorator_ns"], 1e-9), 1)
    results["python"] = sys.version.split()[0]
    results = {k: round(v, 1) if isinstance(v, float) else v for k, v in results.items()}
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
