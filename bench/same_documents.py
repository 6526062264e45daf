"""`rlprof analyze --json` of every input in tests/data, this checkout against an earlier commit: the same bytes?

A change that moves code and means to change no number (a restructure, a speed-up) is checked here: each recorded
run, H100 recording, real public trace and framework output under tests/data is copied once to one temporary path,
analysed by both sides (each its own process, `--workers 1`, the commit run from a `git worktree` of it with the
libraries installed here), and the two documents compared byte for byte. Prints one JSON object: the inputs, which
differ (with the first differing key), and any the commit could not analyse. Exit code 1 where any differs or failed.

    python3 bench/same_documents.py c16ebdf
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from data_inputs import DATA, analysable_inputs  # noqa: E402


def document(src: Path, path: Path) -> bytes:
    env = dict(os.environ, PYTHONPATH=str(src))
    out = subprocess.run(
        [sys.executable, "-m", "rlprof.cli", "analyze", str(path), "--json", "--workers", "1"],
        env=env,
        capture_output=True,
        check=False,
    )
    return out.stdout if out.returncode == 0 else b"exit %d: " % out.returncode + out.stderr[-400:]


def first_difference(a: bytes, b: bytes) -> str:
    try:
        x, y = json.loads(a), json.loads(b)
    except ValueError:
        return "not JSON on one side"
    for key in list(x) + [k for k in y if k not in x]:
        if x.get(key) != y.get(key):
            return key
    return "key order or formatting"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("commit", help="the earlier commit")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlprof-same-") as tmp:
        tmp = Path(tmp)
        before = tmp / "before"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(before), args.commit], cwd=ROOT, check=True)
        try:
            differ, failed, names = {}, [], analysable_inputs()
            for name in names:
                source, copy = DATA / name, tmp / "inputs" / name.replace("/", "__")
                copy.parent.mkdir(exist_ok=True)
                (shutil.copytree if source.is_dir() else shutil.copy)(source, copy)
                a, b = document(before / "src", copy), document(ROOT / "src", copy)
                if not a.startswith(b"{"):
                    failed.append(name)  # no document from the commit: nothing to compare against
                elif a != b:
                    differ[name] = first_difference(a, b)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, check=False)
    print(json.dumps({"commit": args.commit, "inputs": len(names), "differ": differ, "failed": failed}, indent=1))
    return 1 if differ or failed else 0


if __name__ == "__main__":
    sys.exit(main())
