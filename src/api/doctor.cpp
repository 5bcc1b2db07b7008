#include "api/doctor.hpp"

#include <cstdio>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/json_fields.hpp"
#include "policy/seccomp_profile.hpp"
#include "sandbox/cgroup.hpp"
#include "sandbox/seccomp.hpp"
#include "sandbox/features.hpp"

namespace cordon::api {

int doctor_main(const std::string& state_dir, const std::string& seccomp_profile, bool as_json) {
  auto checks = sandbox::probe_features(state_dir);

  // The profile a run would load: it must compile, and what libseccomp skipped is said here.
  sandbox::FeatureCheck prof{"seccomp profile", false, true, "", ""};
  auto profile = policy::load_seccomp_profile(seccomp_profile);
  if (!profile) {
    prof.detail = profile.error().message();
  } else if (auto compiled = sandbox::compile_filters(*profile, {}); !compiled) {
    prof.detail = compiled.error().message();
  } else {
    prof.ok = true;
    prof.detail = fmt::format("`{}`: {} + {} instructions (profile + fixed filter), {} warnings",
                              seccomp_profile, compiled->profile.insns.size(),
                              compiled->fixed.insns.size(), compiled->warnings.size());
    for (const auto& w : compiled->warnings) {
      prof.detail += "; " + w;
    }
  }
  prof.guarantee = "the profile every run loads, with cordon's fixed filter stacked on top";
  checks.push_back(prof);

  sandbox::FeatureCheck cg{"cgroups", false, true, "", ""};
  auto layout = sandbox::detect_cgroup_layout();
  auto delegation =
      layout ? sandbox::check_v2_delegation(*layout) : Result<sandbox::V2Delegation>{};
  if (layout && !delegation) {
    cg.detail = delegation.error().message();
    cg.guarantee = "limits and kill-everything";
  } else if (layout) {
    cg.ok = true;
    if (layout->mode == sandbox::CgroupMode::kUnified) {
      cg.detail = "cgroup v2 with memory, pids, cpu: jobs under `" + layout->v2_parent + "`";
      if (!delegation->leaf.empty()) {
        cg.detail += "; this cgroup `" + delegation->own +
                     "` holds only this process: a cordon started here moves itself into `" +
                     delegation->leaf + "` and passes the controllers on (doctor moves nothing)";
      }
    } else {
      cg.detail = "hybrid: v1 memory `" + layout->v1_memory_parent + "`, pids `" +
                  layout->v1_pids_parent + "`, cpu `" + layout->v1_cpu_parent +
                  "`; v2 tracking and kill under `" + layout->v2_parent + "`";
    }
    cg.guarantee =
        "memory, pids and CPU limits; kill reaches every process; OOM and pids "
        "events read back";
  } else {
    cg.detail = layout.error().message();
    cg.guarantee = "limits and kill-everything";
  }
  checks.push_back(cg);

  sandbox::FeatureCheck sweep{"leftover cgroups", true, false, "", ""};
  auto records = sandbox::CgroupRecords::open(state_dir + "/cgroups");
  if (records) {
    auto n = records->sweep();
    sweep.ok = n.has_value();
    sweep.detail = n ? std::to_string(*n) + " left by a killed cordon swept" : n.error().message();
  } else {
    sweep.ok = false;
    sweep.detail = records.error().message();
  }
  sweep.guarantee = "a SIGKILLed cordon leaves nothing behind for long";
  checks.push_back(sweep);

  bool all_required = true;
  for (const auto& c : checks) {
    all_required = all_required && (c.ok || !c.required);
  }
  if (as_json) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& c : checks) {
      j.push_back({{"name", c.name},
                   {"ok", c.ok},
                   {"required", c.required},
                   {"detail", c.detail},
                   {"guarantee", c.guarantee}});
    }
    std::printf("%s\n",
                json_fields::dump(nlohmann::json{{"ok", all_required}, {"checks", j}}, 2).c_str());
  } else {
    for (const auto& c : checks) {
      const char* mark = c.ok ? "ok  " : (c.required ? "FAIL" : "warn");
      std::printf("%s %-26s %s\n     %-26s -> %s\n", mark, c.name.c_str(), c.detail.c_str(), "",
                  c.guarantee.c_str());
    }
    std::printf("%s\n", all_required
                            ? "cordon can run here with every guarantee."
                            : "cordon refuses to run here: a required feature is missing.");
  }
  return all_required ? 0 : 1;
}

}  // namespace cordon::api
