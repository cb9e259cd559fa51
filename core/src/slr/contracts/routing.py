"""Routed experts: which MoE experts each token ran through, as one compact integer array.

A mixture-of-experts model picks ``top_k`` experts per token in every MoE layer. An engine
that captures this (``return_routed_experts``) reports it per token it ran; the proxy keeps
it per token of a segment; a trainer with ``[algorithm] routing_replay`` makes its own
forward pass use it (R3), so trainer log-probs are computed through the rollout's experts.

It is large (tokens x MoE layers x top_k: a 32k-token segment of a 48-layer, top-8 model
holds 12 M ids), so it travels and is stored as one row-major array of ``uint8`` (up to 256
experts) or ``uint16`` ids, little-endian, in ``data``; a record on disk holds it as one
base64 string (msgspec writes ``bytes`` that way), never as nested JSON lists. Nested lists
(``routed[token][layer] = [expert ids]``, what engines built before this type and what
older records hold) are converted on construction, so a plugin may still pass them.

The array needs neither numpy nor torch: ``torch.frombuffer(r.data, dtype=torch.uint8)``
(``r.torch_dtype``) and ``.view(len(r), r.layers, r.top_k)`` read it without a copy.
"""

from __future__ import annotations

import ast
import base64
import sys
from array import array
from collections.abc import Sequence
from itertools import chain
from typing import Any, Literal

from attrs import field, frozen, validators

RoutingDtype = Literal["uint8", "uint16"]
_ITEMSIZE: dict[str, int] = {"uint8": 1, "uint16": 2}
_TYPECODE: dict[str, str] = {"uint8": "B", "uint16": "H"}
_NPY_DESCR: dict[str, tuple[RoutingDtype | None, int, str]] = {
    # numpy's little-endian / byte-order-free descriptors: (our dtype, bytes, typecode)
    "|u1": ("uint8", 1, "B"),
    "<u1": ("uint8", 1, "B"),
    "|i1": (None, 1, "b"),
    "<u2": ("uint16", 2, "H"),
    "<i2": (None, 2, "h"),
    "<i4": (None, 4, "i"),
    "<u4": (None, 4, "I"),
    "<i8": (None, 8, "q"),
    "<u8": (None, 8, "Q"),
}


def _whole_tokens(instance: RoutedExperts, attribute: Any, value: bytes) -> None:
    row = instance.layers * instance.top_k * _ITEMSIZE[instance.dtype]
    if (row == 0 and value) or (row and len(value) % row):
        raise ValueError(
            f"RoutedExperts.data has {len(value)} bytes, not a whole number of tokens of "
            f"{instance.layers} layers x top_k {instance.top_k} {instance.dtype} ids"
        )


@frozen(kw_only=True)
class RoutedExperts:
    """Expert ids per token: ``data`` is a row-major ``[tokens, layers, top_k]`` array."""

    layers: int = field(validator=validators.ge(0))
    top_k: int = field(validator=validators.ge(0))
    dtype: RoutingDtype = "uint8"
    data: bytes = field(default=b"", converter=bytes, validator=_whole_tokens)

    # -- building ---------------------------------------------------------------------------

    @classmethod
    def from_lists(cls, routed: Sequence[Sequence[Sequence[int]]]) -> RoutedExperts:
        """From ``routed[token][layer] = [expert ids]`` (every token the same shape)."""
        if len(routed) == 0:
            return cls(layers=0, top_k=0)
        layers = len(routed[0])
        top_k = len(routed[0][0]) if layers else 0
        flat = list(chain.from_iterable(chain.from_iterable(routed)))
        if len(flat) != len(routed) * layers * top_k:
            raise ValueError(
                f"routed experts are ragged: expected {layers} layers x {top_k} ids for each "
                f"of {len(routed)} tokens (the first token's shape), got {len(flat)} ids"
            )
        return cls._from_ints(flat, layers=layers, top_k=top_k)

    @classmethod
    def _from_ints(cls, flat: Sequence[int], *, layers: int, top_k: int) -> RoutedExperts:
        if flat and (min(flat) < 0 or max(flat) > 0xFFFF):
            raise ValueError(f"expert ids must lie in 0..65535; got {min(flat)}..{max(flat)}")
        dtype: RoutingDtype = "uint8" if not flat or max(flat) < 256 else "uint16"
        return cls(layers=layers, top_k=top_k, dtype=dtype, data=_pack(flat, dtype))

    @classmethod
    def from_npy(cls, blob: bytes) -> RoutedExperts:
        """From the bytes of a ``.npy`` file holding a ``[tokens, layers, top_k]`` integer
        array (vLLM returns routed experts this way, base64'd); read without numpy."""
        if blob[:6] != b"\x93NUMPY":
            raise ValueError("routed experts are not a .npy array (no \\x93NUMPY magic)")
        major = blob[6]
        width = 2 if major == 1 else 4
        size = int.from_bytes(blob[8 : 8 + width], "little")
        start = 8 + width
        header = ast.literal_eval(blob[start : start + size].decode("latin1"))
        descr, shape = header["descr"], tuple(header["shape"])
        if header.get("fortran_order") or descr not in _NPY_DESCR or len(shape) != 3:
            raise ValueError(
                f"routed experts must be a C-order [tokens, layers, top_k] integer array; "
                f"got descr {descr!r}, shape {shape}, fortran_order "
                f"{header.get('fortran_order')}"
            )
        ours, itemsize, code = _NPY_DESCR[descr]
        tokens, layers, top_k = shape
        body = blob[start + size : start + size + tokens * layers * top_k * itemsize]
        if ours is not None and sys.byteorder == "little":
            return cls(layers=layers, top_k=top_k, dtype=ours, data=body)
        values = array(code, body)
        if sys.byteorder != "little" and itemsize > 1:
            values.byteswap()
        return cls._from_ints(values.tolist(), layers=layers, top_k=top_k)

    # -- reading ----------------------------------------------------------------------------

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.dtype]

    def __len__(self) -> int:
        row = self.layers * self.top_k * self.itemsize
        return len(self.data) // row if row else 0

    @property
    def shape(self) -> tuple[int, int, int]:
        return (len(self), self.layers, self.top_k)

    def values(self) -> array:
        """The ids as a flat ``array`` (row-major ``[tokens, layers, top_k]``)."""
        values = array(_TYPECODE[self.dtype], self.data)
        if sys.byteorder != "little" and self.itemsize > 1:
            values.byteswap()
        return values

    def tolist(self) -> list[list[list[int]]]:
        """``routed[token][layer] = [expert ids]``."""
        flat = self.values().tolist()
        k, per_token = self.top_k, self.layers * self.top_k
        return [
            [flat[t + j : t + j + k] for j in range(0, per_token, k)]
            for t in range(0, len(flat), per_token)
        ]

    def __getitem__(self, index: slice) -> RoutedExperts:
        """The tokens ``index`` selects (a slice; steps are not supported)."""
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("RoutedExperts takes a contiguous slice of tokens, e.g. r[3:10]")
        start, stop, _ = index.indices(len(self))
        row = self.layers * self.top_k * self.itemsize
        data = self.data[start * row : max(start, stop) * row]
        return RoutedExperts(layers=self.layers, top_k=self.top_k, dtype=self.dtype, data=data)

    # -- combining --------------------------------------------------------------------------

    def widened(self, dtype: RoutingDtype) -> RoutedExperts:
        if dtype == self.dtype:
            return self
        if _ITEMSIZE[dtype] < self.itemsize:
            raise ValueError(f"cannot narrow {self.dtype} routed experts to {dtype}")
        return RoutedExperts(
            layers=self.layers,
            top_k=self.top_k,
            dtype=dtype,
            data=_pack(self.values().tolist(), dtype),
        )

    def compatible(self, other: RoutedExperts) -> bool:
        """Whether the two describe the same model's routing (empty arrays fit anything)."""
        return not len(self) or not len(other) or self.shape[1:] == other.shape[1:]

    def __add__(self, other: RoutedExperts) -> RoutedExperts:
        """The tokens of ``self`` followed by those of ``other``."""
        if not len(other):
            return self
        if not len(self):
            return other
        if not self.compatible(other):
            raise ValueError(
                f"cannot join routed experts of {self.layers} layers x top_k {self.top_k} "
                f"with {other.layers} layers x top_k {other.top_k}"
            )
        dtype: RoutingDtype = "uint16" if "uint16" in (self.dtype, other.dtype) else "uint8"
        a, b = self.widened(dtype), other.widened(dtype)
        return RoutedExperts(
            layers=self.layers, top_k=self.top_k, dtype=dtype, data=a.data + b.data
        )

    def __repr__(self) -> str:
        return (
            f"RoutedExperts(tokens={len(self)}, layers={self.layers}, top_k={self.top_k}, "
            f"dtype={self.dtype!r})"
        )


def _pack(flat: Sequence[int], dtype: RoutingDtype) -> bytes:
    if dtype == "uint8":
        return bytes(flat)
    values = array("H", flat)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tobytes()


def as_routed_experts(value: Any) -> RoutedExperts | None:
    """``value`` as ``RoutedExperts``: nested lists per token are converted, None stays."""
    if value is None or isinstance(value, RoutedExperts):
        return value
    return RoutedExperts.from_lists(value)


def from_legacy(value: Any) -> RoutedExperts | None:
    """Routing as records written before ``RoutedExperts`` held it.

    Two layouts were written: per token (``[token][layer][ids]``) and, by the proxy, per
    call (``[call][token][layer][ids]``, each call's entries covering its whole prompt from
    the segment's first token). A call without routing leaves the rest unknown: the routing
    known up to it is kept.
    """
    if not value:
        return None
    first = next((v for v in value if v), None)
    per_call = value[0] is None or (
        first is not None and first[0] and isinstance(first[0][0], list)
    )
    if not per_call:
        return RoutedExperts.from_lists(value)
    known = RoutedExperts(layers=0, top_k=0)
    for call in value:
        if call is None:
            break
        known = merge_call(known, RoutedExperts.from_lists(call))
    return known if len(known) else None


def merge_call(known: RoutedExperts, call: RoutedExperts) -> RoutedExperts:
    """A segment's routing after one more call: ``call`` covers the call's prompt (the
    segment so far, from its first token) and what it generated; only the entries past
    those already ``known`` are added, so each token keeps the routing of the pass that
    first ran it."""
    if len(call) <= len(known):
        return known
    return known + call[len(known) :]


def to_json(value: RoutedExperts) -> dict[str, Any]:
    """Plain data for ``json`` (what msgspec writes: ``data`` as standard base64)."""
    return {
        "data": base64.b64encode(value.data).decode("ascii"),
        "dtype": value.dtype,
        "layers": value.layers,
        "top_k": value.top_k,
    }


def from_json(value: Any) -> RoutedExperts | None:
    """``to_json``'s output, or the nested lists of an earlier record."""
    if value is None or isinstance(value, RoutedExperts):
        return value
    if isinstance(value, dict):
        data = value.get("data", "")
        return RoutedExperts(
            layers=int(value["layers"]),
            top_k=int(value["top_k"]),
            dtype=value.get("dtype", "uint8"),
            data=base64.b64decode(data) if isinstance(data, str) else bytes(data),
        )
    return from_legacy(value)
