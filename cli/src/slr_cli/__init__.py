"""The ``slr`` command line."""
