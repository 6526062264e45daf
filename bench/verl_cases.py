"""Every profiler-setting line of verl's scripts and docs, with the meaning verl's own code gives it.

Two steps, each writing a committed file under tests/data/verl/:

  python3 bench/verl_cases.py extract SRC     SRC: a verl checkout (or `git archive` of one) at the commit named in
                                              tests/data/verl/profiler_lines.yaml; writes that file: per command (a
                                              script, or one code block of a doc), its profiler overrides, shell
                                              variables resolved from the script's own defaults.
  bench/.venv-verlhead/bin/python bench/verl_cases.py meaning SRC
                                              in a side venv holding that verl (pip install --no-deps SRC, plus
                                              hydra-core and tensordict, as bench/setup_verl.sh does for 0.9.1):
                                              composes each command with Hydra exactly as main_ppo does (a refusal is
                                              recorded as verl's), builds each role's DistProfiler as its workers do
                                              and records what it decides; writes tests/data/verl/head_meanings.json.

  python3 bench/verl_cases.py table         writes docs/framework_configs.md, one row per command.

tests/test_verl_cases.py checks rlprof's plan of each command against that file and the table's rows. Nothing here
runs in CI: the side venv is for making the fixture.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINES = ROOT / "tests" / "data" / "verl" / "profiler_lines.yaml"
MEANINGS = ROOT / "tests" / "data" / "verl" / "head_meanings.json"
COMMIT = "1dda039b9c6311889a9c9a26040677e1254814f9"
FILES = (
    "examples/profile/*.sh",
    "tests/special_e2e/*.sh",
    "tests/special_e2e/*/*.sh",
    "tests/special_npu/*.sh",
    "tests/special_npu/*/*.sh",
    "docs/perf/*.md",
    "docs/ascend_tutorial/**/*.md",
    "docs/ascend_tutorial/**/*.rst",
)
OVERRIDE = re.compile(r"""(?:^|\s)(\+{0,2}[A-Za-z_][\w.]*profiler\.[\w.\[\]]+=(?:"[^"]*"|'[^']*'|[^\s#]+))""")
VARIABLE = re.compile(
    r"""^\s*(?:export\s+)?([A-Za-z_]\w*)=(?:\$\{\w+:-(.*)\}|"([^"]*)"|'([^']*)'|([^\s"'#]\S*))\s*(?:#.*)?$"""
)
# What a user's shell would hold for the variables a script or doc leaves to it (the hook's own VERL_PROFILE_* stay
# literal: verl exports them to the hook).
SHELL = {"HOME": "/home/user", "SCRIPT_DIR": "/verl/tests/special_e2e", "PROFILE_SAVE_PATH": "/tmp/profile"}
GAP = 3  # lines between two override lines that start a new command in a doc
RANKS = range(8)  # the ranks each role's DistProfiler is asked about
ROLES = {
    "actor": "actor_rollout_ref.actor",
    "rollout": "actor_rollout_ref.rollout",
    "ref": "actor_rollout_ref.ref",
    "critic": "critic",
}


# ---- extract (no verl needed) -------------------------------------------------------------------------------------
def _unquote(value: str) -> str:
    value = value.strip()
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'" else value


def _variables(text: str) -> dict[str, str]:
    """NAME=${NAME:-default}, NAME="x", NAME=x as the script sets them (the last setting wins)."""
    env: dict[str, str] = dict(SHELL)
    for line in text.splitlines():
        m = VARIABLE.match(line)
        if m:
            value = next((g for g in m.groups()[1:] if g is not None), "")
            env[m.group(1)] = _unquote(re.sub(r"\$\{?(\w+)\}?", lambda v: env.get(v.group(1), v.group(0)), value))
    return env


def _expand(token: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), m.group(0)), token)


def commands(path: Path, text: str) -> list[dict]:
    """The file's commands: its override lines (line numbers, tokens as the shell passes them)."""
    env = {**SHELL, **(_variables(text) if path.suffix == ".sh" else {})}
    out: list[dict] = []
    last = -GAP
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        found = OVERRIDE.findall(line)
        if not found:
            continue
        if path.suffix != ".sh" and n - last > GAP or not out:
            out.append({"lines": [], "overrides": []})
        last = n
        for token in found:
            expanded = _expand(token, env)
            try:
                words = shlex.split(expanded)
            except ValueError:
                words = [expanded]
            out[-1]["lines"].append(n)
            out[-1]["overrides"].extend(words)
    for c in out:
        c["lines"] = sorted(set(c["lines"]))
        c["unresolved"] = sorted(
            {m for o in c["overrides"] for m in re.findall(r"\$\{?(\w+)\}?", o) if not m.startswith("VERL_PROFILE_")}
        )
    return out


YAML_FENCE = re.compile(r"^([ \t]*)```ya?ml[ \t]*\n(.*?)^[ \t]*```", re.S | re.M)
RST_YAML = re.compile(r"^([ \t]*)\.\. code(?:-block)?::[ \t]*yaml[ \t]*\n")


def yaml_blocks(path: Path, text: str) -> list[dict]:
    """The doc's YAML blocks that set profiler keys: edits of the trainer YAML (line range, the mapping)."""
    import textwrap

    import yaml

    found = []
    if path.suffix == ".md":
        for m in YAML_FENCE.finditer(text):
            first = text.count("\n", 0, m.start(2)) + 1
            found.append((first, textwrap.dedent(m.group(2))))
    elif path.suffix == ".rst":
        lines = text.splitlines()
        for n, line in enumerate(lines):
            m = RST_YAML.match(line + "\n")
            if not m:
                continue
            body, k = [], n + 1
            while k < len(lines) and (not lines[k].strip() or len(lines[k]) - len(lines[k].lstrip()) > len(m.group(1))):
                body.append(lines[k])
                k += 1
            found.append((n + 2, textwrap.dedent("\n".join(body))))
    out = []
    for first, body in found:
        if "profiler" not in body:
            continue
        try:
            block = yaml.safe_load(body)
        except yaml.YAMLError:
            block = None
        if isinstance(block, dict):
            out.append({"lines": [first, first + body.rstrip().count("\n")], "block": block})
    return out


def extract(src: Path) -> None:
    import yaml

    cases = []
    for pattern in FILES:
        for path in sorted(src.glob(pattern)):
            rel = path.relative_to(src)
            text = path.read_text(errors="replace")
            for i, c in enumerate(commands(rel, text)):
                cases.append({"id": f"{rel}#{i}", "source": str(rel), **c})
            if rel.suffix in (".md", ".rst"):
                for i, b in enumerate(yaml_blocks(rel, text)):
                    cases.append({"id": f"{rel}#yaml{i}", "source": str(rel), **b})
    LINES.write_text(
        "# Profiler-setting override lines of verl's scripts and docs (bench/verl_cases.py extract), at\n"
        f"# verl-project/verl {COMMIT}; $VARIABLES resolved from the script's own defaults.\n"
        + yaml.safe_dump({"commit": COMMIT, "cases": cases}, sort_keys=False, width=160)
    )
    print(json.dumps({"cases": len(cases), "file": str(LINES.relative_to(ROOT))}))


# ---- meaning (in the side venv: verl's own code) ---------------------------------------------------------------------
def _meaning(config_dir: Path, overrides: list[str], edit: dict | None = None) -> dict:
    """verl's meaning of a command line (`overrides`), or of an edit of its trainer YAML (`edit`: merged into the
    composed config as a change of the file would be: new keys are the file's own, no struct refusal)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.profiler.config import ProfilerConfig

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        try:
            cfg = compose("ppo_trainer", overrides=overrides)
            if edit is not None:
                OmegaConf.set_struct(cfg, False)
                cfg = OmegaConf.merge(cfg, OmegaConf.create(edit))
            OmegaConf.resolve(cfg)
        except Exception as exc:  # Hydra's own refusal (struct, grammar) or an interpolation that fails
            return {"refused": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"}
    steps = OmegaConf.select(cfg, "global_profiler.steps")
    out: dict = {"steps": list(steps) if steps is not None else None, "roles": {}}
    replica = 1
    for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
        replica *= int(OmegaConf.select(cfg, f"actor_rollout_ref.rollout.{key}") or 1)
    for role, path in ROLES.items():
        # the hybrid actor_rollout_ref worker builds its profiler from the actor's block (engine_workers.py ~478)
        block = OmegaConf.select(cfg, f"{ROLES['actor'] if role == 'ref' else path}.profiler")
        if block is None:
            continue
        try:
            config = omega_conf_to_dataclass(block, dataclass_type=ProfilerConfig)
            tool = block.get("tool")
            tool_config = (
                omega_conf_to_dataclass(block.get("tool_config", {}).get(tool))
                if tool in ("npu", "nsys", "torch", "torch_memory", "precision_debugger")
                else None
            )
        except Exception as exc:
            out["roles"][role] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
            continue
        if role == "rollout" and tool not in ("torch", "npu"):  # vllm_async_server.py ~172-176: off otherwise
            out["roles"][role] = {"tool": tool, "enable": False, "ranks": [], "discrete": None}
            continue
        chosen, discrete, enable = [], None, bool(config.enable)
        for rank in RANKS:
            p = _profiler(role, rank, replica, config, tool_config)
            # a rollout server drives its engine profiler in discrete mode only (vllm_async_server.py ~856-862)
            if p.check_enable() and p.check_this_rank() and (role != "rollout" or p.is_discrete_mode()):
                chosen.append(rank)
            discrete = bool(getattr(p, "_discrete", False))
        out["roles"][role] = {"tool": tool, "enable": enable, "ranks": chosen, "discrete": discrete}
    return out


def _profiler(role: str, rank: int, replica: int, config, tool_config):
    """The DistProfiler a worker of `role` builds. Its rank and step decisions come before the tool's backend; where
    that backend cannot be built here (torch_npu, nvtx absent), the same decisions are taken with no backend (the
    tool is then only the precision_debugger special case, which is kept)."""
    import dataclasses

    from verl.utils.profiler import DistProfiler
    from verl.utils.profiler.profile import build_rollout_dist_profiler

    def build(cfg):
        if role == "rollout":
            return build_rollout_dist_profiler(
                replica_rank=rank, replica_world_size=replica, config=cfg, tool_config=tool_config
            )
        return DistProfiler(rank=rank, config=cfg, tool_config=tool_config)

    try:
        return build(config)
    except ImportError:
        return build(dataclasses.replace(config, tool=None))


def meaning(src: Path) -> None:
    import yaml

    cases = yaml.safe_load(LINES.read_text())["cases"]
    config_dir = src / "verl" / "trainer" / "config"
    import verl

    results = {"commit": COMMIT, "verl": getattr(verl, "__version__", None), "ranks": list(RANKS), "cases": {}}
    for case in cases:
        if case.get("unresolved"):
            continue
        results["cases"][case["id"]] = _meaning(config_dir, case.get("overrides", []), case.get("block"))
    MEANINGS.write_text(json.dumps(results, indent=1, sort_keys=True))
    print(json.dumps({"cases": len(results["cases"]), "file": str(MEANINGS.relative_to(ROOT))}))


# ---- table (in this environment: rlprof's reading of each case, beside verl's) ------------------------------------------
TABLE = ROOT / "docs" / "framework_configs.md"


def _who(meaning: dict) -> str:
    """What verl collects, in words: refused, or per role the ranks (of ranks 0-7) and the mode."""
    if "refused" in meaning:
        return "refused: " + meaning["refused"].split(":", 1)[0]
    if not meaning.get("steps"):
        return "nothing (no steps)"
    parts = [
        f"{role} {v['tool']} {'discrete' if v['discrete'] else 'e2e'} ranks {','.join(map(str, v['ranks']))}"
        for role, v in sorted(meaning["roles"].items())
        if v.get("tool") and v.get("ranks")
    ]
    return "; ".join(parts) or "nothing (no role enabled)"


def table() -> None:
    import yaml

    sys.path.insert(0, str(ROOT / "src"))
    cases = yaml.safe_load(LINES.read_text())["cases"]
    verl = json.loads(MEANINGS.read_text())["cases"]
    rows = [
        "# Real framework configs and what they mean",
        "",
        "Every profiler-setting command in verl's `examples/profile/*.sh`, `tests/special_e2e` and `tests/special_npu`",
        f"scripts and profiling docs at verl-project/verl `{COMMIT[:9]}` (0.10.0.dev), extracted by",
        "`bench/verl_cases.py extract` into `tests/data/verl/profiler_lines.yaml`: override lines, and the docs' YAML",
        "blocks (`#yamlN`: edits of the trainer YAML). The last column is what verl's own",
        "code makes of it (Hydra's compose of its trainer config, then each role's DistProfiler; rollout servers profile",
        "in discrete mode only), computed by `bench/verl_cases.py meaning` in a side venv; `tests/test_verl_cases.py`",
        "checks rlprof's plan of each against it (ranks 0-7 asked). MindSpeed-RL's profiler guide blocks and test",
        "config are checked in `tests/test_framework_meanings.py`.",
        "",
        "| command (file#block: lines) | form | verl collects |",
        "| --- | --- | --- |",
    ]
    for c in cases:
        what = f"{len(c['overrides'])} overrides" if "overrides" in c else "YAML edit"
        rows.append(
            f"| `{c['id']}`: {', '.join(map(str, c['lines'][:1] + c['lines'][-1:]))} | {what} | {_who(verl[c['id']])} |"
        )
    rows += [
        "",
        "## MindSpeed-RL",
        "",
        "Its profiler guide's YAML blocks and its only test config with a profiler block, at Ascend/MindSpeed-RL",
        "`05a90d7` (`tests/data/mindspeed/`), each checked in `tests/test_framework_meanings.py` against what",
        "`get_grpo_profiler` / `profiler_start` (mindspeed_rl/utils/utils.py) do with it:",
        "",
        "| source | MindSpeed-RL collects |",
        "| --- | --- |",
        "| `tests/st/configs/test_ppo_trainer_qwen25_7b_integrated.yaml`: 147-163 | actor_update of step 1 on rank 0, "
        "NPU + CPU at level1, db export, parsed online |",
        "| `docs/zh/features/profiler.md`: 17-33 (the general block) | nothing (`profile: false`) |",
        "| `docs/zh/features/profiler.md`: 40-51 (the DPO block) | one window over step 1 on every rank, NPU + CPU "
        "at level1, text export |",
        "| `docs/zh/features/profiler.md`: 92-96 (the lightweight block) | NPU activity at level_none plus its mstx "
        "ranges (msprof_tx); no CPU activity |",
        "| `profile_ranks: 1` (an integer; utils.py ~524-532) | rank 0 (list(1) fails; it falls back to [0]) |",
        "| `profile_with_stack: true` (base_config.py ~29-33) | refused at setup: not a ProfilerConfig key |",
    ]
    TABLE.write_text("\n".join(rows) + "\n")
    print(json.dumps({"rows": len(cases), "file": str(TABLE.relative_to(ROOT))}))


if __name__ == "__main__":
    if sys.argv[1] == "table":
        table()
    else:
        {"extract": extract, "meaning": meaning}[sys.argv[1]](Path(sys.argv[2]))
