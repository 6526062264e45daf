"""Each experiment tracker's scalars read back with that tracker's own reader, as {key: {step: value}}: TensorBoard's
EventAccumulator, W&B's offline run file decoded with wandb's own protobuf records (wandb 0.31 ships no Python reader
of it: its framing is the LevelDB log the SDK's transaction log uses), MLflow's client on the local store."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def tensorboard_scalars(logdir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    return {tag: {e.step: e.value for e in ea.Scalars(tag)} for tag in ea.Tags()["scalars"]}


def tensorboard_text(logdir: Path, tag: str) -> str:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    ea.Reload()
    (event,) = ea.Tensors(tag)
    return event.tensor_proto.string_val[0].decode()


def wandb_records(run_file: Path):
    """wandb's Record messages of an offline run file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(run_file).read_bytes()
    assert data[:4] == b":W&B", data[:7]
    block, pos, buf = 32768, 7, b""  # the file's header, then 32 KiB blocks of chunks (crc32c, length, type)
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (2, 3):  # first, middle: a record cut over blocks
            buf = (b"" if kind == 2 else buf) + chunk
            continue
        if kind not in (1, 4):
            continue
        rec = pb.Record()
        rec.ParseFromString(buf + chunk if kind == 4 else chunk)
        buf = b""
        yield rec


def wandb_scalars(directory: Path) -> tuple[dict[str, dict[int, float]], dict]:
    """(history, final summary) of the one offline run under `directory`."""
    (run_file,) = Path(directory).glob("wandb/offline-run-*/run-*.wandb")
    history: dict[str, dict[int, float]] = {}
    summary: dict = {}
    for rec in wandb_records(run_file):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            step = rec.history.step.num
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    history.setdefault(key, {})[step] = float(json.loads(item.value_json))
        elif kind == "summary":
            for item in rec.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return history, summary


def mlflow_scalars(uri: str) -> tuple[dict[str, dict[int, float]], str]:
    """(metrics, run id) of the one run in the store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    (run,) = runs
    out = {}
    for key in run.data.metrics:
        out[key] = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
    return out, run.info.run_id
