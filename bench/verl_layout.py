"""Record where verl keeps what rlprof's verl plugin attaches to, read from verl's source with `ast` (nothing imported).

    python3 bench/verl_layout.py --label 0.9.1 --root bench/.venv-verl/lib/python3.11/site-packages
    python3 bench/verl_layout.py --label head@1dda039 --git /path/to/verl/.git --rev 1dda039
    ... --write tests/data/verl/layout.json     (merge the entry into the recorded file)

One JSON entry per source: the micro-batch loop of FSDPEngine.forward_backward_batch (what it iterates, whether each
item's `micro_batch{k}` range holds the backward), the stages ActorRolloutRefWorker marks with DistProfiler.annotate,
the DistProfiler hooks (its __init__ keeps tool_config and _impl; annotate delegates to _impl.annotate), the fields of
the torch schedule dataclass, and whether `import verl` loads the verl.plugins entry points. Facts, never code.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
from pathlib import Path

FILES = {
    "engine": "verl/workers/engine/fsdp/transformer_impl.py",
    "workers": "verl/workers/engine_workers.py",
    "profile": "verl/utils/profiler/profile.py",
    "config": "verl/utils/profiler/config.py",
    "init": "verl/__init__.py",
}


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _method(cls: ast.ClassDef | None, name: str):
    if cls is None:
        return None
    return next(
        (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name), None
    )


def _names(node) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


def engine_facts(tree: ast.Module) -> dict:
    method = _method(_class(tree, "FSDPEngine"), "forward_backward_batch")
    imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    loop = None
    if method is not None:
        for node in ast.walk(method):
            if isinstance(node, ast.For):
                source = ast.unparse(node.iter)
                ranges = [
                    w
                    for w in ast.walk(node)
                    if isinstance(w, ast.With)
                    and any("record_function" in ast.unparse(i.context_expr) for i in w.items)
                ]
                named = [
                    ast.unparse(i.context_expr)
                    for w in ranges
                    for i in w.items
                    if "record_function" in ast.unparse(i.context_expr)
                ]
                backward_inside = any("backward" in _names(w) for w in ranges)
                loop = {
                    "iterates": source,
                    "range": named[0] if named else None,
                    "backward_inside_range": backward_inside,
                }
                break
    return {
        "class": "FSDPEngine",
        "method": "forward_backward_batch",
        "defined": method is not None,
        "calls": sorted(n for n in ("prepare_micro_batches",) if method is not None and n in _names(method)),
        "module_imports": sorted(n for n in ("prepare_micro_batches",) if n in imported),
        "loop": loop,
    }


def annotate_facts(tree: ast.Module) -> dict:
    cls = _class(tree, "ActorRolloutRefWorker")
    out = {}
    for node in cls.body if cls else ():
        if not isinstance(node, ast.FunctionDef):
            continue
        for dec in node.decorator_list:
            if isinstance(dec, ast.Call) and ast.unparse(dec.func).endswith("DistProfiler.annotate"):
                role = next((k.value.value for k in dec.keywords if k.arg == "role"), None)
                out[node.name] = role
    return out


def profile_facts(tree: ast.Module) -> dict:
    cls = _class(tree, "DistProfiler")
    init, annotate = _method(cls, "__init__"), _method(cls, "annotate")
    assigned = (
        {t.attr for n in ast.walk(init) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Attribute)}
        if init
        else set()
    )
    return {
        "init_keeps": sorted(a for a in ("tool_config", "_impl", "rank", "config") if a in assigned),
        "annotate_delegates": annotate is not None
        and "annotate"
        in {n.attr for n in ast.walk(annotate) if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "impl"},
        "methods": sorted(
            m
            for m in ("start", "stop", "step", "check_enable", "check_this_rank", "check_this_step")
            if _method(cls, m) is not None
        ),
    }


def config_facts(tree: ast.Module) -> dict:
    out = {}
    for name in ("TorchProfilerScheduleConfig", "TorchProfilerToolConfig", "NPUToolConfig"):
        cls = _class(tree, name)
        if cls is not None:
            out[name] = sorted(
                n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            )
    return out


def facts(read) -> dict:
    trees = {k: ast.parse(read(p)) for k, p in FILES.items()}
    init_source = ast.unparse(trees["init"])
    return {
        "engine": engine_facts(trees["engine"]),
        "annotations": annotate_facts(trees["workers"]),
        "dist_profiler": profile_facts(trees["profile"]),
        "config": config_facts(trees["config"]),
        "loads_plugin_group": "'verl.plugins'" in init_source or '"verl.plugins"' in init_source,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", required=True)
    ap.add_argument("--root", type=Path, help="a directory holding the verl package (site-packages, a checkout)")
    ap.add_argument("--git", help="a git directory of verl's repository (with --rev)")
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--write", type=Path, help="merge the entry into this JSON file")
    args = ap.parse_args()
    if args.git:

        def read(path):
            return subprocess.run(
                ["git", "--git-dir", args.git, "show", f"{args.rev}:{path}"], check=True, capture_output=True, text=True
            ).stdout

        commit = subprocess.run(
            ["git", "--git-dir", args.git, "rev-parse", args.rev], check=True, capture_output=True, text=True
        ).stdout.strip()
        source = f"git {commit}"
    else:

        def read(path):
            return (args.root / path).read_text()

        source = "installed package"
    entry = {"source": source, **facts(read)}
    if args.write:
        recorded = json.loads(args.write.read_text()) if args.write.exists() else {}
        recorded[args.label] = entry
        args.write.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    print(json.dumps({args.label: entry}, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
