"""Errors a user can cause. The CLI prints them as one line and exits with code 2."""

import difflib


class AttnkitError(Exception):
    """A mistake in the user's input (file, option, config): reported as one line, no traceback."""


class DataError(AttnkitError):
    """A corpus file is missing, empty, misaligned or not valid UTF-8."""


class ConfigError(AttnkitError):
    """A config file, preset or override is invalid."""


class CheckpointError(AttnkitError):
    """A checkpoint is missing, truncated or of another kind."""


def did_you_mean(word: object, known, prefix: str = "") -> str:
    """"; did you mean 'x'?" for the closest known name, else the list of them. `word` as written: a YAML key may be
    a number, a boolean or null (tests/test_fuzz.py)."""
    word = str(word)
    close = difflib.get_close_matches(word, list(known), n=1) or sorted(
        (k for k in known if min(len(k), len(word)) >= 2 and (word.startswith(k) or k.startswith(word))),
        key=lambda k: -len(k))[:1]
    return f"; did you mean {prefix + close[0]!r}?" if close else f" (known: {', '.join(sorted(known))})"
