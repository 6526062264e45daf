"""The reference floor for ingestion: read a Kineto trace and decode it into typed structs on one core.

Nothing else: no classification, no columns, no analysis. The struct holds the seven fields every
trace tool needs (ph, name, cat, ts, dur, pid, tid) and is decoded the plain msgspec way, the whole
file in one call. Prints {"events": N, "s": seconds} (seconds measured inside, after imports).

    python3 bench/decode_floor.py TRACE.json [TRACE2.json ...]   # several files: one after another
"""

from __future__ import annotations

import gzip
import json
import sys
import time

import msgspec


class Event(msgspec.Struct):
    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float = 0.0
    dur: float = 0.0
    pid: int | str = 0
    tid: int | str = 0


class Trace(msgspec.Struct):
    traceEvents: list[Event] = []


def decode(path: str) -> int:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    return len(msgspec.json.decode(data, type=Trace).traceEvents)


def main() -> int:
    t = time.perf_counter()
    events = sum(decode(p) for p in sys.argv[1:])
    print(json.dumps({"events": events, "s": round(time.perf_counter() - t, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
