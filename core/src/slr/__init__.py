"""SWE-Lego-RL: online RL for coding agents in their native harnesses."""

from importlib.metadata import PackageNotFoundError, version

from slr.hookspecs import hookimpl

try:
    __version__ = version("slr-core")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0"

__all__ = ["__version__", "hookimpl"]
