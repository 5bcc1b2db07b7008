#!/usr/bin/env bash
# Installs what cordon needs on Debian 12 (as root), builds it, and runs a real example.
#   tools/setup.sh            install + build + example
#   tools/setup.sh --deps     install only (what tools/test.sh calls when something is missing)
set -euo pipefail
cd "$(dirname "$0")/.."

# clang-19 + libclang-rt-19-dev: the libFuzzer harnesses (tools/fuzz.sh, run by the suite);
# Debian 12's default clang 14 cannot compile std::expected.
# e2fsprogs (mkfs.ext4): the faults suite builds a failing disk on a loop device.
packages=(meson ninja-build pkg-config g++ git python3 libseccomp-dev libcap-dev
          nlohmann-json3-dev libspdlog-dev libfmt-dev libboost-test-dev clang-format bubblewrap
          clang-19 libclang-rt-19-dev e2fsprogs)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: missing Debian packages: ${missing[*]}; run this as root" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The e2e suite's real MCP client (the official TypeScript SDK) runs on Node.js (>= 18, as
# Debian 12 ships). A node from another source is used as it is.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: Node.js and npm are missing; run this as root" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm
fi
if [ ! -d tests/e2e/node_modules/@modelcontextprotocol/sdk ]; then
  (cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error)
fi
[ "${1:-}" = "--deps" ] && exit 0

[ -d build ] || meson setup build --buildtype=debugoptimized
ninja -C build

# A real example: a small project built and tested inside the sandbox.
demo=$(mktemp -d /var/tmp/cordon-demo.XXXXXX)
trap 'rm -rf "$demo"' EXIT
cat > "$demo/hello.c" <<'C'
#include <stdio.h>
int main(void) { puts("hello from inside the sandbox"); return 0; }
C
printf 'test: hello\n\t./hello\nhello: hello.c\n\tcc -o hello hello.c\n' > "$demo/Makefile"
echo "setup: build/cordon run --root $demo -- /usr/bin/make test"
build/cordon run --root "$demo" --json-status "$demo/status.json" -- /usr/bin/make test
echo "setup: outcome:"; cat "$demo/status.json"
build/cordon doctor
