"""How a sandbox turns ``exec``'s command into an argv: one rule for every backend.

A string is a shell command line: ``bash -c COMMAND``. Not ``bash -lc``: a login shell reads
``/etc/profile``, and Debian's (most task images) resets ``PATH`` to a fixed list, hiding
what the image's ``ENV PATH=...`` put first (a venv, conda, a toolchain under /opt). The
task's tests and the agent must see the environment the image declares. A sequence is an
argv and runs as is.
"""

from __future__ import annotations

from collections.abc import Sequence


def command_argv(command: str | Sequence[str]) -> list[str]:
    """``["bash", "-c", command]`` for a string, the argv itself for a sequence."""
    if isinstance(command, str):
        return ["bash", "-c", command]
    argv = list(command)
    if not argv:
        raise ValueError("exec() was given an empty argv; pass a command string or [program, ...]")
    return argv
