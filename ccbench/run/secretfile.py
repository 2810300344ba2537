"""The run's secret in a file only this user can read, for ranks that share a host but no
private channel (torchrun: its rendezvous store has no authentication, so anything put there
is anyone's who reaches it).

Rank 0 writes a fresh secret to a new file, mode 0600, that it creates itself (O_EXCL) in
$XDG_RUNTIME_DIR when that is this user's private directory, else in the temporary directory
(sticky: nobody else can replace a file there), and publishes only the file's path. A rank
opens the path without following links and believes it only if it is a regular file of this
user that nobody else may read or write: a path someone else put in the store names a file of
theirs, which is refused. Rank 0 removes the file once every rank has proven the secret (or
when it ends).

CCBENCH_CONTROL_SECRET_FILE names such a file that you made (for ranks on several hosts that
share a file system): the same checks apply.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Callable

from ccbench.errors import RunFailure, UsageError

__all__ = ["SECRET_FILE_VAR", "read_secret_file", "remove_when", "remove_written",
           "secret_from_file_var", "write_secret_file"]

#: a file that holds the run's secret (yours: the ranks of every host must read it)
SECRET_FILE_VAR = "CCBENCH_CONTROL_SECRET_FILE"
_MOST_BYTES = 4096
_SECRET = re.compile(r"[!-~]{16,1024}")        # printable, no spaces; at least 16 characters


def _private_dir() -> str:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            seen = os.stat(runtime)
        except OSError:
            seen = None
        if seen is not None and stat.S_ISDIR(seen.st_mode) and seen.st_uid == os.geteuid() \
                and not seen.st_mode & 0o077:
            return runtime
    return tempfile.gettempdir()


def write_secret_file(secret: str) -> str:
    """A new file of this user, mode 0600, that holds `secret`; returns its path."""
    fd, path = tempfile.mkstemp(prefix="ccbench-secret-", dir=_private_dir())
    try:
        os.write(fd, secret.encode())
    finally:
        os.close(fd)
    atexit.register(_remove, path)
    _WRITTEN.add(path)
    return path


#: the secret files this process wrote and has not removed yet
_WRITTEN: set[str] = set()


def remove_written() -> None:
    """Remove every secret file this process wrote: before os._exit, which skips atexit (a
    rank that ends at once when the launcher stops it, or that skips MPI_Finalize)."""
    for path in list(_WRITTEN):
        _remove(path)


def read_secret_file(path: str, what: str) -> str:
    """The secret in `path`, which must be a regular file of this user that no one else may
    read or write (`what` says where the path came from, for the error)."""
    if not os.path.isabs(path):
        raise RunFailure(f"{what}: {path!r} is not an absolute path")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise RunFailure(f"{what}: cannot open {path} ({exc.strerror})") from None
    try:
        seen = os.fstat(fd)
        if not stat.S_ISREG(seen.st_mode) or seen.st_uid != os.geteuid() \
                or seen.st_mode & 0o077:
            raise RunFailure(f"{what}: {path} is not a private file of this user (it must be a "
                             f"regular file of uid {os.geteuid()}, mode 0600 or less); the run's "
                             f"secret is never taken from a file anyone else could have written")
        text = os.read(fd, _MOST_BYTES + 1)
    finally:
        os.close(fd)
    secret = text.decode(errors="replace").strip()
    if len(text) > _MOST_BYTES or not _SECRET.fullmatch(secret):
        raise RunFailure(f"{what}: {path} does not hold a secret (one line of 16 to 1024 "
                         f"printable characters, no spaces)")
    return secret


def secret_from_file_var() -> str | None:
    """The secret in the file CCBENCH_CONTROL_SECRET_FILE names, if it is set."""
    path = os.environ.get(SECRET_FILE_VAR)
    if not path:
        return None
    try:
        return read_secret_file(path, SECRET_FILE_VAR)
    except RunFailure as exc:
        raise UsageError(str(exc)) from None


def remove_when(path: str, done: Callable[[], bool], limit_s: float) -> None:
    """Remove `path` once `done()` (every rank has read it), or after `limit_s`."""
    def wait() -> None:
        deadline = time.monotonic() + limit_s
        while not done() and time.monotonic() < deadline:
            time.sleep(0.1)
        _remove(path)

    threading.Thread(target=wait, name="ccbench-secret-file", daemon=True).start()


def _remove(path: str) -> None:
    _WRITTEN.discard(path)
    with contextlib.suppress(OSError):
        os.unlink(path)
