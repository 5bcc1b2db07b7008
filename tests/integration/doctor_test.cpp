#define BOOST_TEST_MODULE doctor
#include <boost/test/unit_test.hpp>

#include <nlohmann/json.hpp>

#include "helpers/cordon_fixture.hpp"

using namespace cordon::test;

BOOST_AUTO_TEST_CASE(reports_every_feature_this_machine_has) {
  Sandbox s;
  auto r = run_process({cordon_bin(), "doctor", "--state-dir", s.state, "--json"});
  BOOST_TEST(r.exit_code() == 0, r.err);
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  BOOST_REQUIRE(!j.is_discarded());
  BOOST_TEST(j["ok"] == true);
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& c : j["checks"]) by_name[c["name"].get<std::string>()] = c;
  for (const char* name :
       {"clone3 + namespaces", "pidfd", "openat2 RESOLVE_BENEATH", "mount API", "idmapped mounts",
        "Landlock", "Landlock scopes (ABI 6)", "seccomp filter", "seccomp profile",
        "reserved host ids", "cgroups", "legacy TIOCSTI", "libseccomp syscall names"}) {
    BOOST_REQUIRE_MESSAGE(by_name.count(name) == 1, name);
    BOOST_TEST(by_name[name]["ok"] == true, name << ": " << by_name[name]["detail"]);
    BOOST_TEST(!by_name[name]["guarantee"].get<std::string>().empty(), name);
  }
  BOOST_TEST(by_name["Landlock"]["detail"] == "ABI 7");
  BOOST_TEST(by_name["legacy TIOCSTI"]["detail"].get<std::string>().find("= 1") !=
             std::string::npos);
  BOOST_TEST(by_name["cgroups"]["detail"].get<std::string>().rfind("hybrid", 0) == 0);
  // libseccomp 2.5.4 cannot name the syscalls after 456; doctor lists them.
  BOOST_TEST(by_name["libseccomp syscall names"]["detail"].get<std::string>().find("457") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(text_output_ends_with_a_verdict) {
  Sandbox s;
  auto r = run_process({cordon_bin(), "doctor", "--state-dir", s.state});
  BOOST_TEST(r.exit_code() == 0);
  BOOST_TEST(r.out.find("cordon can run here with every guarantee.") != std::string::npos);
}
