#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz) in build-san (clang++-19, ASan+UBSan, the dir the
# sanitized suite runs in; FUZZ_BUILD_DIR picks another) and runs each on its
# checked-in corpus for a bounded time. The suite runs it for a few seconds per harness; run it
# longer by hand and record the results in docs/reliability.md ("Hostile input").
#   tools/fuzz.sh [seconds per harness, default 10] [harness ...]   (all harnesses by default)
# New inputs go to build-san/corpus/<name> (never into the checked-in corpus) and a finding
# to build-san/findings/<name>-crash-*; the exit status is 1 when any harness found one.
# With JUNIT_FILE set, one JUnit test case per harness is written there (the suite counts them).
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
shift || true
all=(jsonrpc mcp policy seccomp check_start keys paging)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=("${all[@]}")
cxx=${FUZZ_CXX:-clang++-19}

if ! command -v "$cxx" >/dev/null; then
  echo "fuzz: $cxx is missing (tools/setup.sh --deps installs clang-19 and libclang-rt-19-dev)"
  exit 77
fi
dir=${FUZZ_BUILD_DIR:-build-san}
case $dir in /*) ;; *) dir=$PWD/$dir ;; esac
if [ ! -f $dir/build.ninja ]; then
  setup_log=$(mktemp)
  CXX=$cxx meson setup $dir -Dfuzz=true -Db_sanitize=address,undefined \
    --buildtype=debugoptimized >"$setup_log" 2>&1 ||
    { cat "$setup_log"; rm -f "$setup_log"; echo "fuzz: meson setup $dir failed"; exit 1; }
  rm -f "$setup_log"
fi
targets=(cordon-spawner cordon-init)
for n in "${names[@]}"; do targets+=("tests/fuzz/${n}_fuzz"); done
ninja -C $dir "${targets[@]}" >$dir/fuzz-build.log 2>&1 ||
  { tail -50 $dir/fuzz-build.log; echo "fuzz: build failed"; exit 1; }

export CORDON_SPAWNER=$dir/cordon-spawner CORDON_INIT=$dir/cordon-init
export CORDON_SECCOMP_DIR=$PWD/seccomp
# Leaks are checked too; UBSan findings abort (the harnesses are built with
# -fno-sanitize-recover); the MCP harness's engine threads outlive an input by design.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp}
for s in llvm-symbolizer-19 /usr/lib/llvm-19/bin/llvm-symbolizer llvm-symbolizer; do
  command -v "$s" >/dev/null && { export ASAN_SYMBOLIZER_PATH=$(command -v "$s"); break; }
done
# The harnesses make their working roots and engine state under $TMPDIR: one dir per run,
# removed when it ends, so runs leave nothing in /tmp.
run_tmp=$(mktemp -d /tmp/cordon-fuzz.XXXXXX) || { echo "fuzz: mktemp -d failed"; exit 1; }
trap 'rm -rf "$run_tmp"' EXIT
export TMPDIR=$run_tmp
mkdir -p $dir/findings
failed=0
cases=""
printf '%-12s %8s %8s %8s %8s %s\n' harness runs exec/s cov corpus result
for n in "${names[@]}"; do
  mkdir -p $dir/corpus/$n
  log=$dir/fuzz-$n.log
  start=$(date +%s)
  dict=()
  [ -f tests/fuzz/$n.dict ] && dict=(-dict=tests/fuzz/$n.dict)
  $dir/tests/fuzz/${n}_fuzz -max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix=$dir/findings/$n- "${dict[@]}" \
    $dir/corpus/$n tests/fuzz/corpus/$n >"$log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  runs=$(grep -oP 'stat::number_of_executed_units:\s*\K\d+' "$log" | tail -1)
  eps=$(grep -oP 'stat::average_exec_per_sec:\s*\K\d+' "$log" | tail -1)
  cov=$(grep -oP '(#\d+\s+(DONE|pulse|NEW|REDUCE|INITED).*?cov: )\K\d+' "$log" | tail -1)
  corpus=$(ls $dir/corpus/$n | wc -l)
  if [ $rc -eq 0 ]; then
    result=ok
    cases+="<testcase classname=\"fuzz\" name=\"$n\" time=\"$took\"/>"
  else
    result="FINDING (exit $rc; see $log and $dir/findings/)"
    failed=1
    msg=$(grep -m1 -E 'ERROR|invariant|runtime error|Assertion' "$log" | sed 's/&/\&amp;/g; s/</\&lt;/g; s/"/\&quot;/g')
    cases+="<testcase classname=\"fuzz\" name=\"$n\" time=\"$took\"><failure message=\"$msg\"/></testcase>"
    grep -m20 -E 'ERROR|invariant|runtime error|#[0-9]+ 0x' "$log"
  fi
  printf '%-12s %8s %8s %8s %8s %s\n' "$n" "${runs:-?}" "${eps:-?}" "${cov:-?}" "$corpus" "$result"
done
if [ -n "${JUNIT_FILE:-}" ]; then
  echo "<?xml version=\"1.0\"?><testsuites><testsuite name=\"fuzz\">$cases</testsuite></testsuites>" >"$JUNIT_FILE"
fi
exit $failed
