"""`--ray`: the analysis goes to the data. Each node lists what it holds of the run (its own manifest rows),
each file is analysed on the node that wrote it (Ray node affinity: hard where only that node sees it, soft
where others see it too), and only the per-window tables come back to the driver. RAY_ADDRESS selects a
cluster. A node that is gone, or a file missing on its node, is one warning and a partial result: every remote
call has a deadline (RLPROF_RAY_TIMEOUT_S, default 900 s)."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager, redirect_stdout
from functools import partial
from pathlib import Path

from ...errors import AnalyzeError
from ..inputs.find import find_inputs
from ..window.per_file import failed, range_count, run_job
from ..inputs.readers.kineto import NotATrace

DISCOVERY_TIMEOUT_S = 60.0


def timeout_s() -> float:
    return float(os.environ.get("RLPROF_RAY_TIMEOUT_S") or 900)


@contextmanager
def ray_session():
    """A connection to the cluster (RAY_ADDRESS, else a local one), closed again if opened here. Ray's own
    notices (a raylet that died, ...) go to stderr: stdout carries only rlprof's answer (`--json`)."""
    _reachable(os.environ.get("RAY_ADDRESS") or None)
    try:
        import ray
    except ImportError:
        raise AnalyzeError(
            "--ray needs the ray package (pip install 'rlprof[all]' or ray); without --ray the "
            "analysis runs on this machine's cores"
        ) from None
    with redirect_stdout(sys.stderr):
        started_here = not ray.is_initialized()
        if started_here:
            address = os.environ.get("RAY_ADDRESS") or None
            try:
                ray.init(address=address, include_dashboard=False, configure_logging=False, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise AnalyzeError(
                    f"cannot reach the Ray cluster at RAY_ADDRESS={address!r} ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}); allowed: the address of a "
                    "running cluster's head (host:port), or unset for a local one"
                ) from None
        try:
            yield ray
        finally:
            if started_here:
                ray.shutdown()


def _reachable(address: str | None, timeout: float = 10.0) -> None:
    """A host:port address must answer within `timeout` s: Ray's own connect retries for minutes."""
    import socket

    if not address or "://" in address or address == "auto" or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return
    except (OSError, ValueError) as exc:
        raise AnalyzeError(
            f"cannot reach the Ray cluster at RAY_ADDRESS={address!r} ({exc}); allowed: the "
            "address of a running cluster's head (host:port), or unset for a local one"
        ) from None


def ray_map(fn, jobs: list, strategy=None) -> list:
    """`fn` over `jobs` as Ray tasks (placed by `strategy`), in order; raises if one fails or the deadline passes."""
    with ray_session() as ray:
        task = ray.remote(max_retries=0)(fn)
        if strategy is not None:
            task = task.options(scheduling_strategy=strategy)
        refs = [task.remote(job) for job in jobs]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s())
        if pending:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise TimeoutError(f"{len(pending)} of {len(refs)} Ray tasks did not finish in {timeout_s():.0f} s")
        return ray.get(refs)


def _alive_nodes(ray) -> dict[str, str]:
    """node id -> host name, for the nodes that are up."""
    return {
        n["NodeID"]: n.get("NodeManagerHostname") or n.get("NodeManagerAddress") for n in ray.nodes() if n.get("Alive")
    }


def _pinned(node_id: str, soft: bool):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=soft)


def _list_here(path: str):
    """On one node: what it holds of `path` (its manifest rows or its files), or why it holds nothing."""
    from ...where import this_process

    node_id = this_process()["node_id"]
    try:
        return node_id, find_inputs(path), None
    except Exception as exc:  # "does not exist" on a node that holds no part of the run is normal
        return node_id, [], str(exc)


def _key(path: Path, meta: dict) -> tuple:
    return (str(path),) + tuple(str(meta.get(k)) for k in ("window", "step", "role", "stage", "rank"))


def gather_inputs(ray, path: str, nodes: dict[str, str]) -> tuple[list[tuple[Path, dict, list[str]]], list[str]]:
    """Every node's part of the run: (file, metadata, the nodes that see it), in the first lister's order."""
    lister = ray.remote(max_retries=0)(_list_here)
    refs = {lister.options(scheduling_strategy=_pinned(node, soft=False)).remote(path): node for node in nodes}
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=DISCOVERY_TIMEOUT_S)
    warnings = [
        f"node {refs[r]} ({nodes[refs[r]]}) did not list {path} in {DISCOVERY_TIMEOUT_S:.0f} s; "
        "its part of the run is missing"
        for r in pending
    ]
    for ref in pending:
        ray.cancel(ref, force=True)
    found: dict[tuple, tuple[Path, dict, list[str]]] = {}
    errors = []
    for ref in sorted(ready, key=list(refs).index):  # in the nodes' order, not the order they answered
        try:
            node, inputs, error = ray.get(ref)
        except Exception as exc:  # the node went away while listing
            warnings.append(f"node {refs[ref]} ({nodes[refs[ref]]}) could not list {path}: {type(exc).__name__}")
            continue
        if error:
            errors.append(error)
        for file, meta in inputs:
            found.setdefault(_key(file, meta), (file, meta, []))[2].append(node)
    if not found:
        raise AnalyzeError(errors[0] if errors else f"no Ray node holds {path}")
    return list(found.values()), warnings


def place(meta: dict, seen_on: list[str], nodes: dict[str, str]) -> tuple[str | None, bool]:
    """(node, soft): the node that wrote the file (its manifest row says which, by id or by host name) among
    those that see it, else the first that sees it; soft where another node sees the file too."""
    where = meta.get("where") or {}
    by_host = [n for n in seen_on if nodes.get(n) == where.get("host")]
    if where.get("node_id") in seen_on:
        node = where["node_id"]
    elif len(by_host) == 1:
        node = by_host[0]
    else:
        node = seen_on[0] if seen_on else None
    return node, len(seen_on) > 1


def analyze_on_cluster(path: str, top, by_shape: bool, progress=None) -> tuple[list[dict], list[str]]:
    """The per-file results of `path` analysed where its files are, in input order, and the warnings."""

    with ray_session() as ray:
        nodes = _alive_nodes(ray)
        inputs, warnings = gather_inputs(ray, path, nodes)
        if len(inputs) == 1:  # one large trace the driver also sees: its byte ranges run on its node
            file, meta, seen_on = inputs[0]
            node, soft = place(meta, seen_on, nodes)
            cpus = int(next((n["Resources"].get("CPU", 1) for n in ray.nodes() if n["NodeID"] == node), 1))
            if Path(file).exists() and range_count(file, cpus) > 1:
                result = run_job((file, meta, top, by_shape), partial(ray_map, strategy=_pinned(node, soft)), cpus)
                result["input"]["analysed_on"].update(node_id=node, host=nodes.get(node))  # where the ranges ran
                return [result], warnings
        task = ray.remote(max_retries=0)(run_job)
        refs = {}
        for i, (file, meta, seen_on) in enumerate(inputs):
            node, soft = place(meta, seen_on, nodes)
            refs[task.options(scheduling_strategy=_pinned(node, soft)).remote((file, meta, top, by_shape))] = i
        results: list[dict | None] = [None] * len(inputs)
        deadline = time.monotonic() + timeout_s()
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for ref in ready:
                i = refs[ref]
                file, meta, seen_on = inputs[i]
                try:
                    results[i] = ray.get(ref)
                except Exception as exc:  # the node died, the file is gone there, the task could not be placed
                    node = place(meta, seen_on, nodes)[0]
                    why = (
                        f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
                        if str(exc)
                        else type(exc).__name__
                    )
                    results[i] = failed(
                        file, NotATrace(f"{file}: not analysed on node {node} ({nodes.get(node)}): {why}")
                    )
                    results[i]["input"].update(rank=meta.get("rank"), analysed_on=None)
                if progress:
                    progress()
        for ref in pending:  # past the deadline: never a hang
            ray.cancel(ref, force=True)
            file = inputs[refs[ref]][0]
            results[refs[ref]] = failed(file, NotATrace(f"{file}: its analysis did not finish in {timeout_s():.0f} s"))
            results[refs[ref]]["input"].update(rank=inputs[refs[ref]][1].get("rank"), analysed_on=None)
        return results, warnings
