#!/usr/bin/env bash
# A side venv holding verl, able to run verl's own training code on this machine's CPU:
#   bash bench/setup_verl.sh          -> bench/.venv-verl     verl 0.9.1 (the registry's release)
#   bash bench/setup_verl.sh 0.7.1    -> bench/.venv-verl071  verl 0.7.1 (dp_actor layout, no entry-point plugins)
# Used by bench/overhead.py, bench/make_verl_fixtures.py, bench/verl_plugin_run.py, bench/verl_plugin_overhead.py and
# tests/test_verl_plugin.py (whose fixture runs this script on first use). It sees this machine's torch through
# --system-site-packages, and nothing here may pull a CUDA build: verl, tensordict, peft and trl go in without their
# dependency lists (which name torch ranges), the rest by name. Installed besides verl: this checkout of rlprof
# (editable, --no-deps: its verl.plugins entry point) and bench/verl_cpu_shim, a TEST HARNESS (a CPU platform for verl;
# inert unless VERL_PLATFORM=cpu). The last line printed is the venv's python.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
release="${1:-0.9.1}"
case "$release" in
  0.9.1) venv="$here/.venv-verl"
         pins=("transformers>=5.5.3,<5.11" "uvicorn" "fastapi" "pillow")
         nodeps=("peft==0.21.*" "trl==0.29.*") ;;  # trl: verl 0.9.1 imports trl.experimental.ppo
  0.7.1) venv="$here/.venv-verl071"
         pins=("transformers>=4.56,<4.58" "pillow")
         nodeps=("peft==0.17.*" "trl==0.25.*" "datasets>=3,<4.2") ;;  # transformers 4.57 needs a hub < 1
  *) echo "setup_verl.sh: release $release is not one this script makes (0.9.1, 0.7.1)" >&2; exit 2 ;;
esac
python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q --no-deps "verl==$release" "tensordict>=0.8.0,<=0.10.0,!=0.9.0" "${nodeps[@]}"
"$venv/bin/pip" install -q ray codetiming pylatexenc dill cloudpickle orjson importlib_metadata "pyvers<0.2" \
    hydra-core "${pins[@]}"
"$venv/bin/pip" install -q --no-deps -e "$here/.."
"$venv/bin/pip" install -q --no-deps --force-reinstall "$here/verl_cpu_shim"
"$venv/bin/python" -c "from verl.utils.profiler import DistProfiler; import verl; print('verl', verl.__version__, 'importable')"
echo "$venv/bin/python"
