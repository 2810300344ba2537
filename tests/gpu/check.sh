#!/usr/bin/env bash
# Every GPU check of ccbench in one script, one log, inside a fixed time.
#
#   tests/gpu/check.sh              on a machine with a CUDA (or ROCm) device
#   tests/gpu/check.sh --cpu-twin   the same steps on the CPU: the nccl backend's code over gloo
#                                   and CuPy replaced by host memory (tests the script itself)
#
# Steps, the fast and most telling first: the environment and doctor; nccl (torch) and
# nccl-cupy (CuPy's binding) at world size 1, every collective x dtype x op x mode, per-op
# then pipelined, validated from the records, and the two timings side by side; ccbench's
# algorithms over both at world 1 beside NCCL's own results; nccl-cupy with --cuda-graph; the
# two paths' allreduce side by side; every collective's bandwidth to 128 MiB; the algorithms as
# thread ranks at 2 and 4; the --nccl-algo/--nccl-proto settings in the record; in-process
# device checks; world size = devices when there are several; the mpi backend with CuPy
# buffers at 2 ranks; then the slow ones: thread ranks at 8, the pytest GPU tests.
#
# Time: each step has its own timeout (STEP_TIMEOUT, default 90 s; a few steps have more);
# no step starts once TIME_GUARD seconds (default 450) have passed since the start, and no
# step runs past TOTAL_LIMIT (default 480): on a device the whole run fits 8 minutes. A step
# that is not started says so in the log (SKIP ... time guard). ONLY=REGEX runs only the steps
# whose name matches (grep -E), to rerun the failed steps of an earlier run in one short call.
#
# Output, all under ${OUT:-./gpu-check-out}, written as it goes (a run cut short keeps what it
# had): gpu-check.log (everything), environment.txt (GPU, driver, CUDA, torch, NCCL, CuPy,
# mpi4py), doctor.json, steps.tsv (one line per step: result, seconds, timeout) and
# records.tar.gz (every step's records, records/<step>.jsonl, repacked after each step).
# No more than 6 files, none in a subfolder.
#
# Exit status: 0 all started steps passed; 1 a step failed; 3 no device (nothing checked)
# unless --cpu-twin.
set -u -o pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${OUT:-./gpu-check-out}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log="$out/gpu-check.log"
: > "$log"
exec > >(tee -a "$log") 2>&1

python="${PYTHON:-python3}"
# an absolute path: mpiexec's ranks must start this interpreter, not the first python3 on the
# PATH of the processes mpiexec spawns (on the device, /usr/bin/python3 without numpy)
python="$(command -v "$python" || echo "$python")"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"    # this tree, installed or not
export PYTHONUNBUFFERED=1
twin=0
[ "${1:-}" = "--cpu-twin" ] && twin=1
# the CPU twin runs on whatever CPU is there (a loaded 2-core one, say): its limits stretch
scale=1
[ "$twin" = 1 ] && scale="${TWIN_SCALE:-4}"
step_timeout=$(( ${STEP_TIMEOUT:-90} * scale ))
time_guard=$(( ${TIME_GUARD:-450} * scale ))
total_limit=$(( ${TOTAL_LIMIT:-480} * scale ))
work="$(mktemp -d "${TMPDIR:-/tmp}/ccbench-gpu-check.XXXXXX")"
records="$work/records"
mkdir -p "$records"
steps="$out/steps.tsv"
printf 'step\tresult\tseconds\ttimeout_s\n' > "$steps"
failed=0; passed=0; skipped=0
started=$SECONDS

say()  { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*"; }
note() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$steps"; }
pass() { passed=$((passed + 1)); say "PASS  $*"; }
fail() { failed=$((failed + 1)); say "FAIL  $*"; }
skip() { skipped=$((skipped + 1)); say "SKIP  $1"; note "$1" skip 0 -; }

# pack: every records file so far into $out/records.tar.gz (renamed into place: never torn)
pack() {
    [ -n "$(ls -A "$records")" ] || return 0
    tar -czf "$out/records.tar.gz.part" -C "$work" records && \
        mv -f "$out/records.tar.gz.part" "$out/records.tar.gz"
}
finish() {
    pack
    rm -rf "$work"
}
trap finish EXIT

# run [-t SECONDS] NAME CMD...: one step under its timeout (default STEP_TIMEOUT, times the twin
# scale), clamped to what TOTAL_LIMIT leaves; not started past TIME_GUARD
run() {
    local limit="$step_timeout"
    if [ "$1" = "-t" ]; then limit=$(( $2 * scale )); shift 2; fi
    local name="$1"; shift
    if [ -n "${ONLY:-}" ] && ! grep -qE -- "$ONLY" <<< "$name"; then
        say "skip  $name: not in ONLY=$ONLY"
        return 0
    fi
    local elapsed=$(( SECONDS - started ))
    if [ "$elapsed" -ge "$time_guard" ]; then
        skip "$name: time guard, ${elapsed} s of ${time_guard} s passed, not started"
        return 0
    fi
    local left=$(( total_limit - elapsed ))
    if [ "$left" -lt "$limit" ]; then
        say "note  $name: timeout ${limit} s cut to the ${left} s TOTAL_LIMIT leaves"
        limit="$left"
    fi
    say "----  $name (timeout ${limit} s): $*"
    local t0=$SECONDS rc=0
    timeout --kill-after=5 "$limit" "$@" || rc=$?
    local took=$(( SECONDS - t0 ))
    if [ "$rc" = 0 ]; then
        pass "$name (${took} s)"; note "$name" pass "$took" "$limit"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        fail "$name (timed out after ${limit} s)"; note "$name" timeout "$took" "$limit"
    else
        fail "$name (exit $rc, ${took} s)"; note "$name" "fail:$rc" "$took" "$limit"
    fi
    pack
}

say "ccbench GPU check in $repo, output in $out, python $python, twin=$twin"
say "limits: step ${step_timeout} s, no step starts after ${time_guard} s, all steps within ${total_limit} s"
say "git: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout')"

# the environment: what the records and the log were made on
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(hostname)"
    echo "git: $(git -C "$repo" rev-parse HEAD 2>/dev/null || echo 'not a git checkout')"
    echo "twin: $twin"
    if command -v nvidia-smi >/dev/null; then
        timeout 30 nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap \
            --format=csv,noheader | sed 's/^/nvidia-smi gpu: /'
        timeout 30 nvidia-smi | grep -o 'CUDA Version: [0-9.]*' | sed 's/^/nvidia-smi /'
    else
        echo "nvidia-smi: not found"
    fi
    command -v rocm-smi >/dev/null && timeout 30 rocm-smi --showproductname
    timeout 60 "$python" "$here/environment.py"
    echo "ccbench imported from: $(timeout 30 "$python" -c 'import ccbench; print(ccbench.__file__)' 2>&1)"
} > "$out/environment.txt" 2>&1
sed 's/^/env   /' "$out/environment.txt"

if ! "$python" -c "import ccbench, numpy, ml_dtypes" ; then
    fail "ccbench does not import with $python (set PYTHON=...; needs numpy, ml_dtypes, torch)"
    exit 1
fi
# the JSON form beside the table (in the background: it costs the same again)
timeout 60 "$python" -m ccbench doctor --format json > "$out/doctor.json" 2>/dev/null &
doctor_json=$!
run -t 60 "doctor" "$python" -m ccbench doctor
wait "$doctor_json" || say "note  doctor --format json: exit $?"

if [ "$twin" = 1 ]; then
    bench=("$python" "$here/ccbench_with.py" --nccl-twin --fake-cupy --cupy-mpi --)
    mpibench=("$python" "$here/ccbench_with.py" --fake-cupy --cupy-mpi --)
    algbench=("$python" "$here/ccbench_with.py" --fake-cupy --)
    gpus=1
    exact_sizes="8,1K,3000"; band_sizes="1K,64K"; mpi_sizes="8,1K,3000"
    side_sizes="8,1K,64K"; algo_sizes="1K,3000"; thread_size=3000; thread_flags=(--fake-cupy)
else
    reason="$(timeout 60 "$python" -c 'import sys; sys.path.insert(0, "'"$here"'"); import device_checks as d; print(d.skip_reason() or "")' 2>&1 | tail -1)"
    if [ -n "$reason" ]; then
        say "no usable device: $reason"
        say "SUMMARY  nothing checked (no device); run with --cpu-twin to test the steps on the CPU"
        exit 3
    fi
    bench=("$python" -m ccbench)
    # until the registry chooses the class by device, the driver maps mpi to its CuPy class
    mpibench=("$python" "$here/ccbench_with.py" --cupy-mpi --)
    algbench=("$python" -m ccbench)
    gpus="$(timeout 60 "$python" -c 'import torch; print(torch.cuda.device_count())')"
    exact_sizes="8,1K,3000,1M"; band_sizes="1M,16M,128M"; mpi_sizes="8,1K,3000,1M"
    side_sizes="8,1K,64K,1M,16M,64M"; algo_sizes="1K,3000,1M"; thread_size=64K; thread_flags=()
fi
gpu_backend="$("$python" -c 'import torch; print("rccl" if getattr(torch.version, "hip", None) else "nccl")' 2>/dev/null || echo nccl)"
[ "$twin" = 1 ] && gpu_backend=nccl
ops="sum,max,min,prod"
validate=("$python" "$here/validate_records.py")
algos="$("$python" -c 'from ccbench.backends.algorithmic import algorithm_names; print(" ".join(algorithm_names()))')"
# algo_list TRANSPORT: every algorithm over TRANSPORT, comma-separated
algo_list() { local a list=""; for a in $algos; do list="$list${list:+,}$a@$1"; done; echo "$list"; }
cupy_reason=""
if [ "$twin" = 0 ]; then
    cupy_reason="$(timeout 60 "$python" -c 'from ccbench.backends.nccl_cupy import NCCLCupyBackend as B; print(B.unavailable_reason() or "")' 2>&1 | tail -1)"
fi
natives=("$gpu_backend")
if [ -n "$cupy_reason" ]; then
    skip "nccl-cupy (every nccl-cupy step): $cupy_reason"
else
    natives+=(nccl-cupy)
fi
cupy_device=1
if [ "$twin" = 0 ] && ! timeout 60 "$python" -c "import cupy; assert cupy.cuda.runtime.getDeviceCount() > 0" 2>/dev/null; then
    cupy_device=0
fi

# 1. world size 1, every collective x dtype x op x mode, per-op then pipelined, validated
for timing in per-op pipelined; do
    for native in "${natives[@]}"; do
        rec="$records/$native-w1-$timing.jsonl"
        run "$native world 1 $timing, all collectives x dtypes x ops" \
            "${bench[@]}" all --backend "$native" --device cuda --sizes "$exact_sizes" \
            --dtype all --op "$ops" --timing "$timing" --pipeline 8 --iters 5 --warmup 2 \
            --check 1 --timeout 60 -q --output "$rec"
        run -t 30 "records of $native world 1 $timing" "${validate[@]}" "$rec" --backend "$native" \
            --world 1 --timing "$timing" --device cuda --ops "$ops" --full
    done
done
for native in "${natives[@]}"; do
    run -t 30 "$native per-op beside pipelined" "$python" "$here/timings_side_by_side.py" \
        "$records/$native-w1-per-op.jsonl" "$records/$native-w1-pipelined.jsonl"
done

# 2. ccbench's algorithms over both NCCL paths at world 1, beside NCCL's own result
# (the first CuPy kernels are compiled here: more time)
for native in "${natives[@]}"; do
    rec="$records/algorithms-$native-w1.jsonl"
    run -t 150 "algorithms over $native world 1" "${bench[@]}" all \
        --backend "$(algo_list "$native"),$native" --device cuda --sizes "$algo_sizes" \
        --dtype all --op "$ops" --iters 3 --warmup 1 --timeout 60 -q --output "$rec"
    run -t 30 "algorithms over $native exact beside $native" "${validate[@]}" "$rec" \
        --beside "$native" --world 1 --timing per-op
done

# 3. nccl-cupy in CUDA graphs; the two NCCL paths' allreduce side by side
if [ -z "$cupy_reason" ]; then
    rec="$records/nccl-cupy-w1-graph.jsonl"
    run "nccl-cupy world 1 --cuda-graph, all collectives" "${bench[@]}" all --backend nccl-cupy \
        --device cuda --cuda-graph --sizes 8,1K,3000 --dtype all --op sum,max --iters 5 \
        --warmup 2 --timeout 60 -q --output "$rec"
    run -t 30 "records of nccl-cupy --cuda-graph" "${validate[@]}" "$rec" --backend nccl-cupy \
        --world 1 --timing per-op --device cuda --ops sum,max --full
    rec="$records/nccl-paths-allreduce.jsonl"
    run "allreduce through torch ($gpu_backend) and CuPy (nccl-cupy)" "${bench[@]}" allreduce \
        --backend "$gpu_backend,nccl-cupy" --device cuda --sizes "$side_sizes" --dtype float32 \
        --iters 20 --warmup 5 --timeout 60 -q --output "$rec"
    run -t 30 "the two NCCL paths side by side" "$python" "$here/paths_side_by_side.py" "$rec" \
        --a "$gpu_backend" --b nccl-cupy
fi

# 4. bandwidth: every collective, float32, to 128 MiB, pipelined, through both paths
rec="$records/bandwidth-w1.jsonl"
run "bandwidth of every collective through ${natives[*]}" "${bench[@]}" all \
    --backend "$(IFS=,; echo "${natives[*]}")" --device cuda --sizes "$band_sizes" \
    --dtype float32 --op sum --timing pipelined --pipeline 10 --iters 10 --warmup 3 \
    --timeout 60 -q --output "$rec"

# 5. the algorithms' device code at 2 and 4 ranks as threads on one device, one stream each
if [ "$cupy_device" = 0 ]; then
    skip "algorithms as thread ranks: cupy is missing or sees no device"
else
    run -t 120 "every algorithm at 2 and 4 thread ranks on one device, exact" \
        "$python" "$here/thread_ranks.py" --worlds 2,4 --size "$thread_size" ${thread_flags[@]+"${thread_flags[@]}"}
fi

# 6. the library settings reach the record
rec="$records/$gpu_backend-settings.jsonl"
run -t 60 "$gpu_backend with --nccl-algo Ring --nccl-proto Simple" "${bench[@]}" allreduce \
    --backend "$gpu_backend" --device cuda --sizes 1M --nccl-algo Ring --nccl-proto Simple \
    --iters 3 --warmup 1 -q --output "$rec"
run -t 30 "settings in the record" "$python" -c "
from ccbench.records import load_records
r = load_records('$rec')[0]
e = r.environment
assert e['nccl_algo'] == 'Ring' and e['nccl_proto'] == 'Simple', e
assert e['backend']['NCCL_ALGO'] == 'Ring' and e['backend']['NCCL_PROTO'] == 'Simple', e['backend']
print('library', r.library, r.library_version, 'device', r.device, 'gpu', e.get('gpu'))"

# 7. in-process device checks (synchronize, pipelined, exactness through the backend)
if [ "$twin" = 0 ]; then
    run "device checks" "$python" "$here/device_checks.py"
else
    skip "in-process device checks: they time real device work"
fi

# 8. several devices: world size = devices, through the embedded launcher
if [ "$gpus" -ge 2 ] && [ "$twin" = 0 ]; then
    n=$(( gpus < 8 ? gpus : 8 ))
    for native in "${natives[@]}"; do
        rec="$records/$native-w$n.jsonl"
        run "$native world $n" "$python" -m ccbench launch -n "$n" all --backend "$native" \
            --sizes "$exact_sizes" --dtype all --op sum,max --iters 5 --warmup 2 -q \
            --timeout 60 --output "$rec"
        run -t 30 "records of $native world $n" "${validate[@]}" "$rec" --backend "$native" \
            --world "$n" --timing per-op --device cuda --ops sum,max --full
        rec="$records/algorithms-$native-w$n.jsonl"
        run -t 150 "algorithms over $native world $n" "$python" -m ccbench launch -n "$n" all \
            --backend "$(algo_list "$native"),$native" --sizes "$algo_sizes" --dtype all \
            --op "$ops" --iters 3 --warmup 1 --timeout 60 -q --output "$rec"
        run -t 30 "algorithms over $native world $n exact beside $native" "${validate[@]}" \
            "$rec" --beside "$native" --world "$n" --timing per-op
    done
else
    skip "nccl, nccl-cupy and the algorithms over them at world size > 1: $gpus device(s) here (one rank per device)"
fi

# 9. mpi with CuPy buffers at 2 ranks: every precondition is asked first, each under a short
# timeout, so a machine without a working MPI says why in one line instead of hanging
# Open MPI refuses to start as root unless told (device machines often run as root)
if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
bindir="$("$python" -c 'import os, sys; print(os.path.dirname(sys.executable))')"
mpiexec="${MPIEXEC:-$bindir/mpiexec}"
[ -x "$mpiexec" ] || mpiexec="$(command -v mpiexec || true)"
mpi_reason=""
# (the library names itself without MPI_Init, which a broken launcher setup can hang in)
if ! mpi_library="$(timeout 30 "$python" -c 'import mpi4py; mpi4py.rc.initialize = False
from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0].strip())' 2>&1)"; then
    mpi_reason="mpi4py cannot load an MPI library: $(echo "$mpi_library" | tail -1)"
elif [ -z "$mpiexec" ]; then
    mpi_reason="no mpiexec (looked for \$MPIEXEC, $bindir/mpiexec and mpiexec on PATH); mpi4py's library: $mpi_library"
elif [ "$cupy_device" = 0 ]; then
    mpi_reason="cupy is missing or sees no device"
fi
if [ -n "$mpi_reason" ]; then
    skip "mpi with CuPy buffers: $mpi_reason"
elif [ "$(( SECONDS - started ))" -ge "$time_guard" ]; then
    skip "mpi with CuPy buffers: time guard, $(( SECONDS - started )) s of ${time_guard} s passed, not started"
else
    say "MPI: $mpi_library; mpiexec $mpiexec"
    detected="$(timeout $(( 30 * scale )) env -u CCBENCH_MPI_CUDA_AWARE "$mpiexec" -n 1 "$python" -c '
from mpi4py import MPI
from ccbench.backends.cuda_mpi import cuda_support
aware, how = cuda_support(MPI)
print(int(aware), how)' 2>&1 | tail -1)"
    say "MPI CUDA support: ${detected:-unknown (mpiexec -n 1 gave nothing)}"
    modes="0"
    [ "${detected%% *}" = "1" ] && modes="0 1"
    [ "$twin" = 1 ] && modes="0 1"
    for aware in $modes; do
        label=$([ "$aware" = 1 ] && echo cuda-aware || echo host-staging)
        for timing in per-op pipelined; do
            rec="$records/mpi-cupy-$label-$timing.jsonl"
            run "mpi CuPy $label 2 ranks $timing" env CCBENCH_MPI_CUDA_AWARE="$aware" \
                "$mpiexec" -n 2 "${mpibench[@]}" all --backend mpi --device cuda \
                --sizes "$mpi_sizes" --dtype all --op sum,max --timing "$timing" --pipeline 8 \
                --iters 5 --warmup 2 --timeout 60 -q --output "$rec"
            run -t 30 "records of mpi CuPy $label $timing" "${validate[@]}" "$rec" --backend mpi \
                --world 2 --timing "$timing" --device cuda --buffers "$label"
        done
        # the algorithms' CuPy kernels at 2 ranks sharing one device (MPI allows it)
        rec="$records/algorithms-mpi-cupy-$label.jsonl"
        run -t 120 "ring/tree/hypercube@mpi CuPy $label 2 ranks" env CCBENCH_MPI_CUDA_AWARE="$aware" \
            "$mpiexec" -n 2 "${algbench[@]}" all --backend ring@mpi,tree@mpi,hypercube@mpi \
            --device cuda --sizes "$mpi_sizes" --dtype all --op "$ops" --iters 3 --warmup 1 \
            --timeout 60 -q --output "$rec"
        run -t 30 "records of the algorithms over mpi CuPy $label" "$python" -c "
from ccbench.records import load_records
rs = load_records('$rec')
assert rs and all(r.wrong == 0 for r in rs), [r.backend for r in rs if r.wrong]
assert {r.method['buffers'] for r in rs} == {'$label'}, {r.method['buffers'] for r in rs}
assert {r.environment['reductions'] for r in rs} == {'CupyReducer'}
print(len(rs), 'records exact:', sorted({r.backend for r in rs}), 'reductions in CuPy kernels')"
    done
fi

# 10. the slow ones: thread ranks at 8, then the pytest GPU tests (marked gpu; they skip with
# the reason when there is no device)
if [ "$cupy_device" = 1 ]; then
    run -t 150 "every algorithm at 8 thread ranks on one device, exact" \
        "$python" "$here/thread_ranks.py" --worlds 8 --size "$thread_size" ${thread_flags[@]+"${thread_flags[@]}"}
fi
if "$python" -c "import pytest" 2>/dev/null && [ "$twin" = 0 ]; then
    run -t 240 "pytest -m gpu" "$python" -m pytest -q -rs -m gpu -p no:cacheprovider \
        -o timeout=200 "$here"
else
    skip "pytest GPU tests (pytest missing or --cpu-twin)"
fi

say "SUMMARY  passed $passed, failed $failed, skipped $skipped in $(( SECONDS - started )) s; log $log"
[ "$failed" = 0 ]
