#!/usr/bin/env bash
# Build the megakernel, run every GPU test, time it, and print a short summary last.
# Usage (repo root, on a machine with an NVIDIA GPU): bash flywheel/gpu_check.sh [pytest -k expr]
set -uo pipefail
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/megavm-gpu}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/device.txt"
python3 -m megavm.vm.build 2>&1 | tee "$OUT/build.log" || exit 1
python3 -m pytest -q -m cuda tests/gpu ${1:+-k "$1"} -x -rs 2>&1 | tee "$OUT/gpu_tests.log"
tests=${PIPESTATUS[0]}
python3 -m megavm.flywheel.kernel_time ${KT_ARGS:-} 2>&1 | tee "$OUT/kernel_time.log"
echo "== summary =="
tail -n 1 "$OUT/gpu_tests.log"
tail -n 4 "$OUT/kernel_time.log"
exit $tests
