"""Errors phrased for the user: they name the key, file or rank, and the CLI prints them without a traceback."""


class ConfigError(ValueError):
    """A configuration problem, phrased for the user (names the key or file)."""
