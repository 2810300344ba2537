"""Finding and loading oneCCL's C API library (libccl.so.2) and the libfabric it needs.

Where the library is looked for, first hit wins:

1. ``CCBENCH_ONECCL_LIB``: the path of a libccl.so* that exports the C API (or its directory);
2. ``CCL_ROOT``: a oneAPI (or ``scripts/install-oneccl.sh``) install: ``$CCL_ROOT/lib``;
3. ``<sys.prefix>/opt/oneccl/lib``: where ``scripts/install-oneccl.sh`` puts it by default;
4. ``<sys.prefix>/lib``: the ``oneccl`` + ``oneccl-cpu`` wheels pip-installed into the environment.

libccl.so.2 is a thin front end: on the first call it dlopens a plugin (for a CPU,
libccl_legacy_cpu.so next to it, which needs the CPU build of libccl.so.1), and the plugin
dlopens libfabric.so.1 when a communicator is made. libfabric is not on PyPI under that name;
the one in the ``impi-rt`` wheel works. Nothing here needs LD_LIBRARY_PATH: libfabric.so.1 is
preloaded with RTLD_GLOBAL (a later dlopen by soname finds it), and FI_PROVIDER_PATH is set
(unless the user set it) to the directory that holds its providers (libtcp-fi.so, ...).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["INSTALL_HINT", "OneCCLLib", "OneCCLLoadError", "find_library", "load"]

INSTALL_HINT = "set CCBENCH_ONECCL_LIB or run scripts/install-oneccl.sh"
_FRONT_END_NAMES = ("libccl.so.2", "libccl.so.2.0")
_PROVIDER_PROBE = "libtcp-fi.so"
_PLUGIN_EXCEPTION = 11      # what the front end returns when a plugin call throws (2022.2.0)


class OneCCLLoadError(Exception):
    """The library is missing or cannot be loaded; the message says why and what to do."""


@dataclass(frozen=True)
class Found:
    path: Path          # libccl.so.2 (or what CCBENCH_ONECCL_LIB names)
    source: str         # which rule found it


def _front_end_in(directory: Path) -> Path | None:
    for name in _FRONT_END_NAMES:
        if (directory / name).is_file():
            return directory / name
    return None


def find_library() -> Found:
    """Where libccl.so.2 is; raises OneCCLLoadError naming what was tried."""
    explicit = os.environ.get("CCBENCH_ONECCL_LIB")
    if explicit:
        path = Path(explicit)
        if path.is_dir():
            hit = _front_end_in(path)
            if hit is None:
                raise OneCCLLoadError(f"CCBENCH_ONECCL_LIB={explicit} is a directory without "
                                      "libccl.so.2")
            return Found(hit, "CCBENCH_ONECCL_LIB")
        if not path.is_file():
            raise OneCCLLoadError(f"CCBENCH_ONECCL_LIB={explicit} does not exist")
        return Found(path, "CCBENCH_ONECCL_LIB")
    tried = []
    root = os.environ.get("CCL_ROOT")
    if root:
        for sub in ("lib", "lib64", "lib/intel64"):
            hit = _front_end_in(Path(root) / sub)
            if hit is not None:
                return Found(hit, "CCL_ROOT")
        tried.append(f"CCL_ROOT={root}/lib")
    for directory, source in ((Path(sys.prefix) / "opt" / "oneccl" / "lib", "install-oneccl.sh"),
                              (Path(sys.prefix) / "lib", "pip wheels in sys.prefix")):
        hit = _front_end_in(directory)
        if hit is not None:
            return Found(hit, source)
        tried.append(str(directory))
    raise OneCCLLoadError(f"libccl.so not found (looked in {', '.join(tried)}): {INSTALL_HINT}")


def _find_libfabric(libdir: Path) -> Path | None:
    """The libfabric.so.1 to preload: next to libccl, then impi-rt's in sys.prefix, then
    an Intel MPI install; None leaves it to the system loader."""
    candidates = [libdir / "libfabric.so.1", libdir / "libfabric" / "libfabric.so.1",
                  Path(sys.prefix) / "lib" / "libfabric.so.1"]
    for var in ("I_MPI_ROOT",):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "opt" / "mpi" / "libfabric" / "lib"
                              / "libfabric.so.1")
    for path in candidates:
        if path.is_file():
            return path
    return None


def _provider_dir(fabric: Path) -> Path | None:
    for directory in (fabric.parent / "prov", fabric.parent / "libfabric", fabric.parent):
        if (directory / _PROVIDER_PROBE).is_file():
            return directory
    return None


class OneCCLLib:
    """The loaded front end with typed entry points (one instance per process)."""

    def __init__(self, found: Found) -> None:
        self.path = found.path
        self.source = found.source
        self.libfabric: Path | None = None
        self.provider_path: str | None = os.environ.get("FI_PROVIDER_PATH")
        fabric = _find_libfabric(found.path.parent)
        if fabric is not None:
            if self.provider_path is None:
                prov = _provider_dir(fabric)
                if prov is not None:
                    # libfabric reads it when it first initialises, i.e. at the first communicator
                    os.environ["FI_PROVIDER_PATH"] = self.provider_path = str(prov)
            try:
                ctypes.CDLL(str(fabric), mode=ctypes.RTLD_GLOBAL)
                self.libfabric = fabric
            except OSError as exc:
                raise OneCCLLoadError(f"cannot load {fabric}: {exc}") from None
        try:
            self.lib = ctypes.CDLL(str(found.path), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise OneCCLLoadError(f"cannot load {found.path}: {exc}") from None
        if not hasattr(self.lib, "onecclGetUniqueId"):
            raise OneCCLLoadError(f"{found.path} does not export the oneCCL C API "
                                  "(onecclGetUniqueId); it lives in libccl.so.2 (oneCCL >= "
                                  f"2021.17): {INSTALL_HINT}")
        self._declare()
        self.version_code = self._probe_version()

    def _declare(self) -> None:
        c = ctypes
        lib = self.lib
        res, vp, sz, i = c.c_int, c.c_void_p, c.c_size_t, c.c_int
        lib.onecclGetErrorString.restype = c.c_char_p
        lib.onecclGetErrorString.argtypes = [res]
        self.has_last_error = hasattr(lib, "onecclGetLastErrorString")
        if self.has_last_error:
            lib.onecclGetLastErrorString.restype = c.c_char_p
            lib.onecclGetLastErrorString.argtypes = []
        lib.onecclGetVersion.restype = res
        lib.onecclGetVersion.argtypes = [c.POINTER(c.c_int)]
        lib.onecclGetUniqueId.restype = res
        lib.onecclGetUniqueId.argtypes = [c.POINTER(UniqueId)]
        lib.onecclCommInitRank.restype = res
        lib.onecclCommInitRank.argtypes = [c.POINTER(vp), sz, UniqueId, i]
        lib.onecclCommDestroy.restype = res
        lib.onecclCommDestroy.argtypes = [vp]
        # (send, recv, count, dtype, op, comm, stream)
        for name in ("onecclAllReduce", "onecclReduceScatter"):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, [vp, vp, sz, i, i, vp, vp]
        # (send, recv, count, dtype, comm, stream)
        for name in ("onecclAllGather", "onecclAllToAll"):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, [vp, vp, sz, i, vp, vp]
        lib.onecclBroadcast.restype = res
        lib.onecclBroadcast.argtypes = [vp, vp, sz, i, i, vp, vp]
        # (send, recv, count, dtype, op, root, comm, stream)
        lib.onecclReduce.restype = res
        lib.onecclReduce.argtypes = [vp, vp, sz, i, i, i, vp, vp]
        # (buf, count, dtype, peer, comm, stream)
        for name in ("onecclSend", "onecclRecv"):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, [vp, sz, i, i, vp, vp]
        for name in ("onecclGroupStart", "onecclGroupEnd"):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, []

    def _probe_version(self) -> int:
        # the first call loads the plugin: a broken install fails here, not inside a run
        version = ctypes.c_int()
        rc = self.lib.onecclGetVersion(ctypes.byref(version))
        if rc != 0:
            raise OneCCLLoadError(
                f"{self.path}: onecclGetVersion failed: {self.error_text(rc)} (no usable plugin: "
                "libccl_legacy_cpu.so and the CPU libccl.so.1 must sit next to libccl.so.2; "
                f"rerun with CCL_LOG_LEVEL=info): {INSTALL_HINT}")
        return version.value

    @property
    def version(self) -> str:
        v = self.version_code
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"

    def error_text(self, rc: int) -> str:
        text = (self.lib.onecclGetErrorString(rc) or b"").decode(errors="replace")
        if rc == _PLUGIN_EXCEPTION and text.startswith("Unknown"):
            text = "the plugin raised an exception"     # 2022.2.0 has no string for it
        detail = ""
        if self.has_last_error:
            detail = (self.lib.onecclGetLastErrorString() or b"").decode(errors="replace").strip()
        return f"{text} (code {rc})" + (f": {detail}" if detail else "")


class UniqueId(ctypes.Structure):
    """onecclUniqueId: 4096 opaque bytes, passed by value to onecclCommInitRank."""

    SIZE = 4096
    _fields_ = [("internal", ctypes.c_char * 4096)]

    def to_bytes(self) -> bytes:
        return ctypes.string_at(ctypes.addressof(self), self.SIZE)

    @classmethod
    def from_bytes(cls, data: bytes) -> UniqueId:
        if len(data) != cls.SIZE:
            raise ValueError(f"onecclUniqueId must be {cls.SIZE} bytes, got {len(data)}")
        uid = cls()
        ctypes.memmove(ctypes.addressof(uid), data, cls.SIZE)
        return uid


_lock = threading.Lock()
_loaded: OneCCLLib | None = None
_failure: str | None = None


def load() -> OneCCLLib:
    """The process-wide library (loaded once); raises OneCCLLoadError with the reason."""
    global _loaded, _failure
    with _lock:
        if _loaded is not None:
            return _loaded
        if _failure is not None:
            raise OneCCLLoadError(_failure)
        try:
            _loaded = OneCCLLib(find_library())
        except OneCCLLoadError as exc:
            _failure = str(exc)
            raise
        return _loaded
