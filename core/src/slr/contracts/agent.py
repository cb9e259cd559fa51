"""The agent-adapter contract: run an unmodified scaffold against a session endpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from attrs import field, frozen

from slr.contracts.sandbox import Sandbox

Protocol_ = Literal["openai", "anthropic"]


#: Where an agent's bundle (``AgentAdapter.bundle().path``) appears in every sandbox,
#: read-only: the one path the trial runner mounts and the adapters run from.
BUNDLE_MOUNT = "/opt/slr/agent"


@frozen(kw_only=True)
class Bundle:
    """A scaffold's runtime, built once on the host and mounted read-only at ``BUNDLE_MOUNT``."""

    path: Path
    version: str


@frozen(kw_only=True)
class Endpoint:
    """Where the scaffold reaches the policy: a base URL as seen from inside the sandbox."""

    base_url: str
    api_key: str
    model: str


@frozen(kw_only=True)
class AgentOutcome:
    """How the scaffold's process ended, and its own logs."""

    exit_code: int | None
    timed_out: bool = False
    logs: dict[str, str] = field(factory=dict)


@runtime_checkable
class AgentAdapter(Protocol):
    """A thin adapter for one scaffold. Never a fork: configuration, command line, logs.

    Subclass it (``class MyScaffold(AgentAdapter):``) to inherit the defaults of
    ``needs_model`` and ``accepts_task``; a class that does not subclass it defines both.
    Optional: ``prestart`` (``Prestarting``).
    """

    protocol: Protocol_
    """Which API the scaffold speaks through the proxy."""

    needs_model: bool = True
    """Whether the scaffold calls the policy. ``False`` (the ``oracle`` and ``nop`` agents):
    ``slr eval`` runs it with stand-in sessions and loads no engine."""

    accepts_task: bool = False
    """Whether ``run`` takes a ``task`` keyword. ``True``: the trial runner passes the
    ``slr.tasks.Task`` as ``task=`` (for its ``[agent] user``, or its solution)."""

    def bundle(self) -> Bundle:
        """Build (once, cached, locked) and return the scaffold's runtime bundle."""
        ...

    async def run(
        self, sandbox: Sandbox, instruction: str, endpoint: Endpoint, *, timeout_s: float
    ) -> AgentOutcome:
        """Run the scaffold headless on ``instruction`` inside ``sandbox`` until it exits.

        An adapter with ``accepts_task = True`` also takes ``task: slr.tasks.Task``.
        """
        ...


@runtime_checkable
class Prestarting(Protocol):
    """An adapter that starts its scaffold ahead of the trial (optional).

    With a warm sandbox pool, the pool calls ``prestart`` on each pooled sandbox once it is
    up, before its trial is known, so the adapter can start its scaffold ahead
    (``slr.agents.prestart``: the interpreter with its heavy imports done); what it returns
    travels with that sandbox as ``sandbox.prestarted`` (``PoolStarted``) into this
    adapter's ``run`` for the trial it serves.
    """

    async def prestart(self, sandbox: Sandbox) -> object | None: ...
