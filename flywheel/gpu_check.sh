#!/usr/bin/env bash
# Build the megakernel, run every GPU test, time it, and print a short summary last.
# Usage (repo root, on a machine with an NVIDIA GPU): bash flywheel/gpu_check.sh [pytest -k expr]
# The builds of flywheel/gpu_builds.txt are compiled first, JOBS (default: every core) at a time; the
# summary lists any build the tests loaded that the file lacks. The whole suite (270 tests) took more than
# one 10-minute device-tool call when each test compiled its own builds: PART=1, 2 or 3 runs a part of it
# (1: DLRM, families, fp8, linear, LoRA, sampling; 2: test_megakernel.py and test_moe.py; 3: the other
# quantized formats and caches, sizing and tagged hand-offs). SHARDS=N runs the tests in N processes at once,
# dealt round robin over the host's GPUs (flywheel/shards.py; SHARD_TIMEOUT: their wall seconds, default 540):
# most of the tests' time is ReferenceVM on the CPU, so 8 at once on one GPU ran 73 of test_megakernel.py's
# and test_moe.py's tests in one call of 245 s, the builds first (session 60, a script of the same dealing;
# bench/results/gpu_tests/2026-11-28-4e16f52-megakernel-rest-and-moe).
set -uo pipefail
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/megavm-gpu}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/device.txt"
# the builds the tests load, compiled in parallel first (a test compiling its own takes minutes, one at a time)
python3 -m megavm.vm.build --set flywheel/gpu_builds.txt --jobs "${JOBS:-$(nproc)}" 2>&1 | tee "$OUT/build.log"
[ "${PIPESTATUS[0]}" = 0 ] || exit 1
case "${PART:-}" in
  1) files="tests/gpu/test_dlrm.py tests/gpu/test_families.py tests/gpu/test_fp8.py tests/gpu/test_linear.py
            tests/gpu/test_lora.py tests/gpu/test_sample.py" ;;
  2) files="tests/gpu/test_megakernel.py tests/gpu/test_moe.py" ;;
  3) files="tests/gpu/test_fp8_block.py tests/gpu/test_int4.py tests/gpu/test_kv_fp8.py tests/gpu/test_kv_nvfp4.py
            tests/gpu/test_nvfp4.py tests/gpu/test_sizing.py tests/gpu/test_tagged.py" ;;
  *) files="tests/gpu" ;;
esac
rm -f "$OUT/builds.txt"
if [ "${SHARDS:-1}" -gt 1 ]; then   # SHARDS processes at once over the host's GPUs (flywheel/shards.py)
  MEGAVM_BUILD_LOG="$OUT/builds.txt" python3 -m megavm.flywheel.shards --shards "$SHARDS" -x --log-dir "$OUT/shards" \
    ${SHARD_TIMEOUT:+--timeout "$SHARD_TIMEOUT"} -- -m cuda $files ${1:+-k "$1"} 2>&1 | tee "$OUT/gpu_tests.log"
else
  MEGAVM_BUILD_LOG="$OUT/builds.txt" python3 -m pytest -q -m cuda $files ${1:+-k "$1"} -x -rs --durations=15 2>&1 \
    | tee "$OUT/gpu_tests.log"
fi
tests=${PIPESTATUS[0]}
missing=$(grep -vxF -f flywheel/gpu_builds.txt "$OUT/builds.txt" 2>/dev/null)
python3 -m megavm.flywheel.kernel_time ${KT_ARGS:-} 2>&1 | tee "$OUT/kernel_time.log"
# the run docs in one archive (a device call brings back 8 files); here:
#   python3 -m megavm.flywheel.file_runs results.tgz [--commit C] [--slug S]
dirs=$(cd "$OUT" && ls -d kernel_time trace 2>/dev/null)
[ -n "$dirs" ] && tar czf "$OUT/results.tgz" -C "$OUT" $dirs && (cd "$OUT" && rm -rf $dirs)
echo "== summary =="
tail -n 1 "$OUT/gpu_tests.log"
[ -z "$missing" ] || printf 'builds the tests loaded that flywheel/gpu_builds.txt lacks (add them):\n%s\n' "$missing"
tail -n 4 "$OUT/kernel_time.log"
exit $tests
