#!/usr/bin/env bash
# Runs the whole test suite and prints `N passed, N failed, N skipped`. .ci/run calls this.
set -uo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh --deps || exit 1
if [ ! -d build ]; then
  meson setup build --buildtype=debugoptimized || exit 1
fi
ninja -C build || { echo "0 passed, 1 failed, 0 skipped"; exit 1; }
meson test -C build --print-errorlogs --num-processes 2 "$@"
python3 tools/ci_summary.py build
