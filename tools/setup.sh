#!/usr/bin/env bash
# Installs what cordon needs on Debian 12 (as root), builds it, and runs a real example.
#   tools/setup.sh            install + build + example
#   tools/setup.sh --deps     install only (what tools/test.sh calls when something is missing)
set -euo pipefail
cd "$(dirname "$0")/.."

# clang-19 + libclang-rt-19-dev: the libFuzzer harnesses (tools/fuzz.sh, run by the suite);
# Debian 12's default clang 14 cannot compile std::expected.
# lld-19: clang's linker, for build-san's ~60 links (~0.5 s each against GNU ld's ~1.4 s).
# e2fsprogs (mkfs.ext4): the faults suite builds a failing disk on a loop device.
# qemu-system-x86 + busybox-static: the pure cgroup v2 suite boots a kernel of its own
# (tests/vm; this host's controllers are on cgroup v1).
packages=(meson ninja-build pkg-config g++ git python3 libseccomp-dev libcap-dev
          nlohmann-json3-dev libspdlog-dev libfmt-dev libboost-test-dev clang-format bubblewrap
          clang-19 libclang-rt-19-dev lld-19 e2fsprogs qemu-system-x86 busybox-static)
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
# The pure cgroup v2 suite (tests/vm) boots Debian's cloud kernel in qemu. The kernel package
# is downloaded and unpacked under /var/cache/cordon/vm, not installed: this host's own
# kernel, /boot and boot loader stay as they are.
vm_dir=/var/cache/cordon/vm
if [ ! -f "$vm_dir/vmlinuz" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: the VM kernel is missing ($vm_dir/vmlinuz); run this as root" >&2
    exit 1
  fi
  # The metapackage names the current image package (linux-image-6.1.0-N-cloud-amd64).
  kpkg=$(apt-cache depends linux-image-cloud-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -1)
  if [ -z "$kpkg" ]; then
    apt-get update -qq
    kpkg=$(apt-cache depends linux-image-cloud-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -1)
  fi
  [ -n "$kpkg" ] || { echo "setup: no package for linux-image-cloud-amd64" >&2; exit 1; }
  echo "setup: fetching $kpkg for the pure cgroup v2 VM tests"
  tmp=$(mktemp -d /var/tmp/cordon-vmk.XXXXXX)
  (cd "$tmp" && apt-get download -q "$kpkg" 2>/dev/null && dpkg-deb -x ./*.deb x)
  mkdir -p "$vm_dir"
  cp "$tmp"/x/boot/vmlinuz-* "$vm_dir/vmlinuz.new"
  echo "$kpkg" > "$vm_dir/package"
  mv "$vm_dir/vmlinuz.new" "$vm_dir/vmlinuz"
  rm -rf "$tmp"
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
# On a pure cgroup v2 host under systemd, this shell's cgroup (its login session's scope) holds
# other processes: cordon runs in a scope of its own, delegated to it (docs/security.md).
cordon=("$PWD/build/cordon")
if [ -f /sys/fs/cgroup/cgroup.controllers ] && [ -d /run/systemd/system ] &&
   [ "$(cut -d: -f3 /proc/self/cgroup)" != / ]; then
  cordon=(systemd-run --scope -p Delegate=yes --quiet --collect -- "${cordon[@]}")
fi
echo "setup: ${cordon[*]} run --root $demo -- /usr/bin/make test"
"${cordon[@]}" run --root "$demo" --json-status "$demo/status.json" -- /usr/bin/make test
echo "setup: outcome:"; cat "$demo/status.json"
"${cordon[@]}" doctor
