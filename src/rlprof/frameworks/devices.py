"""What the accelerators rlprof's users train on can do at most, as data: each device's peak dense FLOP/s per dtype
and its memory bandwidth, from its vendor's datasheet (`source`), and the single peak verl's `perf/mfu` divides by
(`VERL_PEAK_FLOPS`, verl 0.9.1's `verl/utils/flops_counter.py`: `_DEVICE_FLOPS`, matched as verl matches it).

Dense means without 2:4 structured sparsity (the datasheets' larger "with sparsity" figures are halved away); a
device sold in several forms (SXM, PCIe, NVL) has one entry per form, told apart by the name CUDA gives the device.
A CPU is not here: its limits are measured where the run collects (collect/device_record.py), never taken from a
table. A device this table does not know is said, never assumed (analyze/inputs/hardware.py).
"""

from __future__ import annotations

from dataclasses import dataclass

T = 1e12


@dataclass(frozen=True)
class DeviceLimits:
    name: str  # the device as this table calls it
    match: tuple[str, ...]  # every one of these appears in the name the runtime gives (case-insensitive)
    peak_flops: dict  # dtype -> dense FLOP/s (float32 without TF32; tf32 where matmuls may use it)
    bandwidth: float  # bytes/s of device memory
    source: str


NVIDIA_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023)"
NVIDIA_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021)"
# The order matters: the first whose words all appear in the device's name wins (a PCIe before the SXM it shares
# words with).
DEVICES: tuple[DeviceLimits, ...] = (
    DeviceLimits(
        "NVIDIA H100 PCIe",
        ("h100", "pcie"),
        {"float32": 51.2 * T, "tf32": 378 * T, "bfloat16": 756.5 * T, "float16": 756.5 * T, "float8": 1513 * T},
        2.0e12,
        NVIDIA_H100,
    ),
    DeviceLimits(
        "NVIDIA H100 NVL",
        ("h100", "nvl"),
        {"float32": 60 * T, "tf32": 417.5 * T, "bfloat16": 835.5 * T, "float16": 835.5 * T, "float8": 1670.5 * T},
        3.9e12,
        NVIDIA_H100,
    ),
    DeviceLimits(
        "NVIDIA H100 SXM",
        ("h100",),
        {"float32": 66.9 * T, "tf32": 494.7 * T, "bfloat16": 989.4 * T, "float16": 989.4 * T, "float8": 1978.9 * T},
        3.35e12,
        NVIDIA_H100,
    ),
    DeviceLimits(
        "NVIDIA H800 SXM",
        ("h800",),
        {"float32": 66.9 * T, "tf32": 494.7 * T, "bfloat16": 989.4 * T, "float16": 989.4 * T, "float8": 1978.9 * T},
        3.35e12,
        "NVIDIA H800 datasheet (2023): the H100 SXM's compute",
    ),
    DeviceLimits(
        "NVIDIA H200",
        ("h200",),
        {"float32": 66.9 * T, "tf32": 494.7 * T, "bfloat16": 989.4 * T, "float16": 989.4 * T, "float8": 1978.9 * T},
        4.8e12,
        "NVIDIA H200 Tensor Core GPU datasheet (2024), SXM",
    ),
    DeviceLimits(
        "NVIDIA H20",
        ("h20",),
        {"float32": 44 * T, "tf32": 74 * T, "bfloat16": 148 * T, "float16": 148 * T, "float8": 296 * T},
        4.0e12,
        "NVIDIA HGX H20 product brief (2024)",
    ),
    DeviceLimits(
        "NVIDIA GB200 (one B200 of it)",
        ("gb200",),
        {"float32": 90 * T, "tf32": 1250 * T, "bfloat16": 2500 * T, "float16": 2500 * T, "float8": 5000 * T},
        8.0e12,
        "NVIDIA GB200 NVL72 datasheet (2024), per GPU",
    ),
    DeviceLimits(
        "NVIDIA B200",
        ("b200",),
        {"float32": 80 * T, "tf32": 1100 * T, "bfloat16": 2250 * T, "float16": 2250 * T, "float8": 4500 * T},
        8.0e12,
        "NVIDIA HGX B200 datasheet (2024), per GPU",
    ),
    DeviceLimits(
        "NVIDIA A100 PCIe 40GB",
        ("a100", "pcie", "40gb"),
        {"float32": 19.5 * T, "tf32": 156 * T, "bfloat16": 312 * T, "float16": 312 * T},
        1.555e12,
        NVIDIA_A100,
    ),
    DeviceLimits(
        "NVIDIA A100 PCIe 80GB",
        ("a100", "pcie"),
        {"float32": 19.5 * T, "tf32": 156 * T, "bfloat16": 312 * T, "float16": 312 * T},
        1.935e12,
        NVIDIA_A100,
    ),
    DeviceLimits(
        "NVIDIA A100 SXM 40GB",
        ("a100", "40gb"),
        {"float32": 19.5 * T, "tf32": 156 * T, "bfloat16": 312 * T, "float16": 312 * T},
        1.555e12,
        NVIDIA_A100,
    ),
    DeviceLimits(
        "NVIDIA A100 SXM 80GB",
        ("a100",),
        {"float32": 19.5 * T, "tf32": 156 * T, "bfloat16": 312 * T, "float16": 312 * T},
        2.039e12,
        NVIDIA_A100,
    ),
    DeviceLimits(
        "NVIDIA A800 SXM 80GB",
        ("a800",),
        {"float32": 19.5 * T, "tf32": 156 * T, "bfloat16": 312 * T, "float16": 312 * T},
        2.039e12,
        "NVIDIA A800 datasheet (2022): the A100's compute",
    ),
    DeviceLimits(
        "NVIDIA L40S",
        ("l40s",),
        {"float32": 91.6 * T, "tf32": 183 * T, "bfloat16": 362.05 * T, "float16": 362.05 * T, "float8": 733 * T},
        864e9,
        "NVIDIA L40S datasheet (2023)",
    ),
    DeviceLimits(
        "NVIDIA L40",
        ("l40",),
        {"float32": 90.5 * T, "tf32": 90.5 * T, "bfloat16": 181.05 * T, "float16": 181.05 * T, "float8": 362 * T},
        864e9,
        "NVIDIA L40 datasheet (2022)",
    ),
    DeviceLimits(
        "AMD Instinct MI300X",
        ("mi300x",),
        {"float32": 163.4 * T, "tf32": 653.7 * T, "bfloat16": 1307.4 * T, "float16": 1307.4 * T, "float8": 2614.9 * T},
        5.3e12,
        "AMD Instinct MI300X data sheet (2023)",
    ),
    DeviceLimits(
        "AMD Instinct MI325X",
        ("mi325x",),
        {"float32": 163.4 * T, "tf32": 653.7 * T, "bfloat16": 1307.4 * T, "float16": 1307.4 * T, "float8": 2614.9 * T},
        6.0e12,
        "AMD Instinct MI325X data sheet (2024)",
    ),
    DeviceLimits(
        "Huawei Ascend 910C",
        ("910c",),
        {"float16": 752 * T, "bfloat16": 752 * T},
        3.2e12,
        "no Huawei datasheet figure: two 910B-class dies as public reports give them (2025); flagged, not a vendor's",
    ),
    DeviceLimits(
        "Huawei Ascend 910B",
        ("910b",),
        {"float16": 354 * T, "bfloat16": 354 * T},
        1.6e12,
        "no Huawei datasheet figure: FP16 as verl's table and public reports give it, HBM2e as reported (2023); "
        "flagged, not a vendor's",
    ),
)

# verl 0.9.1's `_DEVICE_FLOPS` (FLOP/s), which its `get_device_flops` matches by substring of the device's name,
# longest key first in reverse-sorted order; "CPU" stands for any CPU. rlprof's `mfu_verl` divides by these, so that a
# row can be set beside verl's own `perf/mfu/actor` (tests/test_speed_of_light_frameworks.py checks the copy against
# verl's function).
VERL_PEAK_FLOPS = {
    "CPU": 448e9,
    "GB200": 2.5e15,
    "B200": 2.25e15,
    "MI300X": 1307e12,
    "MI350X": 2300e12,
    "MI355X": 2500e12,
    "H100": 989e12,
    "H800": 989e12,
    "H200": 989e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362.05e12,
    "L40": 181.05e12,
    "A40": 149.7e12,
    "L20": 119.5e12,
    "H20": 148e12,
    "910B": 354e12,
    "A2G3": 354e12,
    "Ascend950DT": 432e12,
    "Ascend910": 354e12,
    "RTX 3070 Ti": 21.75e12,
}


def device_limits(name: str | None) -> DeviceLimits | None:
    """The table's entry for a device the runtime named (`torch.cuda.get_device_name`, Kineto's deviceProperties,
    torch_npu's), or None where the table does not know it."""
    words = (name or "").lower()
    if not words:
        return None
    return next((d for d in DEVICES if all(m in words for m in d.match)), None)


def verl_peak(name: str | None, kind: str | None) -> float | None:
    """The peak verl's perf/mfu divides by on this device, as verl finds it (None where verl's table has none:
    verl then divides by infinity and logs 0)."""
    device_name = "CPU" if kind == "cpu" else (name or "")
    for key, value in sorted(VERL_PEAK_FLOPS.items(), reverse=True):
        if key in device_name:
            return value
    return None


def device_table() -> str:
    """The table as docs/speed_of_light.md shows it (`python3 -m rlprof.frameworks.devices` prints it; a test checks the
    page holds it as printed)."""

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value / T:g}"

    dtypes = ("float32", "tf32", "bfloat16", "float16", "float8")
    lines = [
        "| device | matched by | " + " | ".join(f"{d} TFLOP/s" for d in dtypes) + " | bandwidth TB/s | source |",
        "| --- | --- | " + " | ".join("---" for _ in dtypes) + " | --- | --- |",
    ]
    for d in DEVICES:
        cells = [rate(d.peak_flops.get(k)) for k in dtypes]
        match = " + ".join(f"`{m}`" for m in d.match)
        lines.append(f"| {d.name} | {match} | " + " | ".join(cells) + f" | {d.bandwidth / T:g} | {d.source} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(device_table(), end="")
