"""Extract the config keys MindSpeed-RL's config classes accept, per YAML section, from a MindSpeed-RL checkout.

    python bench/mindspeed_keys.py /path/to/MindSpeed-RL [COMMIT] > tests/data/mindspeed/config_keys.json

Each section of a MindSpeed-RL YAML is read by one config class that sets its known keys as `self.<key> = ...`
in __init__ and refuses others (config_cls/base_config.py); generate_config's sampling_config is a dict whose
keys are those of its default. The result lets tests check rlprof's MindSpeed-RL lever keys without the repo.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

SECTIONS = {
    "megatron_training": "megatron_config.py",
    "actor_config": "megatron_config.py",
    "rl_config": "rl_config.py",
    "generate_config": "generate_config.py",
}


def keys_of(source: str) -> tuple[list[str], dict[str, list[str]]]:
    tree = ast.parse(source)
    keys, dicts = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    keys.add(target.attr)
                    if isinstance(node.value, ast.Dict):
                        dicts[target.attr] = sorted(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return sorted(keys), dicts


def main(repo: str, commit: str | None = None) -> None:
    root = Path(repo)
    commit = (
        commit
        or subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    )
    out = {"source": f"Ascend/MindSpeed-RL @{commit[:7]} mindspeed_rl/config_cls", "sections": {}}
    for section, name in SECTIONS.items():
        keys, dicts = keys_of((root / "mindspeed_rl/config_cls" / name).read_text())
        out["sections"][section] = {"keys": keys, "dict_keys": dicts}
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(*sys.argv[1:3])
