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
    return values[len(values) // 2]


def mode(values):
    counts = Counter(_require(values))
    best = max(counts.values())
    return min(v for v, c in counts.items() if c == best)


def variance(values):
    values = _require(values)
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / len(values)
