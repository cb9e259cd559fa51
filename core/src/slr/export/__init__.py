"""Trials written in other tools' formats (``slr export``): ``slr.export.atif`` for Harbor."""
