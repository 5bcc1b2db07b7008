#!/bb/sh
# PID 1 of the pure cgroup v2 guest that tests/vm/run.py boots. Prints `VMTEST ok NAME` or
# `VMTEST fail NAME: WHY` per check, then `VMTEST end`, and powers the VM off.
export PATH=/bb:/usr/bin
if [ "$$" = 1 ] && [ ! -e /.stage2 ]; then
  # pivot_root (which every sandbox does) refuses the initramfs itself as the old root: move
  # everything onto a tmpfs first.
  mount -t tmpfs -o size=1200m,mode=755 tmpfs /newroot
  cp -a /bb /usr /opt /etc /init /bin /lib /lib64 /newroot/
  mkdir -p /newroot/proc /newroot/sys /newroot/dev /newroot/tmp /newroot/run \
    /newroot/var/tmp /newroot/var/lib /newroot/work/root
  chmod 1777 /newroot/tmp /newroot/var/tmp
  touch /newroot/.stage2
  exec switch_root /newroot /init
fi

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=755 tmpfs /run
# cgroup2 alone: every controller is on v2, as on a pure v2 host.
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup

CG=/sys/fs/cgroup
C=/opt/cordon/cordon
P=/opt/cordon/probe
W=/work/root
ok() { echo "VMTEST ok $1"; }
fail() { echo "VMTEST fail $1: $2"; }
# check NAME WHY CONDITION: ok when the shell condition (a string, eval'd) holds.
check() {
  if eval "$3"; then ok "$1"; else fail "$1" "$2"; fi
}
field() { grep -o "\"$2\": [^,}]*" "$1" | head -1 | sed 's/^[^:]*: //; s/"//g'; }
has() { grep -q -- "$2" "$1"; }
# Runs COMMAND... as the only process of cgroup DIR (as systemd starts a unit's process).
in_cgroup() {
  dir=$1
  shift
  sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$dir" "$@"
}
no_jobs_left() { [ -z "$(ls -d "$1"/*/ 2>/dev/null)" ]; }

echo "VM: $(uname -r), cgroup controllers: $(cat $CG/cgroup.controllers)"
echo "+memory +pids +cpu" > $CG/cgroup.subtree_control

# --- 1. cordon started from the root cgroup ------------------------------------------------
$C doctor > /tmp/doctor.out 2>&1
rc=$?
check doctor_approves_a_pure_v2_host "exit $rc: $(cat /tmp/doctor.out)" '[ $rc = 0 ]'
check doctor_finds_the_controllers_on_v2 "$(grep cgroups /tmp/doctor.out)" \
  'has /tmp/doctor.out "cgroup v2 with memory, pids, cpu"'

$C run --root $W -- /usr/bin/true
rc=$?
check run_true "exit $rc" '[ $rc = 0 ]'

$C run --root $W --memory 64M --json-status /tmp/oom.json -- $P memory-hog 300 > /dev/null
state=$(field /tmp/oom.json state)
peak=$(field /tmp/oom.json peakMemoryBytes)
check memory_max_oom_kills_the_command "state $state: $(cat /tmp/oom.json)" '[ "$state" = oom ]'
check memory_peak_is_read_from_v2 "peak $peak" \
  '[ -n "$peak" ] && [ "$peak" -gt 0 ] && [ "$peak" -le 67108864 ]'

out=$($C run --root $W --pids 32 --json-status /tmp/pids.json -- $P fork-bomb)
n=$(echo "$out" | sed -n 's/^probe fork-bomb: value \([0-9]*\) .*/\1/p')
hits=$(field /tmp/pids.json pidsLimitHits)
check pids_max_stops_a_fork_bomb "probe said \`$out\`" '[ -n "$n" ] && [ "$n" -lt 32 ]'
check pids_events_are_read_from_v2 "pidsLimitHits $hits" '[ -n "$hits" ] && [ "$hits" -gt 0 ]'

# The limits as the kernel holds them, read from the job's cgroup while it runs.
$C run --root $W --memory 96M --pids 77 --cpus 0.5 -- /usr/bin/sleep 20 &
runner=$!
job=""
for i in $(seq 1 100); do
  job=$(ls -d $CG/cordon/*/ 2>/dev/null | head -1)
  [ -n "$job" ] && [ -n "$(cat "$job/cgroup.procs" 2>/dev/null)" ] && break
  sleep 0.2
done
check limits_are_written_to_the_v2_job_cgroup \
  "memory.max $(cat "$job/memory.max" 2>&1), pids.max $(cat "$job/pids.max" 2>&1), cpu.max $(cat "$job/cpu.max" 2>&1)" \
  '[ "$(cat "$job/memory.max")" = 100663296 ] && [ "$(cat "$job/pids.max")" = 77 ] &&
   [ "$(cat "$job/cpu.max")" = "50000 100000" ]'
kill -TERM $runner
wait $runner

$C run --root $W --timeout 2 --kill-grace 1 --json-status /tmp/to.json -- $P ignore-term-and-fork > /dev/null
state=$(field /tmp/to.json state)
check timeout_escalates_and_reaches_every_descendant "state $state, left: $(pidof probe)" \
  '[ "$state" = timeout ] && [ -z "$(pidof probe)" ]'
check no_job_cgroup_is_left_at_the_root "left: $(ls $CG/cordon)" 'no_jobs_left $CG/cordon'

echo "VMTEST end"
sync
poweroff -f
