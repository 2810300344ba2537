#!/bin/bash
# Probes of docs/input-limits.md's promises that take real runs (issue 33, items 1-4 and 9):
#   1. three concurrent runs with one -O x.parquet keep every record (66 of 66)
#   3. `merge IN -o IN` in a loop while a run appends to IN keeps every record (32 of 32)
#   9. a gzip of 1 GiB of newlines given to merge and report ends at the line cap
#   9. a FIFO as a model, sweep file, --groups-file is refused unread
#   2. on a full disk (a 64 KiB tmpfs; needs root, skipped otherwise) each output command
#      is one line and a previous model stays whole
# Usage: bash scripts/safe-io-probe.sh [TRIALS]   (run from the repository, .venv active)
set -u
TRIALS=${1:-3}
WORK=$(mktemp -d)
trap 'mountpoint -q "$WORK/full" && umount "$WORK/full"; rm -rf "$WORK"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(git rev-parse --short HEAD); load: $(cut -d' ' -f1-3 /proc/loadavg)"
python - "$WORK" <<'PY'
import json, sys, zlib
work = sys.argv[1]
good = json.loads(open("tests/fixtures/records-v1.jsonl").readline())
lines = []
for k in range(10, 20):
    size, rec = 1 << k, json.loads(json.dumps(good))
    t = 5.0 + size / 1e3
    rec.update(size_asked=size, size_used=size, count=size // 4, samples_us=[t * 0.98, t, t * 1.02],
               rank_median_us=[t, t])
    rec["time_us"].update(median=t, min=t * 0.98, max=t * 1.02, mean=t, p5=t * 0.98, p95=t * 1.02)
    lines.append(json.dumps(rec))
open(f"{work}/fit.jsonl", "w").write("\n".join(lines) + "\n")
packer = zlib.compressobj(9, zlib.DEFLATED, 31)
with open(f"{work}/newlines.jsonl.gz", "wb") as out:
    for _ in range(1024):
        out.write(packer.compress(b"\n" * (1 << 20)))
    out.write(packer.flush())
PY
python -m ccbench calibrate "$WORK/fit.jsonl" -o "$WORK/model.json" --bootstrap 0 >/dev/null
count() { python -c "from ccbench.records import read_records; print(len(read_records('$1')[0]))"; }
RUN=(python -m ccbench launch -n 2 allreduce --backend gloo --sizes 1K-1M --quiet)

echo "## 1. three runs, one -O x.parquet (22 records each)"
for t in $(seq "$TRIALS"); do
  d="$WORK/p$t"; mkdir "$d"; pids=()
  for k in 1 2 3; do "${RUN[@]}" -O "$d/x.parquet" >/dev/null 2>"$d/err$k" & pids+=($!); done
  rcs=""; for p in "${pids[@]}"; do wait "$p"; rcs="$rcs $?"; done
  echo "trial $t: $(count "$d/x.parquet") of 66 records; exit$rcs; stderr lines: $(cat "$d"/err* | wc -l)"
done

echo "## 3. merge IN -o IN in a loop while a run appends 22 records to IN (10 before)"
for t in $(seq "$TRIALS"); do
  d="$WORK/m$t"; mkdir "$d"; cp "$WORK/fit.jsonl" "$d/in.jsonl"
  "${RUN[@]}" -O "$d/in.jsonl" >/dev/null 2>"$d/run" & run=$!
  merges=0; failed=0
  while kill -0 "$run" 2>/dev/null; do
    python -m ccbench merge "$d/in.jsonl" -o "$d/in.jsonl" 2>>"$d/merge" || failed=$((failed + 1))
    merges=$((merges + 1))
  done
  wait "$run"; rc=$?
  echo "trial $t: $(count "$d/in.jsonl") of 32 records; run exit $rc; $merges merges ($failed failed)"
done

echo "## 9. 1 GiB of newlines, $(stat -c %s "$WORK/newlines.jsonl.gz") bytes of gzip"
for c in merge report; do
  start=$(date +%s.%N)
  out="$WORK/out-$c"; [ "$c" = merge ] && out="$out.jsonl"
  python -m ccbench $c "$WORK/newlines.jsonl.gz" -o "$out" 2>"$WORK/err"; rc=$?
  echo "$c: exit $rc after $(python -c "print(round($(date +%s.%N) - $start, 1))") s: $(cat "$WORK/err")"
done

echo "## 9. a FIFO as input"
mkfifo "$WORK/fifo"
for argv in "simulate $WORK/fifo allreduce -p 4" "sweep $WORK/fifo --dry-run" \
            "replay $WORK --groups-file $WORK/fifo" "report --model $WORK/fifo $WORK/fit.jsonl -o $WORK/r"; do
  timeout 120 python -m ccbench $argv >/dev/null 2>"$WORK/err"; rc=$?
  echo "ccbench ${argv%% *}: exit $rc, $(wc -l < "$WORK/err") line(s): $(cut -c1-120 "$WORK/err" | head -1)"
done

echo "## 2. a full disk (64 KiB tmpfs)"
mkdir "$WORK/full"
if mount -t tmpfs -o size=64k tmpfs "$WORK/full" 2>/dev/null; then
  full="$WORK/full"; cp "$WORK/model.json" "$full/model.json"
  cat /dev/urandom > "$full/filler" 2>/dev/null
  for argv in "calibrate $WORK/fit.jsonl -o $full/model.json" "merge $WORK/fit.jsonl -o $full/m.jsonl" \
              "simulate $WORK/model.json allreduce -p 4 -o $full/p.jsonl" \
              "export astra-sim $WORK/model.json -o $full/astra" "report $WORK/fit.jsonl -o $full/rep --formats png"; do
    timeout 300 python -m ccbench $argv >/dev/null 2>"$WORK/err"; rc=$?
    echo "ccbench ${argv%% *}: exit $rc, $(wc -l < "$WORK/err") line(s): $(cut -c1-120 "$WORK/err" | head -1)"
  done
  cmp -s "$WORK/model.json" "$full/model.json" && echo "the previous model.json is intact" \
    || echo "the previous model.json CHANGED"
  umount "$full"
else
  echo "skipped: mounting a tmpfs needs root"
fi
