// The SIMD targets the kernels' tests loop over (ForEachTarget), printed so
// that a run's log says what it covered, and checked against what the run
// expects: scripts/test-arm64.sh runs the tests under qemu-aarch64 with
// several emulated CPUs and sets DS_EXPECT_TARGETS to the Highway targets
// each one must bring (e.g. "NEON SVE SVE2 SVE2_128"), so that an emulator
// or compiler that quietly drops a target fails here instead of leaving it
// untested.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "bf16/simd_kernels.h"
#include "deltasync/simd_route.h"

namespace deltasync {
namespace {

std::vector<std::string> Words(const char* text) {
  std::vector<std::string> words;
  std::istringstream in(text ? text : "");
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

TEST(KernelTargets, ListsTheTargetsAndHasEveryExpectedOne) {
  // The default dispatch before and after listing the targets: the best
  // one listed, as in a process that never lists them (a replica). Highway
  // 1.0's SupportedTargets() left SVE2 chosen where the vector size adds
  // SVE_256 or SVE2_128, which a fresh process dispatches to (docs/arm64.md);
  // SupportedTargetNames() clears that.
  const std::string before = kernels::ActiveTargetName();
  const std::vector<std::string> names = kernels::SupportedTargetNames();
  ASSERT_FALSE(names.empty());
  std::string list;
  for (const std::string& name : names) list += (list.empty() ? "" : " ") + name;
  const std::string active = kernels::ActiveTargetName();
  // One line that scripts grep for.
  std::printf("kernel targets: %s (default: %s)\n", list.c_str(), active.c_str());
  RecordProperty("kernel_targets", list);
  EXPECT_EQ(active, before) << "listing the targets changed the default dispatch";
  EXPECT_EQ(active, names.front()) << "the default is not the best target of: " << list;
  for (const std::string& want : Words(std::getenv("DS_EXPECT_TARGETS"))) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end())
        << "expected target " << want << " in: " << list;
  }
  for (const std::string& unwanted : Words(std::getenv("DS_EXPECT_NO_TARGETS"))) {
    EXPECT_EQ(std::find(names.begin(), names.end(), unwanted), names.end())
        << "unexpected target " << unwanted << " in: " << list;
  }
}

TEST(KernelTargets, ThePublicRouteNameIsTheTargetTheKernelsTakeOnEveryTarget) {
  // `deltasync bench --json` reports it as simd_target beside every figure:
  // it must follow the dispatch, "-no-raw" routes included, and be the
  // default again once the restriction is lifted.
  const std::string best = SimdRouteName();
  EXPECT_EQ(best, kernels::SupportedTargetNames().front());
  for (const std::string& name : kernels::SupportedTargetNames()) {
    ASSERT_TRUE(kernels::UseOnlyTarget(name)) << name;
    EXPECT_EQ(SimdRouteName(), name);
  }
  ASSERT_TRUE(kernels::UseOnlyTarget(""));
  EXPECT_EQ(SimdRouteName(), best);
}

}  // namespace
}  // namespace deltasync
