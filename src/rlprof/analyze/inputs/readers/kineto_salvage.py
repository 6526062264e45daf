"""Damaged and odd input, one event at a time: an event that does not decode is dropped and counted by why, and
reading goes on at the next event. Kineto's layout is cut at its separators (which cannot occur inside an event);
other layouts go through Python's JSON parser element by element, which also takes NaN / Infinity, so a value
JSON cannot hold costs its event, not the rest of the file. Only structural damage (text that is not JSON) ends
the generic path; a cut ends both."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import msgspec

from .kineto_events import SEP, Event

# Why an event was dropped (the warning counts them by these).
DAMAGED = "text that is not JSON (damage)"
NOT_OBJECT = "an entry that is not an event object"
NOT_A_NUMBER = "a number JSON cannot hold (NaN, Infinity or out of range)"
DEEP_ARGS = "args nested too deep to read (the event kept without them)"
_FIELD = re.compile(r"at `\$(?:\[\d+\])?\.(\w+)`")


def decode_one(text: bytes, event_type=Event) -> tuple[object | None, str | None]:
    """One event's JSON text -> (event, None), (None, why it cannot be read), or (event, DEEP_ARGS) for an event
    whose args nest deeper than a decoder recurses: kept without its args."""
    try:
        return msgspec.json.decode(text, type=event_type), None
    except RecursionError:
        try:
            return msgspec.json.decode(without_args(text), type=event_type), DEEP_ARGS
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError, ValueError):
            return None, DAMAGED
    except msgspec.ValidationError as exc:  # a value refused before the decoder saw the rest: is the rest JSON?
        why = _not_json(text)
        return None, why if why in (DAMAGED, NOT_OBJECT) else NOT_A_NUMBER if "out of range" in str(
            exc
        ) else _wrong_type(str(exc))
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None, _not_json(text)


def _wrong_type(message: str) -> str:
    if "Expected `object`" in message and not _FIELD.search(message):
        return NOT_OBJECT
    m = _FIELD.search(message)
    return f"a {m.group(1) if m else 'field'} of the wrong type"


def _not_json(text: bytes) -> str:
    """Why text msgspec refused is no event: Python's parser also takes NaN, Infinity and huge numbers."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return DAMAGED
    return NOT_OBJECT if not isinstance(value, dict) else NOT_A_NUMBER


def _why_not_event(value) -> str:
    """Why a parsed element is no typed event."""
    if not isinstance(value, dict):
        return NOT_OBJECT
    for v in value.values():
        if (
            isinstance(v, float)
            and not math.isfinite(v)
            or isinstance(v, int)
            and not isinstance(v, bool)
            and abs(v) > 2**63
        ):
            return NOT_A_NUMBER
    try:
        msgspec.json.decode(msgspec.json.encode(value), type=Event)
    except msgspec.ValidationError as exc:
        return _wrong_type(str(exc))
    except (msgspec.DecodeError, msgspec.EncodeError, RecursionError, TypeError):
        pass
    return DAMAGED


def decode_each(
    piece: bytes, sink, offset: int, fragment_last: bool = False, stop_at_damage: bool = False
) -> int | None:
    """The events of `piece` (Kineto's layout: separated by SEP) one by one into `sink`; those that do not decode
    are counted there (with where the first one starts: `offset` + its position). Returns where reading stopped
    (None when the piece was read to its end): with `fragment_last`, at a last event that does not decode (a cut,
    not a bad event); with `stop_at_damage`, at the first text that is not JSON. A damaged compressed stream
    inflates to garbage from the damage on, so there the first such text ends what can be trusted."""
    events, pos = [], 0
    while pos < len(piece):
        cut = piece.find(SEP, pos)
        end = len(piece) if cut < 0 else cut + 1
        text = piece[pos:end].strip().rstrip(b",")
        if text:
            event, why = decode_one(text, sink.event_type)
            if event is None and (cut < 0 and fragment_last or stop_at_damage and why == DAMAGED):
                sink.add(events)
                return pos
            if event is not None:
                events.append(event)
            if why is not None:
                sink.count_bad(why, offset + pos)
        if cut < 0:
            break
        pos = cut + len(SEP) - 1
    sink.add(events)
    return None


@dataclass
class Salvaged:
    events: list
    end: int  # the byte just past the last element read
    dropped: dict[str, int]  # elements that parsed but are no event, by why
    whole: bool  # the array's "]" (or the end of the text) was reached with nothing unread
    not_utf8: bool  # bytes that are not UTF-8 were read as U+FFFD
    close_at: int | None = None  # just past the array's "]" (None: the text ended first)
    cut: bool = False  # what stopped the reading runs to the end of the text: a cut, not damage inside it

    def damage(self, exc) -> str | None:
        """What stopped the reading ("{n}": the events kept, filled in with the table), None when nothing did."""
        if self.whole:
            return None
        if self.cut:
            return f"trace ends early at byte {self.end} (no closing bracket); the {{n}} events before it were kept"
        return f"damaged event near byte {self.end} ({exc}); the {{n}} events before it were kept"

    def warnings(self, path, exc=None) -> list[str]:
        """The damage (with `exc`: what stopped the reading) and bytes that are not UTF-8, one line each."""
        damage = self.damage(exc) if exc is not None else None
        out = [f"{path}: " + damage.replace("{n}", str(len(self.events)))] if damage else []
        if self.not_utf8:
            out.append(f"{path}: bytes that are not UTF-8 were read as U+FFFD (names may differ from the writer's)")
        return out


def salvage_events(data: bytes, bracket: int, event_type=Event) -> Salvaged:
    """The events of an array in any layout from its "[" (at byte `bracket`), one element at a time: elements that
    parse but are no event are dropped and counted; text that is not JSON (a cut, damage) ends it. A slow path,
    taken only on odd input."""
    try:
        text, not_utf8 = data.decode("utf-8"), False
    except UnicodeDecodeError:
        text, not_utf8 = data.decode("utf-8", errors="replace"), True
    pos = len(data[: bracket + 1].decode("utf-8", errors="replace"))
    decoder, events, kept, dropped = json.JSONDecoder(), [], pos, {}
    whole, close_at, cut = False, None, False
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            whole = True
            if pos < len(text):
                close_at = pos + 1 if text.isascii() else len(text[: pos + 1].encode("utf-8"))
            break
        try:
            raw, end = decoder.raw_decode(text, pos)
        except RecursionError:  # nested deeper than the parser recurses: its args go, the event stays
            end = value_end(text, pos)
            if end is None:
                break
            event, why = decode_one(text[pos:end].encode(), event_type)
            if event is not None:
                events.append(event)
            if why is not None:
                dropped[why] = dropped.get(why, 0) + 1
            pos = kept = end
            continue
        except ValueError:
            cut = value_end(text, pos) is None  # the element runs to the end of the text
            break
        try:
            events.append(msgspec.json.decode(msgspec.json.encode(raw), type=event_type))
        except (msgspec.DecodeError, msgspec.EncodeError, TypeError, RecursionError):
            why = _why_not_event(raw)
            dropped[why] = dropped.get(why, 0) + 1
        pos = kept = end
    return Salvaged(events, len(text[:kept].encode("utf-8")), dropped, whole, not_utf8, close_at, cut)


def value_end(text, pos: int) -> int | None:
    """Where the JSON value starting at `pos` ends, found without recursion (strings and escapes respected);
    None when the text ends first."""
    depth, i, n = 0, pos, len(text)
    quote, backslash, opening, closing = (
        ('"', "\\", "[{", "]}") if isinstance(text, str) else (0x22, 0x5C, (0x5B, 0x7B), (0x5D, 0x7D))
    )
    while i < n:
        c = text[i]
        if c == quote:
            i += 1
            while i < n and text[i] != quote:
                i += 2 if text[i] == backslash else 1
        elif c in opening:
            depth += 1
        elif c in closing:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def without_args(text: bytes) -> bytes:
    """An event object's text with its top-level "args" member removed (found without recursion)."""
    i, n = 1, len(text)
    while i < n:
        key_at = text.find(b'"args"', i)
        if key_at < 0:
            return text
        # only a key of the event itself: everything between the object's start and it is at depth 1
        if _depth(text, key_at) == 1:
            colon = text.index(b":", key_at + 6)
            start = colon + 1
            while text[start : start + 1] in (b" ", b"\n", b"\t", b"\r"):
                start += 1
            end = (
                value_end(text, start)
                if text[start : start + 1] in (b"[", b"{")
                else min((p for p in (text.find(b",", start), text.find(b"}", start)) if p >= 0), default=n)
            )
            head = text[:key_at].rstrip()
            tail = text[end:].lstrip()
            if tail.startswith(b","):
                tail = tail[1:]
            elif head.endswith(b","):
                head = head[:-1]
            return head + tail
        i = key_at + 6
    return text


def _depth(text: bytes, at: int) -> int:
    """The nesting depth at byte `at` of a JSON text (strings respected)."""
    depth, i = 0, 0
    while i < at:
        c = text[i]
        if c == 0x22:
            i += 1
            while i < at and text[i] != 0x22:
                i += 2 if text[i] == 0x5C else 1
        elif c in (0x5B, 0x7B):
            depth += 1
        elif c in (0x5D, 0x7D):
            depth -= 1
        i += 1
    return depth
