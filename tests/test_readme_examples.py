"""Every training command the README and the guides in docs/ show collects what it promises: resolved as
`rlprof train` resolves it (its default profile where no profiling key is given), no plan collects nothing."""

import re
import shlex

import pytest

from conftest import ROOT
from rlprof.config import load_config, resolve_plan, with_default_profile


def readme_training_commands() -> list[list[str]]:
    """The arguments after `rlprof train` / `-m rlprof.trainer` of each such command in README.md and docs/*.md
    (code blocks and inline code), config files resolved from the repository root."""
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    chunks = [b.replace("\\\n", " ") for b in re.findall(r"```bash\n(.*?)```", text, re.S)]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    chunks += [m.replace("\n", " ") for m in re.findall(r"`([^`]*rlprof\.trainer[^`]*)`", prose)]
    out = []
    for chunk in chunks:
        for line in chunk.splitlines():
            line = line.split("   #")[0].strip()
            if not re.search(r"rlprof train\b|-m rlprof\.trainer\b", line):
                continue
            args = shlex.split(line)
            at = next(i for i, a in enumerate(args) if a in ("train", "rlprof.trainer"))
            out.append(args[at + 1 :])
    return out


COMMANDS = [c for c in readme_training_commands() if not (c and c[0] == "next.yaml")]  # next.yaml: made by advise


def test_the_readme_shows_training_commands():
    assert len(COMMANDS) >= 6
    assert any("torchrun" not in " ".join(c) for c in COMMANDS)


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(c)[:60] or "(none)" for c in COMMANDS])
def test_each_readme_training_command_collects(args):
    config = args[0] if args and "=" not in args[0] else None
    overrides = args[1:] if config else args
    plan = resolve_plan(with_default_profile(load_config(ROOT / config if config else None, overrides)), device="cpu")
    assert not plan.collects_nothing, args
