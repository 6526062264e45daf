"""verl's own FLOPs and device peaks (verl/utils/flops_counter.py), for rlprof's speed-of-light tests: run with the verl
side venv's python (bench/setup_verl.sh), a JSON request on stdin, one JSON answer on stdout.

    {"cases": [{"config": {...a model's config.json...}, "lengths": [len, len, ...]}, ...], "devices": [name, ...]}
 -> {"flops": [FLOPs of each case's update, as FlopsCounter.estimate_flops counts them], "peaks": {name: FLOP/s},
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
    flops = []
    for case in request.get("cases", []):
        config = dict(case["config"])
        counter = FlopsCounter(AutoConfig.for_model(config.pop("model_type"), **config))
        flops.append(counter.estimate_flops(case["lengths"], 1.0)[0] * 1e12)
    peaks = {name: get_device_flops(unit="B", device_name=name) for name in request.get("devices", [])}
    json.dump({"flops": flops, "peaks": peaks, "cpu_peak": get_device_flops(unit="B", device_name="CPU")}, sys.stdout)


if __name__ == "__main__":
    main()
