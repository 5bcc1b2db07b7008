#pragma once

namespace cordon::sandbox {

/// PID 1 of every sandbox (the cordon-init binary): forks the command, confines itself,
/// reaps, forwards SIGTERM/INT/HUP/QUIT/USR1/USR2 to every process in the sandbox, reports the
/// command's raw wait status on kFdStatus and exits, which kills whatever is left.
int init_main();

}  // namespace cordon::sandbox
