#pragma once

#include <string>

namespace cordon::api {

/// `cordon doctor`: probes every kernel feature and the cgroup setup, sweeps cgroups left by
/// a SIGKILLed cordon, prints what each guarantee rests on. Exit 0 when every required
/// feature is present, 1 otherwise.
int doctor_main(const std::string& state_dir, const std::string& seccomp_profile, bool as_json);

}  // namespace cordon::api
