#!/usr/bin/env bash
# Every GPU check of ccbench in one script, one log.
#
#   tests/gpu/check.sh              on a machine with a CUDA (or ROCm) device
#   tests/gpu/check.sh --cpu-twin   the same steps on the CPU: the nccl backend's code over gloo
#                                   and CuPy replaced by host memory (tests the script itself)
#
# Steps: doctor; both NCCL paths (nccl: torch.distributed, nccl-cupy: CuPy's binding) at world
# size 1 for every collective x dtype x op x mode, per-op and pipelined timing, validated from
# the records (--output); nccl-cupy with --cuda-graph; the two paths' allreduce side by side;
# ccbench's algorithms over both at world 1 beside NCCL's own results; the algorithms' device
# code at 2, 4 and 8 ranks as threads on one device (one stream each); nccl, nccl-cupy and the
# algorithms at world size = devices when there are several; the --nccl-algo/--nccl-proto
# settings reaching the record; in-process device checks (synchronize really waits, pipelined
# timing includes device work, every collective exact); the mpi backend and the algorithms
# over it with CuPy buffers at 2 ranks (host staging, and CUDA-aware when the MPI library says
# it is); the pytest GPU tests.
#
# Writes ${OUT:-./gpu-check-out}/gpu-check.log plus the records and reports it checked.
# Exit status: 0 all ran steps passed; 1 a step failed; 3 no device (nothing checked) unless
# --cpu-twin.
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
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"    # this tree, installed or not
twin=0
[ "${1:-}" = "--cpu-twin" ] && twin=1
step_timeout="${STEP_TIMEOUT:-420}"
failed=0; passed=0; skipped=0

say()  { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*"; }
pass() { passed=$((passed + 1)); say "PASS  $*"; }
fail() { failed=$((failed + 1)); say "FAIL  $*"; }
skip() { skipped=$((skipped + 1)); say "SKIP  $*"; }

# run NAME CMD...: one step, its own timeout, pass/fail by exit status
run() {
    local name="$1"; shift
    say "----  $name: $*"
    if timeout --kill-after=10 "$step_timeout" "$@"; then pass "$name"; else fail "$name (exit $?)"; fi
}

say "ccbench GPU check in $repo, output in $out, python $python, twin=$twin"
say "git: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
command -v rocm-smi >/dev/null && rocm-smi --showproductname

if ! "$python" -c "import ccbench, numpy, ml_dtypes" ; then
    fail "ccbench does not import with $python (set PYTHON=...; needs numpy, ml_dtypes, torch)"
    exit 1
fi
run "doctor" "$python" -m ccbench doctor
"$python" -m ccbench doctor --format json > "$out/doctor.json" 2>/dev/null

if [ "$twin" = 1 ]; then
    bench=("$python" "$here/ccbench_with.py" --nccl-twin --fake-cupy --cupy-mpi --)
    mpibench=("$python" "$here/ccbench_with.py" --fake-cupy --cupy-mpi --)
    algbench=("$python" "$here/ccbench_with.py" --fake-cupy --)
    gpus=1
    nccl_sizes="8,1K,3000"; big_sizes="1K,64K"; mpi_sizes="8,1K,3000"
    cupy_sizes="8,1K,3000"; side_sizes="8,1K,64K"; algo_sizes="1K,3000"
else
    reason="$("$python" -c 'import sys; sys.path.insert(0, "'"$here"'"); import device_checks as d; print(d.skip_reason() or "")')"
    if [ -n "$reason" ]; then
        say "no usable device: $reason"
        say "SUMMARY  nothing checked (no device); run with --cpu-twin to test the steps on the CPU"
        exit 3
    fi
    bench=("$python" -m ccbench)
    # until the registry chooses the class by device, the driver maps mpi to its CuPy class
    mpibench=("$python" "$here/ccbench_with.py" --cupy-mpi --)
    algbench=("$python" -m ccbench)
    gpus="$("$python" -c 'import torch; print(torch.cuda.device_count())')"
    nccl_sizes="8,1K,3000,1M,32M"; big_sizes="1K,1M,64M"; mpi_sizes="8,1K,3000,1M,16M"
    cupy_sizes="8,1K,3000,1M,8M"; side_sizes="8,1K,64K,1M,16M,64M"; algo_sizes="1K,3000,1M"
fi
gpu_backend="$("$python" -c 'import torch; print("rccl" if getattr(torch.version, "hip", None) else "nccl")' 2>/dev/null || echo nccl)"
[ "$twin" = 1 ] && gpu_backend=nccl
ops="sum,max,min,prod"
validate=("$python" "$here/validate_records.py")
algos="$("$python" -c 'from ccbench.backends.algorithmic import algorithm_names; print(" ".join(algorithm_names()))')"
# algo_list TRANSPORT: every algorithm over TRANSPORT, comma-separated
algo_list() { local a out=""; for a in $algos; do out="$out${out:+,}$a@$1"; done; echo "$out"; }
cupy_reason=""
if [ "$twin" = 0 ]; then
    cupy_reason="$("$python" -c 'from ccbench.backends.nccl_cupy import NCCLCupyBackend as B; print(B.unavailable_reason() or "")' 2>&1 | tail -1)"
fi

# 1. world size 1: every collective x dtype x op x mode, both timing modes, validated
for timing in per-op pipelined; do
    rec="$out/$gpu_backend-w1-$timing.jsonl"; rm -f "$rec"
    run "$gpu_backend world 1 $timing, all collectives x dtypes x ops" \
        "${bench[@]}" all --backend "$gpu_backend" --device cuda --sizes "$nccl_sizes" \
        --dtype all --op "$ops" --timing "$timing" --pipeline 8 --iters 5 --warmup 2 \
        --check 1 --timeout 120 -q --output "$rec"
    run "records of $gpu_backend world 1 $timing" "${validate[@]}" "$rec" --backend "$gpu_backend" \
        --world 1 --timing "$timing" --device cuda --ops "$ops" --full
done

# 1b. the direct NCCL path (nccl-cupy: CuPy's binding, out-of-place ncclAllReduce, own stream)
if [ -n "$cupy_reason" ]; then
    skip "nccl-cupy: $cupy_reason"
else
    for timing in per-op pipelined; do
        rec="$out/nccl-cupy-w1-$timing.jsonl"; rm -f "$rec"
        run "nccl-cupy world 1 $timing, all collectives x dtypes x ops" \
            "${bench[@]}" all --backend nccl-cupy --device cuda --sizes "$cupy_sizes" \
            --dtype all --op "$ops" --timing "$timing" --pipeline 8 --iters 5 --warmup 2 \
            --check 1 --timeout 120 -q --output "$rec"
        run "records of nccl-cupy world 1 $timing" "${validate[@]}" "$rec" --backend nccl-cupy \
            --world 1 --timing "$timing" --device cuda --ops "$ops" --full
    done
    rec="$out/nccl-cupy-w1-graph.jsonl"; rm -f "$rec"
    run "nccl-cupy world 1 --cuda-graph, all collectives" "${bench[@]}" all --backend nccl-cupy \
        --device cuda --cuda-graph --sizes 8,1K,3000 --dtype all --op sum,max --iters 5 \
        --warmup 2 --timeout 120 -q --output "$rec"
    run "records of nccl-cupy --cuda-graph" "${validate[@]}" "$rec" --backend nccl-cupy \
        --world 1 --timing per-op --device cuda --ops sum,max --full
    rec="$out/nccl-paths-allreduce.jsonl"; rm -f "$rec"
    run "allreduce through torch ($gpu_backend) and CuPy (nccl-cupy)" "${bench[@]}" allreduce \
        --backend "$gpu_backend,nccl-cupy" --device cuda --sizes "$side_sizes" --dtype float32 \
        --iters 20 --warmup 5 --timeout 120 -q --output "$rec"
    run "the two NCCL paths side by side" "$python" "$here/paths_side_by_side.py" "$rec" \
        --a "$gpu_backend" --b nccl-cupy
fi

# 1c. ccbench's algorithms over both NCCL paths at world 1, beside NCCL's own result
for native in "$gpu_backend" nccl-cupy; do
    if [ "$native" = nccl-cupy ] && [ -n "$cupy_reason" ]; then
        skip "algorithms over nccl-cupy: $cupy_reason"; continue
    fi
    rec="$out/algorithms-$native-w1.jsonl"; rm -f "$rec"
    run "algorithms over $native world 1" "${bench[@]}" all \
        --backend "$(algo_list "$native"),$native" --device cuda --sizes "$algo_sizes" \
        --dtype all --op "$ops" --iters 3 --warmup 1 --timeout 120 -q --output "$rec"
    run "algorithms over $native exact beside $native" "${validate[@]}" "$rec" --beside "$native" \
        --world 1 --timing per-op
done

# 1d. the algorithms' device code at 2, 4 and 8 ranks as threads on one device, one stream each
threads=(--worlds 2,4,8 --size 64K)
[ "$twin" = 1 ] && threads=(--worlds 2,4,8 --size 3000 --fake-cupy)
if [ "$twin" = 0 ] && ! "$python" -c "import cupy; assert cupy.cuda.runtime.getDeviceCount() > 0" 2>/dev/null; then
    skip "algorithms as thread ranks: cupy is missing or sees no device"
else
    run "every algorithm at 2/4/8 thread ranks on one device, exact" \
        "$python" "$here/thread_ranks.py" "${threads[@]}"
fi

# 2. large sizes, both timings (bandwidth sanity is in the table; validation in the records)
rec="$out/$gpu_backend-w1-large.jsonl"; rm -f "$rec"
run "$gpu_backend world 1 large allreduce/allgather" "${bench[@]}" allreduce,allgather \
    --backend "$gpu_backend" --device cuda --sizes "$big_sizes" --dtype float32,bfloat16 \
    --timing pipelined --pipeline 20 --iters 10 --warmup 3 --timeout 120 -q --output "$rec"

# 3. the library settings reach the record
rec="$out/$gpu_backend-settings.jsonl"; rm -f "$rec"
run "$gpu_backend with --nccl-algo Ring --nccl-proto Simple" "${bench[@]}" allreduce \
    --backend "$gpu_backend" --device cuda --sizes 1M --nccl-algo Ring --nccl-proto Simple \
    --iters 3 --warmup 1 -q --output "$rec"
run "settings in the record" "$python" -c "
from ccbench.records import load_records
r = load_records('$rec')[0]
e = r.environment
assert e['nccl_algo'] == 'Ring' and e['nccl_proto'] == 'Simple', e
assert e['backend']['NCCL_ALGO'] == 'Ring' and e['backend']['NCCL_PROTO'] == 'Simple', e['backend']
print('library', r.library, r.library_version, 'device', r.device, 'gpu', e.get('gpu'))"

# 4. several devices: world size = devices, through the embedded launcher
if [ "$gpus" -ge 2 ] && [ "$twin" = 0 ]; then
    n=$(( gpus < 8 ? gpus : 8 ))
    rec="$out/$gpu_backend-w$n.jsonl"; rm -f "$rec"
    run "$gpu_backend world $n" "$python" -m ccbench launch -n "$n" all --backend "$gpu_backend" \
        --sizes "$nccl_sizes" --dtype all --op sum,max --iters 5 --warmup 2 -q --timeout 120 \
        --output "$rec"
    run "records of $gpu_backend world $n" "${validate[@]}" "$rec" --backend "$gpu_backend" \
        --world "$n" --timing per-op --device cuda --ops sum,max --full
    if [ -z "$cupy_reason" ]; then
        rec="$out/nccl-cupy-w$n.jsonl"; rm -f "$rec"
        run "nccl-cupy world $n" "$python" -m ccbench launch -n "$n" all --backend nccl-cupy \
            --sizes "$nccl_sizes" --dtype all --op sum,max --iters 5 --warmup 2 -q --timeout 120 \
            --output "$rec"
        run "records of nccl-cupy world $n" "${validate[@]}" "$rec" --backend nccl-cupy \
            --world "$n" --timing per-op --device cuda --ops sum,max --full
    fi
    for native in "$gpu_backend" nccl-cupy; do
        [ "$native" = nccl-cupy ] && [ -n "$cupy_reason" ] && continue
        rec="$out/algorithms-$native-w$n.jsonl"; rm -f "$rec"
        run "algorithms over $native world $n" "$python" -m ccbench launch -n "$n" all \
            --backend "$(algo_list "$native"),$native" --sizes "$algo_sizes" --dtype all \
            --op "$ops" --iters 3 --warmup 1 --timeout 120 -q --output "$rec"
        run "algorithms over $native world $n exact beside $native" "${validate[@]}" "$rec" \
            --beside "$native" --world "$n" --timing per-op
    done
else
    skip "nccl, nccl-cupy and the algorithms over them at world size > 1: $gpus device(s) here (one rank per device)"
fi

# 5. in-process device checks (synchronize, pipelined, exactness through the backend)
if [ "$twin" = 0 ]; then
    run "device checks" "$python" "$here/device_checks.py"
else
    skip "in-process device checks: they time real device work"
fi

# 6. mpi with CuPy buffers at 2 ranks
mpiexec="${MPIEXEC:-$(dirname "$python")/mpiexec}"
[ -x "$mpiexec" ] || mpiexec="$(command -v mpiexec || true)"
if [ -z "$mpiexec" ]; then
    skip "mpi with CuPy buffers: no mpiexec"
elif ! "$python" -c "import mpi4py" 2>/dev/null; then
    skip "mpi with CuPy buffers: mpi4py is not installed"
elif [ "$twin" = 0 ] && ! "$python" -c "import cupy; assert cupy.cuda.runtime.getDeviceCount() > 0"; then
    skip "mpi with CuPy buffers: cupy is missing or sees no device"
else
    detected="$(timeout 120 env -u CCBENCH_MPI_CUDA_AWARE "$mpiexec" -n 1 "$python" -c '
from mpi4py import MPI
from ccbench.backends.cuda_mpi import cuda_support
aware, how = cuda_support(MPI)
print(int(aware), how)' | tail -1)"
    say "MPI CUDA support: ${detected:-unknown}"
    modes="0"
    [ "${detected%% *}" = "1" ] && modes="0 1"
    [ "$twin" = 1 ] && modes="0 1"
    for aware in $modes; do
        label=$([ "$aware" = 1 ] && echo cuda-aware || echo host-staging)
        for timing in per-op pipelined; do
            rec="$out/mpi-cupy-$label-$timing.jsonl"; rm -f "$rec"
            run "mpi CuPy $label 2 ranks $timing" env CCBENCH_MPI_CUDA_AWARE="$aware" \
                "$mpiexec" -n 2 "${mpibench[@]}" all --backend mpi --device cuda \
                --sizes "$mpi_sizes" --dtype all --op sum,max --timing "$timing" --pipeline 8 \
                --iters 5 --warmup 2 --timeout 120 -q --output "$rec"
            run "records of mpi CuPy $label $timing" "${validate[@]}" "$rec" --backend mpi \
                --world 2 --timing "$timing" --device cuda --buffers "$label"
        done
        # the algorithms' CuPy kernels at 2 ranks sharing one device (MPI allows it)
        rec="$out/algorithms-mpi-cupy-$label.jsonl"; rm -f "$rec"
        run "ring/tree/hypercube@mpi CuPy $label 2 ranks" env CCBENCH_MPI_CUDA_AWARE="$aware" \
            "$mpiexec" -n 2 "${algbench[@]}" all --backend ring@mpi,tree@mpi,hypercube@mpi \
            --device cuda --sizes "$mpi_sizes" --dtype all --op "$ops" --iters 3 --warmup 1 \
            --timeout 120 -q --output "$rec"
        run "records of the algorithms over mpi CuPy $label" "$python" -c "
from ccbench.records import load_records
rs = load_records('$rec')
assert rs and all(r.wrong == 0 for r in rs), [r.backend for r in rs if r.wrong]
assert {r.method['buffers'] for r in rs} == {'$label'}, {r.method['buffers'] for r in rs}
assert {r.environment['reductions'] for r in rs} == {'CupyReducer'}
print(len(rs), 'records exact:', sorted({r.backend for r in rs}), 'reductions in CuPy kernels')"
    done
fi

# 7. the pytest GPU tests (marked gpu; they skip with the reason when there is no device)
if "$python" -c "import pytest" 2>/dev/null && [ "$twin" = 0 ]; then
    run "pytest -m gpu" "$python" -m pytest -q -rs -m gpu -p no:cacheprovider "$here"
else
    skip "pytest GPU tests (pytest missing or --cpu-twin)"
fi

say "SUMMARY  passed $passed, failed $failed, skipped $skipped; log $log"
[ "$failed" = 0 ]
