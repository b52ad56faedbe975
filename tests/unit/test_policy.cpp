// MicroBatchPolicy and Schedule: pure logic.
#include <gtest/gtest.h>

#include <cmath>

#include "autoaccum/core/error.hpp"
#include "autoaccum/train/micro_batch.hpp"
#include "autoaccum/train/schedule.hpp"

namespace autoaccum::train {
namespace {

TEST(MicroBatchPolicy, AutoHalvesToOneThenStops) {
  MicroBatchPolicy p(100, std::nullopt);
  EXPECT_TRUE(p.automatic());
  EXPECT_EQ(p.current(), 100);
  EXPECT_EQ(p.accumulation(100), 1);
  std::vector<std::int64_t> sizes;
  while (auto next = p.after_oom())
    sizes.push_back(*next);
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{50, 25, 12, 6, 3, 1}));
  EXPECT_EQ(p.current(), 1);
  EXPECT_EQ(p.accumulation(100), 100);
}

TEST(MicroBatchPolicy, AccumulationCoversUnevenParts) {
  MicroBatchPolicy p(7, 3);
  EXPECT_EQ(p.accumulation(7), 3);
  EXPECT_EQ(p.accumulation(6), 2);
}

TEST(MicroBatchPolicy, FixedHasNoNextSize) {
  MicroBatchPolicy p(64, 16);
  EXPECT_FALSE(p.automatic());
  EXPECT_FALSE(p.after_oom().has_value());
  EXPECT_THROW(MicroBatchPolicy(64, 65), UsageError);
  EXPECT_THROW(MicroBatchPolicy(64, 0), UsageError);
}

TEST(MicroBatchPolicy, ResumesAtTheLearnedSize) {
  EXPECT_EQ(MicroBatchPolicy(64, std::nullopt, 8).current(), 8);
  EXPECT_EQ(MicroBatchPolicy(64, std::nullopt, 1000).current(), 64);
}

TEST(Schedule, WarmupThenCosine) {
  Schedule s = make_schedule(1.0, 4, 14, "cosine");
  EXPECT_DOUBLE_EQ(s.lr(0), 0.25);
  EXPECT_DOUBLE_EQ(s.lr(3), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(4), 1.0);
  EXPECT_NEAR(s.lr(13), 0.0, 1e-12);
  EXPECT_LT(s.lr(9), s.lr(8));
  Schedule c = make_schedule(0.1, 0, 10, "constant");
  EXPECT_DOUBLE_EQ(c.lr(9), 0.1);
  EXPECT_THROW(make_schedule(0.1, 0, 10, "linear"), UsageError);
}

}  // namespace
}  // namespace autoaccum::train
