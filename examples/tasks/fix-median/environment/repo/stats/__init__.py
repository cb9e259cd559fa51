"""Tiny descriptive statistics."""

from stats.core import mean, median, mode, variance

__all__ = ["mean", "median", "mode", "variance"]
