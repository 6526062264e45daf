"""What the host sampler costs (collect/host_stacks.py), and the mechanisms it was chosen among, measured two ways:

- `trainer`: the reference trainer with every step profiled (a torch window over the whole step, as `rlprof train`
  profiles its step), the host sampler on for every other step and off for the steps between, in one process, so that
  each "on" step has its "off" neighbours on the same machine at the same moment (side by side, interleaved step by
  step); each round a new process, the parity of the "on" steps swapped from round to round. Per round: the median
  profiled step "on" and "off" (steps after the first 2) and their ratio; then the median over rounds of both, their
  ratio, and the spread of the per-round ratios. Also the sampler's own CPU time in each "on" window (the file's
  `sampler_cpu_ms`) against the window's span, and the stacks' bytes against the trace's.
- `mechanisms`: the same trainer, unprofiled (no torch window: only the sampling itself is measured), each step
  wrapped in one way of sampling the host's stacks every 2 ms, on for every other step: rlprof's sampler
  (`sys._current_frames` from a thread), pyinstrument's (a profile hook on the stage thread, `Profiler(interval=
  0.002)`), and py-spy attached from outside (`py-spy record --rate 500 --nonblocking`, started before the step and
  stopped after it, where it can attach: it needs ptrace rights over the process). pyinstrument and py-spy are
  measured where importable / on PATH (not rlprof's dependencies: a side venv, e.g. `python3 -m venv
  --system-site-packages V && V/bin/pip install pyinstrument py-spy`, run with V/bin/python); null with the reason
  elsewhere.

Prints one JSON object; the result on this machine is kept in results/host_stacks_cost_cpu.json.

    python3 bench/host_stacks_cost.py                                   # 3 rounds x 12 steps, both parts
    python3 bench/host_stacks_cost.py --rounds 1 --steps 6 --part trainer   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(SRC))
A = "actor_rollout_ref.actor.profiler"
TRAIN = {"rollout": {"max_new_tokens": 12, "ignore_eos": True}}
SKIP = 2  # steps left out of the medians (warm-up)


def _trainer_config(steps: int, out: Path):
    from rlprof.trainer.config import parse_train_config

    return parse_train_config({"trainer": {"steps": steps, "output_dir": str(out / "train")}, **TRAIN})


def trainer_worker(steps: int, on_parity: int, out: Path) -> dict:
    """One trainer run, every step profiled: the host sampler on where step % 2 == on_parity, off elsewhere."""
    from rlprof.analyze.inputs.host_stacks_file import read_host_stacks
    from rlprof.collect import window
    from rlprof.config import load_plan
    from rlprof.trainer.train import run_training

    start_host = window.Window._start_host
    window.Window._start_host = lambda self: start_host(self) if self.spec.steps[0] % 2 == on_parity else None
    steps_list = ",".join(map(str, range(1, steps + 1)))
    plan = load_plan(
        None, ["global_profiler.tool=torch", f"global_profiler.steps=[{steps_list}]", f"{A}.enable=true",
               f"global_profiler.save_path={out}/p"]
    )  # fmt: skip
    history, _ = run_training(_trainer_config(steps, out), plan)
    ms = {m["step"]: m["step_ms"] for m in history}
    rows = [json.loads(x) for f in (out / "p").rglob("manifest.jsonl") for x in f.read_text().splitlines()]
    cpu_share, stack_bytes = [], []
    for r in rows:
        if "host_stacks" in r:
            stacks = read_host_stacks(next((out / "p").rglob(r["path"])))
            cpu_share.append(stacks.window["sampler_cpu_ms"] / ((r["end_ns"] - r["start_ns"]) / 1e6))
            stack_bytes.append(r["host_stacks"]["bytes"] / r["bytes"])
    on = [ms[s] for s in ms if s > SKIP and s % 2 == on_parity]
    off = [ms[s] for s in ms if s > SKIP and s % 2 != on_parity]
    return {
        "on_ms": statistics.median(on),
        "off_ms": statistics.median(off),
        "sampled_steps": sorted(r["step"] for r in rows if "host_stacks" in r),
        "sampler_cpu_share": statistics.median(cpu_share),
        "stacks_to_trace_bytes": statistics.median(stack_bytes),
    }


class Mechanism:
    """One way of sampling the stage thread's stacks every 2 ms around a step."""

    def __init__(self, name: str):
        self.name, self.handle = name, None

    def start(self) -> None:
        if self.name == "rlprof":
            from rlprof.collect.host_stacks import HostSampler

            self.handle = HostSampler()
            self.handle.start()
        elif self.name == "pyinstrument":
            from pyinstrument import Profiler

            self.handle = Profiler(interval=0.002, async_mode="disabled")
            self.handle.start()
        elif self.name == "py-spy":
            self.handle = subprocess.Popen(
                [shutil.which("py-spy"), "record", "--pid", str(os.getpid()), "--rate", "500", "--nonblocking",
                 "--format", "raw", "--output", os.devnull],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
            time.sleep(1.0)  # attached before the step is timed
            if self.handle.poll() is not None:
                raise RuntimeError(self.handle.stderr.read().decode(errors="replace").strip()[-300:])

    def stop(self) -> None:
        if self.name == "rlprof":
            self.handle.stop()
        elif self.name == "pyinstrument":
            self.handle.stop()
        elif self.name == "py-spy":
            self.handle.terminate()
            self.handle.wait(timeout=30)


def why_not(name: str) -> str | None:
    if name == "pyinstrument":
        try:
            import pyinstrument  # noqa: F401
        except ImportError:
            return "pyinstrument is not importable here (install it in a side venv)"
    if name == "py-spy" and shutil.which("py-spy") is None:
        return "py-spy is not on PATH (install it in a side venv)"
    return None


def mechanism_worker(name: str, steps: int, on_parity: int, out: Path) -> dict:
    """The trainer unprofiled, each step wrapped in `name`'s sampling where step % 2 == on_parity."""
    from rlprof.config.plan import disabled_plan
    from rlprof.trainer import train

    step_of = train.Trainer.train_step
    mech = Mechanism(name)
    fault: list[str] = []

    def wrapped(self, step: int) -> dict:
        if step % 2 != on_parity or fault:
            return step_of(self, step)
        try:
            mech.start()
        except Exception as exc:
            fault.append(str(exc))
            return step_of(self, step)
        try:
            return step_of(self, step)
        finally:
            mech.stop()

    train.Trainer.train_step = wrapped
    history, _ = train.run_training(_trainer_config(steps, out), disabled_plan())
    if fault:
        return {"error": fault[0]}
    ms = {m["step"]: m["step_ms"] for m in history}
    on = [ms[s] for s in ms if s > SKIP and s % 2 == on_parity]
    off = [ms[s] for s in ms if s > SKIP and s % 2 != on_parity]
    return {"on_ms": statistics.median(on), "off_ms": statistics.median(off)}


def _rounds(args, part: list[str]) -> list[dict]:
    out = []
    for k in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, __file__, "--worker", *part, str(args.steps), str(k % 2), tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, KINETO_LOG_LEVEL="5"))
            if proc.returncode != 0:
                raise SystemExit(proc.stderr[-3000:])
            out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


def summary(rounds: list[dict]) -> dict:
    if any("error" in r for r in rounds):
        return {"error": next(r["error"] for r in rounds if "error" in r)}
    ratios = [r["on_ms"] / r["off_ms"] for r in rounds]
    on, off = statistics.median(r["on_ms"] for r in rounds), statistics.median(r["off_ms"] for r in rounds)
    return {
        "on_ms": on,
        "off_ms": off,
        "ratio": on / off,
        "round_ratios": ratios,
        "ratio_spread": max(ratios) - min(ratios),
        "rounds": rounds,
    }


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        kind, *rest = sys.argv[2:]
        if kind == "trainer":
            steps, parity, out = rest
            print(json.dumps(trainer_worker(int(steps), int(parity), Path(out))))
        else:
            name, steps, parity, out = rest
            print(json.dumps(mechanism_worker(name, int(steps), int(parity), Path(out))))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--part", choices=("trainer", "mechanisms", "both"), default="both")
    args = ap.parse_args()
    result: dict = {"rounds": args.rounds, "steps": args.steps, "interval_ms": 2.0, "python": sys.version.split()[0]}
    if args.part in ("trainer", "both"):
        result["trainer"] = summary(_rounds(args, ["trainer"]))
    if args.part in ("mechanisms", "both"):
        result["mechanisms"] = {}
        for name in ("rlprof", "pyinstrument", "py-spy"):
            reason = why_not(name)
            result["mechanisms"][name] = {"error": reason} if reason else summary(_rounds(args, ["mech", name]))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
