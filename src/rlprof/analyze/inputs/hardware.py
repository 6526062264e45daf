"""The device a window ran on and what it can do at most (its `hardware` record): from the `device` its collector
recorded (collect/device_record.py: an accelerator by name, or the CPU as measured at collection start), else from the
trace's own deviceProperties (Kineto names the GPUs it saw); an accelerator's limits from frameworks/devices.py's
table. A device neither recorded nor known to the table is said, never assumed."""

from __future__ import annotations

from ...frameworks.devices import device_limits, verl_peak


def hardware_record(device: dict | None, device_properties: list | None = None) -> dict:
    """{kind, name, count, peak_flops: {dtype: FLOP/s}, bandwidth (bytes/s), source, verl_peak_flops} where known,
    with `why` where the limits are not."""
    if not isinstance(device, dict) and device_properties:
        names = [p.get("name") for p in device_properties if isinstance(p, dict) and p.get("name")]
        if names:
            device = {"kind": "cuda", "name": names[0], "count": len(names)}
    if not isinstance(device, dict):
        return {
            "kind": None,
            "name": None,
            "count": None,
            "peak_flops": {},
            "bandwidth": None,
            "source": None,
            "verl_peak_flops": None,
            "why": "the window does not say the device it ran on (recorded before rlprof recorded it, or by another "
            "tool, on a CPU or without Kineto's deviceProperties)",
        }
    kind, name = device.get("kind"), device.get("name")
    out = {
        "kind": kind,
        "name": name,
        "count": device.get("count"),
        "peak_flops": {},
        "bandwidth": None,
        "source": None,
        "verl_peak_flops": verl_peak(name, kind),
    }
    if kind == "cpu":
        if device.get("peak_flops") and device.get("bandwidth"):
            out.update(
                peak_flops={k: float(v) for k, v in device["peak_flops"].items()},
                bandwidth=float(device["bandwidth"]),
                source="measured at collection start: " + str(device.get("measured") or "matrix products and copies"),
                cores=device.get("cores"),
                threads=device.get("threads"),
            )
        else:
            out["why"] = "the CPU was not measured at collection start"
        return out
    limits = device_limits(name)
    if limits is None:
        out["why"] = f"{name or 'the device'} is not in rlprof's table of devices (frameworks/devices.py)"
        return out
    out.update(peak_flops=dict(limits.peak_flops), bandwidth=limits.bandwidth, source=f"{limits.name}: {limits.source}")
    return out
