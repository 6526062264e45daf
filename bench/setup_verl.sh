#!/usr/bin/env bash
# A side venv holding verl 0.9.1 (import only): bench/overhead.py's comparison and bench/make_verl_fixtures.py.
# It sees this machine's torch through --system-site-packages, and nothing here may pull a CUDA build:
# verl and tensordict go in without their dependency lists (which name torch ranges), the rest by name.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv-verl"
python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q --no-deps "verl==0.9.1" "tensordict>=0.8.0,<=0.10.0"
"$venv/bin/pip" install -q ray codetiming pylatexenc dill cloudpickle orjson importlib_metadata "pyvers<0.2" \
    "transformers>=5.5.3,<5.11" hydra-core
"$venv/bin/python" -c "from verl.utils.profiler import DistProfiler; print('verl importable:', DistProfiler)"
