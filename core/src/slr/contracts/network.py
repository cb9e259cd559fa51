"""A sandbox's network mode: the type and its one check.

Its own module because both the sandbox contract and the task records (whose verifier
section names a mode) use it, and the sandbox contract refers to tasks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, get_args

NetworkMode = Literal["proxy-only", "none", "full"]
"""A sandbox's network: ``"proxy-only"`` (only the policy's proxy is reachable: the agent
phase), ``"none"`` (no network at all) or ``"full"`` (the task's own choice for its verifier)."""

NETWORK_MODES: tuple[NetworkMode, ...] = get_args(NetworkMode)


def network_mode(value: object, *, allowed: Iterable[NetworkMode] = NETWORK_MODES) -> NetworkMode:
    """``value`` as a ``NetworkMode``, or a ``ValueError`` that names it and what is allowed.

    The one check for a network mode that comes from outside typed code (a task file, a
    config value): sandboxes take the typed value and do not check it again.
    """
    allowed = tuple(allowed)
    for mode in allowed:
        if value == mode:
            return mode
    raise ValueError(f"network mode {value!r}: expected one of {', '.join(allowed)}")
