#!/usr/bin/env bash
# Runs the whole test suite and prints `N passed, N failed, N skipped`. .ci/run calls this.
# Two runs: the suite in build/ (its `fuzz` test runs each libFuzzer harness briefly, see
# tools/fuzz.sh), then the same suite built with AddressSanitizer + UndefinedBehaviorSanitizer
# in build-asan/ when CORDON_ASAN=1 (the last line then counts both runs). The sanitizer run
# is opt-in until a whole clean-checkout run of it has passed here (docs/reliability.md).
set -uo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh --deps || exit 1
if [ ! -d build ]; then
  meson setup build --buildtype=debugoptimized || exit 1
fi
ninja -C build || { echo "0 passed, 1 failed, 0 skipped"; exit 1; }
meson test -C build --print-errorlogs --num-processes 2 "$@"
runs=(build)

if [ -n "${CORDON_ASAN:-}" ]; then
  # Helpers that run inside the sandbox (cordon-init, the probe) and the clone3 child's path
  # are built without sanitizers whatever b_sanitize says (see the meson.build files).
  if [ ! -f build-asan/build.ninja ]; then
    meson setup build-asan -Db_sanitize=address,undefined --buildtype=debugoptimized || exit 1
  fi
  rm -f build-asan/meson-logs/testlog.json  # a failed build must not count an old run
  if ninja -C build-asan; then
    # halt_on_error: a UBSan report fails the test (the build also says
    # -fno-sanitize-recover). The fuzz harnesses already run sanitized; the format lint
    # does not depend on the build.
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:strict_string_checks=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
      meson test -C build-asan --print-errorlogs --num-processes 2 \
        --no-suite fuzz --no-suite lint "$@"
  else
    echo "test: the ASan+UBSan build failed"
  fi
  runs+=(build-asan)
fi
python3 tools/ci_summary.py "${runs[@]}"
