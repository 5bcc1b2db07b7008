#!/usr/bin/env python3
"""Runs cordon on a pure cgroup v2 kernel: boots Debian's cloud kernel in qemu (software
emulation; this host has no KVM) with an initramfs holding this build's cordon, and runs
tests/vm/guest.sh there as PID 1.

    tests/vm/run.py BUILD_DIR [--kernel VMLINUZ] [--junit FILE] [--keep DIR]

Why a VM: this development host is hybrid (memory, pids and cpu bound to cgroup v1), and a
process cannot unbind them; most production hosts are pure cgroup v2. The guest mounts
cgroup2 alone, so every controller is on v2, and lays out cgroups as systemd does (a
delegated service, a scope shared with other processes) to exercise cordon's v2 code for
real: limits, OOM and pids events, kill, and moving itself into a leaf of a delegated cgroup.

The guest prints one line per check, `VMTEST ok NAME` or `VMTEST fail NAME: WHY`, then
`VMTEST end`. Each becomes a JUnit test case; no end line (a panic, a hang, a timeout) is a
failure that quotes the console's last lines. The kernel comes from tools/setup.sh --deps
(Debian's linux-image-cloud-amd64, unpacked under /var/cache/cordon/vm, not installed).
Nothing is skipped: a missing qemu or kernel fails with what to run.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from xml.sax.saxutils import escape, quoteattr

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_KERNEL = "/var/cache/cordon/vm/vmlinuz"
TIMEOUT_S = 600


def fail_all(junit, why):
    print(f"vm: {why}")
    write_junit(junit, [("setup", False, why, 0.0)])
    sys.exit(1)


def write_junit(path, results):
    if not path:
        return
    failures = sum(1 for r in results if not r[1])
    cases = []
    for name, ok, why, secs in results:
        body = "" if ok else f"<failure message={quoteattr('failed')}>{escape(why)}</failure>"
        cases.append(f"<testcase name={quoteattr(name)} time=\"{secs:.3f}\">{body}</testcase>")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(f'<?xml version="1.0"?>\n<testsuite name="vm_cgroup_v2" tests="{len(results)}" '
                f'failures="{failures}">\n' + "\n".join(cases) + "\n</testsuite>\n")


def libraries(binary):
    """Absolute paths of the shared libraries `binary` loads (none for a static one)."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True)
    if out.returncode != 0:
        return []
    return re.findall(r"(/\S+) \(0x", out.stdout)


def copy_into(root, path, dest=None):
    """Copies `path` (symlinks followed) to the same absolute path under `root`."""
    target = os.path.join(root, (dest or path).lstrip("/"))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if not os.path.exists(target):
        shutil.copy2(path, target, follow_symlinks=True)


def build_initramfs(build, work):
    root = os.path.join(work, "root")
    shutil.rmtree(root, ignore_errors=True)
    # A merged-/usr layout like the host's, so the sandbox's read-only binds find what they
    # find on Debian 12: /bin, /lib and /lib64 are links into /usr.
    for d in ["usr/bin", "usr/lib", "usr/lib64", "bb", "opt/cordon", "etc", "proc", "sys",
              "dev", "tmp", "run", "var/tmp", "var/lib", "newroot"]:
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for link in ["bin", "lib", "lib64"]:
        os.symlink("usr/" + link, os.path.join(root, link))
    busybox = shutil.which("busybox") or fail_all(None, "busybox is missing")
    copy_into(root, busybox, "/bb/busybox")
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True).stdout.split()
    for a in applets:
        if a != "busybox":
            os.symlink("busybox", os.path.join(root, "bb", a))
    probe = os.path.join(build, "tests", "helpers", "probe")
    binaries = [os.path.join(build, n) for n in ["cordon", "cordon-init", "cordon-spawner"]]
    for b in binaries + [probe]:
        if not os.path.exists(b):
            fail_all(None, f"{b} is missing: build first (ninja -C {build})")
        copy_into(root, b, "/opt/cordon/" + os.path.basename(b))
    shutil.copytree(os.path.join(build, "seccomp"), os.path.join(root, "opt/cordon/seccomp"))
    host_programs = ["/usr/bin/true", "/usr/bin/sleep"]
    for p in host_programs:
        copy_into(root, p)
    for b in binaries + host_programs:
        for lib in libraries(b):
            copy_into(root, lib)
    copy_into(root, "/etc/ld.so.cache")
    with open(os.path.join(root, "etc/passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bb/sh\n")
    with open(os.path.join(root, "etc/group"), "w") as f:
        f.write("root:x:0:\n")
    shutil.copy2(os.path.join(HERE, "guest.sh"), os.path.join(root, "init"))
    os.chmod(os.path.join(root, "init"), 0o755)
    image = os.path.join(work, "initrd.gz")
    files = subprocess.run(["find", "."], cwd=root, capture_output=True, text=True, check=True)
    cpio = subprocess.run([busybox, "cpio", "-o", "-H", "newc"], cwd=root, input=files.stdout.encode(),
                          capture_output=True, check=True)
    subprocess.run(["gzip", "-1"], input=cpio.stdout, stdout=open(image, "wb"), check=True)
    return image


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--kernel", default=os.environ.get("CORDON_VM_KERNEL", DEFAULT_KERNEL))
    ap.add_argument("--junit", default=os.environ.get("JUNIT_FILE"))
    ap.add_argument("--keep", help="keep the initramfs and console log in this dir")
    args = ap.parse_args()

    qemu = shutil.which("qemu-system-x86_64")
    if not qemu:
        fail_all(args.junit, "qemu-system-x86_64 is missing: run tools/setup.sh --deps")
    if not os.path.exists(args.kernel):
        fail_all(args.junit, f"no kernel at {args.kernel}: run tools/setup.sh --deps")

    work = args.keep or tempfile.mkdtemp(prefix="cordon-vm.")
    os.makedirs(work, exist_ok=True)
    try:
        image = build_initramfs(os.path.abspath(args.build), work)
        console = os.path.join(work, "console.log")
        cmd = [qemu, "-m", "2048", "-smp", "2", "-accel", "tcg,thread=multi",
               "-kernel", args.kernel, "-initrd", image,
               "-append", "console=ttyS0 quiet panic=-1 oops=panic",
               "-nographic", "-no-reboot", "-nic", "none", "-serial", f"file:{console}",
               "-monitor", "none"]
        start = time.monotonic()
        try:
            subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, timeout=TIMEOUT_S)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        secs = time.monotonic() - start
        with open(console, errors="replace") as f:
            text = f.read()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    results = []
    ended = False
    for line in text.splitlines():
        m = re.search(r"VMTEST (ok|fail|end)(?: ([^:]+))?(?:: (.*))?$", line.rstrip("\r"))
        if not m:
            continue
        if m.group(1) == "end":
            ended = True
            continue
        results.append((m.group(2).strip(), m.group(1) == "ok", m.group(3) or "", 0.0))
    if not ended:
        lines = text.splitlines()
        tail = "\n".join(l for l in lines[-40:] if "VMSTALL" not in l)
        stall = "\n".join(l for l in lines if "VMSTALL" in l)
        why = (f"timed out after {TIMEOUT_S} s" if timed_out else "the guest stopped early") + \
              f"; the console's last lines:\n{tail}" + \
              (f"\nthe guest's stall watchdog saw:\n{stall}" if stall else "")
        results.append(("guest_ran_to_the_end", False, why, secs))
    # The sanitized build's reports go to the console with the command's stderr; one fails.
    reports = [l for l in text.splitlines()
               if re.search(r"ERROR: (Address|Leak)Sanitizer|runtime error:", l)]
    results.append(("no_sanitizer_report", not reports, "\n".join(reports[:20]), 0.0))
    for name, ok, why, _ in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name}{'' if ok else ': ' + why}")
    write_junit(args.junit, results)
    failed = sum(1 for r in results if not r[1])
    print(f"vm: {len(results) - failed} passed, {failed} failed in {secs:.1f} s")
    sys.exit(1 if failed or not results else 0)


if __name__ == "__main__":
    main()
