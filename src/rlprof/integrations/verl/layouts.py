"""The micro-batch loops of the verl releases the verl plugin knows, each checked and patched once per process so
that the sampled window running in this context (`CURRENT`, set by the sampler around a stage call) sees each
micro-batch begin and end: FSDPEngine.forward_backward_batch's micro-batches (verl 0.9.x and head), before verl
enters its `micro_batch{k}` range, so micro-batch k's backward stays in its window; DataParallelPPOActor/-Critic's
_forward_micro_batch and _optimizer_step (0.7.x). A release or layout it does not know is one warning and no patch.
The calls verl's own timers wrap for its perf/mfu (the engine's train_batch and infer_batch; 0.7.x's update_policy
and compute_log_prob) are timed into the window too, so that the whole call's rate is taken as verl takes it."""

from __future__ import annotations

import contextvars
import functools
import importlib
import time

from ...frameworks import verl as facts
from ...warn_once import warn_once

# The sampled stage window running in this context (set around a stage call; read by the micro-batch hooks).
CURRENT: contextvars.ContextVar = contextvars.ContextVar("rlprof_verl_window", default=None)
_layouts: dict = {}  # verl release -> the layout found and patched ("engine", "dp"), or None where unknown


def verl_release() -> str:
    import verl

    return str(getattr(verl, "__version__", "unknown"))


def known_layout(release: str, instead: str) -> str | None:
    """Check (and patch, once per process) the micro-batch loop of this verl release. None: one warning said, naming
    what verl's own profiler collects instead."""
    if release in _layouts:
        return _layouts[release]
    major_minor = ".".join(release.split(".")[:2])
    layout = None
    if major_minor not in facts.PLUGIN_RELEASES:
        warn_once(
            ("release", release),
            f"rlprof: verl {release} is not a release the verl plugin knows "
            f"({', '.join(facts.PLUGIN_RELEASES)}.x): no patching, no micro-batch sampled; verl's own profiler "
            f"collects instead: {instead}",
        )
    else:
        missing = _patch_dp() if major_minor == "0.7" else _patch_engine()
        if missing:
            warn_once(
                ("layout", release),
                f"rlprof: verl {release}'s micro-batch loop is not where the verl plugin "
                f"looks ({missing}): no patching, no micro-batch sampled; verl's own profiler collects instead: "
                f"{instead}",
            )
        else:
            layout = "dp" if major_minor == "0.7" else "engine"
    _layouts[release] = layout
    return layout


def _patch_engine() -> str | None:
    """verl 0.9.x / head: FSDPEngine.forward_backward_batch iterates what its module's prepare_micro_batches returns."""
    spec = facts.ENGINE_LAYOUT
    try:
        module = importlib.import_module(spec["module"])
    except Exception as exc:
        return f"{spec['module']} does not import: {type(exc).__name__}: {exc}"
    cls = getattr(module, spec["class"], None)
    method = getattr(cls, spec["method"], None)
    code = getattr(method, "__code__", None)
    if code is None or spec["source"] not in code.co_names or not callable(getattr(module, spec["source"], None)):
        return f"{spec['class']}.{spec['method']} does not take its micro-batches from {spec['source']}"
    original = getattr(module, spec["source"])
    if not getattr(original, "_rlprof", False):
        setattr(module, spec["source"], _ticking_micro_batches(original))
    timed = facts.ENGINE_TIMED
    try:  # without it the call is timed whole (the stage call); the micro-batches are sampled all the same
        engine = getattr(importlib.import_module(timed["module"]), timed["class"])
    except Exception:
        return None
    _time_methods(engine, timed["methods"])
    return None


def _time_methods(cls, names) -> None:
    for name in names:
        method = getattr(cls, name, None)
        if callable(method) and not getattr(method, "_rlprof", False):
            setattr(cls, name, _timed(method))


def _timed(original):
    """A call verl's own timer wraps, timed into the window running in this context (none: verl's call as it is)."""

    @functools.wraps(original)
    def timed(*args, **kwargs):
        window = CURRENT.get()
        if window is None:
            return original(*args, **kwargs)
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            window.timed(time.perf_counter() - started, original.__qualname__)

    timed._rlprof = True
    return timed


def _ticking_micro_batches(original):
    @functools.wraps(original)
    def prepare_micro_batches(*args, **kwargs):
        result = original(*args, **kwargs)
        window = CURRENT.get()
        if window is None or not isinstance(result, tuple) or not result:
            return result
        return (_Ticking(result[0], window, _engine_args, _engine_lengths), *result[1:])

    prepare_micro_batches._rlprof = True
    return prepare_micro_batches


class _Ticking(list):
    """One forward_backward_batch call's micro-batches. Iterating them starts each unit at the head of its loop
    iteration (before verl enters `micro_batch{k}`) and ends the last once the loop asks for more (its backward
    done)."""

    def __init__(self, items, window, describe, lengths):
        super().__init__(items)
        self.window, self.describe, self.lengths = window, describe, lengths

    def __iter__(self):
        window, describe, lengths = self.window, self.describe, self.lengths
        try:
            for item in list.__iter__(self):
                window.unit_begins(functools.partial(describe, item), functools.partial(lengths, item))
                yield item
        finally:
            window.unit_ends()


def _engine_args(micro_batch) -> dict:
    """What a micro-batch of verl's engine holds: rows, tokens the model computes, real (not padding) tokens."""
    from verl.utils import tensordict_utils as tu

    ids = micro_batch["input_ids"]
    if getattr(ids, "is_nested", False):
        lengths = ids.offsets().diff().tolist()
    else:
        lengths = micro_batch["attention_mask"].sum(-1).tolist()
    return _held(lengths, tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True))


def _engine_lengths(micro_batch) -> tuple[str, object]:
    """Where a micro-batch's real lengths are, without an operator: its packed rows' offsets, or its attention mask."""
    ids = micro_batch["input_ids"]
    if getattr(ids, "is_nested", False):
        return "offsets", ids.offsets()
    return "mask", micro_batch["attention_mask"]


def _held(lengths: list[int], packed: bool, width: int | None = None) -> dict:
    """Rows, tokens the model computes (the real ones where packed, else rows x the padded width), real tokens, and
    the query-key pairs attention scores on the real tokens (each row's length squared, summed)."""
    seqs, real = len(lengths), int(sum(lengths))
    width = int(max(lengths, default=0)) if width is None else width
    return {
        "seqs": seqs,
        "tokens": real if packed else seqs * width,
        "real_tokens": real,
        "query_key_pairs": int(sum(n * n for n in lengths)),
    }


def _patch_dp() -> str | None:
    """verl 0.7.x: DataParallelPPOActor/-Critic run one _forward_micro_batch per micro-batch (the backward follows in
    the loop body) and _optimizer_step after a mini-batch's last."""

    for spec in facts.DP_LAYOUTS:
        try:
            module = importlib.import_module(spec["module"])
        except Exception as exc:
            return f"{spec['module']} does not import: {type(exc).__name__}: {exc}"
        cls = getattr(module, spec["class"], None)
        names = (spec["forward"], spec["boundary"], *spec["stages"])
        lacking = [n for n in names if not callable(getattr(cls, n, None))]
        if cls is None or lacking:
            return f"{spec['module']}.{spec['class']} lacks {', '.join(lacking) or 'the class'}"
    for spec in facts.DP_LAYOUTS:
        cls = getattr(importlib.import_module(spec["module"]), spec["class"])
        forward, boundary = getattr(cls, spec["forward"]), getattr(cls, spec["boundary"])
        if not getattr(forward, "_rlprof", False):
            setattr(cls, spec["forward"], _dp_forward(forward))
        if not getattr(boundary, "_rlprof", False):
            setattr(cls, spec["boundary"], _dp_boundary(boundary))
        _time_methods(cls, spec["stages"])
    return None


def _dp_forward(original):
    @functools.wraps(original)
    def _forward_micro_batch(self, micro_batch, *args, **kwargs):
        window = CURRENT.get()
        if window is not None:
            window.unit_begins(
                functools.partial(_dp_args, micro_batch, getattr(self, "use_remove_padding", False)),
                lambda: ("mask", micro_batch["attention_mask"]),
            )
        return original(self, micro_batch, *args, **kwargs)

    _forward_micro_batch._rlprof = True
    return _forward_micro_batch


def _dp_boundary(original):
    @functools.wraps(original)
    def _optimizer_step(self, *args, **kwargs):
        window = CURRENT.get()
        if window is not None:  # the mini-batch's last micro-batch, backward included, is over
            window.unit_ends()
        return original(self, *args, **kwargs)

    _optimizer_step._rlprof = True
    return _optimizer_step


def _dp_args(micro_batch, packed: bool) -> dict:
    mask = micro_batch["attention_mask"]
    return _held(mask.sum(-1).tolist(), packed, int(mask.shape[-1]))
