#!/usr/bin/env bash
# Install a working CPU oneCCL (C API, libccl.so.2) for ccbench's `oneccl` backend.
#
#   scripts/install-oneccl.sh                 # into <active python's sys.prefix>/opt/oneccl
#   scripts/install-oneccl.sh /opt/oneccl     # into a directory of your choice
#   PYTHON=/path/to/python scripts/install-oneccl.sh
#   scripts/install-oneccl.sh --force [DIR]   # reinstall even if the stamp says it is there
#
# Why not `pip install oneccl`: the PyPI wheels do not work as published on a CPU machine.
#   * oneccl==2022.2.0 ships libccl.so.2 (the C API front end, which dlopens a plugin) and the
#     CPU plugin libccl_legacy_cpu.so, but its libccl.so.1 is the SYCL build (needs libsycl.so.9,
#     libsvml, ... from intel-sycl-rt);
#   * oneccl-cpu==2022.2.0 ships the CPU libccl.so.1 but not libccl.so.2, which it needs;
#   * both write lib/libccl.so, lib/libccl.so.1 and lib/libccl_openmp.so* into the same prefix
#     (whichever is installed last wins, uninstalling one breaks the other);
#   * both declare libfabric>=2.6, which is not on PyPI; libccl.so.1 dlopens libfabric.so.1 at
#     run time, and the libfabric of the `impi-rt` wheel (with its tcp/shm/rxm providers) works.
#
# So this script fetches the three wheels with `pip download --no-deps` (PyPI, or whatever
# index pip is configured with; nothing else is contacted) and copies exactly the files that
# make a working set into DIR/lib:
#   libccl.so.2, libccl_legacy_cpu.so   <- oneccl==2022.2.0
#   libccl.so.1 (CPU build)             <- oneccl-cpu==2022.2.0
#   libfabric.so.1, prov/lib{tcp,shm,rxm}-fi.so   <- impi-rt (copied from the environment when
#                                          impi-rt is installed there, else its 2021.18.1 wheel)
# Nothing is installed into site-packages and no MPI library is touched.
# At run time ccbench finds DIR through sys.prefix/opt/oneccl, CCL_ROOT=DIR or
# CCBENCH_ONECCL_LIB=DIR/lib/libccl.so.2, preloads DIR/lib/libfabric.so.1 and sets
# FI_PROVIDER_PATH=DIR/lib/prov itself: no LD_LIBRARY_PATH is needed.
#
# Idempotent: a stamp file records the versions; a second run with the same versions is a no-op.

set -euo pipefail

ONECCL_VERSION="${ONECCL_VERSION:-2022.2.0}"
IMPI_RT_VERSION="${IMPI_RT_VERSION:-2021.18.1}"

force=0
if [[ "${1:-}" == "--force" ]]; then force=1; shift; fi
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -n "${VIRTUAL_ENV:-}" && -x "${VIRTUAL_ENV}/bin/python" ]]; then
        PYTHON="${VIRTUAL_ENV}/bin/python"
    else
        PYTHON="$(command -v python3 || command -v python)"
    fi
fi
prefix="$("$PYTHON" -c 'import sys; print(sys.prefix)')"
target="${1:-${prefix}/opt/oneccl}"
mkdir -p "$target/lib/prov"
target="$(cd "$target" && pwd)"
stamp="$target/lib/.ccbench-oneccl"
# libfabric: from the environment's impi-rt (any version) when it is installed, else the wheel
fabric_src=""
env_impi="$("$PYTHON" -c 'from importlib import metadata
try:
    print(metadata.version("impi-rt"))
except metadata.PackageNotFoundError:
    pass')"
if [[ -n "$env_impi" && -f "$prefix/lib/libfabric.so.1" && -f "$prefix/lib/libtcp-fi.so" ]]; then
    fabric_src="$prefix/lib"
    IMPI_RT_VERSION="$env_impi"
fi

want="oneccl=${ONECCL_VERSION} oneccl-cpu=${ONECCL_VERSION} impi-rt-libfabric=${IMPI_RT_VERSION}"

files=(libccl.so.2 libccl_legacy_cpu.so libccl.so.1 libfabric.so.1
       prov/libtcp-fi.so prov/libshm-fi.so prov/librxm-fi.so)
complete=1
for f in "${files[@]}"; do [[ -f "$target/lib/$f" ]] || complete=0; done
if [[ $force == 0 && $complete == 1 && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "oneCCL already installed in $target ($want)"
    exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

pip_download() {
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
        --platform manylinux_2_28_x86_64 --python-version 3 --implementation py \
        --dest "$work" "$@"
}

echo "downloading oneccl==${ONECCL_VERSION} and oneccl-cpu==${ONECCL_VERSION} (pip, --no-deps)"
pip_download "oneccl==${ONECCL_VERSION}" "oneccl-cpu==${ONECCL_VERSION}"

if [[ -z "$fabric_src" ]]; then
    echo "downloading impi-rt==${IMPI_RT_VERSION} for its libfabric (pip, --no-deps)"
    pip_download "impi-rt==${IMPI_RT_VERSION}"
fi

"$PYTHON" - "$work" "$target/lib" "$ONECCL_VERSION" "$IMPI_RT_VERSION" "$fabric_src" <<'EOF'
import glob, os, shutil, sys, zipfile

work, lib, occl, impi, fabric_src = sys.argv[1:6]

def wheel(name, version):
    hits = glob.glob(os.path.join(work, f"{name}-{version}-*.whl"))
    if not hits:
        sys.exit(f"install-oneccl: {name}=={version} wheel was not downloaded")
    return zipfile.ZipFile(hits[0])

def extract(zf, member_suffix, dest):
    names = [n for n in zf.namelist() if n.endswith(member_suffix)]
    if not names:
        sys.exit(f"install-oneccl: {member_suffix} not found in {zf.filename}")
    tmp = dest + ".tmp"
    with zf.open(names[0]) as src, open(tmp, "wb") as out:
        shutil.copyfileobj(src, out)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dest)          # atomic: a reader never sees half a library

def copy(src, dest):
    tmp = dest + ".tmp"
    shutil.copyfile(src, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dest)

full = wheel("oneccl", occl)
cpu = wheel("oneccl_cpu", occl)
extract(full, "/data/lib/libccl.so.2", os.path.join(lib, "libccl.so.2"))
extract(full, "/data/lib/libccl_legacy_cpu.so", os.path.join(lib, "libccl_legacy_cpu.so"))
extract(cpu, "/data/lib/libccl.so.1", os.path.join(lib, "libccl.so.1"))
doc = os.path.join(os.path.dirname(lib), "share", "doc", "oneccl")
os.makedirs(doc, exist_ok=True)
extract(full, "/licensing/license.txt", os.path.join(doc, "license.txt"))
extract(full, "/licensing/third-party-programs.txt", os.path.join(doc, "third-party-programs.txt"))

providers = ("libtcp-fi.so", "libshm-fi.so", "librxm-fi.so")
if fabric_src:
    copy(os.path.join(fabric_src, "libfabric.so.1"), os.path.join(lib, "libfabric.so.1"))
    for p in providers:
        copy(os.path.join(fabric_src, p), os.path.join(lib, "prov", p))
else:
    impi_whl = wheel("impi_rt", impi)
    extract(impi_whl, "/lib/libfabric.so.1", os.path.join(lib, "libfabric.so.1"))
    for p in providers:
        extract(impi_whl, "/lib/" + p, os.path.join(lib, "prov", p))
EOF

echo "$want" > "$stamp"

# smoke test: the front end loads, finds its CPU plugin and reports its version
"$PYTHON" - "$target/lib" <<'EOF'
import ctypes, os, sys
lib = sys.argv[1]
os.environ.setdefault("FI_PROVIDER_PATH", os.path.join(lib, "prov"))
ctypes.CDLL(os.path.join(lib, "libfabric.so.1"), mode=ctypes.RTLD_GLOBAL)
ccl = ctypes.CDLL(os.path.join(lib, "libccl.so.2"), mode=ctypes.RTLD_GLOBAL)
v = ctypes.c_int()
rc = ccl.onecclGetVersion(ctypes.byref(v))
if rc != 0:
    sys.exit(f"install-oneccl: onecclGetVersion failed ({rc}); rerun with CCL_LOG_LEVEL=info")
print(f"oneCCL {v.value // 10000}.{v.value // 100 % 100}.{v.value % 100} installed in "
      f"{os.path.dirname(lib)}")
EOF
echo "use it: CCL_ROOT=$target (found automatically when it is <sys.prefix>/opt/oneccl)"
