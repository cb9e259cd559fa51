"""Records to and from disk: the only way records reach a file.

``encode`` / ``decode`` are the record format's one owner: msgspec straight from and into
the attrs classes, about ten times faster than building a dict and running ``json`` on a
long trajectory (``bench/records.py``), which matters because trials are recorded while
other trials generate. Two cases keep the older path (cattrs + ``json``), byte for byte what
earlier versions wrote and read:

* a record holding a non-finite float (NaN or an infinite log-probability): JSON has no
  such number, and msgspec would write ``null``, which no float field reads back; ``json``
  writes ``NaN`` / ``Infinity`` as it always did;
* a file msgspec refuses to read into the record, such as one of those.

msgspec runs the records' attrs validators as it builds them; a file it refuses (a loss mask
shorter than its tokens) is handed to the older path, which refuses it as it always did.

``to_dict`` / ``from_dict`` stay for callers that want plain data (``--json`` output).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any, TypeVar

import attrs
import cattrs
import msgspec

from slr.contracts import routing
from slr.contracts.routing import RoutedExperts

T = TypeVar("T")

converter = cattrs.Converter(forbid_extra_keys=False)
# Routed experts are one base64 string on disk (as msgspec writes bytes), also on the
# ``json`` path; records from before hold nested lists, which ``from_json`` converts.
converter.register_unstructure_hook(RoutedExperts, routing.to_json)
converter.register_structure_hook(RoutedExperts, lambda value, _: routing.from_json(value))

_encoder = msgspec.json.Encoder()
_decoders: dict[type, msgspec.json.Decoder[Any]] = {}


def to_dict(record: Any) -> Any:
    return converter.unstructure(record)


def from_dict(data: Any, cls: type[T]) -> T:
    return converter.structure(data, cls)


def encode(record: Any) -> bytes:
    """A record as JSON bytes (msgspec, or ``json`` for records with non-finite floats)."""
    if _all_finite(record):
        return _encoder.encode(record)
    return json.dumps(to_dict(record), sort_keys=True).encode()


def decode(data: bytes | str, cls: type[T]) -> T:
    """A record of type ``cls`` from ``encode``'s output or any earlier version's file."""
    decoder = _decoders.get(cls)
    if decoder is None:
        decoder = _decoders[cls] = msgspec.json.Decoder(cls)
    try:
        record: T = decoder.decode(data)
    except msgspec.MsgspecError:
        return from_dict(json.loads(data), cls)
    return record


def _all_finite(value: Any) -> bool:
    """Whether no float inside ``value`` is NaN or infinite (fast on long float tuples)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (str, int, bytes)) or value is None:
        return True
    if attrs.has(type(value)):
        return all(_all_finite(getattr(value, a.name)) for a in attrs.fields(type(value)))
    if isinstance(value, dict):
        return _all_finite_items(value.values())
    if isinstance(value, (list, tuple)):
        return _all_finite_items(value)
    return True


def _all_finite_items(items: Iterable[Any]) -> bool:
    items = items if isinstance(items, (list, tuple)) else list(items)
    try:
        total = sum(items)  # one C loop over a long tuple of log-probabilities
    except TypeError:  # not all numbers: look inside each
        return all(_all_finite(x) for x in items)
    except OverflowError:  # integers beyond float range hold no NaN
        return True
    # A NaN or an infinity makes the sum non-finite (so can a finite overflow: then the
    # slower, always-correct path is taken).
    return isinstance(total, int) or math.isfinite(total)
