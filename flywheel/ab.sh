#!/usr/bin/env bash
# A/B of this tree against a base commit, on one GPU in one call: the same kernel_time rows for both,
# base and new alternating per configuration, a short table last.
#
#   bash flywheel/ab.sh prepare BASE           # here (no GPU needed): .cache/base = BASE's tree, and
#                                              # both builds for sm_90a under .cache (nvcc only)
#   bash flywheel/ab.sh run MODEL:CTX ...      # on the GPU machine, from the repo root, with .cache/base
#                                              # and .cache/megavm carried; the run docs come back as
#                                              # $OUT/results-{new,base}.tgz, the logs as $OUT/logs.tgz:
#   python3 -m megavm.flywheel.file_runs results-new.tgz --commit C --slug S   # here, to file them
#
# MEGAVM_COMMIT labels the new rows (default: this checkout's commit, -dirty when it differs);
# KT_ARGS adds kernel_time arguments to both sides (--passes 2, --switch ...).
set -uo pipefail
cmd=${1:-}; shift || true
root=$(pwd)
case "$cmd" in
  prepare)
    base=${1:?usage: ab.sh prepare BASE}
    rm -rf .cache/base && mkdir -p .cache/base
    git archive "$base" | tar -x -C .cache/base || exit 1
    echo "$(git rev-parse --short "$base")" > .cache/base/COMMIT
    MEGAVM_CACHE_DIR=$root/.cache/megavm PYTHONPATH=. python3 -m megavm.vm.build --arch "${ARCH:-sm_90a}" || exit 1
    (cd .cache/base && MEGAVM_CACHE_DIR=$PWD/.cache/megavm PYTHONPATH=. python3 -m megavm.vm.build --arch "${ARCH:-sm_90a}") || exit 1
    ;;
  run)
    [ -d .cache/base ] || { echo "ab.sh: no .cache/base (run 'ab.sh prepare BASE' first and carry it)"; exit 2; }
    OUT=${OUT:-/tmp/megavm-ab}; mkdir -p "$OUT/new" "$OUT/base"
    export PYTHONPATH=. PYTHONUNBUFFERED=1
    new_label=${MEGAVM_COMMIT:-$(PYTHONPATH=. python3 -c 'from megavm.flywheel.bench import commit; print(commit())')}
    base_label=$(cat .cache/base/COMMIT 2>/dev/null || echo base)
    for mc in "$@"; do
      m=${mc%%:*}; c=${mc##*:}
      MEGAVM_COMMIT=$new_label MEGAVM_CACHE_DIR=$root/.cache/megavm python3 -m megavm.flywheel.kernel_time \
        --models "$m" --ctx "$c" --out "$OUT/new" ${KT_ARGS:-} > "$OUT/new/$m-$c.log" 2>&1 || echo "new $mc failed"
      (cd .cache/base && MEGAVM_COMMIT=$base_label MEGAVM_CACHE_DIR=$PWD/.cache/megavm python3 -m megavm.flywheel.kernel_time \
        --models "$m" --ctx "$c" --out "$OUT/base" ${KT_ARGS:-} > "$OUT/base/$m-$c.log" 2>&1) || echo "base $mc failed"
    done
    echo "== new ($new_label) against base ($base_label)"
    for side in new base; do
      for f in "$OUT/$side"/*.log; do sed -n '/^model /,$p' "$f" | tail -n +2 | sed "s/^/$side /"; done
    done
    # a device call brings back 8 files: the docs of each side in one archive, the logs in another
    for side in new base; do
      dirs=$(cd "$OUT/$side" && ls -d kernel_time trace 2>/dev/null)
      [ -n "$dirs" ] && tar czf "$OUT/results-$side.tgz" -C "$OUT/$side" $dirs && (cd "$OUT/$side" && rm -rf $dirs)
    done
    (cd "$OUT" && tar czf logs.tgz new base && rm -rf new base)
    ;;
  *) echo "usage: bash flywheel/ab.sh prepare BASE | run MODEL:CTX ..."; exit 2 ;;
esac
