"""The one error of bad user input, raised by every room and shown as one line."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input. The message names the value given and what is allowed."""
