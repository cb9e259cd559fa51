"""Descriptive statistics over sequences of numbers."""

from collections import Counter


def _require(values):
    values = list(values)
    if not values:
        raise ValueError("statistics of an empty sequence are undefined")
    return values


def mean(values):
    values = _require(values)
    return sum(values) / len(values)


def median(values):
    values = sorted(_require(values))
    mid = len(values) // 2
    if len(values) % 2:
        return values[mid]
    return (values[mid - 1] + values[mid]) / 2


def mode(values):
    counts = Counter(_require(values))
    best = max(counts.values())
    return min(v for v, c in counts.items() if c == best)


def variance(values):
    values = _require(values)
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / len(values)
