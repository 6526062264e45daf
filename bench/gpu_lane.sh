#!/usr/bin/env bash
# The GPU lane: the tests marked `cuda` (tests/test_gpu_lane.py) on this machine's CUDA device, in a few minutes (the
# whole lane is cut at 9). What they print (each run's own screen, the analysis's findings, the assertions' outcome)
# is kept in bench/results/gpu_lane_<device>.txt. Usage, from anywhere: bash bench/gpu_lane.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    echo "bench/gpu_lane.sh: no CUDA device here (torch.cuda.is_available() is False); the GPU lane needs one" >&2
    exit 2
fi
device=$(python3 -c "import re, torch; print(re.sub(r'\W+', '_', torch.cuda.get_device_name(0)).strip('_'))")
out="bench/results/gpu_lane_${device}.txt"
{
    echo "# bash bench/gpu_lane.sh, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    python3 -c "import torch; p = torch.cuda.get_device_properties(0); \
print(f'# {p.name}, {p.total_memory / 2**30:.1f} GiB, torch {torch.__version__}, CUDA {torch.version.cuda}')"
    timeout 540 python3 -m pytest -m cuda -v -s -rA -p no:cacheprovider tests/test_gpu_lane.py
} 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
echo "kept in $out"
exit "$status"
