"""Errors that mean "bad input, not a bug": the CLI prints their message alone and exits non-zero."""


class RetoolError(Exception):
    """Base of the errors the command line reports without a traceback."""


class ConfigError(RetoolError, ValueError):
    """A config value is wrong; the message names the key."""


class DataError(RetoolError, ValueError):
    """Bad input data; the message names the file (or dataset) and the line (or row)."""


class EngineRequestError(RetoolError):
    """The rollout engine refused or dropped one request (not the whole engine): that trajectory is void."""


class Resumable(RetoolError):
    """A failure the run continues from, at its last checkpoint: the CLI follows the message with the command that
    resumes it (the same one, with resume on and the run's folder)."""


class EngineTimeout(Resumable):
    """An engine call or weight sync did not return within rollout.engine_timeout_s."""
