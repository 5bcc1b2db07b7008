#!/usr/bin/env bash
# Style check: every C++ source is clang-formatted (.clang-format: Google base, 100 columns).
set -u
src=${1:?source dir}
cd "$src" || exit 1
command -v clang-format >/dev/null || { echo "clang-format is not installed (tools/setup.sh installs it)"; exit 1; }
mapfile -t files < <(find include src tools tests -name '*.cpp' -o -name '*.hpp' | sort)
out=$(clang-format --dry-run --Werror "${files[@]}" 2>&1)
if [ -n "$out" ]; then
  echo "$out" | head -40
  echo "not clang-formatted: run clang-format -i on the files above"
  exit 1
fi
echo "${#files[@]} files clang-formatted"
