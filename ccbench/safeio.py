"""Reading what a user hands us (records, traces, model files, sweep files) within bounds.

Every limit ends the command with one `ccbench: error:` line naming the file, the limit and
how to raise it, before memory or the stack runs out (docs/input-limits.md):

- JSON nested deeper than MAX_JSON_DEPTH (Python's decoder recurses once per level);
- a whole-file read, or a gzip stream once inflated, larger than the input cap
  (CCBENCH_MAX_INPUT_BYTES, default 512 MiB), read in chunks so a bomb stops at the cap;
- one line of a results file longer than MAX_LINE_BYTES;
- YAML whose aliases expand to more than MAX_YAML_NODES nodes (a "billion laughs");
- more than MAX_INPUT_LINES lines (blank ones too) in the results one command reads, and
  more than the input cap of inflated gzip data across them, so a small gzip of a billion
  newlines ends in seconds;
- a FIFO, a device or anything else that is not a regular file (it could block for ever);
- a trace whose parsed form would not fit in the memory this machine has available.

And what ccbench writes for a user goes through `write_atomic` (a whole file: a temporary file
in the same folder, fsynced, renamed over the target) or the records appender: an output that
is a symbolic link is refused, never followed, and an OSError (a full disk, permission) ends
the command with one line naming the file (`output_error`).
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import json
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from ccbench.errors import UsageError
from ccbench.units import size_text

__all__ = ["MAX_JSON_DEPTH", "MAX_LINE_BYTES", "MAX_YAML_NODES", "InputTooLarge", "ReadBudget",
           "check_json_depth", "check_memory", "check_not_symlink", "inflated_size", "input_cap",
           "json_too_deep", "line_cap", "load_json", "load_yaml", "open_input", "open_lines",
           "output_error", "read_input", "read_lines", "scaled_size", "write_atomic"]

MAX_JSON_DEPTH = 100            # records need 3 levels, PyTorch execution traces about 8
MAX_LINE_BYTES = 64 << 20       # one record: a million samples is ~20 MB of text
MAX_YAML_NODES = 100_000        # a sweep file is a few hundred nodes, aliases expanded
CAP_ENV = "CCBENCH_MAX_INPUT_BYTES"
LINES_ENV = "CCBENCH_MAX_INPUT_LINES"
_DEFAULT_LINES = 4_000_000      # a results line is a record of 1 KB or more: 4 GB of records
MEMORY_ENV = "CCBENCH_TRACE_MEMORY"   # bytes a trace may take in memory, instead of MemAvailable
_DEFAULT_CAP = 512 << 20
_CHUNK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
# a JSON string (escapes included), then every byte that is no bracket and no newline
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b"[]{}\n")


class InputTooLarge(UsageError):
    """A file (or its inflated stream) beyond the input cap."""


def _env_count(name: str, default: int, what: str) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(float(text))
    except ValueError:
        raise UsageError(f"{name}={text!r} is not a number of {what}") from None
    if value < 1:
        raise UsageError(f"{name}={text!r} must be a positive number of {what}")
    return value


def input_cap() -> int:
    """Bytes a whole-file read or an inflated gzip stream may hold (CCBENCH_MAX_INPUT_BYTES)."""
    return _env_count(CAP_ENV, _DEFAULT_CAP, "bytes")


def line_cap() -> int:
    """Lines (blank ones too) the results one command reads may hold (CCBENCH_MAX_INPUT_LINES)."""
    return _env_count(LINES_ENV, _DEFAULT_LINES, "lines")


def _too_large(path: object, cap: int, what: str, fixed: str | None = None) -> InputTooLarge:
    """`fixed`: why a cap of its own (a model, a sweep file) is enough; else the variable."""
    how = fixed or f"set {CAP_ENV}=<bytes> to raise it"
    return InputTooLarge(f"{path}: {what} more than {size_text(cap)}, the "
                         f"{'limit' if fixed else 'input cap'} (refused before reading further; "
                         f"{how})")


def open_input(path: str | os.PathLike[str]) -> IO[bytes]:
    """A file opened for reading, refused (UsageError) unless it is a regular file: a FIFO
    would block for ever, a device never end. Opened without blocking, checked on the
    descriptor itself, so nothing is swapped in between. OSError as open() raises it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                    else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
            raise UsageError(f"{path}: {kind}, not a regular file (refused unread: ccbench "
                             f"reads files only)")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _open_maybe_gzip(path: str | os.PathLike[str]) -> tuple[IO[bytes], bool]:
    """(the stream, whether it is inflated): gzip by its magic bytes, whatever the name."""
    raw = open_input(path)
    try:
        packed = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
    except BaseException:
        raw.close()
        raise
    if packed:
        return gzip.GzipFile(fileobj=raw, mode="rb"), True    # type: ignore[return-value]
    return raw, False


def _read_capped(handle: IO[bytes] | gzip.GzipFile, cap: int, path: object, what: str,
                 fixed: str | None = None) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        chunk = handle.read(min(_CHUNK, cap + 1 - total))
        if not chunk:
            return b"".join(parts)
        total += len(chunk)
        if total > cap:
            raise _too_large(path, cap, what, fixed)
        parts.append(chunk)


def read_input(path: str | os.PathLike[str], cap: int | None = None,
               fixed: str | None = None) -> bytes:
    """A whole regular file's bytes, inflated when it is gzip (by its magic bytes), at most
    `cap` (default: the input cap; `fixed` says why a cap of its own is enough, instead of
    naming the variable); InputTooLarge beyond it, OSError as open() raises it."""
    limit = input_cap() if cap is None else cap
    handle, packed = _open_maybe_gzip(path)
    with handle:
        if packed:
            try:
                return _read_capped(handle, limit, path, "inflates to", fixed)
            except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
                raise UsageError(f"{path}: unreadable gzip data ({exc})") from None
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise _too_large(path, limit, f"{size_text(size)} is", fixed)
        return _read_capped(handle, limit, path, "holds", fixed)


def inflated_size(path: str | os.PathLike[str], cap: int | None = None) -> int:
    """Bytes a file holds once inflated, counted by inflating it (every gzip member: a
    trailer of the last one alone can say 0), stopping past `cap` (default the input cap),
    beyond which a read refuses the file anyway; a plain file's size."""
    limit = input_cap() if cap is None else cap
    handle, packed = _open_maybe_gzip(path)
    with handle:
        if not packed:
            return os.fstat(handle.fileno()).st_size
        total = 0
        try:
            while total <= limit:
                chunk = handle.read(_CHUNK)
                if not chunk:
                    break
                total += len(chunk)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise UsageError(f"{path}: unreadable gzip data ({exc})") from None
        return total


def scaled_size(path: str | os.PathLike[str]) -> int:
    """Kept for callers: the inflated size (inflated_size)."""
    return inflated_size(path)


class ReadBudget:
    """What one command may read across all its results files: inflated gzip bytes (the input
    cap) and lines, blank ones too (MAX_INPUT_LINES), so neither a bomb nor a folder of them
    keeps a command busy for more than seconds."""

    def __init__(self, cap: int | None = None, lines: int | None = None) -> None:
        self.cap = input_cap() if cap is None else cap
        self.lines = line_cap() if lines is None else lines
        self.inflated = 0
        self.read_lines = 0

    def take(self, path: object, raw: bytes, packed: bool) -> None:
        self.read_lines += 1
        if self.read_lines > self.lines:
            raise InputTooLarge(f"{path}: more than {self.lines:,} lines read (blank lines too), "
                                f"the line cap (refused before reading further; set "
                                f"{LINES_ENV}=<lines> to raise it)")
        if packed:
            self.inflated += len(raw)
            if self.inflated > self.cap:
                raise _too_large(path, self.cap, "inflates to")


def open_lines(path: Path, cap: int | None = None,
               budget: ReadBudget | None = None) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of a text file, gzip or not, streamed: a line longer than
    MAX_LINE_BYTES, or a read beyond the budget (inflated bytes, lines; one per file unless
    the caller shares one across files) ends it with one error line.
    Unreadable compressed data raises zlib.error / EOFError / OSError for the caller."""
    spend = budget or ReadBudget(cap)
    handle, packed = _open_maybe_gzip(path)
    with handle:
        number = 0
        while True:
            raw = handle.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            number += 1
            spend.take(path, raw, packed)
            if len(raw) > MAX_LINE_BYTES:
                raise UsageError(f"{path}:{number}: a line longer than "
                                 f"{size_text(MAX_LINE_BYTES)} (no record is that long)")
            yield number, raw


def read_lines(path: str | os.PathLike[str], cap: int | None = None) -> list[bytes]:
    """A whole file's lines (read_input's bounds), refused beyond the line cap before they
    are split."""
    data = read_input(path, cap)
    lines = line_cap()
    if data.count(b"\n") > lines:
        raise InputTooLarge(f"{path}: more than {lines:,} lines, the line cap (refused before "
                            f"reading further; set {LINES_ENV}=<lines> to raise it)")
    return data.splitlines()


# -- writing ----------------------------------------------------------------------------------

def check_not_symlink(path: str | os.PathLike[str], flag: str = "-o") -> None:
    """Refuse an output that is a symbolic link: writing through it would change the file it
    points at, which the user did not name."""
    if os.path.islink(path):
        raise UsageError(f"{flag} {os.fspath(path)!r} is a symbolic link (refused: an output "
                         f"is never written through a link; name the file itself)")


def output_error(exc: OSError, path: str | os.PathLike[str], verb: str = "write") -> UsageError:
    """One line for an OSError while writing an output (a full disk, permission denied)."""
    where = exc.filename if exc.filename is not None else os.fspath(path)
    return UsageError(f"cannot {verb} {os.fspath(where)!r}: {exc.strerror or exc}")


def write_atomic(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None],
                 flag: str = "-o") -> None:
    """Replace `path` as a whole or not at all: `write` fills a temporary file in the same
    folder, which is fsynced and renamed over `path` (then the folder is fsynced). A failure
    (a full disk) removes the temporary file and leaves what `path` held; it ends the command
    with one line (UsageError). A `path` that is a symbolic link is refused."""
    target = os.fspath(path)
    check_not_symlink(target, flag)
    folder = os.path.dirname(target) or "."
    tmp = os.path.join(folder, f".{os.path.basename(target)}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        check_not_symlink(target, flag)
        os.replace(tmp, target)
        with contextlib.suppress(OSError):
            folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(folder_fd)
            finally:
                os.close(folder_fd)
    except OSError as exc:          # named by the target, not the temporary file
        raise UsageError(f"cannot write {target!r}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def json_too_deep(data: bytes, limit: int = MAX_JSON_DEPTH) -> int | None:
    """The line (from 1) where JSON text nests deeper than `limit`, else None; checked on the
    bytes (strings removed, brackets counted) before a recursive decoder sees them."""
    if data.count(b"[") + data.count(b"{") <= limit:          # cannot be deeper: most lines
        return None
    structure = _JSON_STRING.sub(b"", data).translate(None, _NOT_STRUCTURE)
    codes = np.frombuffer(structure, dtype=np.uint8)
    steps = np.zeros(len(codes), dtype=np.int32)
    steps[(codes == ord("[")) | (codes == ord("{"))] = 1
    steps[(codes == ord("]")) | (codes == ord("}"))] = -1
    deep = np.flatnonzero(np.cumsum(steps) > limit)
    if not len(deep):
        return None
    return 1 + int(np.count_nonzero(codes[:deep[0]] == ord("\n")))


def check_json_depth(data: bytes, where: str, first_line: int = 1) -> None:
    """UsageError `<where>:<line>: JSON nested more than ...` for text too deep to decode."""
    line = json_too_deep(data)
    if line is not None:
        raise UsageError(f"{where}:{first_line - 1 + line}: JSON nested more than "
                         f"{MAX_JSON_DEPTH} levels deep (no ccbench input nests that deep)")


def load_json(path: str | os.PathLike[str], cap: int | None = None,
              fixed: str | None = None) -> Any:
    """One JSON document from a regular file (gzip or not) within the input cap (or `cap`,
    see read_input) and the depth limit. ValueError (json.JSONDecodeError,
    UnicodeDecodeError) for text that is not JSON; UsageError for a limit; OSError as open()
    raises it."""
    data = read_input(path, cap, fixed)
    check_json_depth(data, str(path))
    try:
        return json.loads(data)
    except RecursionError:      # the check above stops this; kept so no traceback can
        raise UsageError(f"{path}: JSON nested too deep to read") from None


def check_memory(what: str, need: int) -> None:
    """Refuse, before parsing, input whose parsed form needs more than this process can get
    (MemAvailable, the cgroup's limit and the room left under RLIMIT_AS, `ulimit -v`;
    CCBENCH_TRACE_MEMORY overrides)."""
    from ccbench.sysinfo import available_memory

    text = os.environ.get(MEMORY_ENV, "").strip()
    try:
        have = int(float(text)) if text else available_memory()
    except ValueError:
        raise UsageError(f"{MEMORY_ENV}={text!r} is not a number of bytes") from None
    if have is not None and need > have:
        raise UsageError(f"{what} needs about {size_text(need)} of memory to read, more than "
                         f"the {size_text(have)} available (refused before reading; set "
                         f"{MEMORY_ENV}=<bytes> to allow more)")


# -- YAML ------------------------------------------------------------------------------------

def _expanded_nodes(root: Any) -> int:
    """Nodes the document holds once every alias is expanded (aliases share one node object,
    so this counts each shared node once per reference); -1 for a recursive alias."""
    import yaml

    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        children: list[Any] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        if done:
            open_nodes.discard(key)
            sizes[key] = min(1 + sum(sizes[id(c)] for c in children), MAX_YAML_NODES + 1)
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            return -1
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
        if any(id(c) in open_nodes for c in children):
            return -1
    return sizes[id(root)]


def load_yaml(path: str | os.PathLike[str], text: str) -> Any:
    """yaml.safe_load that refuses, before building anything, aliases expanding to more than
    MAX_YAML_NODES nodes, recursive aliases and nesting deeper than Python's stack."""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise UsageError(f"{path}: YAML nested too deep to read") from None
        if node is None:
            return None
        nodes = _expanded_nodes(node)
        if nodes < 0:
            raise UsageError(f"{path}: a YAML alias refers to the node that holds it "
                             f"(recursive aliases are refused)")
        if nodes > MAX_YAML_NODES:
            raise UsageError(f"{path}: YAML aliases expand to more than {MAX_YAML_NODES:,} "
                             f"nodes (refused as an alias bomb; a sweep file needs a few "
                             f"hundred)")
        return loader.construct_document(node)
    finally:
        loader.dispose()
