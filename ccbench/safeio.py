"""Reading what a user hands us (records, traces, model files, sweep files) within bounds.

Every limit ends the command with one `ccbench: error:` line naming the file, the limit and
how to raise it, before memory or the stack runs out (docs/input-limits.md):

- JSON nested deeper than MAX_JSON_DEPTH (Python's decoder recurses once per level);
- a whole-file read, or a gzip stream once inflated, larger than the input cap
  (CCBENCH_MAX_INPUT_BYTES, default 512 MiB), read in chunks so a bomb stops at the cap;
- one line of a results file longer than MAX_LINE_BYTES;
- YAML whose aliases expand to more than MAX_YAML_NODES nodes (a "billion laughs");
- a trace whose parsed form would not fit in the memory this machine has available.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from ccbench.errors import UsageError
from ccbench.units import size_text

__all__ = ["MAX_JSON_DEPTH", "MAX_LINE_BYTES", "MAX_YAML_NODES", "InputTooLarge",
           "check_json_depth", "check_memory", "input_cap", "json_too_deep", "load_json", "load_yaml",
           "open_lines", "read_input", "scaled_size"]

MAX_JSON_DEPTH = 100            # records need 3 levels, PyTorch execution traces about 8
MAX_LINE_BYTES = 64 << 20       # one record: a million samples is ~20 MB of text
MAX_YAML_NODES = 100_000        # a sweep file is a few hundred nodes, aliases expanded
CAP_ENV = "CCBENCH_MAX_INPUT_BYTES"
MEMORY_ENV = "CCBENCH_TRACE_MEMORY"   # bytes a trace may take in memory, instead of MemAvailable
_DEFAULT_CAP = 512 << 20
_CHUNK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
# a JSON string (escapes included), then every byte that is no bracket and no newline
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b"[]{}\n")


class InputTooLarge(UsageError):
    """A file (or its inflated stream) beyond the input cap."""


def input_cap() -> int:
    """Bytes a whole-file read or an inflated gzip stream may hold (CCBENCH_MAX_INPUT_BYTES)."""
    text = os.environ.get(CAP_ENV, "").strip()
    if not text:
        return _DEFAULT_CAP
    try:
        cap = int(float(text))
    except ValueError:
        raise UsageError(f"{CAP_ENV}={text!r} is not a number of bytes") from None
    if cap < 1:
        raise UsageError(f"{CAP_ENV}={text!r} must be a positive number of bytes")
    return cap


def _too_large(path: object, cap: int, what: str) -> InputTooLarge:
    return InputTooLarge(f"{path}: {what} more than {size_text(cap)}, the input cap "
                         f"(refused before reading further; set {CAP_ENV}=<bytes> to raise it)")


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as probe:
        return probe.read(2) == _GZIP_MAGIC


def _read_capped(handle: IO[bytes] | gzip.GzipFile, cap: int, path: object, what: str) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        chunk = handle.read(min(_CHUNK, cap + 1 - total))
        if not chunk:
            return b"".join(parts)
        total += len(chunk)
        if total > cap:
            raise _too_large(path, cap, what)
        parts.append(chunk)


def read_input(path: str | os.PathLike[str], cap: int | None = None) -> bytes:
    """A whole file's bytes, inflated when it is gzip (by its magic bytes), at most `cap`
    (default: the input cap); InputTooLarge beyond it, OSError as open() raises it."""
    path = Path(path)
    limit = input_cap() if cap is None else cap
    if _is_gzip(path):
        with gzip.open(path, "rb") as handle:
            try:
                return _read_capped(handle, limit, path, "inflates to")
            except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
                raise UsageError(f"{path}: unreadable gzip data ({exc})") from None
    if path.stat().st_size > limit:
        raise _too_large(path, limit, f"{size_text(path.stat().st_size)} is")
    with open(path, "rb") as handle:
        return _read_capped(handle, limit, path, "holds")


def scaled_size(path: str | os.PathLike[str]) -> int:
    """Bytes a file holds once inflated: a gzip file's own trailer says (modulo 4 GiB, so
    never less than the compressed size), a plain file its size."""
    path = Path(path)
    size = path.stat().st_size
    if size < 18 or not _is_gzip(path):
        return size
    with open(path, "rb") as handle:
        handle.seek(-4, os.SEEK_END)
        return max(size, int.from_bytes(handle.read(4), "little"))


def open_lines(path: Path, cap: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of a text file, gzip or not, streamed: a line longer than
    MAX_LINE_BYTES or an inflated stream beyond the input cap ends it with one error line.
    Unreadable compressed data raises zlib.error / EOFError / OSError for the caller."""
    limit = input_cap() if cap is None else cap
    packed = _is_gzip(path)
    with (gzip.open(path, "rb") if packed else open(path, "rb")) as handle:
        total, number = 0, 0
        while True:
            raw = handle.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            number += 1
            total += len(raw)
            if packed and total > limit:
                raise _too_large(path, limit, "inflates to")
            if len(raw) > MAX_LINE_BYTES:
                raise UsageError(f"{path}:{number}: a line longer than "
                                 f"{size_text(MAX_LINE_BYTES)} (no record is that long)")
            yield number, raw


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


def load_json(path: str | os.PathLike[str], cap: int | None = None) -> Any:
    """One JSON document from a file (gzip or not) within the input cap and the depth limit.
    ValueError (json.JSONDecodeError, UnicodeDecodeError) for text that is not JSON;
    UsageError for a limit; OSError as open() raises it."""
    data = read_input(path, cap)
    check_json_depth(data, str(path))
    try:
        return json.loads(data)
    except RecursionError:      # the check above stops this; kept so no traceback can
        raise UsageError(f"{path}: JSON nested too deep to read") from None


def check_memory(what: str, need: int) -> None:
    """Refuse, before parsing, input whose parsed form needs more than this machine has
    available (MemAvailable and the cgroup's limit; CCBENCH_TRACE_MEMORY overrides)."""
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
