"""Errors that mean "bad input, not a bug": the CLI prints their message alone and exits non-zero."""


class RetoolError(Exception):
    """Base of the errors the command line reports without a traceback."""


class ConfigError(RetoolError, ValueError):
    """A config value is wrong; the message names the key."""


class DataError(RetoolError, ValueError):
    """Bad input data; the message names the file (or dataset) and the line (or row)."""
