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
PROGRESS=/tmp/vm-progress
ok() { echo "VMTEST ok $1"; touch $PROGRESS; }
fail() { echo "VMTEST fail $1: $2"; touch $PROGRESS; }
# A stall watchdog: when no check has ended for STALL_S seconds, print what every user process
# (and each of its threads) waits in, as `VMSTALL` lines run.py adds to the failure. A hang
# then leaves its evidence in the report instead of only a timeout (one was seen, session 39).
STALL_S=120
stall_dump() {
  echo "VMSTALL no check ended for ${STALL_S} s; the processes and where they wait:"
  for d in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' < $d/cmdline 2>/dev/null | cut -c1-160)
    [ -n "$cmd" ] || continue # a kernel thread
    echo "VMSTALL pid ${d#/proc/} $cmd"
    for t in $d/task/*; do
      echo "VMSTALL   tid ${t##*/} $(grep '^State:' $t/status | tr -s '\t ' ' ') wchan $(cat $t/wchan)"
      sed 's/^/VMSTALL     /' $t/stack
    done
  done
}
watchdog() {
  # usleep, not sleep: the checks below look for the sandbox's `sleep` with pidof.
  while usleep 10000000; do
    now=$(date +%s)
    last=$(stat -c %Y $PROGRESS)
    if [ $((now - last)) -ge $STALL_S ]; then
      stall_dump
      touch $PROGRESS
    fi
  done
}
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
touch $PROGRESS
watchdog &
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

# Socket buffers: cgroup v2 charges them to memory.max (v1 keeps them apart; docs/security.md).
# 300 loopback connections nobody reads queue at most the limit plus the one packet per
# connection the kernel always admits; the control with room to spare queues more than that.
bound=$((32 * 1048576 + 300 * 96 * 1024))
out=$($C run --root $W --memory 32M -- $P tcp-fill 300)
rc=$?
queued=$(echo "$out" | sed -n 's/^probe tcp-fill: value queued \([0-9]*\) .*/\1/p')
check socket_buffers_count_in_memory_max "exit $rc: $out" \
  '[ $rc = 122 ] || { [ $rc = 0 ] && [ -n "$queued" ] && [ "$queued" -gt 0 ] && [ "$queued" -le $bound ]; }'
out=$($C run --root $W --memory 256M -- $P tcp-fill 300)
rc=$?
queued=$(echo "$out" | sed -n 's/^probe tcp-fill: value queued \([0-9]*\) .*/\1/p')
check socket_buffers_control_queues_past_that_bound "exit $rc: $out" \
  '[ $rc = 0 ] && [ -n "$queued" ] && [ "$queued" -gt $bound ]'

# A SIGKILLed cordon: its sandbox dies with it, and the next start sweeps its cgroups.
$C run --root $W -- /usr/bin/sleep 600 &
runner=$!
for i in $(seq 1 100); do
  job=$(ls -d $CG/cordon/*/ 2>/dev/null | head -1)
  [ -n "$job" ] && [ -n "$(pidof sleep)" ] && break
  sleep 0.2
done
kill -KILL $runner
wait $runner 2>/dev/null
for i in $(seq 1 50); do [ -z "$(pidof sleep)" ] && break; sleep 0.2; done
check a_sigkilled_cordon_takes_its_sandbox_with_it "left: $(pidof sleep)" '[ -z "$(pidof sleep)" ]'
killed=$(ls -d $CG/cordon/*/ 2>/dev/null)
$C run --root $W -- /usr/bin/true
check the_next_start_sweeps_the_killed_cordons_cgroups "killed: $killed, left: $(ls $CG/cordon)" \
  '[ -n "$killed" ] && no_jobs_left $CG/cordon'

# --- 2. a delegated service (systemd: Delegate=yes), cordon its only process ---------------
# systemd marks the cgroup of a unit with Delegate=yes: xattr trusted.delegate (and, from
# v251, user.delegate) "1".
delegate() { $P setxattr "$1" trusted.delegate 1 > /dev/null; }
S=$CG/system.slice
mkdir $S
echo "+memory +pids +cpu" > $S/cgroup.subtree_control
O=$S/cordon.service
mkdir $O
delegate $O
in_cgroup $O $C doctor > /tmp/doctor2.out 2>&1
rc=$?
echo "doctor: $(grep -A1 cgroups /tmp/doctor2.out)"
check doctor_approves_a_delegated_cgroup "exit $rc: $(cat /tmp/doctor2.out)" '[ $rc = 0 ]'
check doctor_in_a_delegated_cgroup_moves_nothing "made: $(ls $O)" \
  '[ ! -e $O/cordon ] && [ ! -e $O/cordon-self ] && [ -z "$(cat $O/cgroup.subtree_control)" ]'

in_cgroup $O $C run --root $W --memory 64M --json-status /tmp/svc.json -- $P memory-hog 300 > /dev/null 2> /tmp/svc.err
state=$(field /tmp/svc.json state)
check run_in_a_delegated_cgroup_gets_its_limits "state $state: $(cat /tmp/svc.json /tmp/svc.err)" \
  '[ "$state" = oom ]'
check cordon_moved_itself_into_a_leaf_of_its_cgroup \
  "$(ls $O), subtree_control: $(cat $O/cgroup.subtree_control)" \
  '[ -d $O/cordon-self ] && has $O/cgroup.subtree_control memory &&
   has $O/cgroup.subtree_control pids && has $O/cgroup.subtree_control cpu'
# The service's cgroup passes controllers on now, so the kernel lets no process join it; a
# process cordon starts is born in the leaf, and a cordon there finds the same layout.
in_cgroup $O/cordon-self $C run --root $W --pids 40 -- /usr/bin/true
rc=$?
check a_cordon_in_the_leaf_uses_the_same_layout "exit $rc, $(ls $O/cordon-self)" \
  '[ $rc = 0 ] && [ ! -e $O/cordon-self/cordon ]'
check no_job_cgroup_is_left_in_the_service "left: $(ls $O/cordon)" 'no_jobs_left $O/cordon'

# A service without Delegate=yes: systemd writes its cgroup alone, so cordon writes nothing.
N=$S/plain.service
mkdir $N
in_cgroup $N $C run --root $W -- /usr/bin/true > /tmp/plain.out 2>&1
rc=$?
echo "refusal: $(cat /tmp/plain.out)"
check an_undelegated_service_is_refused "exit $rc: $(cat /tmp/plain.out)" \
  '[ $rc = 125 ] && has /tmp/plain.out "not delegated" && has /tmp/plain.out "Delegate=yes"'
check a_refusal_leaves_the_undelegated_service_as_it_was \
  "$(ls $N), subtree_control: $(cat $N/cgroup.subtree_control)" \
  '[ ! -e $N/cordon ] && [ ! -e $N/cordon-self ] && [ -z "$(cat $N/cgroup.subtree_control)" ]'

# --- 3. cgroups shared with processes that are not cordon's ---------------------------------
U=$CG/user.slice
mkdir $U
echo "+memory +pids +cpu" > $U/cgroup.subtree_control
# A login session's scope (not delegated) with another program in it.
Q=$U/session-1.scope
mkdir $Q
sleep 600 &
other=$!
echo $other > $Q/cgroup.procs
in_cgroup $Q $C run --root $W -- /usr/bin/true > /tmp/scope.out 2>&1
rc=$?
check a_session_scope_is_refused "exit $rc: $(cat /tmp/scope.out)" \
  '[ $rc = 125 ] && has /tmp/scope.out "not delegated"'
check a_refusal_leaves_the_session_scope_as_it_was \
  "$(ls $Q), subtree_control: $(cat $Q/cgroup.subtree_control), procs: $(cat $Q/cgroup.procs)" \
  '[ ! -e $Q/cordon ] && [ ! -e $Q/cordon-self ] && [ -z "$(cat $Q/cgroup.subtree_control)" ] &&
   has $Q/cgroup.procs "^$other\$"'
kill $other
wait $other 2>/dev/null
# A delegated scope where the shell that starts cordon stays (`systemd-run --scope -p
# Delegate=yes -- sh -c 'cordon run ...; ...'`): the shell is not cordon's to move.
R=$U/run-r1.scope
mkdir $R
delegate $R
sh -c 'echo $$ > "$0/cgroup.procs"; echo "shell $$"; "$@"; echo "rc $?"' $R $C run --root $W -- /usr/bin/true > /tmp/shared.out 2>&1
shell=$(sed -n 's/^shell //p' /tmp/shared.out)
echo "refusal: $(cat /tmp/shared.out)"
check a_delegated_scope_shared_with_the_starting_shell_is_refused "$(cat /tmp/shared.out)" \
  'has /tmp/shared.out "^rc 125$" && has /tmp/shared.out "pid $shell \`sh\`" &&
   has /tmp/shared.out "Delegate=yes"'
check a_refusal_leaves_the_shared_scope_as_it_was \
  "$(ls $R), subtree_control: $(cat $R/cgroup.subtree_control)" \
  '[ ! -e $R/cordon ] && [ ! -e $R/cordon-self ] && [ -z "$(cat $R/cgroup.subtree_control)" ]'
# (`; exit $?`: a shell runs the last command of `-c` by exec, which would leave cordon alone.)
sh -c 'echo $$ > "$0/cgroup.procs"; "$@"; exit $?' $R $C doctor > /tmp/doctor3.out 2>&1
rc=$?
check doctor_refuses_a_shared_cgroup "exit $rc: $(cat /tmp/doctor3.out)" \
  '[ $rc = 1 ] && has /tmp/doctor3.out "pid [0-9]* \`sh\`"'

# --- 4. the daemon in a delegated service, restarted ----------------------------------------
D=$S/cordon-daemon.service
stop_daemon() {
  kill -TERM $daemon
  wait $daemon
  left=$(find $D -name cgroup.procs -exec cat {} + 2>/dev/null)
  [ -n "$left" ] && kill -KILL $left
  find $D -depth -type d -exec rmdir {} + 2>/dev/null
  [ ! -e $D ]
}
mkdir -p /etc/cordon
cat > /etc/cordon/policy.json <<EOF
{"allowedExecutables": ["$P", "/usr/bin/true"], "cwdRoot": "$W",
 "limits": {"memoryBytes": 67108864, "pids": 64, "cpus": 1}}
EOF
# As systemd starts a unit (its main process alone in the unit's fresh cgroup) and stops it
# (everything left in the cgroup killed, the cgroup removed with its subgroups).
start_daemon() {
  mkdir -p $D
  delegate $D
  sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' $D $C serve --policy /etc/cordon/policy.json \
    --state-dir /var/lib/cordon-d --socket /run/cordon.sock > /tmp/daemon.log 2>&1 &
  daemon=$!
  for i in $(seq 1 150); do [ -S /run/cordon.sock ] && break; sleep 0.2; done
}
start_daemon
cd $W
$C run --socket /run/cordon.sock --json-status /tmp/d1.json -- $P memory-hog 300 > /dev/null 2> /tmp/d1.err
state=$(field /tmp/d1.json state)
check daemon_in_a_delegated_cgroup_gets_its_limits \
  "state $state: $(cat /tmp/d1.json /tmp/d1.err /tmp/daemon.log)" '[ "$state" = oom ]'
check the_daemon_runs_in_the_leaf "$(cat /proc/$daemon/cgroup)" \
  'grep -q "^0::/system.slice/cordon-daemon.service/cordon-self$" /proc/$daemon/cgroup'
# The pool refills and the settled job's cgroup goes after the run has returned: wait for both.
settled_jobs() { ls -d $D/cordon/*/ 2>/dev/null | grep -v /pool-; }
for i in $(seq 1 100); do
  [ -n "$(ls -d $D/cordon/pool-*/ 2>/dev/null)" ] && [ -z "$(settled_jobs)" ] && break
  sleep 0.1
done
check the_daemon_keeps_its_warm_pool_in_the_service "$(ls $D/cordon)" \
  '[ -n "$(ls -d $D/cordon/pool-*/ 2>/dev/null)" ]'
settled=$(settled_jobs)
check a_settled_job_of_the_daemon_leaves_no_cgroup "left: $settled" '[ -z "$settled" ]'
stop_daemon
check a_stopped_daemon_leaves_no_process_in_its_cgroup "left: $left" '[ -z "$left" ]'
start_daemon
$C run --socket /run/cordon.sock -- /usr/bin/true
rc=$?
check a_restarted_daemon_runs_again "exit $rc: $(cat /tmp/daemon.log)" '[ $rc = 0 ]'
stop_daemon
check a_restarted_daemon_stops_as_cleanly "left: $left" '[ -z "$left" ]'
# A start that finds the leaf of an earlier run (its cgroup not pruned; the controllers off, as
# systemd leaves a delegated cgroup it starts a unit in) reuses it.
mkdir -p $D/cordon-self
start_daemon
$C run --socket /run/cordon.sock -- /usr/bin/true
rc=$?
check a_start_that_finds_an_old_leaf_reuses_it "exit $rc: $(cat /tmp/daemon.log)" \
  '[ $rc = 0 ] && grep -q "^0::/system.slice/cordon-daemon.service/cordon-self$" /proc/$daemon/cgroup'
stop_daemon
cd /

echo "VMTEST end"
sync
poweroff -f
