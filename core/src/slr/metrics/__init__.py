"""Metrics: the metric-logger contract and the built-in plugin that feeds the loggers a run names."""
