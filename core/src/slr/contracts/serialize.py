"""Records to and from JSON-ready dicts (cattrs), the only way records reach disk."""

from __future__ import annotations

from typing import Any, TypeVar

import cattrs

T = TypeVar("T")

converter = cattrs.Converter(forbid_extra_keys=False)


def to_dict(record: Any) -> Any:
    return converter.unstructure(record)


def from_dict(data: Any, cls: type[T]) -> T:
    return converter.structure(data, cls)
