"""The verifier contract: the task's own tests decide the reward."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from slr.contracts.records import Reward
from slr.contracts.sandbox import Sandbox

if TYPE_CHECKING:
    from slr.tasks import Task


@runtime_checkable
class Verifier(Protocol):
    async def verify(self, sandbox: Sandbox, task: Task) -> Reward:
        """Run the task's tests in ``sandbox`` after the agent phase and return the reward.

        Raises ``VerifierTimeout`` or ``VerifierError``; never returns 0 for a broken harness.
        """
        ...


class VerifierError(RuntimeError):
    """The tests could not produce a reward (missing reward file, harness crash)."""


class VerifierTimeout(VerifierError):
    """The tests ran past the task's verifier timeout."""
