#include "engine/step_profile.h"

#include <gtest/gtest.h>

#include <thread>

namespace inferx {
namespace {

TEST(StepProfile, DisabledRecordsNothing) {
  StepProfile p(false);
  p.begin_step();
  p.mark(StepProfile::kSample);
  p.end_step(StepProfile::kOther, 4);
  EXPECT_EQ(p.report().find("steps"), std::string::npos);
}

TEST(StepProfile, AveragesPhasesPerStepKind) {
  StepProfile p(true);
  for (int i = 0; i < 2; ++i) {
    p.begin_step();
    p.mark(StepProfile::kIntake);
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    p.mark(StepProfile::kSample);
    p.end_step(StepProfile::kGraphDecode, 8);
  }
  p.begin_step();
  p.mark(StepProfile::kSchedule);
  p.cancel_step();  // nothing scheduled: not counted
  const std::string r = p.report();
  EXPECT_NE(r.find("graph decode steps 2, rows/step 8.0"), std::string::npos) << r;
  EXPECT_EQ(r.find("other"), std::string::npos) << r;
  // The sleep lands in sample+wait, at least 3 ms per step on average.
  const size_t at = r.find("sample+wait ", r.find("graph decode"));
  ASSERT_NE(at, std::string::npos) << r;
  EXPECT_GE(std::stod(r.substr(at + 12)), 3.0) << r;
}

}  // namespace
}  // namespace inferx
