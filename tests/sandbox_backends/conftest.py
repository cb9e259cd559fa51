"""The sandbox backend tests' shared fixtures (``tests/backend_fixtures.py``)."""

from backend_fixtures import example_tasks, registry, verifier  # noqa: F401 (fixtures)
