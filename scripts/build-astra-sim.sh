#!/usr/bin/env bash
# Build the ASTRA-sim analytical binaries that ccbench's exporter is checked against, at the
# commit the checks were made with, and print the line that points ccbench at them.
#
#   bash scripts/build-astra-sim.sh [DEST]        # default DEST: ~/.cache/ccbench/astra-sim
#
# Needs git, cmake, a C++17 compiler and protobuf (Debian: apt-get install -y git cmake g++
# libprotobuf-dev protobuf-compiler); about 10 minutes on 2 cores. The tests that run the
# binaries (tests/test_model_astra_binary.py, tests/test_trace_astra_binary.py) skip without
# them and say so in pytest's last lines; with CCBENCH_ASTRA_SIM_BIN set they run.
set -euo pipefail
commit=c459ab61193bdb5b663ab61d2e923314dae8a77f
dest=${1:-"$HOME/.cache/ccbench/astra-sim"}
src="$dest/src"
mkdir -p "$dest/bin"
if [ ! -d "$src/.git" ]; then
    git clone --quiet https://github.com/astra-sim/astra-sim.git "$src"
fi
git -C "$src" checkout --quiet "$commit"
git -C "$src" submodule update --init --recursive --quiet
bash "$src/build/astra_analytical/build.sh"
for name in AstraSim_Analytical_Congestion_Unaware AstraSim_Analytical_Congestion_Aware; do
    found=$(find "$src/build/astra_analytical" -type f -name "$name" -perm -u+x | head -n 1)
    [ -n "$found" ] || { echo "build-astra-sim: $name was not built" >&2; exit 1; }
    cp "$found" "$dest/bin/$name"
done
echo "export CCBENCH_ASTRA_SIM_BIN=$dest/bin"
