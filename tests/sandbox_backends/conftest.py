from __future__ import annotations

from pathlib import Path

import pytest

from slr.tasks import load_tasks

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


@pytest.fixture(scope="session")
def verifier():
    """The conformance suite's verifier: the example tasks are Harbor tasks."""
    from slr_verifier_harbor.verifier import HarborVerifier

    return HarborVerifier()


@pytest.fixture(scope="session")
def example_tasks():
    tasks = load_tasks(EXAMPLES)
    # The simple task first: the conformance suite starts its plain sandboxes from it.
    return sorted(tasks, key=lambda t: t.id != "hello-world")
