"""Errors meant for people: each says what was wrong, with the value, and what to do next."""


class SlrError(Exception):
    """Base of every error ``slr`` raises on purpose. ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class UsageError(SlrError):
    """The user asked for something that cannot be (bad config, unknown plugin)."""

    exit_code = 2


class ConfigError(UsageError):
    """A config key or value is invalid."""


class PluginError(SlrError):
    """A plugin is broken: bad hook implementation, duplicate name, factory that won't import."""


class UnknownPluginError(UsageError):
    """A plugin name was asked for that no installed distribution registers."""
