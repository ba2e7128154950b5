#!/usr/bin/env bash
# Build the megakernel, run every GPU test, time it, and print a short summary last.
# Usage (repo root, on a machine with an NVIDIA GPU): bash flywheel/gpu_check.sh [pytest -k expr]
# The whole suite (270 tests) takes more than one 10-minute device-tool call with its builds: PART=1, 2
# or 3 runs a part of it (1: DLRM, families, fp8, linear, LoRA, sampling; 2: test_megakernel.py and
# test_moe.py; 3: the other quantized formats and caches, sizing and tagged hand-offs). test_megakernel.py
# alone needs more builds than one call compiles after its first 49 tests (session 57).
set -uo pipefail
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/megavm-gpu}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/device.txt"
python3 -m megavm.vm.build 2>&1 | tee "$OUT/build.log" || exit 1
case "${PART:-}" in
  1) files="tests/gpu/test_dlrm.py tests/gpu/test_families.py tests/gpu/test_fp8.py tests/gpu/test_linear.py
            tests/gpu/test_lora.py tests/gpu/test_sample.py" ;;
  2) files="tests/gpu/test_megakernel.py tests/gpu/test_moe.py" ;;
  3) files="tests/gpu/test_fp8_block.py tests/gpu/test_int4.py tests/gpu/test_kv_fp8.py tests/gpu/test_kv_nvfp4.py
            tests/gpu/test_nvfp4.py tests/gpu/test_sizing.py tests/gpu/test_tagged.py" ;;
  *) files="tests/gpu" ;;
esac
python3 -m pytest -q -m cuda $files ${1:+-k "$1"} -x -rs --durations=15 2>&1 | tee "$OUT/gpu_tests.log"
tests=${PIPESTATUS[0]}
python3 -m megavm.flywheel.kernel_time ${KT_ARGS:-} 2>&1 | tee "$OUT/kernel_time.log"
# the run docs in one archive (a device call brings back 8 files); here:
#   python3 -m megavm.flywheel.file_runs results.tgz [--commit C] [--slug S]
dirs=$(cd "$OUT" && ls -d kernel_time trace 2>/dev/null)
[ -n "$dirs" ] && tar czf "$OUT/results.tgz" -C "$OUT" $dirs && (cd "$OUT" && rm -rf $dirs)
echo "== summary =="
tail -n 1 "$OUT/gpu_tests.log"
tail -n 4 "$OUT/kernel_time.log"
exit $tests
