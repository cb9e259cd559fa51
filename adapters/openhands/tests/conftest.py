"""The adapter tests' shared fixtures (``tests/adapter_fixtures.py``)."""

from adapter_fixtures import (  # noqa: F401 (fixtures)
    backend_name,
    docker_backend,
    hello_task,
    local_backend,
    sandbox_factory,
)
