"""Errors that end a run with one clear line instead of a traceback."""

from __future__ import annotations

from collections.abc import Iterable


class UsageError(Exception):
    """Bad input from the user: printed as `ccbench: error: ...`, exit status 2."""

    exit_code = 2


class BackendUnavailable(UsageError):
    """A backend whose library, device or launcher is missing."""


class RunFailure(Exception):
    """A run that started but failed (timeout, dead rank, wrong results): exit status 1."""

    exit_code = 1


def choices_error(what: str, value: object, valid: Iterable[str]) -> UsageError:
    """`unknown collective 'foo' (valid: a, b, c)` in one place so every message looks alike."""
    return UsageError(f"unknown {what} {value!r} (valid: {', '.join(valid)})")


#: how every ccbench error line begins; a launcher finds the ranks' error lines by it
ERROR_PREFIX = "ccbench: error:"


def error_line(message: object) -> str:
    """The one line a failed command prints on stderr: `ccbench: error: MESSAGE`."""
    return f"{ERROR_PREFIX} {message}"


def is_error_line(line: str | bytes) -> bool:
    """Whether a line of a rank's or a command's stderr is its error line."""
    if isinstance(line, bytes):
        return line.startswith(ERROR_PREFIX.encode())
    return line.startswith(ERROR_PREFIX)
