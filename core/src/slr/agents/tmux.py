"""A private tmux server in the sandbox, for scaffolds that drive a terminal through tmux.

OpenHands' terminal tool and Terminus-2 type into tmux sessions. The core runs none of
this unless an adapter asks: an adapter wraps its command with ``with_tmux`` (the bundle's
tmux, copied from the host by ``bundle_recipes.host_tool``, on PATH after the image's own;
the server's socket folder in place), passes ``ENV`` to the scaffold, and gives ``end_tmux``
to ``run_scaffold(cleanup=...)``: the server daemonizes, so it is ended by name after the
run, timed out or not.
"""

from __future__ import annotations

from slr.agents.bundle_recipes import host_tools_bin
from slr.agents.headless import AGENT_DIR

#: The tmux server's socket folder, its own (no other tmux in the sandbox is touched).
TMUX_TMPDIR = f"{AGENT_DIR}/tmux"
#: The environment the scaffold runs with, so its tmux finds that folder.
ENV = {"TMUX_TMPDIR": TMUX_TMPDIR}


def with_tmux(root: str, command: str) -> str:
    """``command`` with the bundle's tmux on PATH (after the image's own) and its socket
    folder in place; ``root`` is where the bundle is mounted."""
    return f'export PATH="$PATH:{host_tools_bin(root)}"; mkdir -p {TMUX_TMPDIR} && {command}'


def end_tmux(root: str) -> str:
    """A shell line that ends the scaffold's tmux server (for ``run_scaffold(cleanup=)``)."""
    return f'PATH="$PATH:{host_tools_bin(root)}" TMUX_TMPDIR={TMUX_TMPDIR} tmux kill-server'
