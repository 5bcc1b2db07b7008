#pragma once

// Thin wrappers over the syscalls glibc 2.36 does not wrap, plus the constants that the
// 6.1 kernel headers on Debian 12 lack. Every wrapper returns the raw syscall result
// (-1 with errno set), so the same functions serve the parent and the async-signal-safe
// child path; Result-returning helpers live in sys/fs.hpp.

#include <fcntl.h>
#include <linux/landlock.h>
#include <linux/mount.h>
#include <linux/openat2.h>
#include <linux/sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace cordon::sys {

// --- constants newer than the 6.1 headers -------------------------------------------------
#ifndef __NR_fchmodat2
inline constexpr long kNrFchmodat2 = 452;  // Linux 6.6
#else
inline constexpr long kNrFchmodat2 = __NR_fchmodat2;
#endif
inline constexpr long kNrMapShadowStack = 453;  // 6.6
inline constexpr long kNrFutexWake = 454;       // 6.7
inline constexpr long kNrFutexWait = 455;
inline constexpr long kNrFutexRequeue = 456;
inline constexpr long kNrStatmount = 457;  // 6.8
inline constexpr long kNrListmount = 458;
inline constexpr long kNrLsmGetSelfAttr = 459;
inline constexpr long kNrLsmSetSelfAttr = 460;
inline constexpr long kNrLsmListModules = 461;
inline constexpr long kNrMseal = 462;       // 6.10
inline constexpr long kNrSetxattrat = 463;  // 6.13
inline constexpr long kNrGetxattrat = 464;
inline constexpr long kNrListxattrat = 465;
inline constexpr long kNrRemovexattrat = 466;
inline constexpr long kNrOpenTreeAttr = 467;  // 6.15
inline constexpr long kNrFileGetattr = 468;   // 6.17
inline constexpr long kNrFileSetattr = 469;
// ioctl(pidfd, PIDFD_GET_MNT_NAMESPACE): an nsfs fd (O_CLOEXEC) of the process's mount
// namespace; Linux 6.11, _IO(PIDFS_IOCTL_MAGIC 0xFF, 3).
inline constexpr unsigned long kPidfdGetMntNamespace = (0xFFUL << 8) | 3;

// ioctl(pidfd, PIDFD_GET_INFO) (Linux 6.13), its first version (64 bytes). With
// kPidfdInfoExit in `mask` (Linux 6.15) `exit_code` is the wait status, once the process's
// parent has reaped it.
struct PidfdInfo {
  uint64_t mask;
  uint64_t cgroupid;
  uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
  int32_t exit_code;
};
static_assert(sizeof(PidfdInfo) == 64);
inline constexpr uint64_t kPidfdInfoExit = 1ULL << 3;
// _IOWR(PIDFS_IOCTL_MAGIC 0xFF, 11, 64 bytes)
inline constexpr unsigned long kPidfdGetInfo =
    (3UL << 30) | (sizeof(PidfdInfo) << 16) | (0xFFUL << 8) | 11;

// Landlock: ABI 4 (net), 5 (ioctl_dev), 6 (scopes), 7 (audit flags).
inline constexpr uint64_t kLandlockAccessFsTruncate = 1ULL << 14;        // ABI 3
inline constexpr uint64_t kLandlockAccessFsIoctlDev = 1ULL << 15;        // ABI 5
inline constexpr uint64_t kLandlockScopeAbstractUnixSocket = 1ULL << 0;  // ABI 6
inline constexpr uint64_t kLandlockScopeSignal = 1ULL << 1;              // ABI 6
inline constexpr uint32_t kLandlockRuleTypePathBeneath = 1;

// The full ruleset attribute of ABI 6+ (the 6.1 header has only handled_access_fs).
struct LandlockRulesetAttr {
  uint64_t handled_access_fs;
  uint64_t handled_access_net;
  uint64_t scoped;
};
struct __attribute__((packed)) LandlockPathBeneathAttr {
  uint64_t allowed_access;
  int32_t parent_fd;
};

// prctl(PR_FUTEX_HASH, PR_FUTEX_HASH_SET_SLOTS, n): the process's private futex hash (Linux
// 6.16); 0 slots: the global hash.
inline constexpr int kPrFutexHash = 78;
inline constexpr unsigned long kPrFutexHashSetSlots = 1;

// PR_SET_SECUREBITS values (linux/securebits.h), spelled out to keep includes small.
inline constexpr unsigned long kSecbitNoroot = 1UL << 0;
inline constexpr unsigned long kSecbitNorootLocked = 1UL << 1;
inline constexpr unsigned long kSecbitNoSetuidFixup = 1UL << 2;
inline constexpr unsigned long kSecbitNoSetuidFixupLocked = 1UL << 3;
inline constexpr unsigned long kSecbitKeepCaps = 1UL << 4;
inline constexpr unsigned long kSecbitKeepCapsLocked = 1UL << 5;
inline constexpr unsigned long kSecbitNoCapAmbientRaise = 1UL << 6;
inline constexpr unsigned long kSecbitNoCapAmbientRaiseLocked = 1UL << 7;

// --- raw wrappers ------------------------------------------------------------------------
inline long clone3(struct clone_args* args) {
  return ::syscall(SYS_clone3, args, sizeof(struct clone_args));
}
inline int pidfd_open(pid_t pid, unsigned flags) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, flags));
}
inline int pidfd_send_signal(int pidfd, int sig, siginfo_t* info, unsigned flags) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, sig, info, flags));
}
inline int openat2(int dirfd, const char* path, struct open_how* how) {
  return static_cast<int>(::syscall(SYS_openat2, dirfd, path, how, sizeof(*how)));
}
inline int open_tree(int dirfd, const char* path, unsigned flags) {
  return static_cast<int>(::syscall(SYS_open_tree, dirfd, path, flags));
}
inline int move_mount(int from_dirfd, const char* from_path, int to_dirfd, const char* to_path,
                      unsigned flags) {
  return static_cast<int>(
      ::syscall(SYS_move_mount, from_dirfd, from_path, to_dirfd, to_path, flags));
}
inline int mount_setattr(int dirfd, const char* path, unsigned flags, struct mount_attr* attr) {
  return static_cast<int>(::syscall(SYS_mount_setattr, dirfd, path, flags, attr, sizeof(*attr)));
}
inline int fsopen(const char* fsname, unsigned flags) {
  return static_cast<int>(::syscall(SYS_fsopen, fsname, flags));
}
inline int fsconfig(int fd, unsigned cmd, const char* key, const void* value, int aux) {
  return static_cast<int>(::syscall(SYS_fsconfig, fd, cmd, key, value, aux));
}
inline int fsmount(int fd, unsigned flags, unsigned attr_flags) {
  return static_cast<int>(::syscall(SYS_fsmount, fd, flags, attr_flags));
}
inline int pivot_root(const char* new_root, const char* put_old) {
  return static_cast<int>(::syscall(SYS_pivot_root, new_root, put_old));
}
inline int close_range(unsigned first, unsigned last, unsigned flags) {
  return static_cast<int>(::syscall(SYS_close_range, first, last, flags));
}
inline int execveat(int dirfd, const char* path, char* const argv[], char* const envp[],
                    int flags) {
  return static_cast<int>(::syscall(SYS_execveat, dirfd, path, argv, envp, flags));
}
inline int landlock_create_ruleset(const LandlockRulesetAttr* attr, size_t size, uint32_t flags) {
  return static_cast<int>(::syscall(SYS_landlock_create_ruleset, attr, size, flags));
}
inline int landlock_add_rule(int ruleset_fd, uint32_t type, const void* attr, uint32_t flags) {
  return static_cast<int>(::syscall(SYS_landlock_add_rule, ruleset_fd, type, attr, flags));
}
inline int landlock_restrict_self(int ruleset_fd, uint32_t flags) {
  return static_cast<int>(::syscall(SYS_landlock_restrict_self, ruleset_fd, flags));
}
/// The Landlock ABI version this kernel offers, or -1 (errno set) without Landlock.
inline int landlock_abi() {
  return landlock_create_ruleset(nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
}

}  // namespace cordon::sys
