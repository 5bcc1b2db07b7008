#!/usr/bin/env bash
# Runs the whole test suite and prints `N passed, N failed, N skipped`. .ci/run calls this.
#
# The suite runs once, in build-san: clang-19 with AddressSanitizer + UndefinedBehaviorSanitizer
# (-Db_sanitize=address,undefined; UBSan aborts, LeakSanitizer checks every process at exit).
# Every suite runs there: unit, integration, security, e2e (the official MCP SDK against
# build-san/cordon), lint, bench-smoke, and `fuzz` (the libFuzzer harnesses, built in the same
# dir with -Dfuzz=true, a few seconds each). Helpers that run inside a sandbox (cordon-init,
# the probe) and the clone3 child's path are never instrumented (see the meson.build files).
# One sanitized build instead of a plain one plus a sanitized one: the sanitizers only add
# checks, and two full builds did not fit the suite's time budget on 2 cores.
#
#   CORDON_TEST_BUILD=plain tools/test.sh   the same suite in build/ (gcc, no sanitizers: the
#                                           build tools/setup.sh makes and the benchmarks use)
#   CORDON_TEST_BUILD=both tools/test.sh    both; the last line counts both runs
# Extra arguments go to `meson test` (e.g. a test name).
set -uo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh --deps || exit 1

mode=${CORDON_TEST_BUILD:-sanitized}
case "$mode" in
  sanitized) dirs=(build-san) ;;
  plain) dirs=(build) ;;
  both) dirs=(build-san build) ;;
  *) echo "test: CORDON_TEST_BUILD is sanitized, plain or both, not \`$mode\`"; exit 2 ;;
esac

# What the sanitizers report goes to the test's log; a report fails the test.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# libseccomp 2.5.4 leaks inside seccomp_rule_add (docs/reliability.md): suppressed, nothing else.
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp}
for s in llvm-symbolizer-19 /usr/lib/llvm-19/bin/llvm-symbolizer; do
  command -v "$s" >/dev/null && { export ASAN_SYMBOLIZER_PATH=$(command -v "$s"); break; }
done

for dir in "${dirs[@]}"; do
  rm -f "$dir/meson-logs/testlog.json"  # a failed build must not count an old run
  if [ ! -f "$dir/build.ninja" ]; then
    if [ "$dir" = build-san ]; then
      # Line tables are all the sanitizers' reports need (file:line in every frame); full
      # debug info made the build ~15 % slower (mcp.cpp: 41 s against 34 s).
      CXX=clang++-19 meson setup build-san -Db_sanitize=address,undefined -Dfuzz=true \
        --buildtype=debugoptimized -Dcpp_args=-gline-tables-only ||
        { echo "test: meson setup build-san failed"; continue; }
    else
      meson setup build --buildtype=debugoptimized || { echo "test: meson setup build failed"; continue; }
    fi
  fi
  if ! ninja -C "$dir"; then
    echo "test: the build in $dir failed"
    continue
  fi
  # Every test may run beside any other (bench_smoke alone): each makes its own state dir,
  # cgroups and working roots and leases uids from the host's shared pool, as separate cordon
  # processes on one host do. One process more than the CPUs: most tests wait on the kernel
  # more than they compute.
  meson test -C "$dir" --print-errorlogs --num-processes $(( $(nproc) + 1 )) "$@"
done
python3 tools/ci_summary.py "${dirs[@]}"
