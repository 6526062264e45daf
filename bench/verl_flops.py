"""verl's own FLOPs and device peaks (verl/utils/flops_counter.py), for rlprof's speed-of-light tests: run with the verl
side venv's python (bench/setup_verl.sh), a JSON request on stdin, one JSON answer on stdout.

    {"config": {...a model's config.json...}, "batches": [[len, len, ...], ...], "devices": ["NVIDIA H100 ...", ...]}
 -> {"flops": [FLOPs of each batch's update, as FlopsCounter.estimate_flops counts them], "peaks": {name: FLOP/s},
     "cpu_peak": FLOP/s}

estimate_flops(batch_seqlens, delta_time) returns the achieved TFLOP/s over delta_time; with delta_time 1 s it is
the batch's FLOPs in units of 1e12. The device peaks are get_device_flops(unit="B", device_name=...): verl's unit "B"
leaves the number as its table holds it (FLOP/s), and "CPU" is how verl names a CPU device.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    from transformers import AutoConfig

    from verl.utils.flops_counter import FlopsCounter, get_device_flops

    request = json.load(sys.stdin)
    config = dict(request["config"])
    model_type = config.pop("model_type")
    counter = FlopsCounter(AutoConfig.for_model(model_type, **config))
    flops = [counter.estimate_flops(lengths, 1.0)[0] * 1e12 for lengths in request.get("batches", [])]
    peaks = {name: get_device_flops(unit="B", device_name=name) for name in request.get("devices", [])}
    json.dump({"flops": flops, "peaks": peaks, "cpu_peak": get_device_flops(unit="B", device_name="CPU")}, sys.stdout)


if __name__ == "__main__":
    main()
