#include "policy/seccomp_profile.hpp"
#include "sandbox/spawner.hpp"

int main() {
  return cordon::sandbox::spawner_main(cordon::sandbox::kSpawnerSocketFd,
                                       cordon::policy::load_seccomp_profile);
}
