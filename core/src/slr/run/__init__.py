"""The run: its directory and checkpoints, the sync and async loops, `slr run`, `slr eval`, pass@k."""
