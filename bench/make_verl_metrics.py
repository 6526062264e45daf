"""Write tests/data/verl/metrics/file_logger.jsonl with verl's own FileLogger (verl/utils/tracking.py), from the
real console line in tests/data/verl/metrics/issue1208_console.log (parsed by rlprof's step-metrics reader's
pattern). Run with the side venv's python, where verl is installed (bench/setup_verl.sh, or .venv-verlhead):

    bench/.venv-verlhead/bin/python bench/make_verl_metrics.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "tests" / "data" / "verl" / "metrics"


def main() -> None:
    line = (DATA / "issue1208_console.log").read_text()
    step = int(re.search(r"step:(\d+)", line).group(1))
    pairs = dict(re.findall(r"([\w/@.\-]+):([-+0-9.eE]+)", line.split(f"step:{step} - ", 1)[1]))
    data = {k: float(v) for k, v in pairs.items()}
    out = DATA / "file_logger.jsonl"
    os.environ["VERL_FILE_LOGGER_PATH"] = str(out)
    from verl.utils.tracking import FileLogger

    logger = FileLogger("rlprof", "issue1208")
    logger.log(data, step)
    logger.finish()
    print(out)


if __name__ == "__main__":
    main()
