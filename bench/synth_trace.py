"""Write a synthetic GPU-style Kineto trace of a given size, shaped like a real NCCL training rank.

Per iteration: a ProfilerStep annotation; forward/backward CPU ops with nested children; a
cudaLaunchKernel per kernel with its flow events; compute kernels, NCCL collectives, memcpy and
memset on two streams. Written in Kineto's own pretty layout, streamed (constant memory).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

KERNELS = [
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x128_32x3_nt_align4>(Params)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float>>(int, T)",
    "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>(int, ...)",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, MeanOps>>(R)",
    "ampere_sgemm_128x64_tn",
]
NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
OPS = [
    ("aten::linear", ["aten::t", "aten::matmul"]),
    ("aten::add_", []),
    ("aten::mul", []),
    ("aten::copy_", []),
    ("aten::sum", ["aten::empty_strided"]),
    ("aten::native_layer_norm", ["aten::empty"]),
]


def _event(ph, cat, name, pid, tid, ts, dur=None, args=None) -> str:
    head = f'    "ph": "{ph}", "cat": "{cat}", "name": {json.dumps(name)}, "pid": {pid}, "tid": {tid},\n'
    timing = f'    "ts": {ts:.3f}' + (f', "dur": {dur:.3f}' if dur is not None else "")
    body = ""
    if args:
        body = (
            ',\n    "args": {\n'
            + ",".join(f"      {json.dumps(k)}: {json.dumps(v)}" for k, v in args.items())
            + "\n    }"
        )
    return "  {\n" + head + timing + body + "\n  }"


def write_trace(path: Path, target_mb: float, seed: int = 0, rank: int = 0) -> dict:
    rng = random.Random(seed)
    opener = gzip.open if path.name.endswith(".gz") else open
    written = events = 0
    target = int(target_mb * 1e6)
    ts = 1_700_000_000_000_000.0
    ext = corr = 0
    with opener(path, "wt") as f:
        f.write(
            '{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}],\n'
            f'  "distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": 8}},\n'
            '  "traceEvents": [\n'
        )
        first = True
        step = 0
        while written < target:
            step += 1
            step_start = ts
            chunk = []
            gpu_t = ts + 50
            for _ in range(400):
                name, children = OPS[rng.randrange(len(OPS))]
                ext += 1
                dur = rng.uniform(20, 120)
                chunk.append(
                    _event(
                        "X",
                        "cpu_op",
                        name,
                        1000,
                        1000,
                        ts,
                        dur,
                        {"External id": ext, "Sequence number": ext, "Fwd thread id": 0},
                    )
                )
                t = ts + 2
                for child in children:
                    ext += 1
                    cd = dur / (len(children) + 1)
                    chunk.append(_event("X", "cpu_op", child, 1000, 1000, t, cd, {"External id": ext}))
                    t += cd
                corr += 1
                chunk.append(
                    _event(
                        "X",
                        "cuda_runtime",
                        "cudaLaunchKernel",
                        1000,
                        1000,
                        ts + dur - 8,
                        6,
                        {"correlation": corr, "External id": ext},
                    )
                )
                chunk.append(
                    f'  {{\n    "ph": "s", "id": {corr}, "pid": 1000, "tid": 1000, "ts": {ts + dur - 8:.3f},'
                    f'\n    "cat": "ac2g", "name": "ac2g"\n  }}'
                )
                kname = NCCL if rng.random() < 0.04 else KERNELS[rng.randrange(len(KERNELS))]
                stream = 20 if kname == NCCL else 7
                kd = rng.uniform(10, 200) if kname != NCCL else rng.uniform(200, 900)
                gpu_t = max(gpu_t, ts + dur) + rng.uniform(0, 5)
                chunk.append(
                    _event(
                        "X",
                        "kernel",
                        kname,
                        0,
                        stream,
                        gpu_t,
                        kd,
                        {
                            "queued": 0,
                            "device": 0,
                            "stream": stream,
                            "correlation": corr,
                            "grid": [108, 1, 1],
                            "block": [256, 1, 1],
                        },
                    )
                )
                chunk.append(
                    f'  {{\n    "ph": "f", "id": {corr}, "pid": 0, "tid": {stream}, "ts": {gpu_t:.3f},'
                    f'\n    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  }}'
                )
                if rng.random() < 0.1:
                    chunk.append(
                        _event(
                            "X",
                            "gpu_memcpy",
                            "Memcpy HtoD (Pinned -> Device)",
                            0,
                            7,
                            gpu_t + kd,
                            rng.uniform(5, 40),
                            {"device": 0, "stream": 7, "bytes": 1 << 20},
                        )
                    )
                if rng.random() < 0.05:
                    chunk.append(
                        _event(
                            "X", "gpu_memset", "Memset (Device)", 0, 7, gpu_t + kd + 50, 2.0, {"device": 0, "stream": 7}
                        )
                    )
                if kname != NCCL:
                    gpu_t += kd
                ts += dur + rng.uniform(1, 10)
            chunk.insert(
                0,
                _event(
                    "X",
                    "user_annotation",
                    f"ProfilerStep#{step}",
                    1000,
                    1000,
                    step_start,
                    ts - step_start,
                    {"External id": 0},
                ),
            )
            text = ("" if first else ",\n") + ",\n".join(chunk)
            first = False
            f.write(text)
            written += len(text)
            events += len(chunk)
        f.write('\n  ],\n  "traceName": "synthetic",\n  "displayTimeUnit": "ms"\n}\n')
    return {"path": str(path), "bytes": written, "events": events}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("path", type=Path)
    ap.add_argument("--mb", type=float, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rank", type=int, default=0)
    args = ap.parse_args()
    print(json.dumps(write_trace(args.path, args.mb, args.seed, args.rank)))


if __name__ == "__main__":
    main()
