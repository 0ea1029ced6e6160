"""Errors a user can cause. The CLI prints them as one line and exits with code 2."""


class AttnkitError(Exception):
    """A mistake in the user's input (file, option, config): reported as one line, no traceback."""


class DataError(AttnkitError):
    """A corpus file is missing, empty, misaligned or not valid UTF-8."""


class ConfigError(AttnkitError):
    """A config file, preset or override is invalid."""


class CheckpointError(AttnkitError):
    """A checkpoint is missing, truncated or of another kind."""
